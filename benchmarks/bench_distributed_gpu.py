"""The Ray trainer on one GPU next to the single-process trainer, same steps, one process.

Runs ``--steps`` MathChat-v0 steps (three agents, the rules coach, ``process`` credit;
SmolLM2-135M unless ``--shape`` names another model) with the single-process
:class:`~mappa_train.trainer.Trainer` (unless ``--no-single``), then once per
``--weight-sync`` mode with :func:`~mappa_train.ray_trainer.RayTrainer` colocated on
the same device (each agent's learner a group of ``--ranks`` ranks and ``--engines``
rollout engines, HF or vLLM, as Ray actors with fractional GPUs), one after the other
in one process. It reports for each the setup, the first step, the steady step (median
of the later steps) split into rollouts, log-prob passes, the update and the rest, the
weight sync's seconds, peak memory (the driver's, and each actor's), and checks after
the last step that every engine acts with its group's weights (checksums; parameter
sums for vLLM engines).

On several GPUs ``--gpus-per-rank`` and ``--gpus-per-engine`` set the shares and
``--split`` gives the engines GPUs of their own (``colocate_engines: false``); the
steady update's MFU is ``6 (B + H)`` FLOPs per trained token (``B`` the decoder's
matmul parameters, ``H`` the head's, as in ``bench_train_gpu``; the recomputation of
gradient checkpointing is not counted) over the update's seconds and ``--peak-tflops``
times the GPUs used. Peak memory per GPU is nvidia-smi's (every process on it, CUDA
contexts included), polled each second, beside each actor's own allocator peak.
``--shape`` also takes the random-weight shapes of ``bench_train_gpu`` (``0.5b``,
``1.5b``, ``4b``).

Run:  python -m benchmarks.bench_distributed_gpu            # SmolLM2, one H200
      python -m benchmarks.bench_distributed_gpu --engines 0 # the driver acts itself
      python -m benchmarks.bench_distributed_gpu --rollout-engine vllm --no-single \
          --weight-sync object_store,cuda_ipc --name distributed_1gpu_vllm
      python -m benchmarks.bench_distributed_gpu --agents-in-parallel true,false
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import print_table, write_results
from benchmarks.bench_step_gpu import steady_state, timed_steps
from benchmarks.bench_train_gpu import SHAPES, parameter_counts, random_model_dir

#: The command line's spelling of the trainer's three-valued switches.
SWITCHES: dict[str, bool | str] = {"auto": "auto", "true": True, "false": False}


class GpuMemoryPoller:
    """Peak memory used on each GPU while it runs, as nvidia-smi reports it.

    nvidia-smi's figure counts every process on the GPU (CUDA contexts, NCCL buffers
    and vLLM's reserved KV cache included), which the processes' own allocator peaks
    do not. Without nvidia-smi (no GPU) it records nothing.

    Args:
        every_s: Seconds between two readings.
    """

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.peaks_mib: dict[str, float] = {}
        """Per GPU UUID (as torch spells it, without nvidia-smi's ``GPU-``), peak MiB."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        """MiB used on each GPU now (empty without nvidia-smi)."""
        if shutil.which("nvidia-smi") is None:
            return {}
        answer = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        used = {}
        for line in answer.stdout.splitlines():
            uuid, _, mib = line.partition(",")
            if mib.strip():
                used[uuid.strip().removeprefix("GPU-")] = float(mib)
        return used

    def _poll(self) -> None:
        while not self._stop.is_set():
            for uuid, mib in self.read().items():
                self.peaks_mib[uuid] = max(mib, self.peaks_mib.get(uuid, 0.0))
            self._stop.wait(self.every_s)

    def __enter__(self) -> GpuMemoryPoller:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _shape_only(system: str) -> Any:
    """The model in ``system`` on the meta device: its shapes, no weights read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(system))


def flops_per_token(system: str) -> int:
    """``6 (B + H)``: training FLOPs per token of the model in ``system``."""
    body, head = parameter_counts(_shape_only(system))
    return 6 * (body + head)


def parameter_count(system: str) -> int:
    """Parameters of the model in ``system`` (a tied head counted once)."""
    return sum(p.numel() for p in _shape_only(system).parameters())


def update_mfu(steady: dict[str, float], flops: int, gpus: int, peak_tflops: float) -> float | None:
    """The steady update's model FLOPs utilization over ``gpus`` GPUs of ``peak_tflops``."""
    if not steady.get("update_s") or gpus < 1:
        return None
    return flops * steady["train_tokens"] / steady["update_s"] / (gpus * peak_tflops * 1e12)


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
        "rollout_schedule": args.schedule,
        "max_new_tokens": args.max_new_tokens,
        "mask_truncated": False,
        "micro_batch_tokens": args.micro_batch_tokens,
        # Off unless asked: the figures then time the update without recomputation.
        "gradient_checkpointing": SWITCHES[args.gradient_checkpointing],
        "dtype": args.dtype,
        "save_every": 0,
        "tensorboard": False,
        "progress": False,
        "output_dir": str(out),
        "train_agents": getattr(args, "train_agents", None) or None,
        "compile_decode": not getattr(args, "eager_decode", False),
    }
    if args.shape in SHAPES:
        settings["lr"] = 1e-6  # random weights: the step's figures, not its learning
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


