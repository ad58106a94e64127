"""The Ray trainer on one GPU next to the single-process trainer, same steps, one process.

Runs ``--steps`` MathChat-v0 steps (three agents, the rules coach, ``process`` credit;
SmolLM2-135M unless ``--shape`` names another model) twice, one after the other: with
the single-process :class:`~mappa_train.trainer.Trainer`, then with
:class:`~mappa_train.ray_trainer.RayTrainer` colocated on the same device (each agent's
learner a group of ``--ranks`` ranks and ``--engines`` rollout engines as Ray actors
with fractional GPUs). It reports for both the first step, the steady step (median of
the later steps) split into rollouts, log-prob passes, the update and the rest, the
weight sync's seconds, peak memory (the driver's, and each actor's), and checks after
the last step that every engine acts with its group's weights (checksums).

Run:  python -m benchmarks.bench_distributed_gpu            # SmolLM2, one H200
      python -m benchmarks.bench_distributed_gpu --engines 0 # the driver acts itself
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import print_table, write_results
from benchmarks.bench_step_gpu import steady_state, timed_steps


def checksum(weights: dict[str, Any], dtype: Any = None) -> float:
    """Sum of every weight in float64 (after rounding to ``dtype``, the acting copy's).

    An engine acts in the run's dtype (bf16 on a GPU) with the group's float32 masters
    rounded to it: the group's weights are compared after the same rounding.
    """
    return float(
        sum(float((t if dtype is None else t.to(dtype)).double().sum()) for t in weights.values())
    )


def _config(args: argparse.Namespace, system: str, out: Path, **changes: Any) -> Any:
    from mappa_train.config import TrainConfig

    episodes = args.prompts * args.samples
    settings: dict[str, Any] = {
        "env": "MathChat-v0",
        "env_options": {
            "tasks": "gen:256",
            "sandbox": None if args.sandbox == "none" else args.sandbox,
        },
        "system": system,
        "coach": "rules",
        "credit_mode": "process",
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "samples_per_prompt": args.samples,
        "concurrency": episodes,
        "max_new_tokens": args.max_new_tokens,
        "mask_truncated": False,
        "micro_batch_tokens": args.micro_batch_tokens,
        "gradient_checkpointing": False,
        "dtype": args.dtype,
        "save_every": 0,
        "tensorboard": False,
        "progress": False,
        "output_dir": str(out),
    }
    settings.update(changes)
    return TrainConfig(**settings)


def _run(trainer: Any, steps: int) -> dict[str, Any]:
    import torch

    setup_s, records = timed_steps(trainer, steps)
    driver_gib = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return {
        "setup_s": round(setup_s, 2),
        "first_step_s": round(records[0]["step_s"], 2),
        "steady_step": {k: round(v, 3) for k, v in steady_state(records).items()},
        "steps": records,
        "driver_peak_gib": round(driver_gib, 2),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m", help="a model spec or directory")
    parser.add_argument("--steps", type=int, default=4, help="steps per trainer (first compiles)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--ranks", type=int, default=1, help="ranks per agent (one GPU: 1)")
    parser.add_argument("--engines", type=int, default=1, help="rollout engines per agent")
    parser.add_argument("--sandbox", default="jupyter", help="jupyter, or none (no kernels)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--name", default="distributed_1gpu", help="results file name")
    parser.add_argument(
        "--out", default=os.environ.get("OUT", str(Path("benchmarks") / "results" / "gpu"))
    )
    args = parser.parse_args(argv)

    import ray
    import torch

    from mappa_agents.models import resolve_model
    from mappa_train.ray_trainer import EnginePolicy, RayTrainer
    from mappa_train.trainer import Trainer

    system = str(resolve_model(args.shape))
    work = Path(tempfile.mkdtemp(prefix="mappa-bench-distributed-"))
    # One GPU shared by 3 agents' ranks and engines: fractions that add up to at most 1.
    actors = 3 * (args.ranks + args.engines)
    share = round(0.9 / actors, 3)
    try:
        print("single process:")
        single = Trainer(_config(args, system, work / "single"))
        alone = _run(single, args.steps)
        single.close()
        del single
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

        print(f"ray: {args.ranks} rank(s) and {args.engines} engine(s) per agent, {share} GPU each")
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(include_dashboard=False, log_to_driver=False)
        config = _config(
            args,
            system,
            work / "ray",
            distributed="ray",
            ranks_per_agent=args.ranks,
            engines_per_agent=args.engines,
            gpus_per_rank=share,
            gpus_per_engine=share,
        )
        trainer = RayTrainer(config)
        distributed = _run(trainer, args.steps)
        checks = {}
        memory: dict[str, Any] = {}
        for agent, learner in trainer.learners.items():
            group_weights = learner.group.weights()
            memory[agent] = {
                "ranks_gib": [round(b / 2**30, 2) for b in learner.group.peak_memory()]
            }
            if isinstance(learner.policy, EnginePolicy):
                copies = [ray.get(engine.weights.remote()) for engine in learner.policy.engines]
                memory[agent]["engines_gib"] = [
                    round(b / 2**30, 2)
                    for b in ray.get([e.peak_memory.remote() for e in learner.policy.engines])
                ]
            else:
                copies = [learner.model.state_dict()]
            dtype = next(iter(copies[0].values())).dtype
            trained = checksum(group_weights, dtype)
            acting = [checksum(copy) for copy in copies]
            checks[agent] = {
                "group": trained,
                "acting": acting,
                "equal": all(a == trained for a in acting),
            }
        sync = sorted(trainer.sync_seconds)
        distributed["sync_s_median"] = round(sync[len(sync) // 2], 3) if sync else None
        distributed["memory"] = memory
        trainer.close()
        if started_ray:
            ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ratio = (
        distributed["steady_step"]["step_s"] / alone["steady_step"]["step_s"]
        if alone["steady_step"]["step_s"]
        else None
    )
    summary = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "gpu_share_per_actor": share,
        "single_process": alone,
        "ray": distributed,
        "ray_vs_single_step": round(ratio, 3) if ratio else None,
        "weights_checked": checks,
    }
    write_results(args.name, summary, Path(args.out))
    rows = []
    for what, key in (
        ("first step s", "first_step_s"),
        ("steady step s", "step_s"),
        ("  rollout s", "rollout_s"),
        ("  log-prob s", "logprob_s"),
        ("  update s", "update_s"),
        ("  other s", "other_s"),
    ):
        pick = (
            (lambda r, k=key: r[k])
            if key == "first_step_s"
            else (lambda r, k=key: r["steady_step"][k])
        )
        rows.append({"what": what, "single": pick(alone), "ray": pick(distributed)})
    rows.append({"what": "weight sync s", "single": None, "ray": distributed["sync_s_median"]})
    rows.append(
        {
            "what": "driver peak GiB",
            "single": alone["driver_peak_gib"],
            "ray": distributed["driver_peak_gib"],
        }
    )
    print_table(rows, title=f"{args.shape}: single process vs Ray on one device")
    print("engine weights equal to their group's:", all(c["equal"] for c in checks.values()))
    return summary


if __name__ == "__main__":
    main()
