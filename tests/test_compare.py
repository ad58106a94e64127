"""``mappa compare``: reports side by side, paired differences, compare.json and compare.png."""

from __future__ import annotations

import argparse
import json

import pytest

from mappa_agents.compare import compare_reports, format_comparison, per_task_values


def _report(correct_by_task, k=2, tool_rate=0.5):
    per_task = [
        {"task_id": t, "task_type": "x", "samples": k, "correct": c, "aborted": 0,
         "mean_outcome_reward": c / k}
        for t, c in correct_by_task.items()
    ]  # fmt: skip
    mean = sum(c / k for c in correct_by_task.values()) / len(correct_by_task)
    return {
        "env_id": "MathChat-v0",
        "episodes": k * len(per_task),
        "success_rate": mean,
        "mean_outcome_reward": mean,
        "samples_per_task": k,
        "mean_at_k": {"value": mean, "ci95": [0.0, 1.0], "tasks": len(per_task)},
        "pass_at_k": {"value": 0.5, "ci95": [0.0, 1.0], "tasks": len(per_task)},
        "per_agent": {"verifier": {"mean_reward": 0.25, "tool_call_rate": tool_rate}},
        "invalid_coach_rate": 0.0,
        "coach_cost_usd": 0.0,
        "per_task": per_task,
    }


def test_differences_are_paired_over_shared_tasks():
    base = _report({"a": 0, "b": 1, "c": 2})
    better = _report({"a": 2, "b": 1, "d": 2}, tool_rate=0.75)
    assert per_task_values(better, "pass_at_k") == {"a": 1.0, "b": 1.0, "d": 1.0}
    comparison = compare_reports([base, better], ["base", "better"])
    diff = comparison["metrics"]["mean_at_k"]["diff"]["better"]
    # shared tasks a, b: (1.0 - 0.0 + 0.5 - 0.5) / 2
    assert diff["value"] == pytest.approx(0.5)
    assert diff["tasks"] == 2
    assert diff["paired"] is True
    assert len(diff["ci95"]) == 2
    tool = comparison["metrics"]["verifier/tool_call_rate"]
    assert tool["values"] == {"base": 0.5, "better": 0.75}
    assert tool["diff"]["better"] == {"value": 0.25, "ci95": None, "tasks": None, "paired": False}
    table = format_comparison(comparison)
    assert "baseline: base" in table
    assert "+0.500 [" in table


def test_diff_says_over_how_many_shared_tasks():
    base = _report({"a": 0, "b": 1, "c": 2})
    other = _report({"a": 2, "b": 1, "d": 2, "e": 2})
    comparison = compare_reports([base, other], ["base", "other"])
    assert comparison["metrics"]["success_rate"]["diff"]["other"]["tasks"] == 2
    table = format_comparison(comparison)
    assert "(2 tasks)" in table
    assert (
        "warning: diff other: over the 2 tasks both runs share, of base's 3 and other's 4" in table
    )
    same = compare_reports([base, _report({"a": 2, "b": 1, "c": 0})], ["base", "same"])
    assert same["warnings"] == []
    assert "(3 tasks)" in format_comparison(same)