def _engine_parameter_sums(engine: Any) -> dict[str, float]:
    """:func:`~benchmarks.bench_step_gpu.parameter_sums` of a vLLM engine actor's model."""
    from benchmarks.bench_step_gpu import _worker_parameter_sums

    return engine.policy.llm.collective_rpc(_worker_parameter_sums)[0]


def _weights_checked(trainer: Any, system: str) -> dict[str, Any]:
    """Per agent: whether every acting copy holds its group's weights after the last sync.

    HF copies: float64 checksums of their state dicts against the group's masters
    rounded to their dtype. vLLM engines (which fuse some tensors): float64 sum and sum
    of squares of their parameters against an HF model holding the rounded masters.
    """
    import ray

    from benchmarks.bench_step_gpu import parameter_sums
    from mappa_train.ray_trainer import EnginePolicy

    checks: dict[str, Any] = {}
    for agent, learner in trainer.learners.items():
        group_weights = learner.group.weights()
        policy = learner.policy
        if isinstance(policy, EnginePolicy) and trainer.config.rollout_engine == "vllm":
            import torch
            from transformers import AutoModelForCausalLM

            dtype = getattr(torch, policy.dtype)
            model = AutoModelForCausalLM.from_pretrained(system, dtype=dtype)
            model.load_state_dict({k: v.to(dtype) for k, v in group_weights.items()})
            trained = parameter_sums(model)
            acting = [
                ray.get(engine.__ray_call__.remote(_engine_parameter_sums))
                for engine in policy.engines
            ]
            equal = all(
                abs(a[k] - trained[k]) <= 1e-9 * max(1.0, abs(trained[k]))
                for a in acting
                for k in trained
            )
        else:
            if isinstance(policy, EnginePolicy):
                copies = [ray.get(engine.weights.remote()) for engine in policy.engines]
            else:
                copies = [learner.model.state_dict()]
            trained = checksum(group_weights, next(iter(copies[0].values())).dtype)
            acting = [checksum(copy) for copy in copies]
            equal = all(a == trained for a in acting)
        checks[agent] = {
            "weight_sync": learner.weight_sync,
            "group": trained,
            "acting": acting,
            "equal": equal,
        }
    return checks


def compare_syncs(trainer: Any, modes: Sequence[str], repeats: int) -> dict[str, list[float]]:
    """Seconds of the trainer's weight sync in each mode, on the same weights and engines.

    After the run, :meth:`~mappa_train.trainer.Trainer.after_update` is timed
    ``repeats`` times per mode, the modes taking turns, with every agent's engines
    switched to that mode (each must work for them: ``object_store`` always does; the
    run's own mode was prepared at setup). The run's mode is restored after.
    """
    from mappa_train import sync_modes
    from mappa_train.ray_trainer import EnginePolicy

    learners = list(trainer.learners.values())
    used = [learner.sync for learner in learners]

    def prepared(learner: Any, mode: str) -> Any:
        if mode == learner.sync.name:
            return learner.sync
        if mode != "object_store":
            raise ValueError(f"{learner.agent}: only its own mode and object_store are ready")
        if isinstance(learner.policy, EnginePolicy):
            return sync_modes.ObjectStoreSync(learner.group, learner.policy)
        return sync_modes.DriverCopySync(learner.group, learner.model)

    syncs = [{mode: prepared(learner, mode) for mode in modes} for learner in learners]
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        for _ in range(repeats):
            for mode in modes:
                for learner, ready in zip(learners, syncs):
                    learner.sync = ready[mode]
                trainer.after_update()
                seconds[mode].append(round(trainer.sync_seconds.pop(), 4))
    finally:
        for learner, sync in zip(learners, used):
            learner.sync = sync
    return seconds


