"""Update-phase settings compared on one fixed set of rollouts, side by side.

Rollouts are most of a training step's time on a GPU, and the update settings do not
change them. So this runs one step's rollouts once (MathChat-v0, three agents), then
for each named variant builds a fresh trainer and times ``Trainer.learn`` on those same
episodes: log-prob passes plus the PPO update of every agent, with the variant's
precision, recomputation and batch settings. A plain transformers training step on the
same rows runs last, in the same process (see ``bench_train_gpu`` for how MFU is
counted).

Variants: ``fp32-master`` (bf16 model, float32 master weights in the optimizer, head
logits kept for the backward pass), ``bf16-weights`` (Adam on the bf16 weights alone),
``recompute`` (fp32-master, head logits recomputed in the backward pass),
``checkpointing`` (fp32-master with activation checkpointing), ``token-budget``
(fp32-master, micro-batches of up to 16,384 padded tokens instead of
``--micro-batch`` rows).

Rollouts decode with CUDA graphs (``compile_decode``) unless ``--eager-rollouts``;
``--rollouts 2 --compare-eager-rollout`` times compiled steps (the first compiles) and
one eager step in the same process.

Run:  python -m benchmarks.bench_update_gpu --shape 1.5b --variants fp32-master,bf16-weights
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import parse_variants, print_table, write_results
from benchmarks.bench_train_gpu import (
    SHAPES,
    free_trainer,
    naive_batches,
    naive_result,
    parameter_counts,
    random_model_dir,
)

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32-master": {"mixed_precision": True, "recompute_logits": False},
    "bf16-weights": {"mixed_precision": False, "recompute_logits": False},
    "recompute": {"mixed_precision": True, "recompute_logits": True},
    "checkpointing": {
        "mixed_precision": True,
        "recompute_logits": False,
        "gradient_checkpointing": True,
    },
    "token-budget": {
        "mixed_precision": True,
        "recompute_logits": False,
        "micro_batch_tokens": 16_384,
    },
}


def profile_learn(trainer: Any, episodes: list, path: Path) -> None:
    """One ``learn`` under torch.profiler; the top operators go to ``path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    sort_by = "cpu_time_total"
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
        sort_by = "cuda_time_total"
    with profile(activities=activities) as prof:
        trainer.learn(episodes)
    path.write_text(prof.key_averages().table(sort_by=sort_by, row_limit=30) + "\n")


def timed_rollout(trainer: Any, step: int) -> dict[str, Any]:
    """One step's rollouts with the trainer's current policies."""
    import torch

    started = time.perf_counter()
    episodes = trainer.rollout(step)
    seconds = time.perf_counter() - started
    actions = [a for e in episodes for a in e.actions]
    tokens = sum(len(a.response_ids) for a in actions)
    policy = next(iter(trainer.learners.values())).policy
    return {
        "compiled": policy.compile_decode and torch.cuda.is_available(),
        "prompt_tokens_mean": round(sum(len(a.prompt_ids) for a in actions) / len(actions), 1),
        "seconds": round(seconds, 2),
        "response_tokens": tokens,
        "tok_s": round(tokens / seconds),
        "episodes": episodes,
    }


