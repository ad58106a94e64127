"""Where one mappa training step's seconds go, on the workload of ``bench_vs_trl``.

``bench_vs_trl`` found mappa's rollouts slower than the policy's own generation of the
same tokens; this script says where the difference is, in one process:

1. sets up mappa's trainer on ``bench_vs_trl``'s single-turn workload (same model, same
   fixed-length replies, same config) and runs ``--warmup-steps`` steps;
2. times ``--timed-steps`` steps, logging every call into the rollout policy
   (``generate_calls``: prompts, seconds, CUDA-synchronised) and the phases the
   trainer reports (rollout, log-prob passes, update);
3. generates the last step's prompts again with the same policy, outside the runner
   (``policy_alone``): what the rollout's generation would cost without the rest;
4. runs one step under ``torch.profiler`` (CPU and CUDA activities) and writes the top
   operators by CPU and device time (``<name>_ops_<samples>.txt``) and the GPU's busy share;
5. runs one step under ``cProfile`` and writes the top Python functions by cumulative
   and own time (``<name>_python_<samples>.txt``): what the operator view cannot show
   (tokenisation, chat templates, environment and coach work, thread hand-offs).

Run:  python -m benchmarks.profile_step --model 135m --samples 64 --max-new-tokens 128 \
          --engine hf --no-compile-decode
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import (
    cuda_synchronize,
    print_table,
    profile_operators,
    write_results,
)
from benchmarks.bench_vs_trl import (
    build_model,
    fix_reply_length,
    make_parser,
    mappa_config,
    workload,
)


class CallLog:
    """Wraps a policy's ``generate`` and records each call's prompts and seconds."""

    def __init__(self, policy: Any) -> None:
        self.calls: list[dict[str, float]] = []
        self._policy = policy
        self._generate = policy.generate
        policy.generate = self._timed  # the runner's thread hand-off calls this

    def restore(self) -> None:
        """Give the policy its own ``generate`` back (and drop this log's hold on it)."""
        del self._policy.generate
        self._policy = self._generate = None

    def _timed(self, batch: Sequence[Any], params: Any) -> Any:
        cuda_synchronize()
        started = time.perf_counter()
        output = self._generate(batch, params)
        cuda_synchronize()
        self.calls.append({"prompts": len(batch), "seconds": time.perf_counter() - started})
        return output

    def take(self) -> list[dict[str, float]]:
        """The calls since the last ``take``."""
        calls, self.calls = self.calls, []
        return calls


def timed_step(trainer: Any, log: CallLog) -> dict[str, Any]:
    """One step's wall seconds, the trainer's phases and the generate calls inside it."""
    cuda_synchronize()
    started = time.perf_counter()
    metrics = trainer.train_step()
    cuda_synchronize()
    wall = time.perf_counter() - started
    calls = log.take()
    rollout = float(metrics.get("rollout/seconds") or 0.0)
    generate = sum(c["seconds"] for c in calls)
    return {
        "step_s": round(wall, 4),
        "rollout_s": round(rollout, 4),
        "generate_s": round(generate, 4),
        "rollout_outside_generate_s": round(rollout - generate, 4),
        "logprob_s": round(float(metrics.get("train/logprob_seconds") or 0.0), 4),
        "update_s": round(float(metrics.get("train/update_seconds") or 0.0), 4),
        "generate_calls": [
            {"prompts": int(c["prompts"]), "seconds": round(c["seconds"], 4)} for c in calls
        ],
    }


def operator_profile(trainer: Any, out: Path) -> dict[str, Any]:
    """One step under ``torch.profiler``; writes the operator tables to ``out``, returns
    the wall seconds and the GPU's busy seconds and share."""
    return profile_operators(trainer.train_step, out, cpu_rows=40, device_rows=30)


def python_profile(trainer: Any, out: Path) -> float:
    """One step under ``cProfile``; writes the top functions to ``out``, returns the wall
    seconds."""
    profiler = cProfile.Profile()
    cuda_synchronize()
    started = time.perf_counter()
    profiler.enable()
    trainer.train_step()
    cuda_synchronize()
    profiler.disable()
    wall = time.perf_counter() - started
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    out.write_text(text.getvalue())
    return round(wall, 3)


def step_prompts(trainer: Any, step: int) -> tuple[list[Any], Any]:
    """The prompts of ``step``'s saved rollouts and the run's sampling settings."""
    from mappa_agents.policy import SamplingParams
    from mappa_agents.trajectory import load_jsonl

    config = trainer.config
    params = SamplingParams(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p
    )
    samples = load_jsonl(trainer.out / "rollouts" / f"step-{step:06d}.jsonl")
    return [s.messages for s in samples], params


def policy_alone(trainer: Any, policy: Any, repeats: int = 2) -> list[float]:
    """The last step's prompts generated again by ``policy``, outside the runner."""
    prompts, params = step_prompts(trainer, trainer.step - 1)
    seconds = []
    for _ in range(repeats):
        cuda_synchronize()
        started = time.perf_counter()
        policy.generate(prompts, params)
        cuda_synchronize()
        seconds.append(round(time.perf_counter() - started, 4))
    return seconds


def timed_generate(policy: Any, prompts: list[Any], params: Any, cudnn: bool) -> float:
    """Seconds of one ``policy.generate`` call, CUDA-synchronised.

    ``cudnn``: let PyTorch choose cuDNN's attention too, as it did before
    :func:`mappa_agents.hf.decode_attention` left it out of eager decoding; otherwise the
    policy decodes as it does now.
    """
    from mappa_agents import hf

    choice = hf.decode_attention
    if cudnn:
        hf.decode_attention = lambda device_type, static_cache: contextlib.nullcontext()
    try:
        cuda_synchronize()
        started = time.perf_counter()
        policy.generate(prompts, params)
        cuda_synchronize()
    finally:
        hf.decode_attention = choice
    return round(time.perf_counter() - started, 4)


def attention_backends(trainer: Any, policy: Any, steps: Sequence[int]) -> dict[str, Any]:
    """Generation on prompts of new widths, with and without cuDNN's attention kernels.

    Each variant generates the prompts of one earlier step it has not seen (new batch and
    sequence shapes) twice in a row: ``[first, again]`` seconds. ``default`` is PyTorch's
    own choice (cuDNN allowed), ``no_cudnn`` the policy's eager decoding now. A first call
    much slower than the second, only where cuDNN attention may run, says the first call
    pays for building cuDNN's attention plans for each new shape.
    """
    import torch

    result: dict[str, Any] = {
        "cudnn_sdp_enabled": bool(torch.backends.cuda.cudnn_sdp_enabled()),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }
    for (name, cudnn), step in zip({"default": True, "no_cudnn": False}.items(), steps):
        prompts, params = step_prompts(trainer, step)
        result[name] = [timed_generate(policy, prompts, params, cudnn) for _ in range(2)]
    return result


def thread_check(trainer: Any, policy: Any, step: int) -> dict[str, Any]:
    """One prompt set generated from the main thread, from a fresh thread per call (as a
    new event loop's executor gives each rollout), with and without cuDNN attention, and
    three times from one long-lived thread: seconds of each call (cuDNN allowed, except
    in ``fresh_thread_no_cudnn``)."""
    import concurrent.futures
    import threading

    prompts, params = step_prompts(trainer, step)

    def timed(cudnn: bool = True) -> float:
        return timed_generate(policy, prompts, params, cudnn)

    def in_fresh_thread(cudnn: bool = True) -> float:
        box: list[float] = []
        thread = threading.Thread(target=lambda: box.append(timed(cudnn)))
        thread.start()
        thread.join()
        return box[0]

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as one:
        kept = [one.submit(timed).result() for _ in range(3)]
    return {
        "main_thread": [timed(), timed()],
        "fresh_thread": [in_fresh_thread(), in_fresh_thread()],
        "fresh_thread_no_cudnn": [in_fresh_thread(False), in_fresh_thread(False)],
        "one_kept_thread": kept,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser()
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--timed-steps", type=int, default=3)
    args = parser.parse_args(argv)
    args.name = args.name or "profile_step"
    sizes = [int(s) for s in args.samples.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from benchmarks.bench_train_gpu import free_trainer
    from mappa_train.trainer import Trainer

    scratch = Path(tempfile.mkdtemp(prefix="mappa-profile-step-"))
    model_dir, style = build_model(args.model, scratch / "model")
    # Enough steps for warm-up, timing and the two profiled steps.
    args.steps = max(2, args.warmup_steps + args.timed_steps + 2)
    results: dict[str, Any] = {"model": args.model, "sizes": {}}
    for samples in sizes:
        work = workload(args, samples, model_dir, style)
        trainer = Trainer(mappa_config(work, scratch / f"run-{samples}"))
        trainer.save = lambda: None  # speed only: no checkpoints
        trainer.setup()
        policy = trainer.learners["writer"].rollout_policy
        fix_reply_length(policy, work.engine)
        log = CallLog(policy)
        for _ in range(args.warmup_steps):
            trainer.train_step()
        log.take()
        steps = [timed_step(trainer, log) for _ in range(args.timed_steps)]
        alone = policy_alone(trainer, policy)
        # Steps 0 and 1 (warm-up, first timed) wrote prompts this policy has not run since.
        attention = attention_backends(trainer, policy, [0, 1])
        attention["threads"] = thread_check(trainer, policy, 0)
        log.take()
        ops = operator_profile(trainer, out / f"{args.name}_ops_{samples}.txt")
        log.take()
        python_wall = python_profile(trainer, out / f"{args.name}_python_{samples}.txt")
        median = {
            key: statistics.median(s[key] for s in steps)
            for key in steps[0]
            if key != "generate_calls"
        }
        results["sizes"][str(samples)] = {
            "steps": steps,
            "median": median,
            "policy_alone_s": alone,
            "attention_backends": attention,
            "operator_profile": ops,
            "python_profile_wall_s": python_wall,
        }
        print_table(
            [{"what": k, "value": v} for k, v in median.items()]
            + [{"what": "policy alone s", "value": min(alone)}]
            + [{"what": f"new prompts {k} s", "value": v} for k, v in attention.items()]
            + [{"what": f"profiled {k}", "value": v} for k, v in ops.items()],
            title=f"mappa step, {args.model}, {samples} samples x {args.max_new_tokens} tokens",
        )
        log.restore()
        del policy, log  # both held the policy, which holds the model
        free_trainer(trainer)
    write_results(args.name, results, out)
    return results


if __name__ == "__main__":
    main()
