"""Where rollout time goes: ``HFPolicy.generate`` against bare ``model.generate`` variants.

Rollouts are most of a training step on a GPU (see ``bench_update_gpu``). This times one
batch of sampled responses on a random-weight shape (or a model directory) four
ways, side by side in one process:

- ``policy``: ``HFPolicy.generate`` as the trainer calls it (chat template, left
  padding, the log-prob recorder, the bare generation config);
- ``bare``: ``model.generate`` on the same padded ids with the same sampling settings
  and no logits processor: what the policy adds is the difference;
- ``static``: ``bare`` with transformers' static KV cache (no compilation);
- ``compiled``: ``bare`` with the static cache and transformers' automatic
  ``torch.compile`` of the decode step (CUDA graphs); its first call, which compiles,
  is reported apart as ``first_call_s``;
- ``compiled-thread``: ``compiled`` called from a new worker thread each time, as the
  rollout runner's ``agenerate`` may do;
- ``graphs``: ``bare`` with the static cache, its decode step compiled by
  ``torch.compile``'s ``cudagraphs`` backend (dynamic shapes): CUDA graphs recorded from
  dynamo's graph without inductor's code generation, whose compile took 270-318 s on a
  fresh machine in a training run (``results/gpu/README.md``); whether these graphs
  reach ``compiled``'s speed at a start of seconds is what this variant measures;
- ``recorded``: the same sampling through :class:`mappa_agents.graph_decode.GraphDecoder`,
  which records the model's decode step as a CUDA graph itself (no compiler) and
  samples between replays;
- ``recorded-copied``: ``recorded`` with grouped key/value heads copied in each decode
  step's attention as transformers 5.17 does under a mask (``pack_heads=False``), beside
  ``recorded``'s packed heads (:mod:`mappa_agents.packed_gqa`);
- ``policy-compiled``: ``HFPolicy(compile_decode=True).agenerate``, then a check that an
  in-place weight change (as an optimizer step makes) reaches the recorded graphs.

Random weights never emit EOS, so every row runs to ``--max-new-tokens``; tokens/s
counts ``batch x new tokens``. ``--profile`` writes the top operators of a short
``bare`` call, by CPU and by CUDA time, to show whether a decode step waits on the
GPU or on Python.

Run:  python -m benchmarks.bench_generate_gpu --shape 1.5b --batch 64
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    cuda_synchronize,
    parse_variants,
    print_table,
    profile_operators,
    write_results,
)
from benchmarks.bench_train_gpu import SHAPES, random_model_dir

VARIANTS = (
    "policy",
    "bare",
    "static",
    "compiled",
    "compiled-thread",
    "graphs",
    "recorded",
    "recorded-copied",
    "policy-compiled",
)


def in_new_thread(call: Any) -> Any:
    """Run ``call`` in a fresh worker thread and return its result."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def weights_reach_graphs(policy: Any, chats: list[list[dict]]) -> bool:
    """Zero the output head in place; greedy decoding must then pick id 0 everywhere.

    A stale CUDA graph would keep using the old weights. The policy is spoiled afterwards.
    """
    import torch

    from mappa_agents.policy import SamplingParams

    with torch.no_grad():
        policy.model.get_output_embeddings().weight.zero_()
    generations = policy.generate(chats, SamplingParams(max_new_tokens=8, temperature=0.0))
    return all(set(g.response_ids) == {0} for g in generations)


def word_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[dict]]:
    """``count`` one-message chats of about ``length`` random word tokens each."""
    import random

    rng = random.Random(seed)
    chats = []
    for _ in range(count):
        size = rng.randint(length // 2, length)
        words = " ".join(f"w{rng.randrange(16, vocab)}" for _ in range(size))
        chats.append([{"role": "user", "content": words}])
    return chats


def padded_batch(policy: Any, chats: list[list[dict]]) -> tuple[Any, Any]:
    """Left-padded ids and attention mask, as ``HFPolicy`` builds them."""
    import torch

    prompts = [policy.prompt_ids(chat) for chat in chats]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), policy.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids.to(policy.model.device), mask.to(policy.model.device)


def bare_generate(policy: Any, ids: Any, mask: Any, new_tokens: int, **extra: Any) -> None:
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=policy.eos_token_ids,
        pad_token_id=policy.pad_token_id,
        **extra,
    )
    with torch.inference_mode():
        policy.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)


def recorded_generate(decoder: Any, policy: Any, ids: Any, mask: Any, new_tokens: int) -> None:
    """``new_tokens`` sampled ids a row through :class:`GraphDecoder` (its own CUDA graphs).

    Sampled as ``bare_generate`` samples (temperature 1, no top-k or top-p, no end
    before ``new_tokens``).
    """
    import torch

    from mappa_agents.hf import static_cache_length

    eos = list(policy.eos_token_ids)

    def pick(scores: Any) -> Any:
        scores[:, eos] = float("-inf")
        return torch.multinomial(torch.softmax(scores, dim=-1), 1)[:, 0]

    decoder.decode(
        ids,
        mask,
        max_new_tokens=new_tokens,
        cache_length=static_cache_length(ids.shape[1], new_tokens),
        pick=pick,
        eos_token_ids=eos,
        pad_token_id=policy.pad_token_id,
    )


