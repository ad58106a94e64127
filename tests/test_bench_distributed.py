"""``benchmarks.bench_distributed_gpu`` on CPU with a tiny model: both trainers, checked."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from benchmarks.bench_distributed_gpu import _config, checksum, main
from mappa_agents.tiny_models import tiny_model_dir


def test_checksum_compares_after_rounding_to_the_acting_dtype():
    import torch

    master = {"w": torch.tensor([1.0 + 2**-12, 3.0])}
    acting = {"w": master["w"].to(torch.bfloat16)}
    assert checksum(master) != checksum(acting)  # bf16 drops the 2**-12
    assert checksum(master, torch.bfloat16) == checksum(acting)


@pytest.mark.parametrize(("flag", "value"), [("false", False), ("true", True), ("auto", "auto")])
def test_the_checkpointing_flag_reaches_the_trainers(tmp_path, flag, value):
    import argparse

    settings = argparse.Namespace(
        shape="smollm2-135m", steps=1, prompts=2, samples=2, max_new_tokens=8,
        micro_batch_tokens=4096, schedule="ticks", sandbox="none", dtype="auto",
        gradient_checkpointing=flag,
    )  # fmt: skip
    assert _config(settings, "unused", tmp_path).gradient_checkpointing == value


def test_ray_runs_are_named_by_sync_mode_and_by_the_switch_only_when_it_varies():
    from benchmarks.bench_distributed_gpu import ray_variants

    assert ray_variants(["broadcast", "object_store"], ["true"]) == [
        ("broadcast", "true", "broadcast"), ("object_store", "true", "object_store"),
    ]  # fmt: skip
    assert ray_variants(["broadcast"], ["true", "false"]) == [
        ("broadcast", "true", "broadcast,agents_in_parallel=true"),
        ("broadcast", "false", "broadcast,agents_in_parallel=false"),
    ]


def test_bench_distributed_runs_both_trainers_and_checks_the_engines(tmp_path, ray_cluster):
    # One Ray run (the switch's two values are named above and scheduled in
    # test_ray_trainer) of one trained agent, the others acting frozen: a group and an
    # engine, not three of each (each a process that imports torch and transformers).
    # On the suite's cluster, GPU-less as this machine (test_bench_multi_gpu's child
    # runs main where it starts Ray itself).
    ray_cluster(gpus=0)
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    summary = main(
        [
            "--shape", str(model), "--steps", "2", "--prompts", "2", "--samples", "2",
            "--max-new-tokens", "8", "--sandbox", "none", "--engines", "1",
            "--weight-sync", "broadcast", "--agents-in-parallel", "false",
            "--out", str(out), "--name", "dist_tiny",
            "--compare-syncs", "broadcast,object_store", "--sync-repeats", "2",
            "--train-agents", "problem_solver",
        ]
    )  # fmt: skip
    written = json.loads((out / "dist_tiny.json").read_text())
    assert written["weights_checked"] == summary["weights_checked"]
    assert set(summary["ray"]) == set(summary["weights_checked"]) == {"broadcast"}
    for by_agent in summary["weights_checked"].values():
        assert set(by_agent) == {"problem_solver"}
        assert all(check["weight_sync"] == "broadcast" for check in by_agent.values())
        assert all(check["equal"] for check in by_agent.values())
    for run in (summary["single_process"], *summary["ray"].values()):
        assert len(run["steps"]) == 2
        assert run["steady_step"]["step_s"] > 0
        assert run["mfu_update"] is None  # no GPU: no MFU
    assert summary["flops_per_trained_token"] > 0
    for key, run in summary["ray"].items():
        assert run["agents_at_once"] is False
        assert len(run["sync_s"]) == 2
        assert run["sync_s_median"] is not None
        assert summary["ray_vs_single_step"][key] > 0
        compared = run["syncs_compared_s"]
        assert set(compared) == {"broadcast", "object_store"}
        assert all(len(times) == 2 and min(times) > 0 for times in compared.values())
        assert set(run["memory"]) == {"problem_solver", "actors_sum_gib_by_gpu"}


def test_update_mfu_counts_the_trained_tokens_over_the_gpus_peak():
    from benchmarks.bench_distributed_gpu import update_mfu

    steady = {"train_tokens": 1000.0, "update_s": 2.0}
    # 6e9 FLOPs per token x 1000 tokens / 2 s = 3e12 FLOP/s, over 2 GPUs of 1.5e12.
    assert update_mfu(steady, 6 * 10**9, 2, 1.5) == pytest.approx(1.0)
    assert update_mfu({"train_tokens": 1.0, "update_s": 0.0}, 6, 1, 1.0) is None


def test_the_gpu_poller_reads_nvidia_smi_and_keeps_each_gpus_peak(tmp_path, monkeypatch):
    from benchmarks.bench_distributed_gpu import GpuMemoryPoller

    readings = tmp_path / "readings"
    readings.write_text("GPU-aaaa, 100\nGPU-bbbb, 7\n")
    fake = tmp_path / "nvidia-smi"
    # Prints the readings file, then lowers the first GPU's figure for the next read; each
    # call adds a line to calls.
    calls = tmp_path / "calls"
    fake.write_text(
        f"#!/bin/sh\ncat {readings}\necho 'GPU-aaaa, 40' > {readings}\necho >> {calls}\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    poller = GpuMemoryPoller(every_s=0.01)
    assert poller.read() == {"aaaa": 100.0, "bbbb": 7.0}
    assert poller.read() == {"aaaa": 40.0}
    import time

    def two_more_reads() -> None:
        # Counted through the fake's calls, not slept through: starting it takes long
        # on a busy machine.
        wanted = len(calls.read_text().splitlines()) + 2
        deadline = time.monotonic() + 60
        while len(calls.read_text().splitlines()) < wanted:
            assert time.monotonic() < deadline, "the poller did not read"
            time.sleep(0.01)

    with poller:
        two_more_reads()
    assert poller.peaks_mib == {"aaaa": 40.0}
    readings.write_text("GPU-aaaa, 100\n")
    with GpuMemoryPoller(every_s=0.01) as again:
        two_more_reads()  # 100, then 40
    assert again.peaks_mib == {"aaaa": 100.0}  # the peak, not the later 40
