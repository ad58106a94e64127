"""The front door of ``mappa serve``: who may talk to the server, and how much.

:class:`Gate` is ASGI middleware in front of OpenEnv's app (the token on every route,
request bodies bounded, idle sessions closed, ego-mode resets limited per token);
:func:`guarded_http_protocol` is uvicorn's HTTP protocol with a connection cap and a
deadline for a request's head. :mod:`mappa_agents.openenv_server` puts both in front of
the environments it serves; :class:`~mappa_agents.serving.ServeLimits` sets the bounds.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import math
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from mappa_agents.serving import ServeLimits

logger = logging.getLogger(__name__)


class Gate:
    """ASGI middleware in front of OpenEnv's app: token, body size, idle sessions, resets."""

    def __init__(self, app: Any, *, token: str | None, limits: ServeLimits, ego: bool) -> None:
        self.app = app
        self.token = token
        self.limits = limits
        per_minute = limits.resets_per_minute
        # Per token: a server without one serves only its own process (tests, examples).
        limited = ego and per_minute and token is not None
        self.resets = RateLimit(per_minute, 60.0) if limited else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one ASGI connection: refused, or passed on to the app within bounds."""
        kind = scope["type"]
        if kind not in ("http", "websocket"):  # lifespan: starts OpenEnv's session reaper
            await self.app(scope, receive, send)
            return
        given = _given_token(scope)
        if self.token is not None and not (
            given is not None and hmac.compare_digest(given.encode(), self.token.encode())
        ):
            logger.info("refused %s %s from %s: no valid token", kind, scope["path"], _peer(scope))
            await _refuse(
                scope,
                send,
                401,
                "a valid token is required: send the header 'Authorization: Bearer <token>' "
                "(WebSocket clients that cannot may add ?token=<token> to the URL)",
            )
            return
        if kind == "http":
            await self._http(scope, receive, send)
        else:
            await self._websocket(scope, receive, send, key=given or "")

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit = self.limits.max_body_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _refuse(scope, send, 413, f"the request body is over {limit} bytes")
            return
        received = 0

        async def limited() -> dict[str, Any]:
            nonlocal received
            if received > limit:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # a chunked body with no length: stop reading it
                logger.info("request body from %s over %d bytes: dropped", _peer(scope), limit)
                return {"type": "http.disconnect"}
            return message

        await self.app(scope, limited, send)

    async def _websocket(self, scope: dict[str, Any], receive: Any, send: Any, key: str) -> None:
        idle = self.limits.idle_timeout_s

        async def guarded() -> dict[str, Any]:
            while True:
                try:
                    message = await asyncio.wait_for(receive(), timeout=idle)
                except asyncio.TimeoutError:
                    # OpenEnv's handler takes it as the client leaving: it closes the
                    # session's environment, frees its slot and closes the connection.
                    logger.info("closing the session of %s: idle for %gs", _peer(scope), idle)
                    return {"type": "websocket.disconnect", "code": 1001}
                if self.resets is not None and _is_reset(message):
                    wait_s = self.resets.take(key)
                    if wait_s is not None:
                        await send({"type": "websocket.send", "text": _reset_refusal(wait_s)})
                        continue
                return message

        await self.app(scope, guarded, send)


class RateLimit:
    """At most ``count`` events per key in any ``per_s`` seconds."""

    def __init__(self, count: int, per_s: float) -> None:
        self.count = count
        self.per_s = per_s
        self._times: dict[str, collections.deque[float]] = {}

    def take(self, key: str) -> float | None:
        """Count one event; ``None`` when allowed, else the seconds until one would be."""
        now = time.monotonic()
        times = self._times.setdefault(key, collections.deque())
        while times and now - times[0] >= self.per_s:
            times.popleft()
        if len(times) >= self.count:
            return self.per_s - (now - times[0])
        times.append(now)
        return None


def _reset_refusal(wait_s: float) -> str:
    return json.dumps(
        {
            "type": "error",
            "data": {
                "message": "refused: too many resets with this token (each makes the "
                f"server's policies generate); retry in {math.ceil(wait_s)} s",
                "code": "RATE_LIMITED",
            },
        }
    )


def _is_reset(message: Mapping[str, Any]) -> bool:
    if message.get("type") != "websocket.receive":
        return False
    raw = message.get("text") or message.get("bytes") or ""
    try:
        parsed = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False  # OpenEnv's handler answers it
    return isinstance(parsed, dict) and parsed.get("type") == "reset"


def _given_token(scope: Mapping[str, Any]) -> str | None:
    """The token a request carries: its bearer header, else its ``token`` query parameter."""
    header = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("token")
    return values[0] if values else None


def _peer(scope: Mapping[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


async def _refuse(scope: Mapping[str, Any], send: Any, status: int, reason: str) -> None:
    """Refuse a request before the app sees it, with ``status`` and ``reason``."""
    if scope["type"] == "websocket":
        # Before the handshake is accepted, uvicorn answers a close with HTTP 403.
        await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
        return
    body = json.dumps({"detail": reason}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The unread body (or the rest of a flood) goes with the connection.
        (b"connection", b"close"),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_last_refusal_warning = [0.0]


def guarded_http_protocol(limits: ServeLimits) -> type:
    """The h11 protocol of uvicorn with a connection cap and a deadline for the request head."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                # Closed at once, so a flood of slow clients cannot use up the server's fds.
                now = time.monotonic()
                if now - _last_refusal_warning[0] > 60.0:
                    _last_refusal_warning[0] = now
                    logger.warning(
                        "over %d open connections: closing new ones (max_connections)",
                        limits.max_connections,
                    )
                transport.close()
                return
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(
                limits.keep_alive_s, self._head_overdue, self.cycle
            )

        def _head_overdue(self, cycle: Any) -> None:
            # A new request head since the timer was armed makes a new cycle; an
            # upgraded connection belongs to the WebSocket protocol now.
            transport = self.transport
            mine = transport.get_protocol() is self
            if self.cycle is cycle and mine and not transport.is_closing():
                transport.close()

    return GuardedH11Protocol