def cudagraph_skips() -> int:
    """How many times ``torch.compile`` has skipped recording a CUDA graph so far."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def timed(call: Any) -> float:
    cuda_synchronize()
    started = time.perf_counter()
    call()
    cuda_synchronize()
    return time.perf_counter() - started


def profile_bare(policy: Any, ids: Any, mask: Any, new_tokens: int, out: Path) -> dict[str, Any]:
    """Profile a short bare call; write the top-operator tables; return CPU/GPU totals."""
    totals = profile_operators(
        lambda: bare_generate(policy, ids, mask, new_tokens), out / "profile_generate_bare.txt"
    )
    return {"new_tokens": new_tokens, **totals}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1.5b", help="0.5b, 1.5b, or a model directory")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args(argv)
    names = parse_variants(parser, args.variants, list(VARIANTS))

    import torch
    from transformers import CompileConfig

    from mappa_agents.graph_decode import GraphDecoder
    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams

    work = Path(tempfile.mkdtemp(prefix="mappa-bench-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = random_model_dir(args.shape, work / "model") if args.shape in SHAPES else args.shape
    policy = HFPolicy(model_dir, max_batch_size=args.batch)
    vocab = policy.model.config.vocab_size
    chats = word_prompts(args.batch, args.prompt_tokens, vocab)
    ids, mask = padded_batch(policy, chats)
    new = args.max_new_tokens
    compiled_policy: list[Any] = []
    makers = {
        "recorded": lambda: GraphDecoder(policy.model),
        "recorded-copied": lambda: GraphDecoder(policy.model, pack_heads=False),
    }
    decoders = {name: make() for name, make in makers.items() if name in names}

    def policy_compiled() -> None:
        import asyncio

        if not compiled_policy:
            compiled_policy.append(
                HFPolicy(
                    policy.model, policy.tokenizer, max_batch_size=args.batch, compile_decode=True
                )
            )
        params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
        asyncio.run(compiled_policy[0].agenerate(chats, params))

    calls = {
        "policy": lambda: policy.generate(
            chats, SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
        ),
        "bare": lambda: bare_generate(policy, ids, mask, new),
        "static": lambda: bare_generate(
            policy, ids, mask, new, cache_implementation="static", disable_compile=True
        ),
        "compiled": lambda: bare_generate(
            policy, ids, mask, new, cache_implementation="static", compile_config=CompileConfig()
        ),
        "compiled-thread": lambda: in_new_thread(calls["compiled"]),
        "graphs": lambda: bare_generate(
            policy,
            ids,
            mask,
            new,
            cache_implementation="static",
            compile_config=CompileConfig(backend="cudagraphs", mode=None, dynamic=True),
        ),
        "recorded": lambda: recorded_generate(decoders["recorded"], policy, ids, mask, new),
        "recorded-copied": lambda: recorded_generate(
            decoders["recorded-copied"], policy, ids, mask, new
        ),
        "policy-compiled": policy_compiled,
    }
    rows: list[dict[str, Any]] = []
    for name in names:
        skips_before = cudagraph_skips()
        try:
            first = timed(calls[name])
            times = [timed(calls[name]) for _ in range(args.repeats)]
        except Exception as error:  # noqa: BLE001 - a failing variant keeps the others
            rows.append({"variant": name, "error": f"{type(error).__name__}: {error}"[:300]})
            print(rows[-1], flush=True)
            continue
        seconds = statistics.median(times)
        rows.append(
            {
                "variant": name,
                "first_call_s": round(first, 2),
                "seconds": round(seconds, 3),
                "ms_per_decode_step": round(1000 * seconds / new, 2),
                "tok_s": round(args.batch * new / seconds),
                # Graphs torch.compile decided not to record (it only logs why): a
                # variant whose decode step ran without CUDA graphs shows it here.
                "cudagraph_skips": cudagraph_skips() - skips_before,
            }
        )
        print(rows[-1], flush=True)
    profile = profile_bare(policy, ids, mask, 32, out) if args.profile else None
    in_place = None
    if compiled_policy:
        try:
            in_place = weights_reach_graphs(compiled_policy[0], chats)
        except Exception as error:  # noqa: BLE001 - recorded with the figures
            in_place = f"{type(error).__name__}: {error}"[:300]
        print(f"in-place weight change reaches compiled decoding: {in_place}")
    summary = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "prompt_width": int(ids.shape[1]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "rows": rows,
        "profile_bare": profile,
        "in_place_weights_reach_graphs": in_place,
        # A shape whose graph failed decodes eagerly: its variant's time is then eager.
        "decoders": {
            name: {
                "pack_heads": decoder.pack_heads,
                "recorded_s": round(decoder.recorded_s, 3),
                "fallbacks": {f"{r}x{c}": why for (r, c), why in decoder.fallbacks.items()},
            }
            for name, decoder in decoders.items()
        },
    }
    write_results(args.name or f"generate_gpu_{Path(args.shape).name}", summary, out)
    print_table(
        [r for r in rows if "error" not in r], title=f"generate, {args.shape}, batch {args.batch}"
    )
    if profile:
        print(profile)
    policy.close()
    shutil.rmtree(work, ignore_errors=True)
    return summary


if __name__ == "__main__":
    main()
