"""The Ray trainer on several GPUs: equality with one GPU, scale, scaling efficiency.

Parts (``--parts``, comma-separated; both by default):

- ``equality``: SmolLM2-135M (``--equality-shape``), ``--equality-steps`` MathChat-v0
  steps. The single-process trainer on one GPU and the Ray trainer whose agents each
  shard over 2 GPUs (FSDP2, 2 ranks, float32 masters, the driver acting) learn from the
  same episodes, rolled out by the single-process trainer. Per agent and step the
  loss and the gradient norm side by side; they count as equal when ``|ray - single|
  <= --atol + --rtol * |single|`` (bf16 rounds to 2**-8 relative, and both sides sum
  over layers and tokens in other orders). Each step also records the spread of each
  agent's rewards: where an agent's rewards are all equal, REINFORCE++'s whitening
  divides the KL terms' differences by their own tiny spread, and its loss amplifies
  rounding (its gradient norm stays comparable).
- ``scale``: 3 agents at ``--shape`` (``4b``: random weights at a 4.0B-parameter shape,
  float32 masters in the Ray learners), for each GPU count of ``--gpu-counts`` and each
  placement of ``--placements``, one run of :mod:`benchmarks.bench_distributed_gpu` in a
  process of its own that sees only the first N GPUs. ``colocated``: every GPU holds
  rank ``r`` and engine ``r`` of every agent (weights by CUDA IPC); ``split``: the
  ranks on the first half of the GPUs, the engines on the other half (weights by NCCL
  broadcast). The learners recompute activations (``--gradient-checkpointing``, on
  by default, as the Ray learners' ``auto`` is: at 4B a 16,384-token micro-batch keeps
  71 GiB of activations per rank otherwise, by :func:`mappa_train.memory.activation_bytes`).
  A layout whose planned memory on some GPU (:func:`memory_plan`: the sharded learner
  state, the ranks' activations or AdamW's step temporaries, the engines) exceeds 90% of
  it is skipped with the plan (``--no-memory-check`` runs it anyway); a run that fails
  is recorded with the end of its log.
  Scaling efficiency of a placement at N GPUs: ``(T_n0 * n0) / (T_N * N)`` with ``T``
  the steady step (and the steady update) and ``n0`` its smallest measured count.

Writes ``<name>.json``, the runs' own JSON files and logs under ``<name>-runs/``, and
``<name>.png`` (step time and update MFU against GPUs). ``--resume`` reuses the runs
that an earlier call with the same settings finished there, so a long series can be
cut short and completed later, or split over calls of a few GPU counts each.

Run:  python -m benchmarks.bench_multi_gpu                        # all GPUs it sees
      python -m benchmarks.bench_multi_gpu --parts scale --gpu-counts 4,8
      # 3 agents at 4B need 4 GPUs (memory_plan): a scaling series from 2 GPUs at 1.5B
      python -m benchmarks.bench_multi_gpu --parts scale --shape 1.5b \\
          --name distributed_multi_gpu_1.5b
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import parse_variants, print_table, write_results
from benchmarks.bench_distributed_gpu import SWITCHES
from benchmarks.bench_train_gpu import SHAPES, random_model_dir

PLACEMENTS = ("colocated", "split")
AGENTS = 3  # MathChat-v0: problem solver, code executor, verifier
#: Bytes of sharded learner state per parameter per agent in the Ray learners: float32
#: masters (4) and gradients (4), AdamW's two moments (8), the bf16 reference (2).
LEARNER_BYTES_PER_PARAMETER = 18
COMPARED = ("loss", "grad_norm")


def layout(placement: str, gpus: int, agents: int = AGENTS) -> dict[str, Any]:
    """Ranks and engines per agent and their GPU shares, for ``placement`` on ``gpus``.

    Args:
        placement: ``colocated`` (every GPU holds rank ``r`` and engine ``r`` of every
            agent: shares of ``0.9 / (2 agents)``, so each placement bundle is one GPU)
            or ``split`` (ranks on ``gpus // 2`` GPUs, engines on the rest, shares of
            ``0.9 / agents``).
        gpus: GPUs of the run.
        agents: Trained agents.

    Raises:
        ValueError: An unknown placement, or ``split`` on fewer than 2 GPUs.
    """
    if placement == "colocated":
        share = round(0.9 / (2 * agents), 3)
        return {"ranks": gpus, "engines": gpus, "gpus_per_rank": share,
                "gpus_per_engine": share, "split": False}  # fmt: skip
    if placement == "split":
        if gpus < 2:
            raise ValueError(f"split placement needs 2 or more GPUs, got {gpus}")
        share = round(0.9 / agents, 3)
        return {"ranks": gpus // 2, "engines": gpus - gpus // 2, "gpus_per_rank": share,
                "gpus_per_engine": share, "split": True}  # fmt: skip
    raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def learner_gib_per_gpu(parameters: int, ranks: int, agents: int = AGENTS) -> float:
    """GiB of every agent's sharded learner state on one rank's GPU (activations aside)."""
    return agents * parameters * LEARNER_BYTES_PER_PARAMETER / ranks / 2**30


def memory_plan(
    plan: dict[str, Any],
    parameters: int,
    model_config: Any,
    *,
    agents: int,
    tokens: int,
    checkpointing: bool,
    rollout_engine: str,
    gpu_gib: float,
    vllm_options: dict[str, Any] | None = None,
) -> dict[str, float]:
    """GiB planned on the busiest GPU of a :func:`layout`, by what takes it.

    - ``learner``: every agent's sharded learner state on a rank's GPU
      (:func:`learner_gib_per_gpu`);
    - ``activations``: one micro-batch of ``tokens`` per agent's rank on that GPU
      (:func:`mappa_train.memory.activation_bytes`; with checkpointing each layer's
      input plus one layer recomputed). Counted for every agent, also when the agents
      take turns: each rank's allocator keeps what it reserved;
    - ``optimizer_step``: AdamW's step (foreach, as on a GPU by default) allocates the
      square roots of all of a rank's second moments at once, 4 bytes per sharded
      parameter (the three 1.5B agents on one H200 ran out of memory there). It comes
      after the backward pass, in memory the rank's allocator freed from the
      activations, so the larger of the two counts;
    - ``engines``: every agent's engine on an engine's GPU: vLLM's
      ``gpu_memory_utilization`` of the GPU (weights and KV cache; by default 0.9 of
      its share, as the trainer sets it), an HF engine's bf16 weights.

    ``per_gpu`` is their sum where ranks and engines share GPUs (colocated), else the
    larger side.
    """
    from mappa_train.memory import GIB, activation_bytes

    activations = agents * activation_bytes(tokens, model_config, 2, checkpointing) / GIB
    learner = learner_gib_per_gpu(parameters, plan["ranks"], agents)
    if rollout_engine == "vllm":
        share = (vllm_options or {}).get(
            "gpu_memory_utilization", 0.9 * min(1.0, plan["gpus_per_engine"])
        )
        engine = share * gpu_gib
    else:
        engine = 2 * parameters / GIB
    engines = agents * engine
    optimizer_step = agents * parameters * 4 / plan["ranks"] / GIB
    rank_side = learner + max(activations, optimizer_step)
    per_gpu = max(rank_side, engines) if plan["split"] else rank_side + engines
    return {
        "learner": round(learner, 1),
        "activations": round(activations, 1),
        "optimizer_step": round(optimizer_step, 1),
        "engines": round(engines, 1),
        "per_gpu": round(per_gpu, 1),
    }


def within(single: float, ray: float, rtol: float, atol: float) -> bool:
    """``|ray - single| <= atol + rtol * |single|``."""
    return abs(ray - single) <= atol + rtol * abs(single)


def scaling_efficiency(points: Sequence[tuple[int, float]]) -> dict[int, float]:
    """Strong-scaling efficiency of each ``(gpus, seconds)`` against the fewest GPUs'.

    ``(T_n0 * n0) / (T_N * N)``: 1 when N GPUs do the same work N/n0 times faster.
    """
    if not points:
        return {}
    base_gpus, base_s = min(points)
    return {gpus: round(base_s * base_gpus / (seconds * gpus), 3) for gpus, seconds in points}


def equality(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Single process on one device vs 2 FSDP2 ranks per agent, on the same episodes."""
    import ray
    import torch

    from benchmarks.bench_distributed_gpu import _config
    from mappa_agents.models import resolve_model
    from mappa_train.ray_trainer import RayTrainer
    from mappa_train.trainer import Trainer

    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        raise SystemExit(
            f"the equality part shards each agent over 2 GPUs; this machine shows "
            f"{torch.cuda.device_count()}: run it on 2 or more, or --parts scale"
        )
    system = str(resolve_model(args.equality_shape))
    settings = argparse.Namespace(
        shape=args.equality_shape, steps=args.equality_steps, prompts=args.prompts,
        samples=args.samples, max_new_tokens=args.max_new_tokens,
        micro_batch_tokens=args.micro_batch_tokens, schedule="ticks", sandbox=args.sandbox,
        dtype="auto", train_agents=args.train_agents, gradient_checkpointing="false",
    )  # fmt: skip
    single = Trainer(_config(settings, system, work / "single"))
    # Rank r of every agent in bundle r: 3 x 0.3 of one GPU; the driver acts itself.
    sharded = RayTrainer(
        _config(settings, system, work / "ray", distributed="ray", ranks_per_agent=2,
                gpus_per_rank=0.3, engines_per_agent=0)
    )  # fmt: skip
    steps: list[dict[str, Any]] = []
    started_ray = not ray.is_initialized()  # else the caller's, left running
    try:
        single.setup()
        sharded.setup()
        for step in range(args.equality_steps):
            single.step = sharded.step = step
            episodes = single.rollout(step)
            expected = single.learn(episodes)
            got = sharded.learn(episodes)
            single.after_update()
            sharded.after_update()
            record: dict[str, Any] = {"step": step + 1, "agents": {}, "reward_spread": {}}
            for agent in single.learners:
                own = [a.trainable_reward for e in episodes for a in e.actions if a.agent == agent]
                own = [r for r in own if r is not None]
                # Equal rewards leave whitening only the KL terms' spread to divide by:
                # that agent's loss then scales tiny differences up (see the docstring).
                record["reward_spread"][agent] = (max(own) - min(own)) if own else None
                record["agents"][agent] = {
                    key: {
                        "single": expected[f"{agent}/{key}"],
                        "ray": got[f"{agent}/{key}"],
                        "equal": within(
                            expected[f"{agent}/{key}"], got[f"{agent}/{key}"], args.rtol, args.atol
                        ),
                    }
                    for key in COMPARED
                }
            print(
                f"equality step {step + 1}: "
                + "; ".join(
                    f"{agent} loss {v['loss']['single']:.5g}/{v['loss']['ray']:.5g} grad norm "
                    f"{v['grad_norm']['single']:.4g}/{v['grad_norm']['ray']:.4g}"
                    for agent, v in record["agents"].items()
                )
            )
            steps.append(record)
    finally:
        single.close()
        sharded.close()
        if started_ray and ray.is_initialized():
            ray.shutdown()
    checks = [c for s in steps for a in s["agents"].values() for c in a.values()]
    return {
        "shape": args.equality_shape,
        "tolerance": {"rtol": args.rtol, "atol": args.atol},
        "steps": steps,
        "equal": all(c["equal"] for c in checks),
        "max_abs_difference": {
            key: max(
                abs(a[key]["ray"] - a[key]["single"]) for s in steps for a in s["agents"].values()
            )
            for key in COMPARED
        },
    }


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def scale_run(
    args: argparse.Namespace, system: str, placement: str, gpus: int, runs_dir: Path
) -> dict[str, Any]:
    """One :mod:`benchmarks.bench_distributed_gpu` run of ``placement`` on ``gpus`` GPUs."""
    agents = len(args.train_agents.split(",")) if args.train_agents else AGENTS
    plan = layout(placement, gpus, agents)
    name = f"{placement}_{gpus}gpu"
    result: dict[str, Any] = {"placement": placement, "gpus": gpus, **plan}
    if args.parameters and args.gpu_memory_gib:
        planned = memory_plan(
            plan, args.parameters, args.model_config, agents=agents,
            tokens=args.micro_batch_tokens, checkpointing=args.gradient_checkpointing != "false",
            rollout_engine=args.rollout_engine, gpu_gib=args.gpu_memory_gib,
            vllm_options=json.loads(args.vllm_options),
        )  # fmt: skip
        result["memory_plan_gib"] = planned
        if planned["per_gpu"] > 0.9 * args.gpu_memory_gib and args.memory_check:
            result["skipped"] = (
                f"planned {planned['per_gpu']:.0f} GiB on its busiest GPU (learner "
                f"{planned['learner']:.0f}, activations {planned['activations']:.0f} or "
                f"optimizer step {planned['optimizer_step']:.0f}, engines "
                f"{planned['engines']:.0f}), more than 90% of its {args.gpu_memory_gib:.0f} "
                "GiB; --no-memory-check runs it anyway"
            )
            print(f"{name}: skipped: {result['skipped']}")
            return result
    command = [
        sys.executable, "-m", "benchmarks.bench_distributed_gpu", "--shape", system,
        "--no-single", "--steps", str(args.steps), "--prompts", str(args.prompts),
        "--samples", str(args.samples), "--max-new-tokens", str(args.max_new_tokens),
        "--micro-batch-tokens", str(args.micro_batch_tokens), "--sandbox", args.sandbox,
        "--ranks", str(plan["ranks"]), "--engines", str(plan["engines"]),
        "--gpus-per-rank", str(plan["gpus_per_rank"]),
        "--gpus-per-engine", str(plan["gpus_per_engine"]),
        "--rollout-engine", args.rollout_engine, "--vllm-options", args.vllm_options,
        "--schedule", args.schedule, "--peak-tflops", str(args.peak_tflops),
        "--name", name, "--out", str(runs_dir),
    ]  # fmt: skip
    if args.train_agents:
        command += ["--train-agents", args.train_agents]
    if args.eager_decode:
        command.append("--eager-decode")
    command += ["--gradient-checkpointing", args.gradient_checkpointing]
    if plan["split"]:
        command.append("--split")
    done, record = runs_dir / f"{name}.json", runs_dir / f"{name}.command.json"
    # The run as asked for, with the random model's temporary directory named by its
    # shape (its weights are seeded, so the same shape is the same model).
    asked = [args.shape if part == system else part for part in command[3:]]
    if args.resume and done.exists() and record.exists():
        if json.loads(record.read_text()) == asked:
            print(f"{name}: {done.name} is there from an earlier call (--resume): reused")
            return _read_run(result, done)
        print(f"{name}: {done.name} is from other settings: running again")
    done.unlink(missing_ok=True)  # a run that fails now must not leave an older result
    record.write_text(json.dumps(asked))
    env = dict(os.environ)
    if _visible_gpus():
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    log = runs_dir / f"{name}.log"
    print(f"{name}: {' '.join(command[3:])} (log: {log.name})", flush=True)
    with log.open("w") as handle:
        try:
            code = subprocess.run(
                command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                timeout=args.run_timeout, check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = None
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        result["failed"] = "timed out" if code is None else f"exit code {code}"
        result["log_tail"] = tail
        print(f"{name}: failed ({result['failed']}); the end of its log:\n" + "\n".join(tail))
        return result
    return _read_run(result, done)


def _read_run(result: dict[str, Any], path: Path) -> dict[str, Any]:
    """``result`` with the figures of a :mod:`benchmarks.bench_distributed_gpu` run's JSON."""
    data = json.loads(path.read_text())
    run = next(iter(data["ray"].values()))
    steady = run["steady_step"]
    result.update(
        {
            "setup_s": run["setup_s"],
            "first_step_s": run["first_step_s"],
            "steady_step": steady,
            "mfu_update": run["mfu_update"],
            "weight_sync": sorted({c["weight_sync"] for c in
                                   next(iter(data["weights_checked"].values())).values()}),
            "sync_s": run["sync_s"],
            "sync_s_median": run["sync_s_median"],
            "gpu_peak_used_gib": run["gpu_peak_used_gib"],
            "actors_peak_gib_by_gpu": run["memory"]["actors_sum_gib_by_gpu"],
            "memory": run["memory"],
            "agents_at_once": run["agents_at_once"],
            "engines_hold_group_weights": all(
                c["equal"] for by_agent in data["weights_checked"].values()
                for c in by_agent.values()
            ),
        }
    )  # fmt: skip
    return result


def plot_scaling(runs: Sequence[dict[str, Any]], path: Path) -> Path:
    """Steady step seconds and update MFU against GPUs, one line per placement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (steps_axis, mfu_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for placement in PLACEMENTS:
        done = sorted(
            (r["gpus"], r) for r in runs if r["placement"] == placement and "steady_step" in r
        )
        if not done:
            continue
        gpus = [g for g, _ in done]
        steps_axis.plot(gpus, [r["steady_step"]["step_s"] for _, r in done], "o-",
                        label=f"{placement}: step")  # fmt: skip
        steps_axis.plot(gpus, [r["steady_step"]["update_s"] for _, r in done], "s--",
                        label=f"{placement}: update")  # fmt: skip
        mfu_axis.plot(gpus, [100 * (r["mfu_update"] or 0) for _, r in done], "o-",
                      label=placement)  # fmt: skip
    steps_axis.set(xlabel="GPUs", ylabel="seconds (steady step)", title="Step time")
    mfu_axis.set(xlabel="GPUs", ylabel="update MFU (%)", title="Update MFU")
    for axis in (steps_axis, mfu_axis):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")
    return path


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="equality,scale")
    parser.add_argument("--equality-shape", default="smollm2-135m")
    parser.add_argument("--equality-steps", type=int, default=2)
    parser.add_argument("--rtol", type=float, default=0.02, help="equality: relative tolerance")
    parser.add_argument("--atol", type=float, default=1e-3, help="equality: absolute tolerance")
    parser.add_argument("--shape", default="4b", help="scale: a random shape, spec or directory")
    parser.add_argument(
        "--gpu-counts", default="", help="scale: comma-separated GPU counts (default 2, 4, 8 "
        "up to the GPUs seen)"
    )  # fmt: skip
    parser.add_argument("--placements", default="colocated,split")
    parser.add_argument("--steps", type=int, default=3, help="scale: steps per run")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--rollout-engine", choices=("hf", "vllm"), default="vllm")
    parser.add_argument("--vllm-options", default="{}")
    parser.add_argument(
        "--eager-decode", action="store_true",
        help="HF engines decode eagerly (compiling takes minutes in a short run's first step)",
    )  # fmt: skip
    parser.add_argument(
        "--gradient-checkpointing", choices=sorted(SWITCHES), default="true",
        help="scale: the learners' gradient_checkpointing (the Ray learners take auto as true)",
    )  # fmt: skip
    parser.add_argument(
        "--no-memory-check", dest="memory_check", action="store_false",
        help="scale: run layouts whose planned memory exceeds 90%% of a GPU",
    )  # fmt: skip
    parser.add_argument("--schedule", choices=("ticks", "continuous"), default="continuous")
    parser.add_argument("--sandbox", default="none", help="none (random models write no code)")
    parser.add_argument("--peak-tflops", type=float, default=796.0, help="bf16 peak per GPU")
    parser.add_argument(
        "--train-agents", default="", help="comma-separated agents to train (default: all 3)"
    )
    parser.add_argument("--run-timeout", type=float, default=3000.0, help="seconds per run")
    parser.add_argument(
        "--resume", action="store_true",
        help="scale: reuse the runs an earlier call with the same settings finished in "
        "<name>-runs/ (a call cut short, or one machine's share of the counts)",
    )  # fmt: skip
    parser.add_argument("--name", default="distributed_multi_gpu")
    parser.add_argument(
        "--out", default=os.environ.get("OUT", str(Path("benchmarks") / "results" / "gpu"))
    )
    args = parser.parse_args(argv)
    parts = parse_variants(parser, args.parts, ("equality", "scale"))
    placements = parse_variants(parser, args.placements, PLACEMENTS)
    out = Path(args.out)
    runs_dir = out / f"{args.name}-runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    visible = _visible_gpus()
    if args.gpu_counts:
        counts = [int(c) for c in args.gpu_counts.split(",") if c]
    else:
        counts = [c for c in (2, 4, 8) if c <= visible] or [2]
    if visible and max(counts) > visible:
        parser.error(f"--gpu-counts {counts} asks for more GPUs than the {visible} seen")

    summary: dict[str, Any] = {"gpus_seen": visible, "settings": vars(args)}
    work = Path(tempfile.mkdtemp(prefix="mappa-bench-multi-gpu-"))
    try:
        if "equality" in parts:
            summary["equality"] = equality(args, work / "equality")
        if "scale" in parts:
            import torch
            from transformers import AutoConfig

            from benchmarks.bench_distributed_gpu import parameter_count
            from mappa_agents.models import resolve_model

            system = (
                str(random_model_dir(args.shape, work / "model"))
                if args.shape in SHAPES
                else str(resolve_model(args.shape))
            )
            args.parameters = parameter_count(system)
            args.model_config = AutoConfig.from_pretrained(system)
            args.gpu_memory_gib = (
                torch.cuda.get_device_properties(0).total_memory / 2**30 if visible else 0.0
            )
            runs = [
                scale_run(args, system, placement, gpus, runs_dir)
                for gpus in counts
                for placement in placements
                if not (placement == "split" and gpus < 2)
            ]
            efficiency: dict[str, Any] = {}
            for placement in placements:
                done = [r for r in runs if r["placement"] == placement and "steady_step" in r]
                efficiency[placement] = {
                    what: scaling_efficiency([(r["gpus"], r["steady_step"][key]) for r in done])
                    for what, key in (("step", "step_s"), ("update", "update_s"))
                }
            summary["scale"] = {
                "shape": args.shape,
                "parameters": args.parameters,
                "gpu_memory_gib": round(args.gpu_memory_gib, 1),
                "runs": runs,
                "scaling_efficiency": efficiency,
            }
            if any("steady_step" in r for r in runs):
                plot_scaling(runs, out / f"{args.name}.png")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key in ("parameters", "gpu_memory_gib", "model_config"):
        summary["settings"].pop(key, None)
    write_results(args.name, summary, out)
    if "equality" in summary:
        equal = summary["equality"]
        print(f"equality (rtol {args.rtol}, atol {args.atol}): {equal['equal']}, max |diff| "
              f"{equal['max_abs_difference']}")  # fmt: skip
    if "scale" in summary:
        rows = []
        for r in summary["scale"]["runs"]:
            steady = r.get("steady_step", {})
            peaks = list(r.get("gpu_peak_used_gib", {}).values())
            rows.append(
                {
                    "placement": r["placement"],
                    "GPUs": r["gpus"],
                    "ranks/engines": f"{r['ranks']}/{r['engines']}",
                    "step s": steady.get("step_s"),
                    "update s": steady.get("update_s"),
                    "update MFU": r.get("mfu_update"),
                    "sync s": r.get("sync_s_median"),
                    "planned GiB/GPU": r.get("memory_plan_gib", {}).get("per_gpu"),
                    "peak GiB/GPU": max(peaks) if peaks else None,
                    "note": r.get("skipped") or r.get("failed") or "",
                }
            )
        trained = args.train_agents or f"{AGENTS} agents"
        print_table(rows, title=f"{args.shape}, {trained}: placements and GPU counts")
        print("scaling efficiency:", json.dumps(summary["scale"]["scaling_efficiency"]))
    return summary


if __name__ == "__main__":
    main()
