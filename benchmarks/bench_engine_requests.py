"""One vLLM engine, called mappa's way and TRL's way: where does generation time go?

``bench_vs_trl`` found mappa's rollouts slower than TRL's at 64 samples per step for the
same tokens (and not at 256), while mappa's own work around the engine is a few
hundredths of a second (``bench_rollout_overhead``). What is left differs in how the
engine is built and called. This benchmark times ``llm.generate`` of the same prompts
(``bench_vs_trl``'s ``CharShare-v0`` prompts, ``--max-new-tokens`` each) under each
difference alone:

- engine ``mappa``: as mappa's trainer builds it (``VLLMPolicy``, the run's dtype and
  seed, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so new weights arrive as tensors of the
  trainer's process), called three ways:

  - ``policy``: ``VLLMPolicy.generate`` with a seed, as the trainer's rollouts call it
    (chat template, one seeded ``SamplingParams`` per prompt, outputs read back);
  - ``seeded``: ``llm.generate`` of the same token ids with the same seeded list;
  - ``unseeded``: ``llm.generate`` with one ``SamplingParams`` for the batch (TRL's call);

- engine ``batched_4096``: the same, with ``max_num_batched_tokens=4096`` (TRL's
  colocated engine), called ``unseeded``;
- engine ``multiprocess``: the same as ``mappa`` with vLLM's own default, the engine core
  in a process of its own, called ``unseeded``.

Each engine runs in a fresh child process (``--processes each``, the default), so no two
engines share a process or its GPU memory. Per engine, call and batch size: one warm-up
call, then the median of ``--repeats`` timed calls, with generated tokens/s. The table
gives each figure and its ratio to the ``mappa`` engine's ``unseeded`` call.

Run (GPU; ``VLLM_USE_FLASHINFER_SAMPLER=0`` where flashinfer is not installed)::

    python -m benchmarks.bench_engine_requests --model 0.5b --samples 64,256
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, parse_sizes, print_table, write_results

#: Engine name -> (``vllm.LLM`` arguments over mappa's, environment variables, calls).
ENGINES: dict[str, tuple[dict[str, Any], dict[str, str], tuple[str, ...]]] = {
    "mappa": ({}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ("policy", "seeded", "unseeded")),
    "batched_4096": (
        {"max_num_batched_tokens": 4096},
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        ("unseeded",),
    ),
    "multiprocess": ({}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, ("unseeded",)),
}
#: The call every figure is compared with.
BASELINE = ("mappa", "unseeded")


def prompts_for(model_style: str, count: int) -> list[list[dict[str, str]]]:
    """``count`` chat prompts of ``bench_vs_trl``'s task, in its tasks' order."""
    from benchmarks.bench_vs_trl import CharShareEnv, default_target, task_messages

    options = {"num_tasks": count, "prompt_style": model_style}
    options["target"] = default_target(model_style)  # type: ignore[arg-type]
    env = CharShareEnv(**options)
    ids = [task.id for task in env.tasks][:count]
    env.close()
    messages = task_messages(options, ids)
    return [messages[task_id][0] for task_id in ids]


def time_calls(
    call: Callable[[], int], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, Any]:
    """One warm-up ``call()``, then ``repeats`` timed ones (``call`` returns the tokens made).

    Returns:
        ``seconds`` (median), ``all_seconds``, ``tokens`` (of the median call's run) and
        ``tokens_per_s`` (tokens / median seconds).
    """
    call()
    seconds, tokens = [], []
    for _ in range(repeats):
        started = clock()
        tokens.append(call())
        seconds.append(clock() - started)
    median = statistics.median(seconds)
    made = int(statistics.median(tokens))
    return {
        "seconds": round(median, 6),
        "all_seconds": [round(s, 6) for s in seconds],
        "tokens": made,
        "tokens_per_s": round(made / median, 1) if median > 0 else None,
    }


def call_engine(
    kind: str, policy: Any, prompts: Sequence[Any], requests: Sequence[Any], params: Any
) -> int:
    """One call of ``kind`` (``policy``, ``seeded``, ``unseeded``); the tokens generated.

    ``seeded`` sends what the policy sends (one ``SamplingParams`` per prompt, seeds
    ``seed + i``) as token ids; ``unseeded`` one ``SamplingParams`` for every prompt.
    """
    from mappa_agents.vllm_policy import sampling_kwargs

    if kind == "policy":
        return sum(len(g.response_ids) for g in policy.generate(prompts, params))
    vllm = sys.modules["vllm"]
    shared = sampling_kwargs(params)
    shared.pop("seed", None)
    if kind == "seeded":
        sampling: Any = [
            vllm.SamplingParams(**shared, seed=params.seed + i) for i in range(len(requests))
        ]
    else:
        sampling = vllm.SamplingParams(**shared)
    outputs = policy.llm.generate(list(requests), sampling, use_tqdm=False)
    return sum(len(output.outputs[0].token_ids) for output in outputs)


def measure_engine(
    engine: str,
    model_dir: str,
    style: str,
    sizes: Sequence[int],
    max_new_tokens: int,
    repeats: int,
    gpu_memory_utilization: float,
) -> dict[str, Any]:
    """Build one engine (in this process) and time its calls at every size."""
    llm_args, _, calls = ENGINES[engine]
    from mappa_agents.policy import SamplingParams
    from mappa_agents.vllm_policy import VLLMPolicy

    started = time.perf_counter()
    policy = VLLMPolicy(
        model_dir,
        name=f"writer:{engine}",
        dtype="bfloat16",
        gpu_memory_utilization=gpu_memory_utilization,
        seed=0,
        **llm_args,
    )
    setup_s = time.perf_counter() - started
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=1234)
    results: dict[str, Any] = {"setup_s": round(setup_s, 2), "llm_args": llm_args, "calls": {}}
    try:
        for size in sizes:
            prompts = prompts_for(style, size)
            requests = [{"prompt_token_ids": policy.prompt_ids(m)} for m in prompts]

            for kind in calls:
                figures = time_calls(
                    functools.partial(call_engine, kind, policy, prompts, requests, params),
                    repeats,
                )
                results["calls"][f"{kind}@{size}"] = figures
                print(f"{engine} {kind} {size}: {figures}", flush=True)
    finally:
        policy.close()
    return results


def run_child(argv: Sequence[str], engine: str, model_dir: str, style: str) -> dict[str, Any]:
    """:func:`measure_engine` in a fresh Python process with the engine's variables."""
    env = {**os.environ, **ENGINES[engine][1]}
    with tempfile.TemporaryDirectory(prefix="mappa-engine-requests-") as tmp:
        result_file = Path(tmp) / "result.json"
        command = [
            sys.executable, "-m", "benchmarks.bench_engine_requests", *argv,
            "--only", engine, "--model-dir", model_dir, "--prompt-style", style,
            "--result-file", str(result_file),
        ]  # fmt: skip
        subprocess.run(command, check=True, env=env)
        return json.loads(result_file.read_text())


def table_rows(
    engines: Mapping[str, Mapping[str, Any]], sizes: Sequence[int]
) -> list[dict[str, Any]]:
    """One row per measured call: its seconds, tokens/s and seconds over the baseline's."""
    rows = []
    for size in sizes:
        base = engines.get(BASELINE[0], {}).get("calls", {}).get(f"{BASELINE[1]}@{size}")
        for engine, result in engines.items():
            for key, figures in result["calls"].items():
                kind, at = key.split("@")
                if int(at) != size:
                    continue
                ratio = figures["seconds"] / base["seconds"] if base and base["seconds"] else None
                rows.append(
                    {
                        "samples": size,
                        "engine": engine,
                        "call": kind,
                        "seconds": figures["seconds"],
                        "tokens/s": figures["tokens_per_s"],
                        "vs mappa unseeded": None if ratio is None else round(ratio, 3),
                    }
                )
    return rows


def make_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default="0.5b", help="smollm2-135m, 0.5b, 1.5b, an id or a path")
    add("--samples", default="64,256", help="prompts per call, comma-separated sizes")
    add("--max-new-tokens", type=int, default=256)
    add("--repeats", type=int, default=3, help="timed calls per engine, call and size")
    add("--engines", default=",".join(ENGINES), help="engines to build, comma-separated")
    add("--gpu-memory-utilization", type=float, default=0.3, help="as in bench_vs_trl")
    add("--processes", choices=("one", "each"), default="each", help="a child per engine")
    add("--name", default=None, help="results file name (default engine_requests_<model>)")
    add("--out", default=os.environ.get("OUT", str(RESULTS_DIR / "gpu")))
    # Set by the parent of a child process.
    add("--only", choices=tuple(ENGINES), default=None, help=argparse.SUPPRESS)
    add("--model-dir", default=None, help=argparse.SUPPRESS)
    add("--prompt-style", default=None, help=argparse.SUPPRESS)
    add("--result-file", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    args = parser.parse_args(argv)
    sizes = parse_sizes(parser, args.samples)
    measure = {
        "sizes": sizes,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    if args.only:  # a child: one engine, its result to the parent's file
        result = measure_engine(args.only, args.model_dir, args.prompt_style, **measure)
        Path(args.result_file).write_text(json.dumps(result))
        return result
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"--engines: unknown {unknown}; choose from {list(ENGINES)}")
    from benchmarks.bench_vs_trl import build_model

    with tempfile.TemporaryDirectory(prefix="mappa-engine-requests-") as tmp:
        model_dir, style = build_model(args.model, Path(tmp) / "model")
        results = {}
        for engine in engines:
            if args.processes == "each":
                results[engine] = run_child(argv, engine, model_dir, style)
            else:
                results[engine] = measure_engine(engine, model_dir, style, **measure)
    rows = table_rows(results, sizes)
    print_table(
        rows, title=f"llm.generate of {args.max_new_tokens} new tokens per prompt, {args.model}"
    )
    name = args.name or f"engine_requests_{args.model.replace('-', '_')}"
    payload = {"settings": vars(args), "engines": results, "rows": rows}
    write_results(name, payload, Path(args.out))
    return payload


if __name__ == "__main__":
    main()
