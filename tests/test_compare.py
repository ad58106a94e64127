"""``mappa compare``: reports side by side, paired differences, compare.json and compare.png."""

from __future__ import annotations

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
    assert "pass_at_k" in printed
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
