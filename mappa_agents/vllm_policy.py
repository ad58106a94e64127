"""A policy backed by an in-process vLLM engine (the ``vllm`` extra).

Prompts are rendered with the model's chat template and tokenised here, then handed to
``vllm.LLM.generate`` as token ids, so the prompt ids of every generation are exactly
what the engine ran. Response ids and the logprob of each sampled id come from vLLM's
``RequestOutput`` (``logprobs=0`` makes vLLM report the sampled token's logprob and no
other; vLLM's default ``logprobs_mode="raw_logprobs"`` is the raw model distribution, as
documented on :class:`~mappa_agents.policy.Generation`).

With ``async_engine=True`` the policy runs vLLM's async engine instead (``AsyncLLMEngine``,
the engine core in a process of its own) on a private event loop, and is a
:class:`~mappa_agents.policy.RequestPolicy`: :meth:`VLLMPolicy.agenerate_one` adds one
request to the engine's running batch and returns when its reply ends, without the
process-wide lock of the in-process engine, so several agents' engines decode at once.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mappa_agents.policy import (
    ChatMessages,
    Generation,
    SamplingParams,
    batch_prompt_ids,
    chat_prompt_ids,
    generate_in_thread,
    normalize_batch,
    normalize_finish_reason,
    optional_sampling_fields,
    split_reasoning,
)
from mappa_env._async import BackgroundLoop
from mappa_env._optional import require

logger = logging.getLogger(__name__)


# One lock for every in-process engine, not one per engine: an engine is not safe to
# call from several threads, and engines of one process share vLLM's module-level state
# (the forward context its attention layers read during a step, the current config), so
# two engines stepping at once in two threads (agents of one run, each generating in
# its own worker thread) would read each other's batch metadata.
_ENGINES_LOCK = threading.Lock()


def sampling_kwargs(params: SamplingParams, index: int = 0) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt.

    Args:
        params: Sampling settings.
        index: Position of the prompt in its batch: a seeded batch gives prompt ``i``
            the seed ``seed + i``, so identical prompts still get different samples.

    Returns:
        The arguments (top-k is left at vLLM's "off" default when ``top_k == 0``).
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        # 0: the sampled token's logprob only. 1 would also have the engine find, detokenise
        # and return the most likely token at every position, which nothing here reads.
        "logprobs": 0,
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
    }
    kwargs.update(optional_sampling_fields(params, index))
    return kwargs


def require_vllm() -> Any:
    """The ``vllm`` module, or ``MissingExtraError`` naming the extra to install."""
    return require("vllm", "vllm", purpose="the in-process vLLM policy (VLLMPolicy)")


class VLLMPolicy:
    """An in-process ``vllm.LLM`` as a :class:`~mappa_agents.policy.Policy`.

    Args:
        model: HF model id or local directory.
        name: Label of the policy (default: ``model``).
        chat_template_kwargs: Extra variables for the chat template, e.g.
            ``{"enable_thinking": False}``.
        async_engine: Run vLLM's async engine (``vllm.AsyncLLMEngine``) instead of
            ``vllm.LLM``: requests join its running batch one by one
            (:meth:`agenerate_one`, the runner's ``"episodes"`` schedule).
        **llm_kwargs: Passed to ``vllm.LLM`` or ``vllm.AsyncEngineArgs`` (``dtype``,
            ``gpu_memory_utilization``, ``max_model_len``, ``tensor_parallel_size``,
            ``enforce_eager``, ...).

    Raises:
        MissingExtraError: If vLLM is not installed.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        name: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        async_engine: bool = False,
        **llm_kwargs: Any,
    ) -> None:
        self._vllm = require_vllm()
        self.name = name or str(model)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.continuous_batching = bool(async_engine)
        self._loop: BackgroundLoop | None = None
        if async_engine:
            # The engine binds its output handler to the loop it starts on: one loop of
            # its own keeps it usable from every run's loop and from synchronous code.
            self._loop = BackgroundLoop(name=f"vllm-{self.name}")
            self.llm, self.tokenizer = self._loop.run(self._start_async(str(model), llm_kwargs))
        else:
            self.llm = self._vllm.LLM(model=str(model), **llm_kwargs)
            self.tokenizer = self.llm.get_tokenizer()
        self._lock = _ENGINES_LOCK
        self._request_ids = itertools.count()

    async def _start_async(self, model: str, llm_kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """The async engine and its tokenizer, made on the policy's own loop."""
        args = self._vllm.AsyncEngineArgs(model=model, **llm_kwargs)
        engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        tokenizer = engine.get_tokenizer()  # a coroutine in some vLLM releases
        return engine, (await tokenizer if inspect.isawaitable(tokenizer) else tokenizer)

    def prompt_ids(self, messages: ChatMessages) -> list[int]:
        """The exact ids of a prompt: chat template with the generation prompt, tokenised."""
        return chat_prompt_ids(self.tokenizer, messages, self.chat_template_kwargs)

    def generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        """Generate one response per prompt (see :class:`~mappa_agents.policy.Policy`).

        Args:
            batch: Prompts, each a sequence of chat messages.
            params: Sampling settings.

        Returns:
            One generation per prompt, in order.
        """
        self._engine()  # a closed policy says so before any work
        prompts = batch_prompt_ids(self.prompt_ids, normalize_batch(batch))
        if not prompts:
            return []
        requests = [{"prompt_token_ids": ids} for ids in prompts]
        sampling = self._sampling(params, len(prompts))
        if self._loop is not None:
            return self._loop.run(self._agenerate_all(prompts, sampling))
        with self._lock:
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return [self._to_generation(output) for output in outputs]

    def _sampling(self, params: SamplingParams, count: int) -> Any:
        """The sampling settings the engine gets for a batch of ``count`` prompts.

        Unseeded, one ``vllm.SamplingParams`` serves the whole batch; seeded, prompt ``i``
        needs its own for the seed ``seed + i`` (see :func:`sampling_kwargs`).
        """
        if params.seed is None:
            return self._vllm.SamplingParams(**sampling_kwargs(params))
        shared = sampling_kwargs(params)
        return [
            self._vllm.SamplingParams(**{**shared, "seed": params.seed + i}) for i in range(count)
        ]

    async def agenerate(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        """:meth:`generate` in a worker thread, so an event loop keeps running."""
        return await generate_in_thread(self, batch, params)

    async def agenerate_one(self, messages: ChatMessages, params: SamplingParams) -> Generation:
        """One prompt into the async engine's running batch.

        See :class:`~mappa_agents.policy.RequestPolicy`. Without ``async_engine`` it is
        a batch of one through :meth:`agenerate`.

        Args:
            messages: The prompt's chat messages.
            params: Sampling settings; a seed is sent only when ``params`` has one (the
                runner's ``"episodes"`` schedule sends none).

        Returns:
            The generation.
        """
        if self._loop is None:
            return (await self.agenerate([messages], params))[0]
        self._engine()
        (prompt,) = normalize_batch([messages])
        sampling = self._vllm.SamplingParams(**sampling_kwargs(params))
        return await self._loop.arun(self._agenerate_ids(self.prompt_ids(prompt), sampling))

    async def _agenerate_all(self, prompts: list[list[int]], sampling: Any) -> list[Generation]:
        """A batch through the async engine: every prompt its own request, all at once."""
        each = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        return list(await asyncio.gather(*map(self._agenerate_ids, prompts, each)))

    async def _agenerate_ids(self, prompt_ids: list[int], sampling: Any) -> Generation:
        """One request through the async engine, on its loop: its final output."""
        final = None
        request_id = f"{self.name}-{next(self._request_ids)}"
        async for output in self._engine().generate(
            {"prompt_token_ids": prompt_ids}, sampling, request_id
        ):
            final = output
        if final is None:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        return self._to_generation(final)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Put new weights into the engine in place, e.g. after an optimizer step.

        Through the workers' ``reload_weights`` (vLLM's in-place reload, which also
        redoes the backend's processing of loaded weights), then the prefix cache is
        reset: cached prompt prefixes hold keys and values of the old weights. Calls
        to :meth:`generate` wait until the new weights are in.

        Args:
            weights: ``(name, tensor)`` pairs as a transformers model's
                ``named_parameters()`` gives them; vLLM maps the names to its own
                layout (fused q/k/v, gate/up).

        Raises:
            RuntimeError: The installed vLLM's workers have no ``reload_weights`` (this
                was checked with vLLM 0.26 on a GPU and 0.32 on CPU).
        """
        named = list(weights)
        with self._lock:
            engine = self._engine()
            try:
                self._wait(
                    engine.collective_rpc("reload_weights", kwargs={"weights_iterator": named})
                )
            # vLLM 0.32 reports a worker method it lacks as NotImplementedError; a
            # plain getattr (older releases) as AttributeError. Errors from inside the
            # reload itself are not about a missing method: they pass unchanged.
            except (NotImplementedError, AttributeError) as error:
                if "reload_weights" not in str(error):
                    raise
                raise RuntimeError(
                    f"vLLM {getattr(self._vllm, '__version__', '?')} cannot reload weights "
                    "in place (its workers have no reload_weights); install a vLLM that "
                    "does (0.26 and 0.32 were tested) to train with vLLM rollouts"
                ) from error
            self._wait(engine.reset_prefix_cache())

    def _wait(self, result: Any) -> Any:
        """``result``, awaited on the engine's loop when the async engine returned a coroutine."""
        if self._loop is not None and inspect.isawaitable(result):
            return self._loop.run(_awaited(result))
        return result

    def _engine(self) -> Any:
        """The ``vllm.LLM``; a closed policy raises ``RuntimeError``."""
        if self.llm is None:
            raise RuntimeError(f"policy {self.name!r} is closed: its vLLM engine was dropped")
        return self.llm

    def close(self) -> None:
        """Drop the engine (its memory is freed once nothing else holds it)."""
        with self._lock:
            engine, self.llm = self.llm, None
        if self._loop is not None:
            if engine is not None:
                engine.shutdown()  # stops the engine core's process
            self._loop.close()

    def _to_generation(self, output: Any) -> Generation:
        completion = output.outputs[0]
        response_ids = list(map(int, completion.token_ids))
        logprobs = [
            float(position[token].logprob)
            for position, token in zip(completion.logprobs or [], response_ids)
        ]
        text, reasoning = split_reasoning(completion.text)
        return Generation(
            text=text,
            reasoning=reasoning,
            prompt_ids=[int(t) for t in output.prompt_token_ids],
            response_ids=response_ids,
            logprobs=logprobs,
            finish_reason=normalize_finish_reason(completion.finish_reason),
            info={
                "model": self.name,
                "raw_finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason,
            },
        )


async def _awaited(result: Any) -> Any:
    """Await ``result`` (a coroutine handed over to another loop must be one)."""
    return await result
