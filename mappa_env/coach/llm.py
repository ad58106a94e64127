"""The LLM coach: any chat model litellm can reach scores each action from 0 to 10.

Failures never turn into rewards. A transient API error (rate limit, 5xx, timeout,
dropped connection) is retried a bounded number of times with exponential backoff and
jitter inside a per-verdict deadline. One that every call would meet (a missing or
rejected key, an unknown model, a request the server calls malformed) is not retried: it
raises :class:`CoachSetupError`, whose one-line message names the fix, and stops the
command, since no verdict could come. A reply without a usable score gets one
format-correction follow-up. Whatever still fails (an error bound to one request, such
as a prompt past the context window, included) becomes an *invalid* verdict
(``valid=False``, no score, the error recorded, attempts counted) that callers mask out
of training.

All API calls of one coach object run on one private event loop in a daemon thread.
That gives every caller the same concurrency limit and per-minute budgets (whatever
thread or event loop it calls from), keeps litellm's loop-bound HTTP clients on a loop
that lives as long as the coach, and lets the blocking :meth:`LLMCoach.score` work even
inside a running event loop (a notebook cell).

litellm is imported only when the first verdict is requested, so ``import
mappa_env.coach.llm`` and prompt building work without the ``llm`` extra. Retries,
failure causes, budgets and litellm's import live in :mod:`mappa_env.coach.transport`
(their names stay importable from here).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from mappa_env._async import BackgroundLoop
from mappa_env._optional import require
from mappa_env.api_errors import setup_error, setup_error_message
from mappa_env.coach.base import CoachRequest, CoachVerdict
from mappa_env.coach.cache import CachedVerdict, CoachCache, CoachCacheMiss, cache_key
from mappa_env.coach.ledger import CoachLedger, LedgerEntry
from mappa_env.coach.parsing import parse_reply, visible_text
from mappa_env.coach.specs import parse_model_spec, parse_spec_bool
from mappa_env.coach.templates import VERDICT_JSON_SCHEMA, CoachTemplates
from mappa_env.coach.transport import (
    TIMEOUT_GRACE_S,
    CoachSetupError,
    MinuteRateLimiter,
    VerdictBill,
    VerdictFailure,
    backoff_s,
    describe_failure,
    failure_cause,
    from_api_stack,
    import_litellm,
    is_transient_error,
    retry_after_s,
)
from mappa_env.text import truncate_middle

logger = logging.getLogger(__name__)

StructuredOutput = Literal["auto", "json", "text"]
"""How the coach asks for its verdict:

