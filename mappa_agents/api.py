"""A policy backed by any chat model litellm can reach: hosted APIs or a local server.

Use it to benchmark hosted models as agents, or to drive an OpenAI-compatible server
(``vllm serve``, llama.cpp, ...) through ``api_base``. Prompts of a batch are sent
concurrently under a concurrency limit. Text, finish reason, token usage and cost are
always recorded; token ids and logprobs only when the server returns them:

- ``request_logprobs=True`` asks for OpenAI-style logprobs of the sampled tokens;
- ``request_token_ids=True`` asks a vLLM server for the exact prompt and response ids
  (``return_token_ids``, ``return_tokens_as_token_ids``) and logprobs. Only then can the
  generations be trained on (:attr:`~mappa_agents.policy.Generation.trainable`).

All calls of one policy run on one private event loop in a daemon thread (started
afresh after ``close`` and in a forked child), so the blocking
:meth:`LiteLLMPolicy.generate` also works inside a running event loop, and litellm's
loop-bound HTTP clients live as long as the policy. litellm is imported on the first
call.

Only errors a later call may not meet (rate limits, timeouts, dropped connections, 5xx)
are retried. One that every call would meet (a missing or rejected key, an unknown
model, a request the server calls malformed) raises
:class:`~mappa_env.api_errors.ApiSetupError` at once, with one line naming the fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from mappa_agents.policy import (
    ChatMessages,
    Generation,
    GenerationError,
    SamplingParams,
    normalize_batch,
    normalize_finish_reason,
    optional_sampling_fields,
    split_reasoning,
)
from mappa_env._async import BackgroundLoop
from mappa_env._optional import require
from mappa_env.api_errors import ApiSetupError, setup_error, setup_error_message
from mappa_env.coach.llm import backoff_s, is_transient_error

logger = logging.getLogger(__name__)

# vLLM writes each logprob token as "token_id:<id>" when asked for token ids.
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def _import_litellm() -> ModuleType:
    # Without this, litellm downloads a price list when imported.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm", "llm", purpose="API policies (LiteLLMPolicy)")
    # No "Give Feedback / Get Help" banner on every failed call: failures are raised.
    litellm.suppress_debug_info = True
    return litellm


class LiteLLMPolicy:
    """A chat model behind litellm as a :class:`~mappa_agents.policy.Policy`.

    Args:
        model: litellm model name, e.g. ``"openai/gpt-4.1-mini"``,
            ``"gemini/gemini-2.5-flash"``, or ``"openai/<served name>"`` with
            ``api_base`` for an OpenAI-compatible server.
        api_base: Base URL of the server (``None``: the provider's default).
        api_key: API key (``None``: litellm reads the provider's environment variable).
        name: Label of the policy (default: ``model``).
        max_concurrency: Requests in flight at once for this policy.
        request_logprobs: Ask for the logprob of each sampled token.
        request_token_ids: Ask a vLLM server for exact prompt/response ids (and
            logprobs). Other providers reject or ignore these fields.
        chat_template_kwargs: Sent to vLLM servers as ``chat_template_kwargs`` (e.g.
            ``{"enable_thinking": False}``).
        timeout_s: Limit on one request.
        num_retries: Retries of a request after a transient error (rate limit, timeout,
            connection, 5xx); other errors are not retried.
        backoff_initial_s: First retry delay (doubles per retry, plus jitter; a
            server's ``retry-after`` is waited for).
        backoff_max_s: Largest retry delay.
        **litellm_options: Passed to ``litellm.acompletion`` (e.g. ``mock_response``,
            ``reasoning_effort``, ``extra_headers``).

    Raises:
        ValueError: On an empty model name or a bad limit.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        name: str | None = None,
        max_concurrency: int = 16,
        request_logprobs: bool = False,
        request_token_ids: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        timeout_s: float = 600.0,
        num_retries: int = 2,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        **litellm_options: Any,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty litellm model name")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        for label, value in (
            ("num_retries", num_retries),
            ("backoff_initial_s", backoff_initial_s),
            ("backoff_max_s", backoff_max_s),
        ):
            if value < 0:
                raise ValueError(f"{label} must be >= 0, got {value}")
        self.model = model
        self.name = name or model
        self.api_base = api_base
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.request_logprobs = request_logprobs or request_token_ids
        self.request_token_ids = request_token_ids
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.timeout_s = timeout_s
        self.num_retries = num_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.litellm_options = dict(litellm_options)
        self._runner = BackgroundLoop(name=f"policy-{model}")
        # Created on the loop that uses it (see _semaphore_for_this_loop).
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None
        self._litellm: ModuleType | None = None

    # ----------------------------------------------------------------- public API

    def generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        """Send every prompt (concurrently) and wait for all replies.

        Args:
            batch: Prompts, each a sequence of chat messages.
            params: Sampling settings; with a ``seed``, prompt ``i`` is sent with
                ``seed + i`` so identical prompts still get different samples.

        Returns:
            One generation per prompt, in order.

        Raises:
            GenerationError: If any request failed after its retries; it holds the
                generations that succeeded.
            ApiSetupError: If a request failed for a reason no retry fixes (a missing
                or rejected key, an unknown model, an invalid request).
            RuntimeError: If called from inside the policy's own event loop.
        """
        if self._runner.in_loop_thread():
            raise RuntimeError("generate() called from the policy's own loop; use agenerate()")
        return self._runner.run(self._generate_all(normalize_batch(batch), params))

    async def agenerate(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        """Async :meth:`generate`; awaits the work running on the policy's loop."""
        prompts = normalize_batch(batch)
        return await self._runner.arun(self._generate_all(prompts, params))

    def request_kwargs(
        self, messages: list[dict[str, str]], params: SamplingParams, index: int = 0
    ) -> dict[str, Any]:
        """The keyword arguments of ``litellm.acompletion`` for one prompt.

        Args:
            messages: The prompt.
            params: Sampling settings.
            index: Position of the prompt in its batch (offsets the seed).

        Returns:
            The arguments.
        """
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "timeout": self.timeout_s,
            # Retries are ours: litellm's would retry a missing key or an unknown model too.
            "num_retries": 0,
            "max_retries": 0,
        }
        if params.top_p < 1:
            kwargs["top_p"] = params.top_p
        kwargs.update(optional_sampling_fields(params, index))
        if self.api_base is not None:
            kwargs["api_base"] = self.api_base
        if self.api_key is not None:
            kwargs["api_key"] = self.api_key
        if self.request_logprobs:
            kwargs["logprobs"] = True
        extra_body: dict[str, Any] = {}
        if self.request_token_ids:
            extra_body.update(return_token_ids=True, return_tokens_as_token_ids=True)
        if self.chat_template_kwargs:
            extra_body["chat_template_kwargs"] = self.chat_template_kwargs
        if extra_body:
            kwargs["extra_body"] = extra_body
        kwargs.update(self.litellm_options)
        return kwargs

    def close(self) -> None:
        """Stop the policy's event loop thread."""
        self._runner.close()
        self._semaphore = self._semaphore_loop = None

    # ----------------------------------------------------------------- internals

    async def _generate_all(
        self, prompts: list[list[dict[str, str]]], params: SamplingParams
    ) -> list[Generation]:
        semaphore = self._semaphore_for_this_loop()
        if self._litellm is None:
            self._litellm = _import_litellm()
        litellm = self._litellm
        results = await asyncio.gather(
            *(self._generate_one(litellm, semaphore, p, params, i) for i, p in enumerate(prompts)),
            return_exceptions=True,
        )
        errors = [r if isinstance(r, BaseException) else None for r in results]
        for error in errors:
            if isinstance(error, ApiSetupError):
                raise error
        if any(e is not None for e in errors):
            generations = [r if isinstance(r, Generation) else None for r in results]
            for index, error in enumerate(errors):
                if error is not None:
                    logger.warning("%s: prompt %d failed: %r", self.name, index, error)
            raise GenerationError(generations, errors)
        return [r for r in results if isinstance(r, Generation)]

    def _semaphore_for_this_loop(self) -> asyncio.Semaphore:
        # A semaphore binds to the loop it first waits on, and one inherited by a forked
        # child may count permits of requests that will never finish there; so each new
        # loop (after close() or a fork) gets a fresh one. Only the policy's loop thread
        # runs this, so no lock is needed.
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._semaphore_loop = loop
        return self._semaphore

    async def _generate_one(
        self,
        litellm: ModuleType,
        semaphore: asyncio.Semaphore,
        messages: list[dict[str, str]],
        params: SamplingParams,
        index: int,
    ) -> Generation:
        kwargs = self.request_kwargs(messages, params, index)
        attempt = 0
        while True:
            async with semaphore:
                started = time.perf_counter()
                try:
                    response = await litellm.acompletion(**kwargs)
                    break
                except Exception as exc:  # classified: a setup error, a retry, or raised
                    kind = setup_error(exc)
                    if kind is not None:
                        raise ApiSetupError(
                            setup_error_message(
                                exc,
                                kind,
                                who=f"policy {self.name}",
                                model=self.model,
                                api_base=self.api_base,
                                where="the policy spec (api:<model>?api_key=...)",
                            )
                        ) from exc
                    if attempt >= self.num_retries or not is_transient_error(exc):
                        raise
                    failure = exc
            # Outside the semaphore: a waiting retry holds no slot.
            delay = backoff_s(attempt, self.backoff_initial_s, self.backoff_max_s, failure)
            attempt += 1
            logger.warning(
                "%s: transient error on call %d, retrying in %.2fs: %s",
                self.name,
                attempt,
                delay,
                failure,
            )
            await asyncio.sleep(delay)
        latency = time.perf_counter() - started
        generation = parse_response(response)
        generation.info["latency_s"] = latency
        return generation


def _field(obj: Any, name: str) -> Any:
    """An attribute or key of a litellm object or a plain dict (``None`` when absent)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def parse_response(response: Any) -> Generation:
    """Turn a chat completion (litellm ``ModelResponse`` or dict) into a :class:`Generation`.

    Token ids come from vLLM's ``prompt_token_ids`` / ``choices[0].token_ids`` or from
    logprob tokens written as ``token_id:<id>``; they stay empty otherwise.

    Args:
        response: The completion with one choice.

    Returns:
        The generation (``usage``, ``cost_usd`` and ``info`` filled where known).
    """
    choice = _field(response, "choices")[0]
    message = _field(choice, "message")
    content = _field(message, "content") or ""
    text, reasoning = split_reasoning(content)
    provider_reasoning = _field(message, "reasoning_content")
    if provider_reasoning:
        parts = [provider_reasoning] if reasoning is None else [provider_reasoning, reasoning]
        reasoning = "\n".join(parts)

    logprobs: list[float] = []
    logprob_ids: list[int] = []
    content_logprobs = _field(_field(choice, "logprobs"), "content") or []
    for entry in content_logprobs:
        logprobs.append(float(_field(entry, "logprob")))
        match = _TOKEN_ID.match(str(_field(entry, "token") or ""))
        if match:
            logprob_ids.append(int(match.group(1)))
    response_ids = list(_field(choice, "token_ids") or [])
    if not response_ids and len(logprob_ids) == len(logprobs):
        response_ids = logprob_ids
    prompt_ids = list(_field(response, "prompt_token_ids") or [])

    usage_obj = _field(response, "usage")
    usage = None
    if usage_obj is not None:
        usage = {
            "prompt_tokens": int(_field(usage_obj, "prompt_tokens") or 0),
            "completion_tokens": int(_field(usage_obj, "completion_tokens") or 0),
        }
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost")
    raw_finish = _field(choice, "finish_reason")
    return Generation(
        text=text,
        reasoning=reasoning,
        prompt_ids=[int(i) for i in prompt_ids],
        response_ids=[int(i) for i in response_ids],
        logprobs=logprobs,
        finish_reason=normalize_finish_reason(raw_finish),
        usage=usage,
        cost_usd=float(cost) if cost is not None else None,
        info={"model": _field(response, "model"), "raw_finish_reason": raw_finish},
    )
