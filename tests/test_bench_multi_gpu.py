"""``benchmarks.bench_multi_gpu`` on CPU with a tiny model: its layouts, checks and files."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from benchmarks.bench_multi_gpu import (
    layout,
    learner_gib_per_gpu,
    main,
    memory_plan,
    scale_run,
    scaling_efficiency,
    within,
)
from mappa_agents.tiny_models import tiny_model_dir


def test_layouts_put_a_bundle_on_each_gpu_and_split_needs_two():
    colocated = layout("colocated", 4)
    assert (colocated["ranks"], colocated["engines"], colocated["split"]) == (4, 4, False)
    # 3 agents' rank and engine on each GPU: 6 x 0.15 = 0.9 of it.
    assert colocated["gpus_per_rank"] == colocated["gpus_per_engine"] == 0.15
    split = layout("split", 8)
    assert (split["ranks"], split["engines"], split["split"]) == (4, 4, True)
    assert split["gpus_per_rank"] == 0.3  # 3 agents' ranks on each of the first 4 GPUs
    with pytest.raises(ValueError, match="split placement needs 2 or more GPUs"):
        layout("split", 1)
    with pytest.raises(ValueError, match="placement must be one of"):
        layout("spread", 2)


def test_the_figures_behind_the_skips_the_checks_and_the_efficiency():
    # 4.03B parameters, 3 agents, 18 bytes each, over 2 ranks: 101 GiB per rank's GPU.
    assert learner_gib_per_gpu(4_034_056_704, 2) == pytest.approx(101.44, abs=0.01)
    assert within(1.0, 1.019, rtol=0.02, atol=0.0)
    assert not within(1.0, 1.021, rtol=0.02, atol=0.0)
    assert within(0.0, 5e-4, rtol=0.02, atol=1e-3)  # a loss near 0: the absolute part
    # 2 GPUs: 10 s; 4 GPUs: 6 s (2 x 10 / (4 x 6) = 0.833); 8: 2.5 s (perfect).
    assert scaling_efficiency([(4, 6.0), (2, 10.0), (8, 2.5)]) == {2: 1.0, 4: 0.833, 8: 1.0}
    assert scaling_efficiency([]) == {}


SHAPE_4B = SimpleNamespace(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728)
SHAPE_1_5B = SimpleNamespace(hidden_size=1536, num_hidden_layers=28, intermediate_size=8960)


def test_the_memory_plan_counts_learners_activations_and_engines():
    # 4e9 parameters, 3 agents, split over 2 GPUs: 3 x 4e9 x 18 B = 201.2 GiB of state on
    # the ranks' GPU; checkpointed activations of 16,384 tokens: 36 layer inputs of
    # 2,560 values plus one layer's 10 h + 4 i values per token, 4.78 GiB per rank; the
    # optimizer step's temporaries, 3 x 4e9 x 4 B = 44.7 GiB, are the larger.
    split = memory_plan(
        layout("split", 2), 4_000_000_000, SHAPE_4B, agents=3, tokens=16384,
        checkpointing=True, rollout_engine="hf", gpu_gib=139.8,
    )  # fmt: skip
    assert split == {
        "learner": 201.2, "activations": 14.3, "optimizer_step": 44.7, "engines": 22.4,
        "per_gpu": 245.9,
    }  # fmt: skip
    # Without checkpointing the same ranks would keep 70.9 GiB of activations each.
    eager = memory_plan(
        layout("split", 2), 4_000_000_000, SHAPE_4B, agents=3, tokens=16384,
        checkpointing=False, rollout_engine="hf", gpu_gib=139.8,
    )  # fmt: skip
    assert eager["activations"] == pytest.approx(3 * 70.87, abs=0.1)
    # Colocated vLLM engines take 0.9 of their share each, next to the ranks.
    colocated = memory_plan(
        layout("colocated", 4), 4_000_000_000, SHAPE_4B, agents=3, tokens=16384,
        checkpointing=True, rollout_engine="vllm", gpu_gib=100.0,
    )  # fmt: skip
    assert colocated["engines"] == pytest.approx(3 * 0.9 * 0.15 * 100.0, abs=0.1)
    assert colocated["activations"] > colocated["optimizer_step"]  # 4 ranks share the state
    assert colocated["per_gpu"] == pytest.approx(
        colocated["learner"] + colocated["activations"] + colocated["engines"], abs=0.2
    )
    given = memory_plan(
        layout("colocated", 4), 4_000_000_000, SHAPE_4B, agents=3, tokens=16384,
        checkpointing=True, rollout_engine="vllm", gpu_gib=100.0,
        vllm_options={"gpu_memory_utilization": 0.05},
    )  # fmt: skip
    assert given["engines"] == pytest.approx(15.0)


def test_the_plan_skips_what_did_not_fit_one_h200_and_runs_what_did():
    # On one H200 (139.8 GiB), HF engines, 8,192-token micro-batches, no checkpointing:
    # three 1.78B agents ran out of memory there; one 4.03B agent ran (peak 139.1 GiB).
    three = _scale_args(
        parameters=1_777_088_000, gpu_memory_gib=139.8, gradient_checkpointing="false",
        micro_batch_tokens=8192, model_config=SHAPE_1_5B,
    )  # fmt: skip
    assert "skipped" in scale_run(three, "unused", "colocated", 1, None)
    plan = memory_plan(
        layout("colocated", 1, agents=1), 4_033_927_680, SHAPE_4B, agents=1, tokens=8192,
        checkpointing=False, rollout_engine="hf", gpu_gib=139.8,
    )  # fmt: skip
    assert plan["per_gpu"] < 0.9 * 139.8  # scale_run would start it


def _scale_args(**changes) -> argparse.Namespace:
    settings = {
        "steps": 1, "prompts": 2, "samples": 2, "max_new_tokens": 8,
        "micro_batch_tokens": 4096, "sandbox": "none", "rollout_engine": "hf",
        "vllm_options": "{}", "schedule": "ticks", "peak_tflops": 796.0,
        "run_timeout": 300.0, "parameters": 0, "gpu_memory_gib": 0.0, "train_agents": "",
        "eager_decode": False, "gradient_checkpointing": "true", "memory_check": True,
        "resume": False, "shape": "tiny",
        "model_config": SHAPE_4B,
    }  # fmt: skip
    settings.update(changes)
    return argparse.Namespace(**settings)


def test_a_layout_that_cannot_fit_is_skipped_and_a_failed_run_is_recorded(tmp_path):
    big = _scale_args(parameters=4_000_000_000, gpu_memory_gib=139.0, micro_batch_tokens=16384)
    skipped = scale_run(big, "unused", "split", 2, tmp_path)  # 3 agents' 4B state on 1 GPU
    assert (
        "planned 246 GiB on its busiest GPU (learner 201, activations 14 or optimizer step 45,"
        in skipped["skipped"]
    )
    assert skipped["memory_plan_gib"]["per_gpu"] == 245.9
    assert not list(tmp_path.iterdir())  # nothing ran
    failed = scale_run(_scale_args(), str(tmp_path / "no-model"), "colocated", 1, tmp_path)
    assert failed["failed"] == "exit code 1"
    assert any("no-model" in line for line in failed["log_tail"])


def test_both_parts_run_and_write_the_results_and_the_plot(tmp_path, ray_cluster):
    ray_cluster(gpus=0)  # the equality part's, GPU-less as this machine; kept after it
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    summary = main(
        [
            "--equality-shape", str(model), "--equality-steps", "1", "--shape", str(model),
            "--gpu-counts", "2", "--placements", "split", "--steps", "1", "--prompts", "2",
            "--samples", "2", "--max-new-tokens", "8", "--rollout-engine", "hf",
            "--schedule", "ticks", "--out", str(out), "--name", "multi_tiny",
            # One trained agent (the others act frozen): 2 rank actors, not 6.
            "--train-agents", "problem_solver", "--eager-decode",
        ]
    )  # fmt: skip
    written = json.loads((out / "multi_tiny.json").read_text())
    assert written["equality"] == json.loads(json.dumps(summary["equality"]))
    equality = summary["equality"]
    # One step: the tiny model's rewards are all equal here, and from the second step on
    # whitening scales the KL terms' float32 differences up in the loss (not a mismatch).
    assert [s["step"] for s in equality["steps"]] == [1]
    for step in equality["steps"]:
        assert set(step["agents"]) == set(step["reward_spread"]) == {"problem_solver"}
        for compared in step["agents"].values():
            assert set(compared) == {"loss", "grad_norm"}
            assert all(c["equal"] for c in compared.values())
    assert equality["equal"]
    assert equality["max_abs_difference"]["grad_norm"] < 1e-3  # float32 on the CPU
    (run,) = summary["scale"]["runs"]
    assert (run["placement"], run["gpus"], run["ranks"], run["engines"]) == ("split", 2, 1, 1)
    assert run["gpus_per_rank"] == 0.9  # one trained agent: the whole 0.9 of a GPU
    assert "failed" not in run, run.get("log_tail")
    assert run["steady_step"]["step_s"] > 0
    assert run["weight_sync"] == ["object_store"]  # on the CPU
    assert run["engines_hold_group_weights"]
    assert summary["scale"]["scaling_efficiency"]["split"]["step"] == {2: 1.0}
    passed_on = json.loads((out / "multi_tiny-runs" / "split_2gpu.json").read_text())["settings"]
    assert passed_on["eager_decode"]
    assert passed_on["train_agents"] == "problem_solver"
    assert (out / "multi_tiny.png").stat().st_size > 0


def _finished_run(name: str) -> dict:
    """What a finished bench_distributed_gpu child writes, as far as scale_run reads it."""
    run = {
        "setup_s": 1.0, "first_step_s": 2.0, "steady_step": {"step_s": 1.5, "update_s": 0.5},
        "mfu_update": None, "sync_s": [0.1], "sync_s_median": 0.1,
        "gpu_peak_used_gib": {}, "memory": {"actors_sum_gib_by_gpu": {}},
        "agents_at_once": True,
    }  # fmt: skip
    checked = {"problem_solver": {"weight_sync": "object_store", "equal": True}}
    return {"ray": {name: run}, "weights_checked": {name: checked}}


def test_resume_reuses_finished_runs_of_the_same_settings_only(tmp_path, monkeypatch):
    """The run itself is a stand-in here: the test above runs a real one."""
    import benchmarks.bench_multi_gpu as bench

    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    started = []

    real_run = subprocess.run

    def child(command, **kwargs):
        if "benchmarks.bench_distributed_gpu" not in command:
            return real_run(command, **kwargs)  # e.g. platform's own `uname -p`
        # Writes its results where --out and --name say, as the real child does.
        started.append(command)
        name, runs = command[command.index("--name") + 1], command[command.index("--out") + 1]
        if "--max-new-tokens" in command and command[command.index("--max-new-tokens") + 1] == "9":
            return subprocess.CompletedProcess(command, 1)
        (Path(runs) / f"{name}.json").write_text(json.dumps(_finished_run(name)))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(bench.subprocess, "run", child)

    def call(*extra):
        return main(
            [
                "--parts", "scale", "--shape", str(model), "--gpu-counts", "1",
                "--placements", "colocated", "--steps", "1", "--prompts", "2",
                "--samples", "2", "--max-new-tokens", "8", "--rollout-engine", "hf",
                "--schedule", "ticks", "--out", str(out), "--name", "resumed",
                "--train-agents", "problem_solver", "--resume", *extra,
            ]
        )  # fmt: skip

    (first,) = call()["scale"]["runs"]
    assert len(started) == 1
    assert first["steady_step"]["step_s"] == 1.5
    (again,) = call()["scale"]["runs"]
    assert len(started) == 1  # nothing ran: the finished run was read back
    assert again == json.loads(json.dumps(first))
    (changed,) = call("--max-new-tokens", "9")["scale"]["runs"]
    assert len(started) == 2  # other settings: run again (here it fails at once)
    assert changed["failed"] == "exit code 1"
    assert not (out / "resumed-runs" / "colocated_1gpu.json").exists()  # not the old one