- ``"json"``: ``response_format`` with a JSON schema (analysis, score);
- ``"text"``: analysis then a final ``PROCESS_SCORE: <score>`` line;
- ``"auto"``: ``"json"`` when litellm reports the model supports response schemas.
"""

# Its former private name (the class lives in mappa_env.coach.transport now).
_MinuteRateLimiter = MinuteRateLimiter

__all__ = [
    "CoachSetupError",
    "LLMCoach",
    "StructuredOutput",
    "backoff_s",
    "failure_cause",
    "is_transient_error",
    "retry_after_s",
]


class LLMCoach:
    """A coach backed by any chat model litellm supports.

    Implements the :class:`~mappa_env.coach.base.Coach` protocol. One object may be
    shared by many episodes, threads and event loops; its concurrency limit and rate
    budgets are shared by all of them.

    Args:
        model: litellm model name, e.g. ``"gemini/gemini-2.5-flash"``,
            ``"openai/gpt-4.1-mini"``, or ``"openai/<name>"`` with ``api_base`` for any
            OpenAI-compatible server (vLLM, llama.cpp, ...).
        api_base: Base URL of the server (``None``: the provider's default).
        api_key: API key (``None``: litellm reads the provider's environment variable).
        temperature: Sampling temperature; 0 as in the paper.
        max_tokens: Largest reply. Reasoning models spend thinking tokens from it too.
        timeout_s: Limit on one API call.
        max_retries: Retries of a call after transient errors (so at most
            ``max_retries + 1`` calls per reply).
        deadline_s: Limit on the coach's own work for one verdict, all calls, retries
            and backoff included (time queued behind ``max_concurrency`` or the rate
            budgets does not count).
        max_concurrency: Calls in flight at once, across all users of this object.
        requests_per_minute: Request budget over a sliding minute (``None``: unlimited).
        tokens_per_minute: Token budget (prompt estimate + ``max_tokens`` reserved per
            call, settled with the real usage) over a sliding minute.
        structured_output: See :data:`StructuredOutput`.
        templates: Prompt templates, or a rubric override (``{agent: rubric}`` or
            ``{env_id: {agent: rubric}}``) applied to the default templates.
        cache: A :class:`~mappa_env.coach.cache.CoachCache` or a path to one. Valid
            verdicts are stored; a repeated request returns the stored verdict with
            ``cached=True`` and costs nothing.
        replay: Never call the model: a request missing from the cache raises
            :class:`~mappa_env.coach.cache.CoachCacheMiss`. Needs ``cache``.
        ledger: Where each verdict's tokens, cost, latency and attempts are recorded
            (default: a new :class:`~mappa_env.coach.ledger.CoachLedger`).
        format_retries: Follow-up requests after a reply without a usable score.
        backoff_initial_s: First retry delay (doubles per retry, plus jitter).
        backoff_max_s: Largest retry delay.
        **litellm_options: Passed to ``litellm.acompletion`` (e.g. ``reasoning_effort``,
            ``seed``, ``extra_headers``, ``mock_response``); they enter the cache key.

    Raises:
        ValueError: On an invalid setting.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        timeout_s: float = 120.0,
        max_retries: int = 6,
        deadline_s: float = 600.0,
        max_concurrency: int = 32,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        structured_output: StructuredOutput = "auto",
        templates: CoachTemplates | Mapping[str, Any] | None = None,
        cache: CoachCache | str | Path | None = None,
        replay: bool = False,
        ledger: CoachLedger | None = None,
        format_retries: int = 1,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        **litellm_options: Any,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty litellm model name")
        if structured_output not in ("auto", "json", "text"):
            raise ValueError(
                f"structured_output must be 'auto', 'json' or 'text', got {structured_output!r}"
            )
        for label, value in (
            ("max_tokens", max_tokens),
            ("timeout_s", timeout_s),
            ("deadline_s", deadline_s),
            ("max_concurrency", max_concurrency),
        ):
            if not value > 0:
                raise ValueError(f"{label} must be > 0, got {value}")
        for label, value in (
            ("max_retries", max_retries),
            ("format_retries", format_retries),
            ("backoff_initial_s", backoff_initial_s),
            ("backoff_max_s", backoff_max_s),
        ):
            if value < 0:
                raise ValueError(f"{label} must be >= 0, got {value}")
        for label, value in (
            ("requests_per_minute", requests_per_minute),
            ("tokens_per_minute", tokens_per_minute),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{label} must be > 0 or None, got {value}")
        if replay and cache is None:
            raise ValueError("replay=True needs a cache to replay from")

        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.deadline_s = deadline_s
        self.max_concurrency = max_concurrency
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.structured_output: StructuredOutput = structured_output
        self.format_retries = format_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.replay = replay
        self.litellm_options = dict(litellm_options)
        if isinstance(templates, CoachTemplates):
            self.templates = templates
        elif templates is None:
            self.templates = CoachTemplates()
        else:
            self.templates = CoachTemplates().with_rubrics(templates)
        self._owns_cache = cache is not None and not isinstance(cache, CoachCache)
        self.cache = CoachCache(cache) if self._owns_cache else cache  # type: ignore[arg-type]
        self.ledger = ledger if ledger is not None else CoachLedger()
        self._init_runtime()

    def _init_runtime(self) -> None:
        # Stopped by close(), or when the coach is collected or the interpreter exits.
        self._runner = BackgroundLoop(name=f"coach-{self.model}")
        self._runtime_lock = threading.Lock()
        self._litellm: ModuleType | None = None
        self._structured: bool | None = None
        # Loop-bound primitives are created on the loop that uses them (see _primitives).
        self._primitives_loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._limiter: MinuteRateLimiter | None = None

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_spec(cls, spec: str, **overrides: Any) -> LLMCoach:
        """Build a coach from a string such as ``"llm:gemini/gemini-2.5-flash"``.

        A query suffix sets options: ``"llm:openai/qwen?api_base=http://host:8000/v1&
        temperature=0.2&max_concurrency=8"``. Numbers and booleans are converted;
        ``reasoning_effort``, ``seed``, ``top_p`` and ``api_version`` go to litellm.
        The reply budget and the per-call limit are ``max_tokens`` and ``timeout_s``
        (alias ``timeout``): ``"llm:openai/judge?max_tokens=512&timeout=30"`` (see
        :func:`~mappa_env.coach.make_coach` for how to size them). The query is read by
        :func:`~mappa_env.coach.parse_model_spec`, as ``api:`` policy specs are.

        Args:
            spec: ``"llm:<model>[?key=value&...]"`` (the ``llm:`` prefix is optional).
            **overrides: Keyword arguments that win over the spec's options.

        Returns:
            The coach.

        Raises:
            ValueError: On an empty model or an unknown option.
        """
        model, options = parse_model_spec(
            spec, prefix="llm:", options=_SPEC_OPTIONS, aliases=_SPEC_ALIASES, what="coach"
        )
        options.update(overrides)
        return cls(model, **options)

    # ----------------------------------------------------------------- protocol

    @property
    def name(self) -> str:
        """``"llm:<model>"``."""
        return f"llm:{self.model}"

    def score(self, request: CoachRequest) -> CoachVerdict:
        """Judge one action, blocking until the verdict is ready.

        Safe from any thread, including one running an event loop (the work runs on
        the coach's own loop).

        Args:
            request: The action to judge.

        Returns:
            The verdict (``valid=False`` with ``error`` set when no score was obtained).

        Raises:
            CoachCacheMiss: In replay mode, when the request is not cached.
            CoachSetupError: When the API refuses calls for a reason no retry fixes
                (a missing or rejected key, an unknown model, an invalid request).
        """
        if self._runner.in_loop_thread():
            raise RuntimeError("LLMCoach.score() called from the coach's own loop; await ascore()")
        return self._runner.run(self._judge(request))

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        """Judge one action without blocking the caller's event loop.

        Args:
            request: The action to judge.

        Returns:
            The verdict (``valid=False`` with ``error`` set when no score was obtained).

        Raises:
            CoachCacheMiss: In replay mode, when the request is not cached.
            CoachSetupError: When the API refuses calls for a reason no retry fixes
                (a missing or rejected key, an unknown model, an invalid request).
        """
        return await self._runner.arun(self._judge(request))

    # ----------------------------------------------------------------- public helpers

    def uses_structured_output(self) -> bool:
        """Whether replies are requested as JSON through ``response_format``.

        ``"auto"`` asks litellm (and so imports it) on the first call.
        """
        if self._structured is None:
            if self.structured_output == "auto":
                litellm = self._litellm_module()
                self._structured = bool(litellm.supports_response_schema(model=self.model))
            else:
                self._structured = self.structured_output == "json"
        return self._structured

    def build_messages(self, request: CoachRequest) -> list[dict[str, str]]:
        """The chat messages sent to the model for ``request``."""
        return self.templates.render(request, structured=self.uses_structured_output())

    def request_params(self) -> dict[str, Any]:
        """Sampling and request parameters of every call (they enter the cache key)."""
        params: dict[str, Any] = {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            **self.litellm_options,
        }
        if self.uses_structured_output():
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "coach_verdict",
                    "schema": dict(VERDICT_JSON_SCHEMA),
                    "strict": True,
                },
            }
        return params

    def cache_key(self, request: CoachRequest) -> str:
        """The cache key of ``request`` under this coach's settings."""
        return cache_key(
            self.model, self.build_messages(request), self.request_params(), self.templates.version
        )

    @property
    def stats(self) -> dict[str, Any]:
        """Totals over every verdict so far (``ledger.summary()``)."""
        return self.ledger.summary()

    def close(self) -> None:
        """Stop the coach's event-loop thread and close a cache it opened from a path.

        Calls made later start a new loop; a cache closed here cannot be used again.
        """
        self._runner.close()
        if self._owns_cache and self.cache is not None:
            self.cache.close()

    def __enter__(self) -> LLMCoach:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Threads, loops and loop-bound primitives stay behind; the copy makes its own.
        state = self.__dict__.copy()
        for key in (
            "_runner",
            "_runtime_lock",
            "_litellm",
            "_primitives_loop",
            "_semaphore",
            "_limiter",
        ):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        return (
            f"LLMCoach(model={self.model!r}, api_base={self.api_base!r}, "
            f"max_concurrency={self.max_concurrency}, cache={self.cache!r})"
        )

    # ----------------------------------------------------------------- internals

    def _litellm_module(self) -> ModuleType:
        if self._litellm is None:
            self._litellm = import_litellm()
        return self._litellm

    def _primitives(self) -> tuple[asyncio.Semaphore, MinuteRateLimiter | None]:
        loop = asyncio.get_running_loop()
        with self._runtime_lock:
            if self._primitives_loop is not loop or self._semaphore is None:
                self._semaphore = asyncio.Semaphore(self.max_concurrency)
                self._limiter = None
                if self.requests_per_minute or self.tokens_per_minute:
                    self._limiter = MinuteRateLimiter(
                        self.requests_per_minute, self.tokens_per_minute
                    )
                self._primitives_loop = loop
            return self._semaphore, self._limiter

    async def _judge(self, request: CoachRequest) -> CoachVerdict:
        started = time.perf_counter()
        structured = self.uses_structured_output()
        messages = self.templates.render(request, structured=structured)
        params = self.request_params()
        key = cache_key(self.model, messages, params, self.templates.version)
        version = self.templates.rubric_version(request)

        if self.cache is not None:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                verdict = CoachVerdict(
                    score=hit.score,
                    valid=True,
                    analysis=hit.analysis,
                    coach=self.name,
                    latency_s=time.perf_counter() - started,
                    attempts=0,
                    cached=True,
                    rubric_version=version,
                )
                self._record(request, verdict, None)
                return verdict
            if self.replay:
                raise CoachCacheMiss(
                    f"no cached verdict for agent {request.agent!r} on task "
                    f"{request.task_id!r} (key {key[:16]}); replay mode never calls the model. "
                    "Run once without replay=True to fill the cache."
                )

        bill = VerdictBill(deadline_s=self.deadline_s)
        try:
            score, analysis, reply = await self._converse(messages, params, structured, bill)
        except VerdictFailure as failure:
            verdict = CoachVerdict.invalid(
                failure.message,
                analysis=failure.analysis or failure.message,
                coach=self.name,
                latency_s=time.perf_counter() - started,
                cost_usd=bill.cost_usd,
                prompt_tokens=bill.prompt_tokens,
                completion_tokens=bill.completion_tokens,
                attempts=bill.attempts,
                failure=failure.cause,
                rubric_version=version,
            )
            logger.warning(
                "coach %s: invalid verdict for %s/%s (%s after %d calls): %s",
                self.name,
                request.task_id,
                request.agent,
                failure.kind,
                bill.attempts,
                failure.message,
            )
            self._record(request, verdict, failure.kind)
            return verdict

        verdict = CoachVerdict(
            score=score,
            valid=True,
            analysis=analysis,
            coach=self.name,
            latency_s=time.perf_counter() - started,
            cost_usd=bill.cost_usd,
            prompt_tokens=bill.prompt_tokens,
            completion_tokens=bill.completion_tokens,
            attempts=bill.attempts,
            rubric_version=version,
        )
        if self.cache is not None:
            entry = CachedVerdict(
                score=score,
                analysis=analysis,
                reply=reply,
                coach=self.name,
                prompt_tokens=bill.prompt_tokens,
                completion_tokens=bill.completion_tokens,
                cost_usd=bill.cost_usd,
                attempts=bill.attempts,
            )
            await asyncio.to_thread(self.cache.put, key, entry)
        self._record(request, verdict, None)
        return verdict

    async def _converse(
        self,
        messages: list[dict[str, str]],
        params: dict[str, Any],
        structured: bool,
        bill: VerdictBill,
    ) -> tuple[float, str, str]:
        """Ask, and on an unusable reply ask again once with the problem quoted."""
        conversation = list(messages)
        error = "no reply"
        reply = ""
        for round_index in range(self.format_retries + 1):
            response = await self._call_with_retries(conversation, params, bill)
            choices = getattr(response, "choices", None) or []
            message = getattr(choices[0], "message", None) if choices else None
            reply = getattr(message, "content", None) or ""
            parsed = parse_reply(reply)
            if parsed.ok and parsed.score is not None:
                return parsed.score, parsed.analysis, reply
            error = parsed.error or "unusable reply"
            if choices and getattr(choices[0], "finish_reason", None) == "length":
                error += f" (the reply was cut at max_tokens={self.max_tokens})"
            bill.last_error = error
            logger.info("coach %s: unusable reply (%s)", self.name, error)
            if round_index < self.format_retries:
                quoted = visible_text(reply) or "(empty reply)"
                limit = self.templates.limits.previous_reply
                correction = self.templates.correction(error, structured=structured)
                conversation += [
                    {"role": "assistant", "content": truncate_middle(quoted, limit)},
                    {"role": "user", "content": correction},
                ]
        replies = self.format_retries + 1
        shown = truncate_middle(reply, 2_000) if reply else "(empty)"
        raise VerdictFailure(
            "format",
            f"no usable score after {replies} replies: {error}",
            analysis=f"no usable score after {replies} replies: {error}\n\nLast reply:\n{shown}",
            cause="format",
        )

    async def _call_with_retries(
        self, conversation: list[dict[str, str]], params: dict[str, Any], bill: VerdictBill
    ) -> Any:
        tenacity = require("tenacity", "llm", purpose="the LLM coach's retries")

        def wait(retry_state: Any) -> float:
            # Never sleeping past the deadline.
            outcome = retry_state.outcome
            delay = backoff_s(
                max(retry_state.attempt_number - 1, 0),
                self.backoff_initial_s,
                self.backoff_max_s,
                outcome.exception() if outcome is not None else None,
            )
            return max(0.0, min(delay, bill.remaining_s()))

        def log_retry(retry_state: Any) -> None:
            logger.warning(
                "coach %s: transient error on call %d, retrying in %.2fs: %s",
                self.name,
                retry_state.attempt_number,
                retry_state.next_action.sleep if retry_state.next_action else 0.0,
                bill.last_error,
            )

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.max_retries + 1)
            | (lambda _state: bill.remaining_s() <= 0),
            wait=wait,
            retry=tenacity.retry_if_exception(is_transient_error),
            before_sleep=log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._call_once(conversation, params, bill)
        except VerdictFailure:
            raise
        except Exception as exc:  # API errors of any provider end here, bugs re-raise
            if not from_api_stack(exc):
                raise
            kind = setup_error(exc)
            if kind is not None:
                raise CoachSetupError(
                    setup_error_message(
                        exc,
                        kind,
                        who=f"coach {self.name}",
                        model=self.model,
                        api_base=self.api_base,
                        where="the coach spec (llm:<model>?api_key=...)",
                    )
                ) from exc
            message = describe_failure(exc)
            cause = failure_cause(exc)
            if bill.remaining_s() <= 0:
                raise VerdictFailure(
                    "deadline",
                    f"deadline_s={self.deadline_s:g} passed after {bill.attempts} calls; "
                    f"last error: {message}",
                    cause="timeout",
                ) from exc
            if is_transient_error(exc):
                raise VerdictFailure(
                    "transient",
                    f"transient API error persisted through {bill.attempts} calls: {message}",
                    cause=cause,
                ) from exc
            logger.error("coach %s: non-retryable API error: %s", self.name, message)
            raise VerdictFailure(
                "fatal", f"non-retryable API error: {message}", cause=cause
            ) from exc
        raise AssertionError("tenacity ended without a result or an exception")

    async def _call_once(
        self, conversation: list[dict[str, str]], params: dict[str, Any], bill: VerdictBill
    ) -> Any:
        litellm = self._litellm_module()
        semaphore, limiter = self._primitives()
        queued_from = time.monotonic()
        async with semaphore:
            event = None
            if limiter is not None:
                estimate = sum(len(m["content"]) for m in conversation) // 4 + self.max_tokens
                event = await limiter.acquire(estimate)
            bill.queued_s += time.monotonic() - queued_from
            remaining = bill.remaining_s()
            if remaining <= 0:
                raise VerdictFailure(
                    "deadline",
                    f"deadline_s={self.deadline_s:g} passed after {bill.attempts} calls; "
                    f"last error: {bill.last_error}",
                    cause="timeout",
                )
            call_timeout = min(self.timeout_s, remaining)
            bill.attempts += 1
            try:
                response = await asyncio.wait_for(
                    litellm.acompletion(
                        model=self.model,
                        messages=conversation,
                        api_base=self.api_base,
                        api_key=self.api_key,
                        timeout=call_timeout,
                        max_retries=0,  # retries are ours, bounded and logged
                        **params,
                    ),
                    timeout=call_timeout + TIMEOUT_GRACE_S,
                )
            except Exception as exc:  # recorded, then classified by the caller
                bill.last_error = describe_failure(exc)
                raise
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        bill.prompt_tokens += prompt_tokens
        bill.completion_tokens += completion_tokens
        cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
        if isinstance(cost, (int, float)) and math.isfinite(cost):
            bill.cost_usd += float(cost)
        if limiter is not None and event is not None:
            limiter.settle(event, prompt_tokens + completion_tokens)
        return response

    def _record(self, request: CoachRequest, verdict: CoachVerdict, kind: str | None) -> None:
        self.ledger.record(
            LedgerEntry(
                agent=request.agent,
                env_id=request.env_id,
                task_id=request.task_id,
                coach=verdict.coach,
                valid=verdict.valid,
                cached=verdict.cached,
                attempts=verdict.attempts,
                prompt_tokens=verdict.prompt_tokens,
                completion_tokens=verdict.completion_tokens,
                cost_usd=verdict.cost_usd,
                latency_s=verdict.latency_s,
                error_kind=kind,
                error=verdict.error,
            )
        )


def _parse_bool(raw: str) -> bool:
    return parse_spec_bool(raw)


def _optional_int(raw: str) -> int | None:
    return None if raw.strip().lower() in ("", "none") else int(raw)


_SPEC_OPTIONS: dict[str, Any] = {
    "api_base": str,
    "api_key": str,
    "temperature": float,
    "max_tokens": int,
    "timeout_s": float,
    "max_retries": int,
    "deadline_s": float,
    "max_concurrency": int,
    "requests_per_minute": _optional_int,
    "tokens_per_minute": _optional_int,
    "structured_output": str,
    "cache": str,
    "replay": _parse_bool,
    "format_retries": int,
    "backoff_initial_s": float,
    "backoff_max_s": float,
    "reasoning_effort": str,
    "seed": int,
    "top_p": float,
    "api_version": str,
}

_SPEC_ALIASES: dict[str, str] = {"timeout": "timeout_s"}
