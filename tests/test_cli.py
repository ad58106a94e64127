"""The mappa command line: eval end to end with a tiny model; argument errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir
from mappa_train.command import build_parser, main


def test_eval_writes_report_transcripts_and_plots(tmp_path, capsys):
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    code = main(
        [
            "eval", "--env", "MathChat-v0", "--system", str(model), "--coach", "rules",
            "--episodes", "3", "--concurrency", "3", "--max-new-tokens", "8",
            "--num-tasks", "3", "--sandbox", "none", "--out", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["episodes"] == 3
    assert set(report["per_agent"]) == {"problem_solver", "code_executor", "verifier"}
    assert report["per_agent"]["problem_solver"]["mean_response_tokens"] <= 8
    rows = (out / "transcripts.jsonl").read_text().splitlines()
    assert len(rows) == report["actions"]
    assert json.loads(rows[0])["response_ids"]
    assert (out / "rewards.png").stat().st_size > 1000
    assert report["isolation"]["code_execution"] is False  # --sandbox none
    captured = capsys.readouterr()
    printed = captured.out
    assert "MathChat-v0: 3 episodes" in printed
    assert "isolation: no code execution" in printed
    # --no-progress: no bar of mappa's, nor transformers' bar over the weights it loads.
    assert "Loading weights" not in captured.err
    assert "actions:" not in captured.err
    from transformers.utils import logging as transformers_logging

    assert transformers_logging.is_progress_bar_enabled()  # back on after the command


def test_eval_compile_decode_reaches_local_policies(tmp_path, caplog):
    model = tiny_model_dir(tmp_path / "model")
    with caplog.at_level("WARNING", logger="mappa_agents.hf"):
        code = main(
            [
                "eval", "--env", "MathChat-v0", "--system", str(model), "--coach", "rules",
                "--episodes", "1", "--max-new-tokens", "4", "--num-tasks", "1",
                "--sandbox", "none", "--out", str(tmp_path / "out"), "--no-progress",
                "--compile-decode",
            ]
        )  # fmt: skip
    assert code == 0
    # On this CPU the policy says it gets the static cache without CUDA graphs.
    assert "compile_decode on the CPU" in caplog.text


def test_unknown_choices_are_rejected():
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--sandbox", "docker"])
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--gradient-checkpointing", "maybe"])


def test_eval_runs_dsbench_too(tmp_path, capsys):
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "ds"
    code = main(
        [
            "eval", "--env", "DSBench-v0", "--system", str(model), "--episodes", "2",
            "--concurrency", "2", "--max-new-tokens", "4", "--sandbox", "none",
            "--task-ids", "iris,diabetes", "--out", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["per_agent"]) == {"data_engineer", "modeler", "analyst"}
    assert "fair_value_mean" in report