def use_eager_policies(trainer: Any) -> None:
    """Give every agent an eager policy on its same model, for a side-by-side rollout."""
    from mappa_agents.hf import HFPolicy

    for learner in trainer.learners.values():
        compiled = learner.policy
        learner.policy = HFPolicy(
            learner.model,
            learner.tokenizer,
            name=compiled.name,
            max_batch_size=compiled.max_batch_size,
        )
        compiled.close()  # its decode thread; the model stays with the learner
    trainer._close_runners()  # the next rollout builds its runner on the new policies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5b", help="0.5b, 1.5b, or a model directory / spec")
    parser.add_argument("--variants", default="fp32-master,bf16-weights")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=1, help="rollout steps to time")
    parser.add_argument("--eager-rollouts", action="store_true", help="decode without CUDA graphs")
    parser.add_argument(
        "--compare-eager-rollout",
        action="store_true",
        help="time one more rollout step with eager decoding, in the same process",
    )
    parser.add_argument(
        "--train-truncated",
        action="store_true",
        help="train on responses cut by the length limit (always for random-weight shapes)",
    )
    parser.add_argument("--peak-tflops", type=float, default=796.0)
    parser.add_argument("--dtype", default="auto", help="compute dtype (auto: bf16 on CUDA)")
    parser.add_argument("--profile", action="store_true", help="write a profile per variant")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = parser.parse_args()
    names = parse_variants(parser, args.variants, list(VARIANTS))

    import torch

    from mappa_agents.models import resolve_model
    from mappa_train.config import TrainConfig
    from mappa_train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="mappa-bench-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    random_shape = args.shape in SHAPES
    system = (
        str(random_model_dir(args.shape, work / "model"))
        if random_shape
        else str(resolve_model(args.shape))
    )
    base = TrainConfig(
        env="MathChat-v0",
        env_options={"sandbox": None, "tasks": "gen:64"},
        system=system,
        steps=1,
        prompts_per_step=args.prompts,
        samples_per_prompt=args.samples,
        concurrency=args.prompts * args.samples,
        max_new_tokens=args.max_new_tokens,
        # Random weights never emit EOS: train on length-cut responses there.
        mask_truncated=not (random_shape or args.train_truncated),
        train_batch_size=args.train_batch,
        micro_batch_size=args.micro_batch,
        rollout_batch_size=args.prompts * args.samples,
        gradient_checkpointing=False,
        save_every=0,
        tensorboard=False,
        progress=False,
        output_dir=str(work / "rollout"),
        lr=1e-6,
        dtype=args.dtype,
        compile_decode=not args.eager_rollouts,
    )
    trainer = Trainer(base)
    trainer.setup()
    rollouts = []
    for index in range(args.rollouts):
        # The first compiled rollout includes compilation; later ones show steady state.
        rollouts.append(timed_rollout(trainer, index))
    if args.compare_eager_rollout and base.compile_decode:
        use_eager_policies(trainer)
        rollouts.append(timed_rollout(trainer, args.rollouts))
    episodes = rollouts[0]["episodes"]  # every variant learns from the same episodes
    for row in rollouts:
        del row["episodes"]
        print(f"rollout: {row}")
    body, head = parameter_counts(next(iter(trainer.learners.values())).model)
    agents = list(trainer.agents)
    free_trainer(trainer)
    del trainer

    peak = args.peak_tflops * 1e12
    results: dict[str, Any] = {}
    for name in names:
        config = dataclasses.replace(base, output_dir=str(work / name), **VARIANTS[name])
        trainer = Trainer(config)
        trainer.save = lambda: None  # throughput only: no checkpoints
        trainer.setup()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        trainer.learn(episodes)  # warm-up: allocator, kernels, optimizer states
        runs = [trainer.learn(episodes) for _ in range(args.repeats)]
        if args.profile:
            profile_learn(trainer, episodes, out / f"profile_update_{name}.txt")
        tokens = runs[0]["train/tokens"]
        update_s = statistics.median(r["train/update_seconds"] for r in runs)
        logprob_s = statistics.median(r["train/logprob_seconds"] for r in runs)
        results[name] = {
            "settings": VARIANTS[name],
            "tokens": tokens,
            "update_s": round(update_s, 3),
            "logprob_s": round(logprob_s, 3),
            "update_tok_s": round(tokens / update_s),
            "mfu_update": round(6 * (body + head) * tokens / update_s / peak, 4),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
            if torch.cuda.is_available()
            else None,
        }
        free_trainer(trainer)
        del trainer

    naive: dict[str, Any] = {}
    if torch.cuda.is_available():
        samples = [a for e in episodes for a in e.actions]
        rows, tokens = naive_batches(samples, agents, args.micro_batch, base.mask_truncated)
        per_step = max(1, args.train_batch // args.micro_batch)
        naive = naive_result(system, rows, per_step, args.repeats, tokens, body + head, peak)
    summary = {
        "shape": args.shape,
        "decoder_params": body,
        "head_params": head,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "rollouts": rollouts,
        "variants": results,
        "naive_same_rows": naive,
    }
    write_results(f"update_gpu_{Path(args.shape).name}", summary, out)
    table = [
        {
            "variant": name,
            "update tok/s": r["update_tok_s"],
            "MFU": r["mfu_update"],
            "log-prob s": r["logprob_s"],
            "peak GiB": None if r["peak_memory_gib"] is None else round(r["peak_memory_gib"], 1),
        }
        for name, r in results.items()
    ]
    if naive and "error" not in naive:
        table.append(
            {
                "variant": "naive HF step, same rows",
                "update tok/s": naive["tok_s"],
                "MFU": naive["mfu"],
                "log-prob s": None,
                "peak GiB": None,
            }
        )
    print_table(table, title=f"update phase, {args.shape}")
    shutil.rmtree(work, ignore_errors=True)  # model copies take gigabytes


if __name__ == "__main__":
    main()