def _memory(trainer: Any) -> dict[str, Any]:
    """Each actor's allocator peak (GiB) and GPU, per agent; their sum per GPU."""
    import ray

    from mappa_train.ray_trainer import EnginePolicy

    memory: dict[str, Any] = {}
    by_gpu: dict[str, float] = {}
    for agent, learner in trainer.learners.items():
        ranks = [b / 2**30 for b in learner.group.peak_memory()]
        rank_gpus = learner.group.gpus()
        memory[agent] = {"ranks_gib": [round(b, 2) for b in ranks], "rank_gpus": rank_gpus}
        actors = list(zip(rank_gpus, ranks))
        if isinstance(learner.policy, EnginePolicy):
            engines = learner.policy.engines
            peaks = [b / 2**30 for b in ray.get([e.peak_memory.remote() for e in engines])]
            engine_gpus = ray.get([e.gpu.remote() for e in engines])
            memory[agent]["engines_gib"] = [round(b, 2) for b in peaks]
            memory[agent]["engine_gpus"] = engine_gpus
            actors += list(zip(engine_gpus, peaks))
        for gpu, gib in actors:
            if gpu is not None:
                by_gpu[gpu] = by_gpu.get(gpu, 0.0) + gib
    memory["actors_sum_gib_by_gpu"] = {gpu: round(gib, 2) for gpu, gib in by_gpu.items()}
    return memory


