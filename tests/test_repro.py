"""The reproduction driver: statistics, summaries, an end-to-end run, and the CPU smoke check."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from benchmarks import repro_mathchat as repro

ROOT = Path(__file__).resolve().parents[1]


def test_mean_ci95_matches_a_hand_computed_t_interval():
    # mean 0.2, s = 0.1, n = 3, t(0.975, 2) = 4.302653 -> half-width 0.248414
    stat = repro.mean_ci95([0.1, 0.2, 0.3])
    assert stat["mean"] == pytest.approx(0.2)
    assert stat["ci95"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert repro.mean_ci95([0.5])["ci95"] is None
    assert repro.mean_ci95([None, float("nan")])["mean"] is None


def test_ema_carries_over_gaps():
    assert repro.ema([3.0, None, 0.0]) == pytest.approx([3.0, 3.0, 2.0])
    assert math.isnan(repro.ema([None, 1.0])[0])


def fake_run(mode: str, seed: int, accuracies: list[float], tool: list[float], base: bool):
    evals = [
        {
            "step": 5 * i,
            "accuracy": acc,
            **{f"{a}/mean_response_tokens": 100.0 - i for a in repro.AGENTS},
            **{f"{a}/mean_coach_score": 1.0 for a in repro.AGENTS},
            **{f"{a}/tool_call_rate": 0.0 for a in repro.AGENTS},
            "code_executor/tool_call_rate": rate,
        }
        for i, (acc, rate) in enumerate(zip(accuracies, tool))
    ]
    return {"mode": mode, "seed": seed, "evals": evals if base else evals[1:], "train": []}


def test_summary_pairs_runs_by_seed_and_judges_the_goals():
    runs = []
    for seed, (base, proc, out) in enumerate([(0.0, 0.2, 0.0), (0.05, 0.2, 0.05), (0.1, 0.3, 0.1)]):
        runs.append(fake_run("process", seed, [base, proc], [0.1, 0.5], base=True))
        runs.append(fake_run("outcome", seed, [base, out], [0.1, 0.1], base=False))
    for run in runs:  # what collect() does for runs without their own base evaluation
        if run["mode"] == "outcome":
            first = next(r for r in runs if r["mode"] == "process" and r["seed"] == run["seed"])
            run["evals"].insert(0, first["evals"][0])
    summary = repro.summarise(runs, ["process", "outcome"])
    assert summary["base"]["accuracy"]["mean"] == pytest.approx(0.05)
    process = summary["modes"]["process"]
    assert process["accuracy"]["mean"] == pytest.approx(0.7 / 3)
    assert process["gain_over_base"]["values"] == pytest.approx([0.2, 0.15, 0.2])
    assert process["tool_call_ratio_over_base"] == pytest.approx(5.0)
    assert summary["process_minus_outcome"]["values"] == pytest.approx([0.2, 0.15, 0.2])
    goals = repro.goal_checks(summary)
    assert goals == {
        "process_gain_at_least_10_points": True,
        "process_gain_interval_excludes_0": True,
        "process_beats_outcome_by_5_points": True,
        "tool_call_rate_at_least_3x": True,
    }
    assert summary["compared_at_step"] == 5
    # A run cut short: every mode is compared at the last step all runs reached.
    runs[0]["evals"].append({**runs[0]["evals"][-1], "step": 10, "accuracy": 0.9})
    again = repro.summarise(runs, ["process", "outcome"])
    assert again["compared_at_step"] == 5
    assert again["modes"]["process"]["accuracy"] == summary["modes"]["process"]["accuracy"]
    assert again["modes"]["process"]["last_evaluation"]["0"] == {"step": 10, "accuracy": 0.9}
    flat = [fake_run("process", s, [0.1, 0.1], [0.1, 0.1], base=True) for s in range(3)]
    goals = repro.goal_checks(repro.summarise(flat, ["process"]))
    assert not goals["process_gain_at_least_10_points"]
    assert not goals["process_gain_interval_excludes_0"]
    assert not goals["tool_call_rate_at_least_3x"]


def test_lockstep_holds_runs_ahead_and_never_the_slowest():
    moves = repro.lockstep_moves
    assert moves({"a": 3, "b": 1, "c": 2}, set(), set()) == ({"a", "c"}, set())
    # b caught up with c: c goes on, a (still ahead) stays paused.
    assert moves({"a": 3, "b": 2, "c": 2}, {"a", "c"}, set()) == (set(), {"c"})
    # A finished (or failed) run holds nobody back.
    assert moves({"a": 3, "b": 1, "c": 2}, {"a", "c"}, {"b"}) == (set(), {"c"})
    assert moves({"a": 3, "b": 1}, {"a"}, {"a", "b"}) == (set(), {"a"})
    assert moves({"a": 5, "b": 4}, set(), set(), lead=2) == (set(), set())
    # Whatever the progress, the slowest unfinished run is never paused: no deadlock.
    for steps in ({"a": 0, "b": 0}, {"a": 7, "b": 2, "c": 2}, {"a": 1, "b": 9}):
        to_pause, _ = moves(steps, set(), set())
        assert min(steps, key=steps.get) not in to_pause


def test_lockstep_pauses_come_out_of_the_rollout_seconds(tmp_path):
    (tmp_path / repro.PAUSES_FILE).write_text(
        '{"step": 2, "seconds": 3.0}\n{"step": 2, "seconds": 1.5}\n{"step": 3, "sec'
    )  # two pauses in step 2, and a line torn by a kill
    assert repro.read_pauses(tmp_path) == {2: 4.5}
    records = [
        {"step": s, "rollout/episodes": 4, "rollout/seconds": 10.0, "train/seconds": 2.0}
        for s in (1, 2)
    ]
    points = repro.train_points(records, repro.read_pauses(tmp_path))
    assert [p["rollout_seconds"] for p in points] == [10.0, 5.5]
    assert [p["paused_seconds"] for p in points] == [0.0, 4.5]
    assert points[1]["seconds"] == 7.5


def test_one_base_evaluation_per_seed_also_across_sessions(tmp_path):
    recipe = {"env": "MathChat-v0", "steps": 2}
    first = repro.plan_runs(recipe, ["process", "outcome"], [0, 1], tmp_path)
    assert [(m, s, c["eval_at_start"]) for m, s, _, c in first] == [
        ("process", 0, True),
        ("outcome", 0, False),
        ("process", 1, True),
        ("outcome", 1, False),
    ]
    # Seed 0's process run evaluated the base (and a later step); seed 1's did not get
    # that far. A later session's outcome runs reuse seed 0's base only.
    (tmp_path / "process-s0").mkdir()
    (tmp_path / "process-s0" / "metrics.jsonl").write_text(
        '{"step": 0, "eval/success_rate": 0.01}\n{"step": 1}\n'
        '{"step": 10, "eval/success_rate": 0.1}\n'
    )
    (tmp_path / "process-s1").mkdir()
    (tmp_path / "process-s1" / "metrics.jsonl").write_text('{"step": 1}\n')
    later = repro.plan_runs(recipe, ["outcome"], [0, 1], tmp_path)
    assert [(s, c["eval_at_start"]) for _, s, _, c in later] == [(0, False), (1, True)]
    assert later[0][2] == tmp_path / "outcome-s0"


def _metrics(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_an_earlier_sessions_results_file_joins_the_report(tmp_path):
    recipe = {"env": "MathChat-v0", "steps": 2, "eval_every": 2}
    tool = "code_executor/tool_call_rate"
    # Session 1: process credit, seed 0, on a machine whose run dirs are gone afterwards.
    first_dir = tmp_path / "session1"
    _metrics(
        first_dir / "process-s0",
        [
            {"step": 0, "eval/success_rate": 0.0, f"eval/{tool}": 0.5},
            {"step": 1, "rollout/episodes": 4, tool: 0.5},
            {"step": 2, "rollout/episodes": 4, tool: 0.9},
            {"step": 2, "eval/success_rate": 0.25, f"eval/{tool}": 1.0},
        ],
    )
    (first_dir / "process-s0" / "provenance.json").write_text('{"commit": null}\n')
    earlier = repro.collect(first_dir, ["process"], [0], runs_commit="abc123")
    assert earlier[0]["commit"] == "abc123"
    results = tmp_path / "process.json"
    results.write_text(json.dumps({"recipe": recipe, "runs": earlier, "runs_commit": ["abc123"]}))
    included = repro.load_included([results], recipe)
    assert set(included) == {("process", 0)}
    # Session 2 trains outcome credit only, and reuses the included run's base evaluation.
    planned = repro.plan_runs(recipe, ["process", "outcome"], [0], tmp_path / "s2", included)
    assert [(m, c["eval_at_start"]) for m, _, _, c in planned] == [("outcome", False)]
    _metrics(
        tmp_path / "s2" / "outcome-s0",
        [
            {"step": 1, "rollout/episodes": 4, tool: 0.5},
            {"step": 2, "rollout/episodes": 4, tool: 0.5},
            {"step": 2, "eval/success_rate": 0.0, f"eval/{tool}": 0.5},
        ],
    )
    runs = repro.collect(tmp_path / "s2", ["process", "outcome"], [0], included)
    assert "shared_base" not in included[("process", 0)]["evals"][0]  # the input is kept
    by_mode = {r["mode"]: r for r in runs}
    assert by_mode["process"]["included_from"] == "process.json"
    assert by_mode["process"]["commit"] == "abc123"
    assert by_mode["outcome"]["evals"][0]["shared_base"] is True
    summary = repro.summarise(runs, ["process", "outcome"])
    assert summary["compared_at_step"] == 2
    assert summary["process_minus_outcome"]["values"] == pytest.approx([0.25])
    # A results file of an outcome run whose base was a copy: the copy serves as base.
    only_copy = {("outcome", 0): {**by_mode["outcome"], "regraded": []}}
    (again,) = repro.collect(tmp_path / "none", ["outcome"], [0], only_copy)
    assert again["evals"][0]["step"] == 0
    # Another recipe is not at equal rollouts: refused, naming the field.
    with pytest.raises(SystemExit, match="fields steps differ"):
        repro.load_included([results], {**recipe, "steps": 20})
    with pytest.raises(SystemExit, match="cannot read a results file"):
        repro.load_included([tmp_path / "missing.json"], recipe)


def test_saved_episodes_are_graded_again_with_the_current_grader(tmp_path):
    def action(episode: str, predicted: str | None, correct: bool, **more) -> str:
        outcome = {"correct": correct, "predicted": predicted, "answer": "5507", **more}
        return json.dumps({"episode_id": episode, "agent": "verifier", "outcome": outcome})

    (tmp_path / "rollouts").mkdir()
    (tmp_path / "eval").mkdir()
    # Graded solved by an older grader: the problem's expression, copied; and a real answer.
    (tmp_path / "rollouts" / "step-000002.jsonl").write_text(
        "\n".join(
            [
                action("a", "91 * 64 - 317", True),
                action("a", "91 * 64 - 317", True),  # every action carries the outcome
                action("b", "5507", True),
                action("c", None, False),
            ]
        )
        + "\n{torn"
    )
    (tmp_path / "eval" / "step-000010.jsonl").write_text(
        action("d", "5508", False)
        + "\n"
        + action("e", "81", True, answer="080", accepted_answers=["080", "081"])
        + "\n"
    )
    assert repro.regrade(tmp_path) == [
        {"kind": "rollouts", "step": 3, "episodes": 3, "solved_logged": 2, "solved_now": 1},
        {"kind": "eval", "step": 10, "episodes": 2, "solved_logged": 1, "solved_now": 1},
    ]


def test_overlapping_task_sets_are_refused():
    recipe = {
        "env": "MathChat-v0",
        "env_options": {"tasks": {"n": 8, "seed": 1, "kinds": ["expression"]}},
        "eval_env_options": {"tasks": {"n": 4, "seed": 1, "kinds": ["expression"]}},
    }
    with pytest.raises(SystemExit, match="held-out problems are also training problems"):
        repro.check_disjoint(recipe)


@pytest.mark.slow
def test_end_to_end_runs_write_results_and_plots(tmp_path):
    from mappa_agents.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model")
    recipe = {
        "env": "MathChat-v0",
        "system": str(model),
        "env_options": {
            "tasks": {"n": 4, "seed": 1, "kinds": ["expression"]},
            "max_new_tokens": 6,
            "sandbox": None,
        },
        "eval_env_options": {
            "tasks": {"n": 2, "seed": 2, "kinds": ["expression"]},
            "max_new_tokens": 6,
            "sandbox": None,
        },
        "steps": 2,
        "prompts_per_step": 2,
        "samples_per_prompt": 1,
        "max_new_tokens": 6,
        "lr": 1e-3,
        "mask_truncated": False,
        "train_batch_size": 4,
        "micro_batch_size": 4,
        "gradient_checkpointing": False,
        "eval_every": 1,
        "eval_episodes": 2,
        "save_every": 0,
        "tensorboard": False,
        "device": "cpu",
        "dtype": "float32",
    }
    config = tmp_path / "recipe.yaml"
    config.write_text(json.dumps(recipe))  # JSON is YAML
    out, runs_dir = tmp_path / "results", tmp_path / "runs"
    code = repro.main(
        [
            "--config",
            str(config),
            "--seeds",
            "0",
            "--runs-dir",
            str(runs_dir),
            "--out",
            str(out),
            "--name",
            "tiny",
        ]
    )
    assert code == 0
    data = json.loads((out / "tiny.json").read_text())
    assert data["recipe"]["steps"] == 2
    assert {r["commit"] for r in data["runs"]} == {repro.git_commit()}
    assert {r["machine"]["cpus"] for r in data["runs"]} == {os.cpu_count()}
    assert data["train_tasks"] == 4
    by_mode = {r["mode"]: r for r in data["runs"]}
    assert [p["step"] for p in by_mode["process"]["evals"]] == [0, 1, 2]
    # The outcome run shares its seed's base evaluation instead of repeating it.
    assert by_mode["outcome"]["evals"][0].get("shared_base") is True
    assert [p["step"] for p in by_mode["outcome"]["train"]] == [1, 2]
    assert set(data["summary"]["modes"]) == {"process", "outcome"}
    assert (out / "tiny_accuracy.png").stat().st_size > 0
    assert (out / "tiny_behaviour.png").stat().st_size > 0
    run_config = json.loads((runs_dir / "outcome-s0" / "run_config.json").read_text())
    assert run_config["credit_mode"] == "outcome"
    assert run_config["eval_at_start"] is False
    # --report-only rebuilds the same summary from the run directories.
    code = repro.main(
        [
            "--config",
            str(config),
            "--seeds",
            "0",
            "--runs-dir",
            str(runs_dir),
            "--out",
            str(out),
            "--name",
            "again",
            "--report-only",
        ]
    )
    assert code == 0
    again = json.loads((out / "again.json").read_text())
    assert again["summary"] == data["summary"]


@pytest.mark.slow
def test_smoke_process_credit_raises_code_turns_and_outcome_does_not(tmp_path):
    from benchmarks.repro_smoke import run_smoke

    assert run_smoke(tmp_path) == 0
    data = json.loads((tmp_path / "mathchat_smoke.json").read_text())
    assert all(data["checks"].values()), data["checks"]
    # Outcome credit with no success has no signal: its code executor never moved.
    assert all(kl in (0.0, None) for kl in data["results"]["outcome"]["code_executor_kl"])
