"""The LLM coach's transport: litellm's import, API failures, retries and budgets.

What :class:`~mappa_env.coach.llm.LLMCoach` needs around one API call, and what an API
policy (:mod:`mappa_agents.api`) shares with it: which failures are worth retrying
(:func:`is_transient_error`) and for how long to wait (:func:`backoff_s`), the cause of a
failure for counting (:func:`failure_cause`), the error that stops a run whose every
call is refused (:class:`CoachSetupError`), per-minute request and token budgets
(:class:`MinuteRateLimiter`) and what one verdict has cost (:class:`VerdictBill`).

litellm is imported only by :func:`import_litellm`, when the first call is made.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from types import ModuleType

from mappa_env._optional import require
from mappa_env.api_errors import ApiSetupError, setup_error
from mappa_env.coach.base import CoachStop
from mappa_env.text import truncate_middle

# HTTP statuses worth retrying besides 5xx: request timeout, conflict, too early, rate limit.
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
# Slack over the per-call timeout given to litellm before our own guard cancels the call.
TIMEOUT_GRACE_S = 5.0
# Modules whose exceptions are API failures (turned into verdicts), not programming errors.
_API_STACK = ("litellm", "openai", "httpx", "httpcore", "aiohttp", "anthropic", "google")


def import_litellm() -> ModuleType:
    """litellm, quiet and without a price-list download, or an error naming the extra."""
    # Without this, litellm downloads a price list when imported.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm", "llm", purpose="the LLM coach")
    # Otherwise litellm prints a "Give Feedback / Get Help" banner on every failed call;
    # failures are logged here, with their cause.
    litellm.suppress_debug_info = True
    return litellm


def failure_cause(exc: BaseException) -> str:
    """The cause of an API failure, for counting: what to fix differs by cause.

    Args:
        exc: The exception raised by the API call.

    Returns:
        ``"timeout"``, ``"connection"`` (no server answered: a wrong ``api_base``, a
        dead server), ``"http_<status>"`` (an HTTP error status, e.g. ``"http_429"``)
        or ``"api_error"``.
    """
    # litellm reraises a refused connection as an InternalServerError (status 500): the
    # exceptions it was raised from say what happened.
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(chain) < 16:
        chain.append(link)
        link = link.__cause__ or link.__context__
    names = {cls.__name__ for link in chain for cls in type(link).__mro__}
    if any(isinstance(link, TimeoutError) for link in chain) or names & {
        "Timeout",
        "APITimeoutError",
        "TimeoutException",
    }:
        return "timeout"
    if any(isinstance(link, ConnectionError) for link in chain) or names & {
        "APIConnectionError",
        "ConnectError",
    }:
        return "connection"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 400:
        return f"http_{status}"
    return "api_error"


def retry_after_s(exc: BaseException | None) -> float | None:
    """The delay a server asked for before the next call (``retry-after``), in seconds.

    Read from the response headers the exception carries (``retry-after-ms`` or
    ``retry-after``, in seconds or as an HTTP date); ``None`` when there is none.
    """
    if exc is None:
        return None
    sources = (
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "litellm_response_headers", None),
        getattr(exc, "headers", None),
    )
    for headers in sources:
        if headers is None:
            continue
        try:
            millis = headers.get("retry-after-ms")
            text = headers.get("retry-after")
        except AttributeError:
            continue
        try:
            if millis is not None:
                return max(float(millis) / 1000.0, 0.0)
            if text is not None:
                return max(float(text), 0.0)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(str(text))
            except (TypeError, ValueError):
                continue
            return max((when - datetime.datetime.now(when.tzinfo)).total_seconds(), 0.0)
    return None


def backoff_s(
    retry: int, initial_s: float, max_s: float, failure: BaseException | None = None
) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first).

    ``min(initial_s * 2**retry, max_s) + U(0, initial_s)``: a doubling delay, capped,
    plus jitter that spreads out the retries of many episodes; at least the delay the
    server asked for in ``failure`` (429/503 ``retry-after``, :func:`retry_after_s`).
    """
    delay = min(initial_s * 2.0**retry, max_s) + random.uniform(0.0, initial_s)
    return max(delay, retry_after_s(failure) or 0.0)


