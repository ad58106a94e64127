"""HFPolicy throughput with the embedded SmolLM2-135M-Instruct on this machine.

Measures the one-time GGUF conversion (or notes that the cache already holds it), the
load time of the converted directory, and response tokens per second of
``HFPolicy.generate`` at batch 1 and 8, in float32 and bfloat16. Every prompt asks for a
long answer and sampling runs at temperature 1 with fixed seeds; tokens/s counts the
response tokens returned (EOS included), so a row that stops early shows fewer tokens.
Each row is timed ``--repeats`` times after a warm-up; the median and the best rate are
reported.

On a small shared CPU, torch's default of one thread per core can collapse when other
processes compete for the cores (threads spin at barriers); ``--threads 1`` is steadier.
The load average at each row is recorded for that reason.

Usage:
    python benchmarks/bench_policy.py [--max-new-tokens 32] [--batch-sizes 1 8]
        [--dtypes float32 bfloat16] [--repeats 3] [--threads N] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import print_table, write_results  # noqa: E402
from mappa_agents import models  # noqa: E402
from mappa_agents.hf import HFPolicy  # noqa: E402
from mappa_agents.policy import SamplingParams  # noqa: E402

TOPICS = [
    "a cat who learns to sail",
    "the history of the number zero",
    "how a compiler turns code into machine instructions",
    "a lighthouse keeper's last night on duty",
    "why the sky is blue",
    "a robot that collects old maps",
    "the rules of a game you invent",
    "a city built inside a mountain",
]


def prompts(count: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write a long, detailed essay about {TOPICS[i % 8]}."}]
        for i in range(count)
    ]


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def resolve_with_timing(model: str) -> tuple[Path | str, float | None]:
    """Resolve the model; time the conversion when the cache did not hold it yet."""
    if model.lower() in models.SMOLLM2_ALIASES:
        cached = (models.smollm2_cache_dir() / "config.json").is_file()
        started = time.perf_counter()
        path = models.resolve_model(model)
        return path, None if cached else time.perf_counter() - started
    return models.resolve_model(model), None


def measure(policy: HFPolicy, batch_size: int, max_new_tokens: int, repeats: int) -> dict[str, Any]:
    """Time ``repeats`` seeded batches after a warm-up; report the median and best rate."""
    policy.generate(prompts(batch_size), SamplingParams(max_new_tokens=2, seed=0))  # warm-up
    rates, tokens, stopped = [], 0, 0
    for repeat in range(repeats):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=repeat)
        started = time.perf_counter()
        generations = policy.generate(prompts(batch_size), params)
        elapsed = time.perf_counter() - started
        tokens = sum(g.num_response_tokens for g in generations)
        stopped += sum(g.finish_reason == "stop" for g in generations)
        rates.append(tokens / elapsed)
    return {
        "batch": batch_size,
        "new_tokens": tokens,
        "tokens_per_s_median": round(statistics.median(rates), 2),
        "tokens_per_s_best": round(max(rates), 2),
        "stopped_early": stopped,
        "load_avg_1m": load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per row")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--name", default="bench_policy", help="name of the results file")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    path, conversion_s = resolve_with_timing(args.model)
    rows = []
    load_times = {}
    for dtype in args.dtypes:
        started = time.perf_counter()
        policy = HFPolicy(path, device=args.device, dtype=dtype, name=args.model)
        load_times[dtype] = round(time.perf_counter() - started, 3)
        for batch_size in args.batch_sizes:
            row = {"dtype": dtype, **measure(policy, batch_size, args.max_new_tokens, args.repeats)}
            rows.append(row)
            print(row, flush=True)
        policy.close()

    print_table(rows, title=f"HFPolicy {args.model} on {args.device}")
    conversion = "cached" if conversion_s is None else f"{conversion_s:.1f} s"
    print(f"conversion: {conversion}; load (s): {load_times}")
    write_results(
        args.name,
        {
            "model": args.model,
            "device": args.device,
            "torch_threads": torch.get_num_threads(),
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "conversion_s": conversion_s,
            "load_s": load_times,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
