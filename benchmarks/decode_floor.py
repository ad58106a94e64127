"""The decode floor: one decode step of a model, replayed as a CUDA graph, at a batch size.

A rollout cannot generate faster than the model's decode step allows at its batch size.
This measures that step the cheapest way a process can run it: a static KV cache filled
by a prefill, one decode step (``batch`` new tokens, one per row) captured as a CUDA
graph, then replayed ``repeats`` times with the cache position moved forward in place
between replays. Nothing else runs: no sampling, no Python between kernels, no
scheduling. ``tokens_per_s = batch / step_s``.

Where the graph cannot be captured (no CUDA, or the model's forward synchronises with
the host), the step is timed eagerly instead and ``method`` says so: then it is the
eager step's speed, not a floor.

Each replay attends over the whole static cache (``context_tokens`` long, masked past
the position), as a decode step late in a reply does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


def decode_floor(
    model: Any, batch: int, context_tokens: int, *, repeats: int = 50, warmup: int = 3
) -> dict[str, Any]:
    """Time one decode step of ``model`` at ``batch`` rows over ``context_tokens`` of cache.

    Args:
        model: A causal LM (transformers), on the device it is timed on.
        batch: Rows decoded at once.
        context_tokens: The static cache's length; the prefill fills half of it and the
            replays write from there on (``repeats`` must fit in the other half).
        repeats: Timed decode steps.
        warmup: Untimed steps first (on a side stream, as capture requires).

    Returns:
        ``method`` (``cuda-graph`` or ``eager``, and ``capture_error`` when a capture
        failed), ``batch``, ``context_tokens``, ``step_ms`` and ``tokens_per_s``.
    """
    import torch
    from transformers import StaticCache

    from mappa_agents.graph_decode import cache_keyword

    if batch < 1 or repeats < 1:
        raise ValueError(f"batch and repeats must be at least 1, got {batch} and {repeats}")
    prefill = context_tokens // 2
    if prefill < 1 or prefill + repeats + warmup > context_tokens:
        raise ValueError(
            f"context_tokens={context_tokens} leaves no room for a prefill and "
            f"{warmup + repeats} decode steps: give at least {2 * (warmup + repeats)}"
        )
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, prefill), generator=generator).to(device)
    cache = StaticCache(config=model.config, max_cache_len=context_tokens)
    step_ids = torch.randint(0, vocab, (batch, 1), generator=generator).to(device)
    position = torch.tensor([prefill], device=device)
    was_training = model.training
    model.eval()
    cache_kw = {cache_keyword(model): cache}

    def step() -> Any:
        out = model(input_ids=step_ids, cache_position=position, use_cache=True, **cache_kw)
        return out.logits

    def advance(index: int) -> None:
        position.fill_(prefill + index)

    result: dict[str, Any] = {"batch": batch, "context_tokens": context_tokens}
    try:
        with torch.no_grad():
            model(
                input_ids=prompt,
                cache_position=torch.arange(prefill, device=device),
                use_cache=True,
                **cache_kw,
            )
            graph = None
            if device.type == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for index in range(warmup):
                        advance(index)
                        step()
                torch.cuda.current_stream().wait_stream(side)
                try:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                except RuntimeError as exc:  # a host sync in the forward: time it eagerly
                    logger.warning("decode step could not be captured (%s); timing it eagerly", exc)
                    result["capture_error"] = str(exc).splitlines()[0][:200]
                    graph = None
                    torch.cuda.synchronize()
            else:
                for index in range(warmup):
                    advance(index)
                    step()
            run = graph.replay if graph is not None else step
            _synchronize(device)
            started = time.perf_counter()
            for index in range(repeats):
                advance(warmup + index)
                run()
            _synchronize(device)
            seconds = (time.perf_counter() - started) / repeats
    finally:
        model.train(was_training)
    result.update(
        method="cuda-graph" if graph is not None else "eager",
        step_ms=round(seconds * 1000, 3),
        tokens_per_s=round(batch / seconds, 1),
    )
    return result


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