def test_pass_at_k_is_compared_at_the_smallest_k(tmp_path, capsys):
    from mappa_agents.compare import run_compare
    from mappa_agents.report import summarize_samples

    def report(k, correct):
        rows = [
            {"task_id": f"t{i}", "task_type": "x", "samples": k, "correct": correct(i),
             "aborted": 0, "mean_outcome_reward": correct(i) / k}
            for i in range(8)
        ]  # fmt: skip
        rate = sum(r["correct"] for r in rows) / (k * len(rows))
        return {"env_id": "MathChat-v0", "success_rate": rate, "mean_outcome_reward": rate,
                "per_agent": {}, "per_task": rows, **summarize_samples(rows, k)}  # fmt: skip

    k1 = report(1, lambda i: int(i % 4 == 0))  # pass@1 = 0.25
    k4 = report(4, lambda i: 1)  # one correct in four: pass@4 = 1.0, pass@1 = 0.25
    assert k4["pass_at_k"]["value"] == 1.0
    comparison = compare_reports([k1, k4], ["k1", "k4"])
    entry = comparison["metrics"]["pass_at_k"]
    assert comparison["pass_k"] == 1
    assert entry["label"] == "pass@1"
    assert entry["values"] == {"k1": pytest.approx(0.25), "k4": pytest.approx(0.25)}
    assert entry["diff"]["k4"]["value"] == pytest.approx(0.0)  # like with like: pass@1 both
    assert entry["diff"]["k4"]["tasks"] == 8
    table = format_comparison(comparison)
    assert "pass@1" in table
    assert "pass@4" not in table
    assert "pass_at_k" not in table
    assert "warning: runs sampled different K per task (k1 K=1, k4 K=4)" in table
    assert "pass@1, recomputed from its per_task rows" in table
    # same K: the reports' own numbers, named with their k
    same = compare_reports([k4, k4], ["a", "b"])
    assert same["metrics"]["pass_at_k"]["label"] == "pass@4"
    assert same["metrics"]["pass_at_k"]["values"]["a"] == 1.0
    assert same["warnings"] == []
    # through the command: the warning is printed
    for name, rep in (("k1", k1), ("k4", k4)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(rep))
    args = argparse.Namespace(
        runs=[str(tmp_path / "k1"), str(tmp_path / "k4")], out=str(tmp_path / "cmp")
    )
    run_compare(args)
    assert "warning: runs sampled different K" in capsys.readouterr().out
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["metrics"]["pass_at_k"]["label"] == "pass@1"


def test_compare_two_tiny_model_eval_runs(tmp_path, capsys):
    pytest.importorskip("transformers")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.command import main

    model = tiny_model_dir(tmp_path / "model")
    runs = []
    for name, temperature in (("greedy", "0"), ("sampled", "1.0")):
        out = tmp_path / name
        code = main(
            [
                "eval", "--system", str(model), "--coach", "rules", "--max-new-tokens", "4",
                "--num-tasks", "2", "--samples-per-task", "2", "--temperature", temperature,
                "--sandbox", "none", "--out", str(out), "--no-progress",
            ]
        )  # fmt: skip
        assert code == 0
        runs.append(str(out))
    capsys.readouterr()
    out = tmp_path / "cmp"
    assert main(["compare", *runs, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "baseline: greedy" in printed
    assert "pass@2" in printed
    assert "mean@2" in printed
    assert "(2 tasks)" in printed
    comparison = json.loads((out / "compare.json").read_text())
    assert [r["name"] for r in comparison["runs"]] == ["greedy", "sampled"]
    diff = comparison["metrics"]["mean_at_k"]["diff"]["sampled"]
    assert diff["paired"] is True
    assert diff["tasks"] == 2
    assert "problem_solver/mean_response_tokens" in comparison["metrics"]
    assert (out / "compare.png").stat().st_size > 1000


def test_compare_names_a_directory_without_report(tmp_path):
    from mappa_train.command import main

    with pytest.raises(SystemExit, match=r"has no report\.json"):
        main(["compare", str(tmp_path), "--out", str(tmp_path / "cmp")])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"success_rate": 0.5, "per_agent": {"a": {"mean_re', "is not valid JSON (cut short?): "),
        ("[1, 2]", "is JSON but not a mappa eval report"),
        ("", "is not valid JSON (cut short?): Expecting value (line 1, column 1)"),
    ],
)
def test_compare_names_a_report_it_cannot_read_and_what_is_wrong(tmp_path, capsys, text, says):
    from mappa_train.command import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(text)
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(run), "--out", str(tmp_path / "cmp")])
    message = str(stop.value.code)
    assert message.startswith(f"mappa compare: {run / 'report.json'} ")
    assert says in message
    assert "run `mappa eval --out DIR` again" in message
    assert len(message.splitlines()) == 1


def test_compare_help_shows_one_percent_sign(capsys):
    from mappa_train.command import main

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "95% paired bootstrap" in text
    assert "%%" not in text
