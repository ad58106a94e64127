"""Decoding by replaying CUDA graphs recorded here, without a compiler.

A small model's decode step on a GPU is bound by kernel launches: SmolLM2-135M took
15-25 ms a step eagerly at any batch on one H100, against 4-9 ms for the same step
replayed as a CUDA graph (``benchmarks/results/gpu/README.md``). ``torch.compile``
records such graphs too, but compiles first (270-318 s on a fresh GPU machine). This
module records the model's own decode step, as vLLM and SGLang do, in a fraction of a
second per shape:

- one static KV cache, input buffers and graph per shape (batch rows, cache length);
- the prompt filled in eagerly (one forward over the left-padded batch);
- each later token: the new ids, positions and attention-mask column written into the
  buffers in place, the graph replayed, the next ids sampled from its logits eagerly
  (temperature, top-k and top-p as transformers' ``generate`` applies them), and the
  log-probability of each sampled id taken from the model's raw logits.

Weights may change in place between calls (an optimizer step does); a graph keeps the
addresses it was recorded with, so replacing parameter tensors needs a new decoder.
Without CUDA the same steps run eagerly, which is what the CPU tests check.
"""

from __future__ import annotations

import collections
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
"""Attention implementations that take the additive 4-D mask this module builds."""

DONE_CHECK_EVERY = 8
"""Decode steps between checks whether every row has ended (each check waits for the GPU)."""

WARMUP_STEPS = 2
"""Eager decode steps on a side stream before a shape's graph is recorded (as capture wants)."""

DEFAULT_MAX_SHAPES = 4
"""Shapes a decoder keeps at once (see :class:`GraphDecoder`'s ``max_shapes``)."""

REPLAY_TOLERANCE = 1e-3
"""Largest difference between a first replay's logits and the eager step's, relative to
the largest logit, for a recorded graph to be used. Both run the same kernels on the same
inputs, so they agree to the last bit unless recording went wrong."""


def cache_keyword(model: Any) -> str:
    """The name of ``model.forward``'s KV-cache argument.

    transformers renamed it from ``past_key_values`` to ``cache``; both are accepted.

    Args:
        model: A transformers causal LM.

    Returns:
        ``"cache"`` where the forward takes it, else ``"past_key_values"``.
    """
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@dataclass
class _Shape:
    """Everything recorded for one (rows, cache length): cache, buffers and graph."""

    cache: Any
    input_ids: Any
    position_ids: Any
    cache_position: Any
    mask: Any
    graph: Any = None
    logits: Any = None
    eager: bool = False
    """Recording failed or its replay disagreed with the eager step: decode eagerly."""


