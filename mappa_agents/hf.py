"""A policy backed by a Hugging Face transformers causal LM, in this process.

Prompts go through the model's chat template, are left-padded into batches and run
through ``model.generate``, or with ``compile_decode`` through
:class:`~mappa_agents.graph_decode.GraphDecoder` (the model's decode step replayed as
CUDA graphs recorded per batch shape). Every generation keeps the exact prompt ids, the
exact sampled ids and the log-probability of each sampled id, so training never
re-tokenises text. torch and transformers are imported when a policy is built, not on
import.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mappa_agents.dtypes import resolve_dtype
from mappa_agents.generation_lock import GENERATION_LOCK
from mappa_agents.graph_decode import GraphDecoder, unsupported_reason
from mappa_agents.policy import (
    ChatMessages,
    Generation,
    SamplingParams,
    batch_prompt_ids,
    chat_prompt_ids,
    find_stop,
    normalize_batch,
    split_reasoning,
)
from mappa_env._optional import require

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


MIN_CACHE_LENGTH = 512
"""Smallest static KV cache (``compile_decode``); larger ones are powers of two."""

DECODE_ROW_GROWTH = 4
"""``compile_decode`` batches are padded to a power of this many rows (4, 16, 64, ...)."""


def decode_attention(
    device_type: str, static_cache: bool
) -> contextlib.AbstractContextManager[Any]:
    """The attention kernels a ``generate`` call on ``device_type`` may use.

    Eager decoding on CUDA: every scaled-dot-product backend but cuDNN's. On an H100, a
    mappa step's eager generation of 64 x 128 tokens (SmolLM2-135M's shape) spent 5.1 of
    its 8.8 s in 3,960 attention calls (1.3 ms each), while the same call on a thread
    that had generated before took 2.3-3.2 s in all; a rollout's generation then ran on
    a thread that was new each step (it now runs on the policy's own). cuDNN builds an execution
    plan per attention shape and PyTorch keeps those plans per thread, and eager decoding
    meets a new key length at every step: the likely cause, which this choice removes
    (benchmarks/results/gpu/README.md). Decoding over a static cache (``compile_decode``,
    which replays recorded graphs) meets one shape and keeps the default choice, as does
    every other device.

    Args:
        device_type: The model's device type (``"cuda"``, ``"cpu"``, ...).
        static_cache: Whether the call decodes over a static KV cache.

    Returns:
        A context manager to enter around the call.
    """
    if device_type != "cuda" or static_cache:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )


def decode_batch_rows(count: int, max_batch_size: int) -> int:
    """Rows a ``compile_decode`` batch is padded to: the next power of four from 4, at most the cap.

    :class:`~mappa_agents.graph_decode.GraphDecoder` records one CUDA graph, with its
    own static KV cache and buffers, per (rows, cache length), and each recording holds
    memory while it is kept (the decoder keeps the few it used last). Rounding the
    batch up to 4, 16, 64, ... rows keeps the shapes of a policy to a handful, 3 up to
    a 64-row cap; a single prompt runs as 4 rows too rather than record a one-row shape
    of its own. A decode step is bound by launch overhead, not by rows, so filler rows
    cost little there; they do take their share of the (eager) prefill and of the KV
    cache: 17 prompts run as 64 rows.

    Args:
        count: Prompts in the batch (``1 <= count <= max_batch_size``).
        max_batch_size: The policy's largest batch.

    Returns:
        ``min(max(4, 4 ** ceil(log4(count))), max_batch_size)``.
    """
    rows = DECODE_ROW_GROWTH
    while rows < count:
        rows *= DECODE_ROW_GROWTH
    return min(rows, max_batch_size)


def static_cache_length(prompt_width: int, max_new_tokens: int) -> int:
    """Positions a static KV cache needs, rounded up to a power of two (at least 512).

    Calls of different prompt widths then share one cache shape and replay the same
    recorded decode step. Powers of two give few shapes over a whole run: the code
    executor's prompts of a MathChat reproduction run (histories up to ~2,000 tokens,
    256 new ones) need 4 cache lengths, against 7 in steps of 256. The price is up to
    twice the positions of the cache (memory, and attention over masked positions).

    Args:
        prompt_width: Positions of the (left-padded) prompts.
        max_new_tokens: Most tokens the call may generate.

    Returns:
        The smallest power of two ``>= max(prompt_width + max_new_tokens, 512)``.
    """
    needed = max(prompt_width + max_new_tokens, MIN_CACHE_LENGTH)
    return 1 << (needed - 1).bit_length()


def _torch() -> Any:
    return require("torch", "agents", purpose="running local models (HFPolicy)")


def _transformers() -> Any:
    return require("transformers", "agents", purpose="running local models (HFPolicy)")


def resolve_device(device: str) -> str:
    """``"auto"`` becomes ``"cuda"`` when a GPU is visible, else ``"cpu"``.

    Args:
        device: ``"auto"`` or a torch device string.

    Returns:
        A torch device string.
    """
    if device != "auto":
        return device
    return "cuda" if _torch().cuda.is_available() else "cpu"


def pick_next_ids(
    scores: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The next id of each row, chosen from its logits as ``generate`` chooses it.

    For a row's logits ``s`` over the vocabulary:

    - greedy (``temperature == 0``): ``argmax_v s[v]``;
    - else ``s' = s / temperature``; with ``top_k > 0``, entries of ``s'`` below its
      ``top_k``-th largest become ``-inf``; with ``top_p < 1``, so do the smallest
      entries whose probabilities under ``softmax(s')`` sum to at most ``1 - top_p``
      (the largest entry always stays); the id is then drawn as
      ``torch.multinomial(softmax(s'), 1)``.

    The steps are transformers' own warpers (``TemperatureLogitsWarper``,
    ``TopKLogitsWarper``, ``TopPLogitsWarper``) in ``generate``'s order, so from the same
    logits and random generator state this draws what ``generate`` draws.

    Args:
        scores: ``rows x vocab`` float32 logits (left unchanged).
        params: The call's sampling settings.
        generator: Draw from this generator (a seeded call's own, on the scores'
            device) instead of torch's default one.

    Returns:
        ``rows`` chosen ids.
    """
    torch = _torch()
    if params.greedy:
        return scores.argmax(dim=-1)
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(float(params.temperature))(None, scores)
    if params.top_k > 0:
        scores = TopKLogitsWarper(top_k=params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(top_p=params.top_p)(None, scores)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]