def is_transient_error(exc: BaseException) -> bool:
    """Whether an API error is worth retrying.

    Transient: timeouts, connection errors, HTTP 408/409/425/429 and 5xx. Everything
    else (401, 403, 400, 404, context too long, unsupported parameters) is not: retrying
    cannot fix it. Nor is a missing key, which litellm reports as a server error (500).

    Args:
        exc: The exception raised by the API call.

    Returns:
        True for errors that a later attempt may not meet.
    """
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if setup_error(exc) is not None:
        return False
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status in _TRANSIENT_STATUS or status >= 500
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"APIConnectionError", "APITimeoutError", "Timeout", "RateLimitError"})


def from_api_stack(exc: BaseException) -> bool:
    """Whether ``exc`` is an API failure (a verdict to record), not a programming error."""
    if isinstance(exc, (TimeoutError, OSError)):
        return True
    return any(cls.__module__.split(".")[0] in _API_STACK for cls in type(exc).__mro__)


def describe_failure(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, the message cut to 500 characters."""
    message = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {truncate_middle(message, 500)}"


class CoachSetupError(CoachStop, ApiSetupError):
    """The coach's model API refuses every call: no verdict can come, so the run stops.

    The cause is a missing or rejected key, an unknown model or an invalid request; the
    message names the fix.

    A :class:`~mappa_env.coach.base.CoachStop` (environments re-raise it rather than
    turn it into an invalid verdict) and a :class:`~mappa_env.errors.SettingsError`
    (the ``mappa`` command prints its message as one line and exits with status 2).
    """


class MinuteRateLimiter:
    """Requests- and tokens-per-minute budgets over a sliding window.

    Lives on the coach's event loop (no locking needed). Token use is reserved with an
    estimate before a call and settled with the real count after it.
    """

    def __init__(self, requests: int | None, tokens: int | None, *, window_s: float = 60.0) -> None:
        self.requests = requests
        self.tokens = tokens
        self.window_s = window_s
        self._events: deque[list[float]] = deque()  # [time, tokens] per call

    async def acquire(self, tokens_estimate: int) -> list[float]:
        """Wait until a call of ``tokens_estimate`` tokens fits both budgets."""
        while True:
            now = time.monotonic()
            while self._events and self._events[0][0] <= now - self.window_s:
                self._events.popleft()
            used_tokens = sum(e[1] for e in self._events)
            fits_requests = self.requests is None or len(self._events) < self.requests
            # A single call larger than the whole budget still runs once the window is empty.
            fits_tokens = (
                self.tokens is None
                or not self._events
                or used_tokens + tokens_estimate <= self.tokens
            )
            if fits_requests and fits_tokens:
                event = [now, float(tokens_estimate)]
                self._events.append(event)
                return event
            await asyncio.sleep(max(self._events[0][0] + self.window_s - now, 0.001))

    @staticmethod
    def settle(event: list[float], tokens_used: int) -> None:
        """Replace a call's token estimate by its real count."""
        event[1] = float(tokens_used)


@dataclass
class VerdictBill:
    """What one verdict has cost so far, and how long it may still take."""

    deadline_s: float
    started: float = field(default_factory=time.monotonic)
    queued_s: float = 0.0  # time spent waiting for a concurrency slot or rate budget
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    last_error: str | None = None

    def remaining_s(self) -> float:
        """Deadline left; waiting in the local queue does not count against it."""
        return self.deadline_s - (time.monotonic() - self.started - self.queued_s)


class VerdictFailure(Exception):
    """The verdict cannot be produced; carries the error kind for the ledger."""

    def __init__(
        self, kind: str, message: str, analysis: str | None = None, cause: str = "api_error"
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.analysis = analysis
        self.cause = cause  # CoachVerdict.failure