class GraphDecoder:
    """Decode steps of one model, recorded once per shape and replayed as CUDA graphs.

    Args:
        model: A transformers causal LM, in eval mode, on the device it decodes on.
        use_graphs: Record and replay CUDA graphs (default: when the model is on CUDA).
            ``False`` runs the same steps eagerly.
        max_shapes: Shapes kept at once; the one used longest ago is let go (its KV
            cache and graph) when another is needed, and recorded again if it comes
            back. Each shape holds a KV cache of ``rows x cache length`` positions:
            for SmolLM2-135M (30 layers, 3 KV heads of 64 in bfloat16) 22.5 KiB a
            position, 5.6 GiB at 64 rows over 4,096 positions, so a policy meeting all
            12 shapes of 4-64 rows and 512-4,096 positions would otherwise hold 13.8 GiB.

    Raises:
        ValueError: If the model's attention implementation cannot take an additive
            4-D mask (``sdpa`` and ``eager`` can).
    """

    def __init__(
        self, model: Any, *, use_graphs: bool | None = None, max_shapes: int = DEFAULT_MAX_SHAPES
    ) -> None:
        import torch

        if max_shapes < 1:
            raise ValueError(f"max_shapes must be at least 1, got {max_shapes}")

        implementation = getattr(model.config, "_attn_implementation", "sdpa") or "sdpa"
        if implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"decoding with recorded CUDA graphs needs the 'sdpa' or 'eager' attention "
                f"implementation; this model uses {implementation!r}: load it with "
                "attn_implementation='sdpa'"
            )
        self.model = model
        self.device = next(model.parameters()).device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ValueError("use_graphs needs a model on a CUDA device")
        self._torch = torch
        self._cache_keyword = cache_keyword(model)
        forward = inspect.signature(model.forward).parameters
        self._takes_cache_position = "cache_position" in forward
        self._takes_logits_to_keep = "logits_to_keep" in forward
        self.max_shapes = max_shapes
        self._shapes: collections.OrderedDict[tuple[int, int], _Shape] = collections.OrderedDict()
        self.recorded_s = 0.0
        """Seconds spent recording graphs (warm-up steps included), over the decoder's life."""
        self.fallbacks: dict[tuple[int, int], str] = {}
        """Shapes decoded eagerly because their graph failed, each with the reason."""

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, cache length) shapes held now (at most ``max_shapes``)."""
        return sorted(self._shapes)

    def decode(
        self,
        input_ids: Any,
        attention_mask: Any,
        *,
        max_new_tokens: int,
        cache_length: int,
        pick: Callable[[Any], Any],
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        ended: Any = None,
        stopped: Callable[[Any], Any] | None = None,
    ) -> tuple[Any, Any]:
        """Decode up to ``max_new_tokens`` ids for each row of a left-padded batch.

        Args:
            input_ids: ``rows x width`` prompt ids, left-padded, on the model's device.
            attention_mask: ``rows x width``, 1 on prompt ids and 0 on padding.
            max_new_tokens: Most ids to generate per row.
            cache_length: Positions of the static cache (``>= width + max_new_tokens``);
                each distinct (rows, cache length) records one graph.
            pick: Maps a ``rows x vocab`` float32 logits tensor to ``rows`` chosen ids.
            eos_token_ids: Ids that end a row (kept as its last id).
            pad_token_id: Id written after a row ended.
            ended: Optional ``rows`` bool tensor of rows ended before the first id
                (filler rows); they produce padding from the start.
            stopped: Optional callable taking the ``rows x t`` ids generated so far and
                returning a ``rows`` bool tensor of rows that just completed a stop
                string.

        Returns:
            ``(ids, logprobs)``: ``rows x steps`` generated ids (padding after each
            row's end) and the raw-model log-probability of each, both on the CPU;
            ``steps`` is at most ``max_new_tokens``, fewer when every row ended early.

        Raises:
            ValueError: If the cache cannot hold the prompt and the new ids.
        """
        torch = self._torch
        width = input_ids.shape[1]
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if cache_length < width + max_new_tokens:
            raise ValueError(
                f"a cache of {cache_length} positions cannot hold {width} prompt positions "
                f"and {max_new_tokens} new ones"
            )
        # Everything in inference mode: the cache's tensors are made in it (lazily, by
        # the first prefill) and may only be written in it.
        with torch.inference_mode():
            return self._decode(
                input_ids,
                attention_mask,
                max_new_tokens=max_new_tokens,
                cache_length=cache_length,
                pick=pick,
                eos_token_ids=eos_token_ids,
                pad_token_id=pad_token_id,
                ended=ended,
                stopped=stopped,
            )

    # ----------------------------------------------------------------- internals

    def _decode(
        self,
        input_ids: Any,
        attention_mask: Any,
        *,
        max_new_tokens: int,
        cache_length: int,
        pick: Callable[[Any], Any],
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        ended: Any,
        stopped: Callable[[Any], Any] | None,
    ) -> tuple[Any, Any]:
        torch = self._torch
        rows = input_ids.shape[0]
        shape = self._shape(rows, cache_length)
        logits = self._prefill(shape, input_ids, attention_mask)
        if self.use_graphs and shape.graph is None and not shape.eager:
            self._record(shape, logits, input_ids, attention_mask)
            logits = self._prefill(shape, input_ids, attention_mask)

        eos = torch.tensor(list(eos_token_ids), device=self.device)
        finished = (
            torch.zeros(rows, dtype=torch.bool, device=self.device)
            if ended is None
            else ended.to(self.device, torch.bool).clone()
        )
        ids = torch.full((rows, max_new_tokens), pad_token_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=self.device)
        steps = 0
        for step in range(max_new_tokens):
            scores = logits.float()
            # Before ``pick``, which may change the scores it is given.
            all_logprobs = torch.log_softmax(scores, dim=-1)
            chosen = pick(scores).to(torch.long)
            chosen = torch.where(finished, torch.full_like(chosen, pad_token_id), chosen)
            logprobs[:, step] = all_logprobs.gather(1, chosen[:, None])[:, 0]
            ids[:, step] = chosen
            finished |= torch.isin(chosen, eos)
            if stopped is not None:
                finished |= stopped(ids[:, : step + 1]).to(self.device)
            steps = step + 1
            if steps == max_new_tokens:
                break
            if steps % DONE_CHECK_EVERY == 0 and bool(finished.all()):
                break
            shape.input_ids.copy_(chosen[:, None])
            logits = self._step(shape)
            shape.position_ids.add_(1)
            shape.cache_position.add_(1)
        # Rows that ended keep padding past their end; trailing all-padding steps of a
        # check interval are dropped with the rest after the last step taken.
        return ids[:, :steps].cpu(), logprobs[:, :steps].cpu()

    def _shape(self, rows: int, cache_length: int) -> _Shape:
        key = (rows, cache_length)
        shape = self._shapes.get(key)
        if shape is not None:
            self._shapes.move_to_end(key)
        else:
            while len(self._shapes) >= self.max_shapes:
                dropped, _ = self._shapes.popitem(last=False)
                logger.debug("let go of the decode shape %s (cache and graph)", dropped)
            torch = self._torch
            from transformers import StaticCache

            dtype = next(self.model.parameters()).dtype
            shape = _Shape(
                cache=StaticCache(config=self.model.config, max_cache_len=cache_length),
                input_ids=torch.zeros((rows, 1), dtype=torch.long, device=self.device),
                position_ids=torch.zeros((rows, 1), dtype=torch.long, device=self.device),
                cache_position=torch.zeros(1, dtype=torch.long, device=self.device),
                mask=torch.zeros((rows, 1, 1, cache_length), dtype=dtype, device=self.device),
            )
            self._shapes[key] = shape
        return shape

    def _forward(self, shape: _Shape, **inputs: Any) -> Any:
        arguments: dict[str, Any] = {self._cache_keyword: shape.cache, "use_cache": True}
        if not self._takes_cache_position:
            inputs.pop("cache_position", None)
        if self._takes_logits_to_keep:
            arguments["logits_to_keep"] = 1
        return self.model(**inputs, **arguments).logits[:, -1, :]

    def _prefill(self, shape: _Shape, input_ids: Any, attention_mask: Any) -> Any:
        """Fill the cache with the prompts and set the buffers for the first decode step."""
        torch = self._torch
        width = input_ids.shape[1]
        shape.cache.reset()
        mask = attention_mask.to(self.device, torch.long)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._forward(
            shape,
            input_ids=input_ids.to(self.device),
            attention_mask=mask,
            position_ids=positions,
            cache_position=torch.arange(width, device=self.device),
        )
        lowest = torch.finfo(shape.mask.dtype).min
        shape.mask.fill_(lowest)
        shape.mask[:, 0, 0, :width] = torch.where(mask.bool(), 0.0, lowest).to(shape.mask.dtype)
        shape.position_ids.copy_(mask.sum(-1, keepdim=True))
        shape.cache_position.fill_(width)
        return logits

    def _step_eager(self, shape: _Shape) -> Any:
        """One decode step from the buffers: unmask the new position, run the model."""
        shape.mask.index_fill_(3, shape.cache_position, 0.0)
        return self._forward(
            shape,
            input_ids=shape.input_ids,
            attention_mask=shape.mask,
            position_ids=shape.position_ids,
            cache_position=shape.cache_position,
        )

    def _step(self, shape: _Shape) -> Any:
        if shape.graph is None:
            return self._step_eager(shape)
        shape.graph.replay()
        return shape.logits

    def _record(self, shape: _Shape, logits: Any, input_ids: Any, attention_mask: Any) -> None:
        """Record the shape's decode step as a CUDA graph, and check its first replay.

        Eager warm-up steps on a side stream come first (as capture wants). Then the
        prompt's first decode step runs eagerly and from the graph, each after a fresh
        prefill; a replay that disagrees with the eager step (or a capture that fails:
        a forward that waits on the host, say) leaves the shape to eager steps, logged
        once and kept in :attr:`fallbacks`, so a graph never decodes what the model
        would not. The caller fills the cache again before decoding. The steps' ids
        are the argmax, not a sample: recording draws nothing from the random
        generator, so a seeded call samples the same ids on a new shape as on a
        recorded one.
        """
        torch = self._torch
        started = time.perf_counter()
        first_ids = logits.argmax(-1)[:, None]
        shape.input_ids.copy_(first_ids)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step_eager(shape)
        torch.cuda.current_stream(self.device).wait_stream(side)
        key = (shape.input_ids.shape[0], shape.mask.shape[-1])
        graph = torch.cuda.CUDAGraph()
        try:
            # Only this thread is barred from calls unsafe during a capture. The default
            # ("global") bars every thread of the process, so a sweep's update running
            # beside a rollout that records a new shape would fail at its next allocation
            # or synchronisation (torch's own graph trees record in this mode too).
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                shape.logits = self._step_eager(shape)
        except RuntimeError as error:
            torch.cuda.synchronize(self.device)
            self._fall_back(shape, key, f"capture failed: {str(error).splitlines()[0][:200]}")
            return
        self._prefill(shape, input_ids, attention_mask)
        shape.input_ids.copy_(first_ids)
        expected = self._step_eager(shape).float().clone()
        self._prefill(shape, input_ids, attention_mask)
        shape.input_ids.copy_(first_ids)
        graph.replay()
        replayed = shape.logits.float()
        difference = float((replayed - expected).abs().max())
        scale = float(expected.abs().max()) or 1.0
        if not difference <= REPLAY_TOLERANCE * scale:  # NaN fails too
            self._fall_back(
                shape, key, f"the replay's logits differ from the eager step's by {difference:.3g}"
            )
            return
        shape.graph = graph
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        self.recorded_s += seconds
        logger.info(
            "recorded the decode step for %d rows over %d cache positions in %.2f s",
            key[0],
            key[1],
            seconds,
        )

    def _fall_back(self, shape: _Shape, key: tuple[int, int], reason: str) -> None:
        shape.eager, shape.graph, shape.logits = True, None, None
        self.fallbacks[key] = reason
        logger.warning(
            "decoding %d rows over %d cache positions eagerly (slower): %s", key[0], key[1], reason
        )