def ray_variants(modes: Sequence[str], parallel: Sequence[str]) -> list[tuple[str, str, str]]:
    """One Ray run per (weight sync mode, agents_in_parallel value), with its name.

    A run is named by its sync mode alone when ``parallel`` has one value, else by both.

    Returns:
        ``[(mode, agents_in_parallel value, name), ...]``.
    """
    return [
        (mode, value, mode if len(parallel) == 1 else f"{mode},agents_in_parallel={value}")
        for mode in modes
        for value in parallel
    ]


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
    parser.add_argument(
        "--weight-sync",
        default="auto",
        help="comma-separated weight_sync modes: one Ray run each, one after the other",
    )
    parser.add_argument("--rollout-engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument(
        "--vllm-options", default="{}", help="JSON object of vllm.LLM arguments (vllm engines)"
    )
    parser.add_argument(
        "--no-single", action="store_true", help="skip the single-process trainer's run"
    )
    parser.add_argument(
        "--compare-syncs",
        default="",
        help="after each Ray run, time its sync in these comma-separated modes in turn "
        "(of them, the run's own mode and object_store)",
    )
    parser.add_argument("--sync-repeats", type=int, default=5)
    parser.add_argument(
        "--gpus-per-rank", type=float, help="each rank's GPU share (default: one GPU shared)"
    )
    parser.add_argument("--gpus-per-engine", type=float, help="each engine's GPU share")
    parser.add_argument(
        "--split", action="store_true", help="engines on GPUs of their own (colocate_engines off)"
    )
    parser.add_argument(
        "--agents-in-parallel",
        default="auto",
        help="comma-separated agents_in_parallel values (auto, true, false): a Ray run each",
    )
    parser.add_argument("--peak-tflops", type=float, default=796.0, help="bf16 peak per GPU")
    parser.add_argument(
        "--train-agents", default="", help="comma-separated agents to train (default: all)"
    )
    parser.add_argument(
        "--eager-decode", action="store_true", help="HF engines decode eagerly (no compiling)"
    )
    parser.add_argument(
        "--gradient-checkpointing", choices=sorted(SWITCHES), default="false",
        help="the trainers' gradient_checkpointing (the Ray learners take auto as true); "
        "MFU counts the model's FLOPs only, not the recomputed forward",
    )  # fmt: skip
    parser.add_argument("--schedule", choices=("ticks", "continuous"), default="ticks")
    parser.add_argument("--sandbox", default="jupyter", help="jupyter, or none (no kernels)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--name", default="distributed_1gpu", help="results file name")
    parser.add_argument(
        "--out", default=os.environ.get("OUT", str(Path("benchmarks") / "results" / "gpu"))
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.weight_sync.split(",") if m.strip()]
    parallel = [v.strip() for v in args.agents_in_parallel.split(",") if v.strip()]
    if not parallel or any(v not in SWITCHES for v in parallel):
        parser.error(f"--agents-in-parallel takes {sorted(SWITCHES)}, got {parallel}")
    variants = ray_variants(modes, parallel)

    import ray
    import torch

    from mappa_agents.models import resolve_model
    from mappa_train.ray_trainer import RayTrainer
    from mappa_train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="mappa-bench-distributed-"))
    if args.shape in SHAPES:
        system = str(random_model_dir(args.shape, work / "model"))
    else:
        system = str(resolve_model(args.shape))
    flops = flops_per_token(system)
    # By default one GPU shared by 3 agents' ranks and engines: shares adding up to 0.9.
    actors = 3 * (args.ranks + args.engines)
    share = round(0.9 / actors, 3)
    rank_share = args.gpus_per_rank or share
    engine_share = args.gpus_per_engine or share
    alone: dict[str, Any] | None = None
    runs: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    try:
        if not args.no_single:
            print("single process:")
            single = Trainer(_config(args, system, work / "single"))
            alone = _run(single, args.steps)
            alone["mfu_update"] = update_mfu(
                alone["steady_step"], flops, int(torch.cuda.is_available()), args.peak_tflops
            )
            single.close()
            del single
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(include_dashboard=False, log_to_driver=False)
        gpus_used = int(ray.cluster_resources().get("GPU", 0))
        for mode, at_once, key in variants:
            print(
                f"ray ({key}): {args.ranks} rank(s) at {rank_share} GPU and {args.engines} "
                f"{args.rollout_engine} engine(s) at {engine_share} GPU per agent"
                + (", engines apart" if args.split else "")
            )
            config = _config(
                args,
                system,
                work / f"ray-{len(runs)}",
                distributed="ray",
                ranks_per_agent=args.ranks,
                engines_per_agent=args.engines,
                gpus_per_rank=rank_share,
                gpus_per_engine=engine_share,
                colocate_engines=not args.split,
                agents_in_parallel=SWITCHES[at_once],
                weight_sync=mode,
                rollout_engine=args.rollout_engine,
                vllm_options=json.loads(args.vllm_options),
            )
            trainer = RayTrainer(config)
            poller = GpuMemoryPoller()
            try:
                with poller:
                    run = _run(trainer, args.steps)
                run["agents_at_once"] = trainer.backend.agents_at_once()
                run["mfu_update"] = update_mfu(
                    run["steady_step"], flops, gpus_used, args.peak_tflops
                )
                run["gpu_peak_used_gib"] = {
                    gpu: round(mib / 1024, 2) for gpu, mib in poller.peaks_mib.items()
                }
                # Before the comparison: the last sync was the run's own mode's.
                checks[key] = _weights_checked(trainer, system)
                # The run prepared the mode it resolved to; the object store needs nothing.
                ready = {"object_store"} | {
                    learner.weight_sync for learner in trainer.learners.values()
                }
                compared = [m.strip() for m in args.compare_syncs.split(",") if m.strip() in ready]
                if compared:
                    run["syncs_compared_s"] = compare_syncs(trainer, compared, args.sync_repeats)
                run["memory"] = _memory(trainer)
            finally:
                trainer.close()
            sync = sorted(trainer.sync_seconds)
            run["sync_s"] = [round(t, 3) for t in trainer.sync_seconds]
            run["sync_s_median"] = round(sync[len(sync) // 2], 3) if sync else None
            runs[key] = run
        if started_ray:
            ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def _ratio(mine: dict[str, Any]) -> float | None:
        if alone is None or not alone["steady_step"]["step_s"]:
            return None
        return round(mine["steady_step"]["step_s"] / alone["steady_step"]["step_s"], 3)

    summary = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "gpus": torch.cuda.device_count(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "gpu_share_per_rank": rank_share,
        "gpu_share_per_engine": engine_share,
        "flops_per_trained_token": flops,
        "single_process": alone,
        "ray": runs,
        "ray_vs_single_step": {mode: _ratio(run) for mode, run in runs.items()},
        "weights_checked": checks,
    }
    write_results(args.name, summary, Path(args.out))
    rows = []
    for what, key in (
        ("setup s", "setup_s"),
        ("first step s", "first_step_s"),
        ("steady step s", "step_s"),
        ("  rollout s", "rollout_s"),
        ("  log-prob s", "logprob_s"),
        ("  update s", "update_s"),
        ("  other s", "other_s"),
        ("weight sync s (median)", "sync_s_median"),
        ("update MFU", "mfu_update"),
        ("driver peak GiB", "driver_peak_gib"),
    ):
        row: dict[str, Any] = {"what": what}
        for column, run in (("single", alone), *((f"ray {k}", runs[k]) for k in runs)):
            if run is None:
                continue
            row[column] = run[key] if key in run else run["steady_step"].get(key)
        rows.append(row)
    print_table(rows, title=f"{args.shape}: single process vs Ray on this machine")
    for mode, by_agent in checks.items():
        equal = all(c["equal"] for c in by_agent.values())
        print(f"ray {mode}: engine weights equal to their group's: {equal}")
    return summary


if __name__ == "__main__":
    main()
