"""API errors that no retry can fix, told apart from those a later call may not meet.

A missing or rejected key, a model the server does not know and a request the server
calls malformed fail the same way on every call: retrying them only delays the message
(with growing back-off, for minutes). :func:`setup_error` recognises them in the
exceptions litellm raises (litellm reports a key the OpenAI client refused to go without
as a server error, status 500, raised from the client's own ``OpenAIError``) and
:func:`setup_error_message` turns one into a single line that names the fix. Callers
raise :class:`ApiSetupError` with it, which the ``mappa`` command prints as that line.

Errors bound to one request (a prompt past the context window, a content filter) are
not setup errors: other requests may pass.
"""

from __future__ import annotations

import re
from typing import Literal

from mappa_env.errors import SettingsError

SetupErrorKind = Literal["missing_key", "rejected_key", "forbidden", "unknown_model", "bad_request"]
"""Why every call to an API fails: see :func:`setup_error`."""

# What the OpenAI client and litellm's providers say when they have no key to send.
_MISSING_KEY = re.compile(
    r"missing credentials|api_key client option must be set|missing api[ _-]?key"
    r"|no api[ _-]?key|api[ _-]?key (?:is )?(?:not set|required|missing)",
    re.IGNORECASE,
)
# A request too long for the model, or refused for its content: that request only.
_ONE_REQUEST = re.compile(
    r"context (?:length|window)|maximum context|too many tokens|prompt is too long",
    re.IGNORECASE,
)
_ONE_REQUEST_TYPES = frozenset({"ContextWindowExceededError", "ContentPolicyViolationError"})
_STATUS_KIND: dict[int, SetupErrorKind] = {
    400: "bad_request",
    401: "rejected_key",
    403: "forbidden",
    404: "unknown_model",
    422: "bad_request",
}
_TYPE_KIND: dict[str, SetupErrorKind] = {
    "AuthenticationError": "rejected_key",
    "PermissionDeniedError": "forbidden",
    "NotFoundError": "unknown_model",
    "BadRequestError": "bad_request",
    "UnprocessableEntityError": "bad_request",
}


class ApiSetupError(SettingsError):
    """Every call to a model's API would fail the same way; the message names the fix."""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(chain) < 16 and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def setup_error(exc: BaseException) -> SetupErrorKind | None:
    """Whether ``exc`` is an API error that every later call would meet too.

    Args:
        exc: The exception raised by an API call (litellm, openai, httpx...).

    Returns:
        ``"missing_key"`` (no key was sent: none given and none in the environment),
        ``"rejected_key"`` (HTTP 401), ``"forbidden"`` (403), ``"unknown_model"``
        (404), ``"bad_request"`` (400/422, unless bound to that request's length or
        content), or ``None`` for anything else: transient errors (429, 5xx,
        timeouts, connections) and errors of one request.
    """
    chain = _chain(exc)
    text = " ".join(str(link) for link in chain)
    names = {cls.__name__ for link in chain for cls in type(link).__mro__}
    # The OpenAI client refuses to send a request without a key, raising its base error
    # (no status); litellm re-raises that as a server error with status 500.
    client_refusal = any(
        type(link).__name__ == "OpenAIError" and type(link).__module__.startswith("openai")
        for link in chain
    )
    if _MISSING_KEY.search(text) and (client_refusal or "AuthenticationError" in names):
        return "missing_key"
    if names & _ONE_REQUEST_TYPES or _ONE_REQUEST.search(text):
        return None
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status in _STATUS_KIND:
        return _STATUS_KIND[status]
    if isinstance(status, int):
        return None  # 429, 5xx and others: the status decides, not the class name
    for name, kind in _TYPE_KIND.items():
        if name in names:
            return kind
    return None


def key_variable(model: str) -> str:
    """The environment variable litellm reads the key of ``model``'s provider from."""
    provider = model.split("/", 1)[0] if "/" in model else "openai"
    special = {"gemini": "GEMINI_API_KEY", "vertex_ai": "GOOGLE_APPLICATION_CREDENTIALS"}
    return special.get(provider, f"{re.sub(r'[^A-Za-z0-9]', '_', provider).upper()}_API_KEY")


def _server_said(exc: BaseException) -> str:
    """The server's (or client's) own words, on one line and short."""
    message = getattr(exc, "message", None) or str(exc)
    # litellm prefixes its class names ("litellm.NotFoundError: OpenAIException - ...").
    message = re.sub(
        r"^(?:(?:litellm\.)?\w+Error:\s*)*(?:\w+Exception\s*-\s*)?", "", str(message).strip()
    )
    message = " ".join(message.split())
    return message if len(message) <= 200 else message[:197] + "..."


def setup_error_message(
    exc: BaseException,
    kind: SetupErrorKind,
    *,
    who: str,
    model: str,
    api_base: str | None,
    where: str,
) -> str:
    """One line for a setup error: what failed, what the server said, and the fix.

    Args:
        exc: The exception.
        kind: Its kind, from :func:`setup_error`.
        who: What made the call, e.g. ``"coach llm:openai/judge"``.
        model: The litellm model name.
        api_base: The server's base URL, if one was given.
        where: Where the user sets the model's options, e.g. ``"the --coach spec"``.

    Returns:
        The message (no newline).
    """
    server = f"the server at {api_base}" if api_base else "the provider"
    said = _server_said(exc)
    variable = key_variable(model)
    if kind == "missing_key":
        return (
            f"{who}: no API key to send ({said}). Set api_key=... in {where} or "
            f"{variable} (a local server that checks no key takes any, e.g. api_key=none)"
        )
    if kind == "rejected_key":
        return (
            f"{who}: {server} rejected the API key (HTTP 401: {said}). Set the right "
            f"api_key=... in {where} or {variable}"
        )
    if kind == "forbidden":
        return (
            f"{who}: {server} refused access to {model} (HTTP 403: {said}). Use a key "
            f"allowed to call it (api_key=... in {where} or {variable}), or another model"
        )
    if kind == "unknown_model":
        served = model.split("/", 1)[1] if "/" in model else model
        listing = f" (GET {api_base.rstrip('/')}/models lists them)" if api_base else ""
        return (
            f"{who}: {server} has no model {served!r} (HTTP 404: {said}). Name a model "
            f"it serves{listing} in {where}, or check api_base"
        )
    return (
        f"{who}: {server} rejected the request as invalid (HTTP "
        f"{getattr(exc, 'status_code', 400)}: {said}). Change or remove the option it "
        f"names in {where}"
    )
