"""``benchmarks.bench_distributed_gpu`` on CPU with a tiny model: both trainers, checked."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from benchmarks.bench_distributed_gpu import checksum, main
from mappa_agents.tiny_models import tiny_model_dir


def test_checksum_compares_after_rounding_to_the_acting_dtype():
    import torch

    master = {"w": torch.tensor([1.0 + 2**-12, 3.0])}
    acting = {"w": master["w"].to(torch.bfloat16)}
    assert checksum(master) != checksum(acting)  # bf16 drops the 2**-12
    assert checksum(master, torch.bfloat16) == checksum(acting)


def test_bench_distributed_runs_both_trainers_and_checks_the_engines(tmp_path):
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    summary = main(
        [
            "--shape", str(model), "--steps", "2", "--prompts", "2", "--samples", "2",
            "--max-new-tokens", "8", "--sandbox", "none", "--engines", "1",
            "--weight-sync", "object_store,broadcast", "--out", str(out), "--name", "dist_tiny",
            "--compare-syncs", "broadcast,object_store", "--sync-repeats", "2",
        ]
    )  # fmt: skip
    written = json.loads((out / "dist_tiny.json").read_text())
    assert written["weights_checked"] == summary["weights_checked"]
    assert set(summary["ray"]) == set(summary["weights_checked"]) == {"object_store", "broadcast"}
    for mode, by_agent in summary["weights_checked"].items():
        assert set(by_agent) == {"problem_solver", "code_executor", "verifier"}
        assert all(check["weight_sync"] == mode for check in by_agent.values())
        assert all(check["equal"] for check in by_agent.values())
    for run in (summary["single_process"], *summary["ray"].values()):
        assert len(run["steps"]) == 2
        assert run["steady_step"]["step_s"] > 0
    for mode, run in summary["ray"].items():
        assert len(run["sync_s"]) == 2
        assert run["sync_s_median"] is not None
        assert summary["ray_vs_single_step"][mode] > 0
        compared = run["syncs_compared_s"]
        assert set(compared) == {mode, "object_store"}
        assert all(len(times) == 2 and min(times) > 0 for times in compared.values())
