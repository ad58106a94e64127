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
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mappa_agents.generation_lock import RANDOM_DRAWS
from mappa_agents.packed_gqa import use_packed_attention, wants_packed_attention

logger = logging.getLogger(__name__)

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
"""Attention implementations that take the additive 4-D mask this module builds."""

DONE_CHECK_EVERY = 8
"""Decode steps between checks whether every row has ended (each check waits for the GPU)."""

WARMUP_STEPS = 2
"""Eager decode steps on a side stream before a shape's graph is recorded (as capture wants)."""

DEFAULT_MAX_CACHE_BYTES = 4 * 2**30
"""KV-cache bytes a decoder keeps over its shapes (see :class:`GraphDecoder`)."""

CHECKED_STEPS = 2
"""Decode steps a new graph's replays are checked on against eager steps (the second
catches a counter the capture froze)."""

REPLAY_TOLERANCE = 1e-3
"""Largest difference between a replay's logits and the eager step's, relative to the
largest logit, for a recorded graph to be used (or :data:`REPLAY_ULPS` of the model's
dtype where that is more). A replay may run other kernels than the eager step (on one
H100 a SmolLM2-shaped bfloat16 model's replay differed by 0.008 of the largest logit,
one bfloat16 step); a replay that computes nothing, or the wrong step, is off by far more."""

REPLAY_ULPS = 4
"""Steps of the model dtype's precision (``finfo.eps``) a replay may differ by."""

SLIDING_LAYER_TYPES = ("sliding_attention", "chunked_attention")
"""Layer types whose mask a single full-attention mask cannot stand for."""


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`GraphDecoder` cannot decode ``model``, or ``None`` when it can.

    It builds one additive 4-D mask for every layer: models whose attention
    implementation does not take such a mask (``sdpa`` and ``eager`` do), or whose
    layers attend over a sliding or chunked window, need ``generate``.

    Args:
        model: A transformers causal LM.

    Returns:
        A sentence naming the cause and what to do, or ``None``.
    """
    config = model.config
    implementation = getattr(config, "_attn_implementation", "sdpa") or "sdpa"
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        return (
            f"decoding with recorded CUDA graphs needs the 'sdpa' or 'eager' attention "
            f"implementation; this model uses {implementation!r}: load it with "
            "attn_implementation='sdpa'"
        )
    layer_types = getattr(config, "layer_types", None) or []
    windowed = [kind for kind in layer_types if kind in SLIDING_LAYER_TYPES]
    if not layer_types and getattr(config, "sliding_window", None):
        # Configs without layer types: a window applies where the model says it is used.
        windowed = ["sliding_attention"] if getattr(config, "use_sliding_window", True) else []
    if windowed:
        return (
            f"decoding with recorded CUDA graphs builds one full-attention mask, and this "
            f"model has {len(windowed)} {windowed[0]} layer(s): it decodes with generate"
        )
    return None


def cache_keyword(model: Any) -> str:
    """The name of ``model.forward``'s KV-cache argument.

    transformers renamed it from ``past_key_values`` to ``cache``; both are accepted.

    Args:
        model: A transformers causal LM.

    Returns:
        ``"cache"`` where the forward takes it, else ``"past_key_values"``.
    """
    # The class's forward: an instance's may be wrapped as (*args, **kwargs).
    parameters = inspect.signature(type(model).forward).parameters
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
    cache_bytes: int = 0
    """Bytes of the shape's KV cache (known after its first prefill)."""


