"""The reproduction driver: the recipe's decided test, records, reports, a run, the smoke."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from benchmarks import repro_collect, repro_report
from benchmarks import repro_mathchat as repro

ROOT = Path(__file__).resolve().parents[1]


def test_ema_carries_over_gaps():
    import math

    assert repro_report.ema([3.0, None, 0.0]) == pytest.approx([3.0, 3.0, 2.0])
    assert math.isnan(repro_report.ema([None, 1.0])[0])


def test_the_recipe_decides_the_test_and_its_task_sets_hold_a_held_out_claim():
    recipe, test = repro.load_recipe(repro.DEFAULT_CONFIG)
    # The claim: the paper's information structure against the paper's baseline.
    assert (test["treatment"], test["baseline"]) == ("process_blind", "outcome")
    assert test["arms"]["process_blind"]["env_options"] == {"reveal": "last_agent"}
    assert {"outcome", "agent_oracle", "process", "process_blind"} <= set(test["arms"])
    assert len(test["seeds"]) == test["goal"]["min_seeds"] == 10
    assert test["void"]["through_step"] == test["compare_step"]
    assert test["compare_step"] == recipe["steps"]
    facts = repro.check_task_sets(recipe, test)
    # Training problems are stated in words: none is its own solution.
    assert facts["train"]["own_solution_share"] == 0.0
    for name in test["out_of_family_sets"]:
        assert facts[name]["out_of_family"]
        assert not set(facts[name]["kinds"]) & set(facts["train"]["kinds"])
    assert set(facts[test["main_task_set"]]["kinds"]) <= set(facts["train"]["kinds"])


def test_a_recipe_without_its_decided_test_is_refused(tmp_path):
    (tmp_path / "recipe.yaml").write_text(json.dumps({"env": "MathChat-v0"}))
    path = tmp_path / "test.yaml"
    path.write_text(json.dumps({"arms": {}}))
    with pytest.raises(ValueError, match="must name its training recipe"):
        repro.load_recipe(path)
    path.write_text(json.dumps({"recipe": "recipe.yaml", "arms": {}}))
    with pytest.raises(ValueError, match="must give"):
        repro.load_recipe(path)
    test = {
        "recipe": "recipe.yaml",
        "arms": {"process": {"credit_mode": "process", "colour": "red"}},
        "seeds": [0],
        "treatment": "process",
        "baseline": "process",
        "compare_step": 1,
        "main_task_set": "in_family",
        "out_of_family_sets": [],
        "goal": {},
        "void": {},
    }
    path.write_text(json.dumps(test))
    with pytest.raises(ValueError, match="baseline 'process' must be one of the arms"):
        repro.load_recipe(path)
    test["arms"]["outcome"] = {"credit_mode": "outcome"}
    test["baseline"] = "outcome"
    path.write_text(json.dumps(test))
    with pytest.raises(ValueError, match="arm 'process' must give credit_mode"):
        repro.load_recipe(path)
    test["arms"]["process"] = {"credit_mode": "process"}
    test["void"] = {"kl_floor": 0.1}
    path.write_text(json.dumps(test))
    with pytest.raises(ValueError, match=r"void: unknown fields \['kl_floor'\]"):
        repro.load_recipe(path)


def test_overlapping_or_same_kind_task_sets_are_refused(tmp_path):
    test = {"main_task_set": "in_family", "out_of_family_sets": ["other"]}
    recipe = {
        "env": "MathChat-v0",
        "env_options": {"tasks": {"n": 8, "seed": 1, "kinds": ["expression"]}},
        "eval_env_options": {"tasks": {"n": 4, "seed": 1, "kinds": ["expression"]}},
    }
    with pytest.raises(SystemExit, match="also training problems"):
        repro.check_task_sets(recipe, test)
    recipe["eval_env_options"]["tasks"]["seed"] = 2
    recipe["eval_sets"] = {"other": {"tasks": {"n": 4, "seed": 3, "kinds": ["expression"]}}}
    with pytest.raises(SystemExit, match="out-of-family set 'other' has kinds"):
        repro.check_task_sets(recipe, test)
    recipe["eval_sets"]["other"]["tasks"]["kinds"] = ["gcd_lcm"]
    facts = repro.check_task_sets(recipe, test)
    assert facts["train"]["own_solution_share"] == 1.0  # "Compute 3 * 4 + 5." is Python
    assert facts["other"]["kinds"] == ["gcd_lcm"]
    # A task file given on the command line becomes one more held-out set.
    tasks = [{"id": "f1", "prompt": "What is 2 + 2?", "answer": "4"}]
    (tmp_path / "more.json").write_text(json.dumps(tasks))
    extended = repro.with_eval_tasks(recipe, [str(tmp_path / "more.json")])
    assert repro.task_sets(extended, test) == ["in_family", "other", "file_more"]
    assert repro.check_task_sets(extended, test)["file_more"]["tasks"] == 1


def test_held_out_problems_that_restate_training_ones_are_refused():
    test = {"main_task_set": "in_family", "out_of_family_sets": []}
    easy = {"kinds": ["word_one_step"], "difficulty": "easy", "secret": ""}
    train = {"n": 512, "seed": 1, **easy}
    recipe = {
        "env": "MathChat-v0",
        "env_options": {"tasks": train},
        "eval_env_options": {"tasks": {"n": 32, "seed": 2, **easy}},
    }
    # No prompt is a training prompt, but 25 are training problems with other names.
    with pytest.raises(SystemExit, match="25 of the 32 problems of held-out set 'in_family' "):
        repro.check_task_sets(recipe, test)
    recipe["eval_env_options"]["tasks"]["exclude"] = train
    assert repro.check_task_sets(recipe, test)["in_family"]["tasks"] == 32
    # A problem stated twice is one problem counted twice.
    recipe["env_options"]["tasks"] = {"n": 8, "seed": 1, "kinds": ["expression"]}
    recipe["eval_env_options"]["tasks"] = {"n": 64, "seed": 2, **easy}
    with pytest.raises(SystemExit, match="held-out set 'in_family' states 5 of its problems twice"):
        repro.check_task_sets(recipe, test)


def test_runs_are_planned_per_seed_with_one_base_evaluation(tmp_path):
    test = {
        "arms": {
            "outcome": {"credit_mode": "outcome"},
            "process_blind": {"credit_mode": "process", "env_options": {"reveal": "last_agent"}},
        },
        "main_task_set": "in_family",
    }
    recipe = {"env": "MathChat-v0", "steps": 2, "env_options": {"max_new_tokens": 8}}
    first = repro.plan_runs(recipe, test, ["outcome", "process_blind"], [0, 1], tmp_path)
    assert [(a, s, c["eval_at_start"]) for a, s, _, c in first] == [
        ("outcome", 0, True),
        ("process_blind", 0, False),
        ("outcome", 1, True),
        ("process_blind", 1, False),
    ]
    blind = first[1][3]
    assert blind["credit_mode"] == "process"
    assert blind["env_options"] == {"max_new_tokens": 8, "reveal": "last_agent"}
    assert recipe["env_options"] == {"max_new_tokens": 8}  # the recipe itself is untouched
    # Seed 0's base was evaluated by an earlier command: a later one does not repeat it.
    (tmp_path / "outcome-s0" / "eval").mkdir(parents=True)
    (tmp_path / "outcome-s0" / "eval" / "step-000000.jsonl").write_text("")
    later = repro.plan_runs(recipe, test, ["process_blind"], [0, 1], tmp_path)
    assert [(s, c["eval_at_start"]) for _, s, _, c in later] == [(0, False), (1, True)]


def test_lockstep_holds_runs_ahead_and_never_the_slowest():
    moves = repro.lockstep_moves
    assert moves({"a": 3, "b": 1, "c": 2}, set(), set()) == ({"a", "c"}, set())
    # b caught up with c: c goes on, a (still ahead) stays paused.
    assert moves({"a": 3, "b": 2, "c": 2}, {"a", "c"}, set()) == (set(), {"c"})
    # A finished (or failed) run holds nobody back.
    assert moves({"a": 3, "b": 1, "c": 2}, {"a", "c"}, {"b"}) == (set(), {"c"})
    assert moves({"a": 3, "b": 1}, {"a"}, {"a", "b"}) == (set(), {"a"})
    assert moves({"a": 5, "b": 4}, set(), set(), lead=2) == (set(), set())
    for steps in ({"a": 0, "b": 0}, {"a": 7, "b": 2, "c": 2}, {"a": 1, "b": 9}):
        to_pause, _ = moves(steps, set(), set())
        assert min(steps, key=steps.get) not in to_pause


def test_lockstep_pauses_come_out_of_the_rollout_seconds(tmp_path):
    (tmp_path / repro_collect.PAUSES_FILE).write_text(
        '{"step": 2, "seconds": 3.0}\n{"step": 2, "seconds": 1.5}\n{"step": 3, "sec'
    )  # two pauses in step 2, and a line torn by a kill
    assert repro_collect.read_pauses(tmp_path) == {2: 4.5}
    records = [
        {"step": s, "rollout/episodes": 4, "rollout/seconds": 10.0, "train/seconds": 2.0}
        for s in (1, 2)
    ]
    points = repro_collect.train_points(records, repro_collect.read_pauses(tmp_path))
    assert [p["rollout_seconds"] for p in points] == [10.0, 5.5]
    assert [p["paused_seconds"] for p in points] == [0.0, 4.5]
    assert points[1]["seconds"] == 7.5


def _row(episode: int, task: str, agent: str, score, correct: bool, **outcome) -> str:
    coach = None if score is None else {"valid": score >= 0, "score": max(score, 0)}
    if coach is not None:
        coach["rubric_version"] = "mathchat-rules-v4"
    return json.dumps(
        {
            "episode_id": f"ep-{episode:05d}",
            "task_id": task,
            "agent": agent,
            "coach": coach,
            "outcome": {"correct": correct, "task_type": "word_change", **outcome},
        }
    )


def test_each_saved_held_out_episode_becomes_one_record(tmp_path):
    path = tmp_path / "step-000010.jsonl"
    lines = [
        _row(0, "a", "problem_solver", 3, False),
        _row(0, "a", "code_executor", 10, False),
        _row(0, "a", "code_executor", 6, False),
        _row(1, "b", "problem_solver", -1, True),  # an invalid verdict: no score
        _row(2, "a", "problem_solver", 10, True, agent_correct={"problem_solver": True}),
        _row(3, "b", "problem_solver", 1, False, aborted=True),
    ]
    path.write_text("\n".join(lines) + "\n{torn")
    records = repro_collect.episode_records(path, "process", 4, 10, "in_family")
    # The aborted episode stays, wrong: its problem keeps every sample paired.
    assert [(r["task_id"], r["sample"], r["correct"], r["aborted"]) for r in records] == [
        ("a", 0, False, False),
        ("b", 0, True, False),
        ("a", 1, True, False),
        ("b", 1, False, True),
    ]
    assert records[0]["scores"] == {"problem_solver": 3.0, "code_executor": 8.0}
    assert records[1]["scores"] == {"problem_solver": None}
    assert records[2]["agent_correct"] == {"problem_solver": True}
    assert records[0]["rubric_versions"] == ["mathchat-rules-v4"]
    assert repro_collect.aborted_episodes(path) == 1
    from benchmarks.repro_stats import validate_records

    assert len(validate_records(records)) == 4


def test_saved_episodes_are_graded_again_with_the_current_grader(tmp_path):
    def action(episode: str, predicted: str | None, correct: bool, **more) -> str:
        outcome = {"correct": correct, "predicted": predicted, "answer": "5507", **more}
        return json.dumps({"episode_id": episode, "agent": "verifier", "outcome": outcome})

    (tmp_path / "rollouts").mkdir()
    (tmp_path / "eval" / "unseen").mkdir(parents=True)
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
    (tmp_path / "eval" / "unseen" / "step-000010.jsonl").write_text(
        action("f", "\\boxed{1} \\boxed{5507}", True) + "\n"
    )
    assert repro_collect.regrade(tmp_path) == [
        {"kind": "rollouts", "step": 3, "episodes": 3, "solved_logged": 2, "solved_now": 1},
        {"kind": "eval", "step": 10, "episodes": 2, "solved_logged": 1, "solved_now": 1},
        {"kind": "eval/unseen", "step": 10, "episodes": 1, "solved_logged": 1, "solved_now": 0},
    ]


def _records(arm: str, seeds, accuracy: float, step: int = 2, problems: int = 4):
    return [
        {
            "arm": arm,
            "seed": seed,
            "step": step,
            "task_set": "in_family",
            "task_id": f"t{p}",
            "sample": 0,
            "correct": p < accuracy * problems,
            "scores": {},
        }
        for seed in seeds
        for p in range(problems)
    ]


def _run(arm: str, seed: int, commit: str = "abc", steps=(1, 2), spread: float = 0.2):
    return {
        "arm": arm,
        "seed": seed,
        "commits": [commit],
        "evals": {"in_family": [{"step": s, "accuracy": 0.5} for s in (0, *steps)]},
        "train": [
            {
                "step": s,
                "rollout/episodes": 4,
                "rollout/success_rate": 0.0,
                "process/reward_std": spread,
                "process/kl": 0.1,
                "process/grad_norm": 1.0,
            }
            for s in steps
        ],
    }


def test_the_decided_test_is_applied_and_voided_where_the_runs_cannot_carry_it():
    seeds = range(6)
    test = {
        "treatment": "process",
        "baseline": "outcome",
        "compare_step": 2,
        "goal": {"resamples": 200, "min_seeds": 6},
        "void": {"through_step": 2, "min_steps": 1},
    }
    records = _records("process", seeds, 0.75) + _records("outcome", seeds, 0.25)
    records += _records("base", seeds, 0.25, step=0)
    runs = [_run(arm, s) for arm in ("process", "outcome") for s in seeds]
    summary = repro_report.compare(runs, records, test, ["process", "outcome"], ["in_family"])
    entry = summary["task_sets"]["in_family"]
    assert entry["step"] == 2
    assert entry["at_decided_step"]
    assert entry["base"]["mean"] == pytest.approx(0.25)
    (pair,) = entry["comparison"]["pairs"]
    assert pair["interval"]["estimate"] == pytest.approx(0.5)
    assert pair["test"]["p"] == pytest.approx(2**-6)
    assert pair["tests"]["sign_p"] == pytest.approx(2**-5)
    assert pair["verdict"]["met"], pair["verdict"]["why"]
    arm_rows, pair_rows = repro_report.table_rows(summary, "in_family")
    assert arm_rows[0]["arm"] == "base (step 0)"
    assert arm_rows[0]["mean"] == "25.0"
    assert pair_rows[0]["goal"] == "met"
    # Runs of two commits: nothing is compared as if one code had made them.
    mixed = [*runs[:-1], _run("outcome", 5, commit="def")]
    again = repro_report.compare(mixed, records, test, ["process", "outcome"], ["in_family"])
    (pair,) = again["task_sets"]["in_family"]["comparison"]["pairs"]
    assert pair["void"]
    assert not pair["verdict"]["met"]
    assert any("2 commits" in why for why in pair["verdict"]["why"])
    # An arm whose rewards never varied is void, whatever its accuracy; the test file's
    # floors decide (no success in training is not a reason: none above had one).
    failed = [*runs[:6], *(_run("outcome", s, spread=0.0) for s in seeds)]
    void = repro_report.compare(failed, records, test, ["process", "outcome"], ["in_family"])
    (pair,) = void["task_sets"]["in_family"]["comparison"]["pairs"]
    assert pair["void_reasons"][0] == (
        "outcome: rewards did not vary within an agent's step in every seed"
    )
    assert pair["void_reasons"][1] == (
        "outcome seed 0: reward std >= 0.05 in 0 of 2 steps (1-2), fewer than 1"
    )
    # Runs cut short are compared where they all got to, and say it is not the decided step.
    short = [_run(arm, s, steps=(1,)) for arm in ("process", "outcome") for s in seeds]
    ones = [{**r, "step": 1} for r in records if r["step"] == 2]
    cut = repro_report.compare(short, ones, test, ["process", "outcome"], ["in_family"])
    entry = cut["task_sets"]["in_family"]
    assert entry["step"] == 1
    assert not entry["at_decided_step"]
    (pair,) = entry["comparison"]["pairs"]
    assert not pair["verdict"]["met"]
    assert any("not the decided step 2" in why for why in pair["verdict"]["why"])


@pytest.mark.slow
def test_end_to_end_runs_write_results_records_and_plots(tmp_path):
    from mappa_agents.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model")
    tasks = [{"id": "f1", "prompt": "What is 2 + 2?", "answer": "4"}]
    (tmp_path / "more.json").write_text(json.dumps(tasks))
    env_options = {"max_new_tokens": 6, "sandbox": None}
    recipe = {
        "env": "MathChat-v0",
        "system": str(model),
        "env_options": {
            **env_options,
            "tasks": {"n": 4, "seed": 1, "kinds": ["word_change"]},
        },
        "eval_env_options": {
            **env_options,
            "tasks": {"n": 2, "seed": 2, "kinds": ["word_change"]},
        },
        "eval_sets": {"out_of_family": {"tasks": {"n": 2, "seed": 3, "kinds": ["word_ages"]}}},
        "steps": 2,
        "prompts_per_step": 2,
        "samples_per_prompt": 1,
        "max_new_tokens": 6,
        "lr": 1e-3,
        "mask_truncated": False,
        "train_batch_size": 4,
        "micro_batch_size": 4,
        "gradient_checkpointing": False,
        "eval_every": 2,
        "eval_episodes": 2,
        "save_every": 0,
        "tensorboard": False,
        "device": "cpu",
        "dtype": "float32",
    }
    test = {
        "recipe": "recipe.yaml",
        # The decided pair keeps the test short; the smoke check trains process too.
        "arms": {
            "process_blind": {"credit_mode": "process", "env_options": {"reveal": "last_agent"}},
            "outcome": {"credit_mode": "outcome"},
        },
        "seeds": [0],
        "treatment": "process_blind",
        "baseline": "outcome",
        "compare_step": 2,
        "main_task_set": "in_family",
        "out_of_family_sets": ["out_of_family"],
        "goal": {"resamples": 100},
        "void": {"through_step": 2, "min_steps": 1},
    }
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    config = tmp_path / "test.yaml"
    config.write_text(json.dumps(test))
    out, runs_dir = tmp_path / "results", tmp_path / "runs"
    common = ["--config", str(config), "--runs-dir", str(runs_dir), "--out", str(out)]
    extra = ["--eval-tasks", str(tmp_path / "more.json")]
    assert repro.main([*common, *extra, "--name", "tiny"]) == 0
    data = json.loads((out / "tiny.json").read_text())
    assert data["recipe"]["steps"] == 2
    assert data["runs_commits"] == [repro.git_commit()]
    assert data["coach"]["rubric_versions"]["truth_aware"].startswith("mathchat-rules")
    assert {r["launches"][0]["machine"]["cpus"] for r in data["runs"]} == {os.cpu_count()}
    assert set(data["task_sets"]) == {"train", "in_family", "out_of_family", "file_more"}
    by_arm = {r["arm"]: r for r in data["runs"]}
    assert [p["step"] for p in by_arm["process_blind"]["evals"]["out_of_family"]] == [0, 2]
    assert [p["step"] for p in by_arm["outcome"]["evals"]["file_more"]] == [2]
    run_config = json.loads((runs_dir / "outcome-s0" / "run_config.json").read_text())
    assert run_config["credit_mode"] == "outcome"
    assert run_config["eval_at_start"] is False
    # Every held-out episode is a record: 2 episodes x (2 arms x 1 evaluation + base) x 3 sets.
    episodes = [json.loads(x) for x in (out / "tiny_episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == data["episodes"] == 2 * 3 * 3
    assert {(e["arm"], e["step"]) for e in episodes if e["step"] == 0} == {("base", 0)}
    # The tiny model never succeeds: outcome rewards never vary, so every comparison is void.
    for entry in data["summary"]["task_sets"].values():
        for pair in entry["comparison"]["pairs"]:
            assert pair["void"]
            assert not pair["verdict"]["met"]
    assert (out / "tiny_accuracy.png").stat().st_size > 0
    assert (out / "tiny_behaviour.png").stat().st_size > 0
    # --report-only rebuilds the same summary from the run directories.
    assert repro.main([*common, *extra, "--name", "again", "--report-only"]) == 0
    again = json.loads((out / "again.json").read_text())
    assert again["summary"] == data["summary"]


@pytest.mark.slow
def test_smoke_every_arm_trains_on_its_own_reward(tmp_path):
    from benchmarks.repro_smoke import run_smoke

    assert run_smoke(tmp_path) == 0
    data = json.loads((tmp_path / "mathchat_smoke.json").read_text())
    assert all(data["checks"].values()), data["checks"]
    assert set(data["results"]) == {"process_blind", "outcome", "process"}
    for arm, result in data["results"].items():
        assert result["rewards_checked"] > 0, arm
        assert result["rewards_wrong"] == [], arm
