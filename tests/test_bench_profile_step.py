"""The step profiler on the CPU: it logs every generate call and writes both profiles."""

from __future__ import annotations

import json

from benchmarks import profile_step


def test_profile_step_logs_the_generate_calls_and_writes_both_profiles(tmp_path):
    result = profile_step.main(
        [
            "--model", "tiny", "--samples", "4", "--samples-per-prompt", "2",
            "--max-new-tokens", "4", "--warmup-steps", "1", "--timed-steps", "2",
            "--engine", "hf", "--no-compile-decode", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    size = result["sizes"]["4"]
    assert len(size["steps"]) == 2
    for step in size["steps"]:
        # One single-turn episode per sample: the calls carry every prompt once.
        assert sum(call["prompts"] for call in step["generate_calls"]) == 4
        assert 0 < step["generate_s"] <= step["rollout_s"]
        assert step["rollout_outside_generate_s"] >= 0
    assert len(size["policy_alone_s"]) == 2
    assert size["operator_profile"]["gpu_busy_s"] == 0  # no CUDA here
    ops = (tmp_path / "profile_step_ops_4.txt").read_text()
    assert "aten::" in ops
    python = (tmp_path / "profile_step_python_4.txt").read_text()
    assert "train_step" in python
    assert json.loads((tmp_path / "profile_step.json").read_text())["model"] == "tiny"