class GraphDecoder:
    """Decode steps of one model, recorded once per shape and replayed as CUDA graphs.

    Args:
        model: A transformers causal LM, in eval mode, on the device it decodes on.
        use_graphs: Record and replay CUDA graphs (default: when the model is on CUDA).
            ``False`` runs the same steps eagerly.
        max_cache_bytes: KV-cache bytes kept over all shapes: a new shape lets go of
            the ones used longest ago (their caches and graphs) until it fits, and a
            shape that comes back is recorded again; the shape in use is always kept.
            A shape's cache holds ``rows x cache length`` positions: for SmolLM2-135M
            (30 layers, 3 KV heads of 64 in bfloat16) 22.5 KiB a position, 5.6 GiB at
            64 rows over 4,096 positions; the 12 shapes of 4-64 rows and 512-4,096
            positions a MathChat run can meet would hold 13.8 GiB together.
        pack_heads: Run decode steps' attention through
            :func:`mappa_agents.packed_gqa.packed_gqa_sdpa`, which reads grouped
            key/value heads without copying them (default: where
            :func:`~mappa_agents.packed_gqa.wants_packed_attention` says it gains).

    Raises:
        ValueError: If :func:`unsupported_reason` finds the model cannot be decoded here.
    """

    def __init__(
        self,
        model: Any,
        *,
        use_graphs: bool | None = None,
        max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES,
        pack_heads: bool | None = None,
    ) -> None:
        import torch

        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.device = next(model.parameters()).device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ValueError("use_graphs needs a model on a CUDA device")
        self._torch = torch
        self._cache_keyword = cache_keyword(model)
        forward = inspect.signature(type(model).forward).parameters
        self._takes_cache_position = "cache_position" in forward
        self._takes_logits_to_keep = "logits_to_keep" in forward
        self.max_cache_bytes = max_cache_bytes
        self.pack_heads = wants_packed_attention(model) if pack_heads is None else pack_heads
        self._pool: Any = None
        self._shapes: collections.OrderedDict[tuple[int, int], _Shape] = collections.OrderedDict()
        self.recorded_s = 0.0
        """Seconds spent recording graphs (warm-up steps included), over the decoder's life."""
        self.recordings = 0
        """Graphs recorded over the decoder's life (a shape let go and met again counts twice)."""
        self.fallbacks: dict[tuple[int, int], str] = {}
        """Shapes decoded eagerly because their graph failed, each with the reason."""

    @property
    def cache_bytes(self) -> int:
        """KV-cache bytes the decoder holds now, over its shapes."""
        return sum(shape.cache_bytes for shape in self._shapes.values())

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, cache length) shapes held now (their caches within ``max_cache_bytes``)."""
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
    ) -> tuple[Any, Any, list[int]]:
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
            ``(ids, logprobs, lengths)``: ``rows x steps`` generated ids (padding after
            each row's end), the raw-model log-probability of each (both on the CPU),
            and each row's length: the ids up to and including the one that ended it
            (EOS, a stop string), ``steps`` for a row that never ended, 0 for a row
            ended before the start. ``steps`` is at most ``max_new_tokens``, fewer
            when every row ended early. ``pick`` sees only the rows not ended before
            the start, so filler rows draw nothing from the random generator.

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
        with self._eval_inference():
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
            live = None if ended is None else (~finished).nonzero()[:, 0]
            ends = torch.full((rows,), -1, dtype=torch.long, device=self.device)
            ends[finished] = 0
            ids = torch.full(
                (rows, max_new_tokens), pad_token_id, dtype=torch.long, device=self.device
            )
            logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=self.device)
            padding = torch.full((rows,), pad_token_id, dtype=torch.long, device=self.device)
            steps = 0
            for step in range(max_new_tokens):
                scores = logits.float()
                # Before ``pick``, which may change the scores it is given.
                all_logprobs = torch.log_softmax(scores, dim=-1)
                with RANDOM_DRAWS.shared():
                    if live is None:
                        chosen = pick(scores).to(torch.long)
                    else:
                        chosen = padding.clone()
                        chosen[live] = pick(scores[live]).to(torch.long)
                chosen = torch.where(finished, padding, chosen)
                logprobs[:, step] = all_logprobs.gather(1, chosen[:, None])[:, 0]
                ids[:, step] = chosen
                was_finished = finished.clone()
                finished |= torch.isin(chosen, eos)
                if stopped is not None:
                    finished |= stopped(ids[:, : step + 1]).to(self.device)
                ends[finished & ~was_finished] = step + 1
                steps = step + 1
                if steps == max_new_tokens:
                    break
                if steps % DONE_CHECK_EVERY == 0 and bool(finished.all()):
                    break
                shape.input_ids.copy_(chosen[:, None])
                logits = self._step(shape)
                shape.position_ids.add_(1)
                shape.cache_position.add_(1)
            lengths = [steps if end < 0 else end for end in ends.tolist()]
            return ids[:, :steps].cpu(), logprobs[:, :steps].cpu(), lengths

    # ----------------------------------------------------------------- internals

    @contextlib.contextmanager
    def _eval_inference(self) -> Iterator[None]:
        """Eval and inference mode for a call; the model's mode given back after.

        Inference mode: the cache's tensors are made in it (lazily, by the first
        prefill) and may only be written in it. Eval mode: a layer with activation
        checkpointing on drops the cache in training mode (transformers 5.17), and a
        recorded graph would replay whatever mode it was recorded in.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            with self._torch.inference_mode():
                yield
        finally:
            self.model.train(was_training)

    def _shape(self, rows: int, cache_length: int) -> _Shape:
        key = (rows, cache_length)
        shape = self._shapes.get(key)
        if shape is not None:
            self._shapes.move_to_end(key)
        else:
            self._make_room(rows * cache_length)
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

    def _make_room(self, positions: int) -> None:
        """Let go of the shapes used longest ago until a cache of ``positions`` fits."""
        sized = [shape for shape in self._shapes.values() if shape.cache_bytes]
        if not sized:
            return
        per_position = sized[0].cache_bytes / (
            sized[0].input_ids.shape[0] * sized[0].mask.shape[-1]
        )
        held = sum(shape.cache_bytes for shape in self._shapes.values())
        while self._shapes and held + positions * per_position > self.max_cache_bytes:
            dropped, shape = self._shapes.popitem(last=False)
            held -= shape.cache_bytes
            logger.debug("let go of the decode shape %s (cache and graph)", dropped)

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
        # Filled in the mask's own dtype: a float32 intermediate would overflow float64's.
        open_positions = torch.zeros_like(mask, dtype=shape.mask.dtype)
        shape.mask[:, 0, 0, :width] = open_positions.masked_fill(~mask.bool(), lowest)
        shape.position_ids.copy_(mask.sum(-1, keepdim=True))
        shape.cache_position.fill_(width)
        if not shape.cache_bytes:
            shape.cache_bytes = sum(
                tensor.nbytes
                for layer in getattr(shape.cache, "layers", [])
                for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if tensor is not None
            )
        return logits

    def _step_eager(self, shape: _Shape) -> Any:
        """One decode step from the buffers: unmask the new position, run the model."""
        shape.mask.index_fill_(3, shape.cache_position, 0.0)
        with use_packed_attention(self.model, self.pack_heads):
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
        """Record the shape's decode step as a CUDA graph, and check its replays.

        Eager warm-up steps on a side stream come first (as capture wants), all on the
        model's own device. Then the prompt's first :data:`CHECKED_STEPS` decode steps
        run eagerly and from the graph, each run after a fresh prefill, the graph's
        output filled with NaN before each replay (a replay that computes nothing
        fails); a replay that disagrees with the eager step (or a capture that fails:
        a forward that waits on the host, say) leaves the shape to eager steps, logged
        once and kept in :attr:`fallbacks`, so a graph never decodes what the model
        would not. The caller fills the cache again before decoding. The steps' ids
        are the argmax, not a sample: recording draws nothing from the random
        generator, so a seeded call samples the same ids on a new shape as on a
        recorded one.
        """
        torch = self._torch
        started = time.perf_counter()
        key = (shape.input_ids.shape[0], shape.mask.shape[-1])
        first_ids = logits.argmax(-1)[:, None]
        with torch.cuda.device(self.device):
            shape.input_ids.copy_(first_ids)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._step_eager(shape)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if not any(held.graph is not None for held in self._shapes.values()):
                # One memory pool for the decoder's graphs (they never replay at once),
                # while one of them lives: once the last graph recorded into a pool is
                # let go, torch frees the pool, and a capture into its old handle fails
                # (an internal assert in the caching allocator, on one H100).
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            failure = None
            # torch.cuda.graph's exit leaves the capture stream current when the capture
            # fails: this thread would then decode on it (unordered with the default
            # stream, and a stream the pool hands to later captures).
            stream_before = torch.cuda.current_stream(self.device)
            # No other thread samples while the device's random generator is captured.
            with RANDOM_DRAWS.exclusive():
                try:
                    # Only this thread is barred from calls unsafe during a capture. The
                    # default ("global") bars every thread of the process, so a sweep's
                    # update running beside a rollout that records a new shape would
                    # fail at its next allocation or synchronisation (torch's own graph
                    # trees record in this mode too).
                    with torch.cuda.graph(
                        graph,
                        pool=self._pool,
                        stream=torch.cuda.Stream(device=self.device),
                        capture_error_mode="thread_local",
                    ):
                        shape.logits = self._step_eager(shape)
                except RuntimeError as error:
                    torch.cuda.set_stream(stream_before)
                    torch.cuda.synchronize(self.device)
                    failure = f"capture failed: {str(error).splitlines()[0][:200]}"
                    self._check_random_numbers_after(failure, error)
            if failure is not None:
                self._fall_back(shape, key, failure)
                return
            shape.graph = graph
            difference = self._replay_difference(shape, first_ids, input_ids, attention_mask)
            tolerance = max(REPLAY_TOLERANCE, REPLAY_ULPS * torch.finfo(shape.mask.dtype).eps)
            if not difference <= tolerance:  # NaN fails too
                reason = f"the replays' logits differ from the eager steps' by {difference:.3g}"
                self._fall_back(shape, key, reason)
                return
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        self.recorded_s += seconds
        self.recordings += 1
        logger.info(
            "recorded the decode step for %d rows over %d cache positions in %.2f s "
            "(%d graphs recorded so far)",
            key[0],
            key[1],
            seconds,
            self.recordings,
        )

    def _replay_difference(
        self, shape: _Shape, first_ids: Any, input_ids: Any, attention_mask: Any
    ) -> float:
        """Largest difference of the graph's logits from eager steps', over the largest logit.

        Each run starts from a fresh prefill and feeds the same ids (the eager steps'
        argmax) for :data:`CHECKED_STEPS` steps.
        """
        torch = self._torch
        eager_steps, feeds = [], [first_ids]
        self._prefill(shape, input_ids, attention_mask)
        for step in range(CHECKED_STEPS):
            shape.input_ids.copy_(feeds[step])
            eager_steps.append(self._step_eager(shape).float().clone())
            feeds.append(eager_steps[-1].argmax(-1)[:, None])
            shape.position_ids.add_(1)
            shape.cache_position.add_(1)
        self._prefill(shape, input_ids, attention_mask)
        worst = 0.0
        for step, expected in enumerate(eager_steps):
            shape.input_ids.copy_(feeds[step])
            shape.logits.fill_(float("nan"))
            shape.graph.replay()
            scale = float(expected.abs().max()) or 1.0
            difference = float((shape.logits.float() - expected).abs().max()) / scale
            if difference != difference:  # NaN: the replay wrote nothing
                return difference
            worst = max(worst, difference)
            shape.position_ids.add_(1)
            shape.cache_position.add_(1)
        torch.cuda.synchronize(self.device)
        return worst

    def _check_random_numbers_after(self, reason: str, error: BaseException) -> None:
        """Give CUDA's random numbers back their eager state after a failed capture.

        A capture puts the device's random generator state in a capturing mode that only
        a capture that ends cleanly leaves; after one that failed part-way, every later
        draw of the process fails with "Offset increment outside graph capture" (seen on
        one H100, in the same test process). The generator then gets a copy of its state
        (same seed and offset, not capturing): torch's ``clone_state`` and
        ``graphsafe_set_state``. Graphs recorded before keep the old state, still
        capturing, and replay on: a replay touches its generator states only by the
        random numbers the graph draws, and a decode step draws none (ids are picked
        between replays). If drawing still fails, the run stops with the cause and the
        way on (decoding without ``compile_decode``).
        """
        torch = self._torch
        try:
            torch.rand(1, device=self.device)
            return
        except RuntimeError:
            index = self.device.index
            if index is None:
                index = torch.cuda.current_device()
            generator = torch.cuda.default_generators[index]
            generator.graphsafe_set_state(generator.clone_state())
        try:
            torch.rand(1, device=self.device)
        except RuntimeError as broken:
            raise RuntimeError(
                f"recording the decode step failed ({reason}) and left CUDA's random "
                f"number generator unusable in this process ({broken}): decode without "
                "compile_decode (--no-compile-decode)"
            ) from error
        logger.info("CUDA's random generator left capturing mode after a failed capture")

    def _fall_back(self, shape: _Shape, key: tuple[int, int], reason: str) -> None:
        shape.eager, shape.graph, shape.logits = True, None, None
        self.fallbacks[key] = reason
        logger.warning(
            "decoding %d rows over %d cache positions eagerly (slower): %s", key[0], key[1], reason
        )