def takes_generator(pick: Callable[..., Any]) -> bool:
    """Whether ``pick`` names a ``generator`` parameter (as :func:`pick_next_ids` does).

    A ``**kwargs`` pick does not count: it may take the keyword and draw from torch's
    default generator anyway, and a seeded call would then not repeat.
    """
    try:
        parameters = inspect.signature(pick).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature cannot be read
        return False
    return any(
        parameter.name == "generator" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
        for parameter in parameters
    )


class _SampledLogprobRecorder:
    """A logits processor that records the raw-model log-probability of each sampled id.

    ``generate`` calls processors with the raw logits of step ``t`` and the ids up to
    step ``t - 1``, so each call scores the id chosen at the previous step under the
    distribution kept from that step; the last step's id is scored by :meth:`finish`.
    Memory stays at one ``batch x vocab`` row (keeping every step's logits would not).
    The policy gives ``generate`` a config without other logits processors, so the
    logits seen here are the model's own.
    """

    def __init__(self) -> None:
        self._previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._score_last(input_ids[:, -1])
        self._previous = _torch().log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Score the final step and return ``batch x steps`` logprobs."""
        self._score_last(sequences[:, -1])
        torch = _torch()
        if not self.steps:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.steps, dim=1).cpu()

    def _score_last(self, chosen: torch.Tensor) -> None:
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, chosen[:, None].long())[:, 0])
            self._previous = None


class HFPolicy:
    """A transformers causal LM as a :class:`~mappa_agents.policy.Policy`.

    Generation is batched with left padding and the model's chat template; a seeded
    call (``SamplingParams.seed``) is reproducible for the same batch on the same
    device; temperature 0 decodes greedily. The generate calls of all HFPolicy objects
    in the process run one at a time, because sampling uses torch's process-global
    random generator (concurrent calls would make seeded results depend on thread
    timing); :meth:`agenerate` runs :meth:`generate` in a worker thread.

    Args:
        model: An HF model id, a local directory, or a loaded ``PreTrainedModel``
            (then ``tokenizer`` is required and the model is used as it is unless
            ``device``/``dtype`` ask otherwise).
        tokenizer: A tokenizer, or an id/path to load one from (default: ``model``).
        device: ``"auto"`` (CUDA when present, else CPU) or a torch device string.
        dtype: ``"auto"`` (bfloat16 on CUDA, float32 on CPU), a name such as
            ``"bfloat16"``, or a ``torch.dtype``.
        name: Label of the policy (default: the model's name or path).
        chat_template_kwargs: Extra variables for the chat template, e.g.
            ``{"enable_thinking": False}`` for Qwen3.
        max_batch_size: Largest number of prompts run through ``generate`` at once;
            bigger batches are split (prompts of similar length are grouped).
        adapter: Name of the LoRA adapter of a peft model to generate with; it is made
            active for each call (see :mod:`mappa_agents.lora`: agents sharing one base).
        compile_decode: Decode through a :class:`~mappa_agents.graph_decode.GraphDecoder`:
            the model's decode step over a static KV cache, recorded by mappa as a CUDA
            graph per batch shape and replayed (no compiler), each id picked between
            replays as ``generate`` picks it (:func:`pick_next_ids`) and stop strings
            checked there too. Decoding in eager mode is bound by Python and kernel
            launches, not by the GPU; graphs remove most of that. Each new (rows,
            cache length) shape is recorded at its first call (a few eager warm-up
            steps, then the recording), so batches are padded to a power of four from
            4 (filler rows end before their first id and are discarded) and caches
            sized in powers of two (:func:`decode_batch_rows`,
            :func:`static_cache_length`). The decoder is made at the first call, on
            the policy's own thread, where every call of such a policy runs. Weights
            may change in place between calls (optimizer steps do); replacing
            parameter tensors needs a new policy. A model the decoder cannot decode
            (another attention implementation than ``sdpa`` or ``eager``, or layers
            with a sliding window: :func:`~mappa_agents.graph_decode.unsupported_reason`)
            decodes through ``generate`` instead, a warning says why, and
            :attr:`compile_decode` reads ``False``. Not with ``adapter``. On CPU the
            same steps run eagerly, without graphs (a warning says so). Fixed when the
            policy is built.
        **model_kwargs: Passed to ``AutoModelForCausalLM.from_pretrained`` (e.g.
            ``attn_implementation``, ``trust_remote_code``).

    Attributes:
        name: Label of the policy.
        model: The causal LM (``None`` after :meth:`close`).
        tokenizer: Its tokenizer.
        device: Device of the model's weights, e.g. ``"cpu"`` or ``"cuda:0"``.
        dtype: ``torch.dtype`` of the model's weights.
        eos_token_ids: Ids that end a response (the model's generation config and the
            tokenizer's EOS).
        pad_token_id: Id used for left padding (the tokenizer's pad, else the first EOS).
        pick: How ``compile_decode`` chooses each id from a step's ``rows x vocab``
            float32 logits and the call's :class:`~mappa_agents.policy.SamplingParams`
            (default :func:`pick_next_ids`, as ``generate`` chooses), and a
            ``generator`` keyword where it takes one (see ``decodes_beside_others``).
            Replacing it changes sampling only: log-probs stay the model's, taken
            before the pick.
        decodes_beside_others: Whether a call may run while other policies' calls run
            (:mod:`mappa_agents.generation_lock`; default: with ``compile_decode`` on
            CUDA, where a call mostly waits on its graphs' replays). A seeded call then
            samples from a generator of its own, seeded with the call's seed (the same
            draws as torch's default generator after ``torch.manual_seed``), which
            :attr:`pick` must accept as ``generator``; otherwise it reseeds the
            process's generator and runs alone. Calls on one model take turns. Eager
            decoding switches process-wide attention settings per call, so it never runs
            beside another call.

    Raises:
        MissingExtraError: If torch or transformers is not installed.
        ValueError: If a model object is given without a tokenizer, or the tokenizer
            has no chat template.
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
        *,
        device: str = "auto",
        dtype: Any = "auto",
        name: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_batch_size: int = 16,
        adapter: str | None = None,
        compile_decode: bool = False,
        **model_kwargs: Any,
    ) -> None:
        torch = _torch()
        transformers = _transformers()
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if compile_decode and adapter is not None:
            # A recorded graph replays the adapter that was active when it was recorded;
            # policies sharing one base switch adapters at every call.
            raise ValueError(
                "compile_decode does not work with a LoRA adapter: leave compile_decode off "
                "for policies sharing one base model"
            )
        self.max_batch_size = max_batch_size
        self._compile_decode = compile_decode
        # The policy's own generation thread, for the whole of its life. Every call of a
        # compile_decode policy runs on it, so its GraphDecoder is made, records and
        # replays there; eager calls from an event loop (`agenerate`) run on it too: a
        # rollout's loop would otherwise start new executor threads every step, and
        # per-thread state (cuDNN's attention plans, allocator caches) would start cold
        # each time (with cuDNN's attention, a generate call took 6.7 s on a new thread
        # against 2.3 s on one that had generated, on one H100).
        self._decode_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="mappa-decode"
        )
        self._decoder: GraphDecoder | None = None
        self._closing = False
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.adapter = adapter
        self.pick: Callable[[torch.Tensor, SamplingParams], torch.Tensor] = pick_next_ids
        self.decodes_beside_others = False

        if isinstance(model, (str, Path)):
            source = str(model)
            self.device = resolve_device(device)
            self.dtype = resolve_dtype(dtype, self.device)
            started = time.perf_counter()
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                source, dtype=self.dtype, **model_kwargs
            ).to(self.device)
            logger.info(
                "loaded %s (%s, %s) in %.1f s",
                source,
                self.dtype,
                self.device,
                time.perf_counter() - started,
            )
            tokenizer = source if tokenizer is None else tokenizer
        else:
            if tokenizer is None:
                raise ValueError("a tokenizer is required when a model object is given")
            source = str(getattr(model, "name_or_path", "") or type(model).__name__)
            self.model = model
            if device != "auto":
                self.model = self.model.to(device)
            if dtype != "auto":
                self.model = self.model.to(resolve_dtype(dtype, device))
        first_weight = next(self.model.parameters())
        self.device = str(first_weight.device)
        self.dtype = first_weight.dtype
        self.model.eval()

        if isinstance(tokenizer, (str, Path)):
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {source!r} has no chat template")
        self.name = name or source

        self.eos_token_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_ids[0]
        self._torch = torch
        self._transformers = transformers
        unsupported = unsupported_reason(self.model) if compile_decode else None
        if unsupported is not None:
            logger.warning("compile_decode is off for %s: %s", self.name, unsupported)
            self._compile_decode = False
        elif compile_decode and self.device == "cpu":
            logger.warning(
                "compile_decode on the CPU: CUDA graphs need a CUDA device, so this policy "
                "runs the same decode steps eagerly over a static KV cache, without CUDA "
                "graphs"
            )
        self.decodes_beside_others = self._compile_decode and self.device.startswith("cuda")

    @property
    def compile_decode(self) -> bool:
        """Whether decoding uses CUDA graphs (see the class arguments); fixed at build."""
        return self._compile_decode

    # ----------------------------------------------------------------- public API

    def generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        """Generate one response per prompt (see :class:`~mappa_agents.policy.Policy`).

        Args:
            batch: Prompts, each a sequence of chat messages.
            params: Sampling settings.

        Returns:
            One :class:`~mappa_agents.policy.Generation` per prompt, in order.

        Raises:
            RuntimeError: If the policy was closed.
        """
        if self.model is None or self._closing:
            raise self._closed_error()
        if not self._compile_decode:
            # In the caller's thread: a Ctrl-C there stops the call at once.
            return self._generate(batch, params)
        future = self._submit(batch, params)
        try:
            return future.result()
        except concurrent.futures.CancelledError:  # close() dropped the queued call
            raise self._closed_error() from None

    async def agenerate(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        """:meth:`generate` on the policy's own thread, so the loop keeps running."""
        if self.model is None or self._closing:
            raise self._closed_error()
        future = self._submit(batch, params)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancelled() and self._closing:  # dropped by close()
                raise self._closed_error() from None
            raise  # the awaiting task itself was cancelled

    def _submit(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> concurrent.futures.Future[list[Generation]]:
        """Queue a call on the policy's generation thread."""
        try:
            return self._decode_executor.submit(self._generate_on_decode_thread, batch, params)
        except RuntimeError:  # the executor was shut down by close()
            raise self._closed_error() from None

    def _generate_on_decode_thread(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        if not self._compile_decode:
            # `generate` itself, on this thread: `agenerate` stays `generate` off the loop
            # (what wraps or replaces an instance's `generate` sees the rollout's calls).
            return self.generate(batch, params)
        return self._generate(batch, params)

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"policy {self.name!r} is closed")

    def _generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        prompts = batch_prompt_ids(self.prompt_ids, normalize_batch(batch))
        if not prompts:
            return []
        # Group prompts of similar length to waste less compute on padding; the order
        # is deterministic, so seeded calls stay reproducible.
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        results: list[Generation | None] = [None] * len(prompts)
        torch = self._torch
        # A call that reseeds the process's generator runs alone; the others hold the
        # lock shared (an unseeded draw would land inside another call's seeded draws).
        shares = (
            self.decodes_beside_others
            and self._compile_decode
            and (params.seed is None or takes_generator(self.pick))
        )
        reseeds = params.seed is not None and not shares
        with GENERATION_LOCK.hold(self.model, exclusive=not shares):
            model = self.model
            if model is None:  # closed while this call waited for the lock
                raise self._closed_error()
            devices = [model.device] if model.device.type == "cuda" else []
            generator = None
            if params.seed is not None and shares:
                generator = torch.Generator(device=model.device)
                generator.manual_seed(params.seed)
            with torch.random.fork_rng(devices=devices, enabled=reseeds):
                if reseeds:
                    torch.manual_seed(params.seed)
                if self.adapter is not None:
                    # Policies sharing one base model take turns under the lock: switch
                    # to this agent's adapter for the whole call.
                    model.set_adapter(self.adapter)
                for start in range(0, len(order), self.max_batch_size):
                    chunk = order[start : start + self.max_batch_size]
                    generations = self._generate_chunk(
                        [prompts[i] for i in chunk], params, generator
                    )
                    for index, generation in zip(chunk, generations):
                        results[index] = generation
        return [g for g in results if g is not None]

    def prompt_ids(self, messages: ChatMessages) -> list[int]:
        """The exact ids of a prompt: chat template with the generation prompt, tokenised.

        Args:
            messages: Chat messages.

        Returns:
            Token ids (the template's own special tokens included, none added twice).
        """
        return chat_prompt_ids(self.tokenizer, messages, self.chat_template_kwargs)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens and without whitespace clean-up."""
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def close(self) -> None:
        """Drop the model; frees GPU memory once no one else holds it.

        A running generate call finishes first; calls still queued on the policy's
        generation thread raise the closed error.
        """
        self._closing = True
        # Not waiting for the thread: its running call needs the lock taken below.
        self._decode_executor.shutdown(wait=False, cancel_futures=True)
        with GENERATION_LOCK.hold(self.model, exclusive=True):
            on_cuda = str(self.device).startswith("cuda")
            self.model = None  # type: ignore[assignment]
            self._decoder = None  # it holds the model, its KV caches and graphs
            if on_cuda:
                self._torch.cuda.empty_cache()

    # ----------------------------------------------------------------- internals

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            values = source if isinstance(source, (list, tuple)) else [source]
            ids += [int(v) for v in values if v is not None and int(v) not in ids]
        if not ids:
            raise ValueError("neither the model nor the tokenizer defines an EOS token")
        return ids

    def _generation_config(self, params: SamplingParams) -> Any:
        sampling: dict[str, Any] = {}
        if not params.greedy:
            # Explicit values, top_k=0 included: generate() fills unset ones from global
            # defaults (top_k=50) and the model's generation config (Qwen3: top_p=0.95).
            sampling = {"temperature": params.temperature, "top_p": params.top_p}
            sampling["top_k"] = params.top_k
        config = self._transformers.GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            repetition_penalty=1.0,
            num_beams=1,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            **sampling,
        )
        if params.stop:
            config.stop_strings = list(params.stop)
        return config

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        torch = self._torch
        width = max(len(p) for p in prompts)
        rows = len(prompts)
        if self._compile_decode:
            # Filler rows (copies of the first prompt) keep the batch on a recorded shape.
            rows = decode_batch_rows(len(prompts), self.max_batch_size)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, width), dtype=torch.long)
        for row in range(rows):
            ids = prompts[row] if row < len(prompts) else prompts[0]
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        started = time.perf_counter()
        # Each row's length where the decoding knows it (a stop it cut at may not show
        # in the text, and padding after it is no part of the response).
        lengths: list[int] | None = None
        if self._compile_decode:
            new_tokens, logprobs, lengths = self._decode_with_graphs(
                input_ids, attention_mask, len(prompts), params, generator
            )
        else:
            new_tokens, logprobs = self._decode_with_generate(input_ids, attention_mask, params)
        elapsed = time.perf_counter() - started
        if logprobs.shape != new_tokens.shape or new_tokens.shape[0] != rows:
            raise RuntimeError(
                f"recorded {tuple(logprobs.shape)} logprobs for {tuple(new_tokens.shape)} "
                f"generated tokens of {rows} rows; another logits processor or decoding "
                "mode is interfering"
            )
        info = {
            "model": self.name,
            "batch_size": len(prompts),
            "decode_rows": rows,
            "latency_s": elapsed,
        }
        kept = lengths or [new_tokens.shape[1]] * rows
        return [
            self.finish_generation(
                prompt,
                new_tokens[row, : kept[row]].tolist(),
                logprobs[row, : kept[row]].tolist(),
                params,
                dict(info),
            )
            for row, prompt in enumerate(prompts)
        ]

    def _decode_with_generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eager decoding through ``model.generate``: ``(new ids, logprobs)`` on the CPU."""
        torch = self._torch
        recorder = _SampledLogprobRecorder()
        extra: dict[str, Any] = {"tokenizer": self.tokenizer} if params.stop else {}
        # The model's own generation config could add processors (repetition penalty,
        # min_p, ...) that generate() merges in; swap in a bare one for this call.
        saved_config = self.model.generation_config
        self.model.generation_config = self._transformers.GenerationConfig(
            eos_token_id=self.eos_token_ids, pad_token_id=self.pad_token_id
        )
        try:
            attention = decode_attention(self.model.device.type, static_cache=False)
            with torch.inference_mode(), attention:
                output = self.model.generate(
                    input_ids=input_ids.to(self.model.device),
                    attention_mask=attention_mask.to(self.model.device),
                    generation_config=self._generation_config(params),
                    logits_processor=self._transformers.LogitsProcessorList([recorder]),
                    **extra,
                )
        finally:
            self.model.generation_config = saved_config
        new_tokens = output.sequences[:, input_ids.shape[1] :].cpu()
        return new_tokens, recorder.finish(output.sequences)

    def _decode_with_graphs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompts: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """``compile_decode``: decoding through the policy's :class:`GraphDecoder`.

        Rows from ``prompts`` on are filler, ended before their first id; ``generator``
        (a seeded call's own) goes to :attr:`pick`. Returns
        ``(new ids, logprobs, lengths)``, the ids and logprobs on the CPU (see
        :meth:`GraphDecoder.decode`).
        """
        torch = self._torch
        if self._decoder is None:
            # Once per policy, on its own thread (every compile_decode call runs there).
            self._decoder = GraphDecoder(self.model)
        decoder = self._decoder
        rows, width = input_ids.shape
        stopped = None
        if params.stop:
            from transformers.generation.stopping_criteria import StopStringCriteria

            criteria = StopStringCriteria(self.tokenizer, list(params.stop))

            def stopped(generated: torch.Tensor) -> torch.Tensor:
                return criteria(generated, None)

        return decoder.decode(
            input_ids.to(decoder.device),
            attention_mask.to(decoder.device),
            max_new_tokens=params.max_new_tokens,
            cache_length=static_cache_length(width, params.max_new_tokens),
            pick=(
                functools.partial(self.pick, params=params)
                if generator is None
                else functools.partial(self.pick, params=params, generator=generator)
            ),
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            ended=torch.arange(rows) >= prompts,
            stopped=stopped,
        )

    def finish_generation(
        self,
        prompt_ids: list[int],
        generated_ids: list[int],
        logprobs: list[float],
        params: SamplingParams,
        info: dict[str, Any] | None = None,
    ) -> Generation:
        """Turn one decoded row (``generate``'s or the graph decoder's) into a :class:`Generation`.

        Cuts at the first EOS (kept) and at the first stop string (ids up to the token
        that completed it, text before it), drops the padding after the end, and splits
        off reasoning.

        Args:
            prompt_ids: The prompt's ids (unpadded).
            generated_ids: The ids decoded for this row (padding included).
            logprobs: One logprob per generated id.
            params: The sampling settings used.
            info: Backend details to attach.

        Returns:
            The generation.
        """
        end = len(generated_ids)
        finish_reason = "length"
        eos = set(self.eos_token_ids)
        for position, token in enumerate(generated_ids):
            if token in eos:
                end, finish_reason = position + 1, "stop"
                break
        ids = generated_ids[:end]
        text = self.decode(ids)
        if params.stop and find_stop(text, params.stop) is not None:
            end = self._stop_end(ids, params.stop)
            ids = ids[:end]
            text = self.decode(ids)
            text = text[: find_stop(text, params.stop)]
            finish_reason = "stop"
        elif finish_reason == "length" and len(ids) < params.max_new_tokens:
            # Decoding stopped this row early (its token-level stop-string check) though
            # the decoded text shows no stop string: still a stop, not a length cut.
            finish_reason = "stop"
        answer, reasoning = split_reasoning(text)
        return Generation(
            text=answer,
            reasoning=reasoning,
            prompt_ids=list(prompt_ids),
            response_ids=list(ids),
            logprobs=[float(x) for x in logprobs[: len(ids)]],
            finish_reason=finish_reason,  # type: ignore[arg-type]
            info=info or {},
        )

    def _stop_end(self, ids: list[int], stops: Sequence[str]) -> int:
        """Smallest prefix length of ``ids`` whose text contains a stop string."""
        low, high = 1, len(ids)
        while low < high:
            middle = (low + high) // 2
            if find_stop(self.decode(ids[:middle]), stops) is None:
                low = middle + 1
            else:
                high = middle
        return high
