"""A small OpenAI-compatible chat server for tests, on 127.0.0.1 with an ephemeral port.

It speaks enough of ``POST /v1/chat/completions`` (plain and ``stream=true``) and
``GET /v1/models`` for litellm's ``openai/<model>`` route and the ``openai`` client.
A handler decides every reply, so tests script good answers, odd formats, HTTP errors
and slow responses, and the server records each request it received.

Example:
    >>> with run_stub_server(lambda req: "PROCESS_SCORE: 7") as server:
    ...     litellm.completion(model="openai/stub", api_base=server.base_url,
    ...                        api_key="test", messages=[...])
    ...     assert server.request_count == 1
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class StubRequest:
    """One request the server received.

    Attributes:
        index: 0-based arrival order over the server's life.
        body: The parsed JSON body.
        headers: Request headers.
        received_at: ``time.perf_counter()`` at arrival (for overlap checks).
    """

    index: int
    body: dict[str, Any]
    headers: dict[str, str]
    received_at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of the request."""
        return list(self.body.get("messages", []))

    @property
    def last_user_text(self) -> str:
        """Content of the last user message ("" when none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                content = message.get("content", "")
                return content if isinstance(content, str) else json.dumps(content)
        return ""


@dataclass(frozen=True)
class StubReply:
    """What the server answers to one request.

    Attributes:
        content: Assistant message text (ignored for error statuses).
        status: HTTP status; anything but 200 sends an OpenAI-style error body.
        delay_s: Seconds to wait before answering (simulates latency and timeouts).
        error_message: Message of the error body for non-200 statuses.
        prompt_tokens: Reported usage; defaults to a rough count of the request text.
        completion_tokens: Reported usage; defaults to a rough count of ``content``.
        finish_reason: The choice's finish reason.
        headers: Extra response headers (e.g. ``retry-after``).
    """

    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    error_message: str = "stub error"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)


HandlerResult = StubReply | str
Handler = Callable[[StubRequest], HandlerResult | Awaitable[HandlerResult]]


@dataclass
class StubServer:
    """A running stub server (yielded by :func:`run_stub_server`).

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1``; pass it as ``api_base``/``base_url``.
        requests: Every chat request received, in arrival order.
    """

    base_url: str
    requests: list[StubRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def request_count(self) -> int:
        """Number of chat requests received so far."""
        with self._lock:
            return len(self.requests)

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> StubRequest:
        with self._lock:
            request = StubRequest(len(self.requests), body, headers, time.perf_counter())
            self.requests.append(request)
        return request


def scripted(replies: Sequence[HandlerResult]) -> Handler:
    """A handler answering with ``replies`` in order, repeating the last one afterwards.

    Args:
        replies: Reply texts or :class:`StubReply` objects; at least one.

    Returns:
        A handler for :func:`run_stub_server`.
    """
    if not replies:
        raise ValueError("scripted() needs at least one reply")
    lock = threading.Lock()
    position = 0

    def handler(_request: StubRequest) -> HandlerResult:
        nonlocal position
        with lock:
            reply = replies[min(position, len(replies) - 1)]
            position += 1
        return reply

    return handler


def counting_in_flight(reply: HandlerResult, delay_s: float) -> tuple[Handler, dict[str, int]]:
    """A handler that answers ``reply`` after ``delay_s`` and counts requests in flight.

    Args:
        reply: The reply to every request.
        delay_s: Seconds each request is held.

    Returns:
        The handler and its counters: ``now`` (in flight) and ``max`` (most at once).
    """
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    async def handler(_request: StubRequest) -> HandlerResult:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(delay_s)
        with lock:
            state["now"] -= 1
        return reply

    return handler, state


def _rough_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_exceeded",
    }.get(status, "server_error")


def _completion_body(body: dict[str, Any], reply: StubReply, index: int) -> dict[str, Any]:
    prompt_text = json.dumps(body.get("messages", []))
    prompt_tokens = reply.prompt_tokens
    if prompt_tokens is None:
        prompt_tokens = _rough_tokens(prompt_text)
    completion_tokens = reply.completion_tokens
    if completion_tokens is None:
        completion_tokens = _rough_tokens(reply.content)
    return {
        "id": f"chatcmpl-stub-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stub"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


async def _stream(
    http_request: web.Request, body: dict[str, Any], reply: StubReply, index: int
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
    await response.prepare(http_request)
    full = _completion_body(body, reply, index)
    base = {k: full[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [
        {"index": 0, "delta": {"role": "assistant", "content": reply.content}},
        {"index": 0, "delta": {}, "finish_reason": reply.finish_reason},
    ]
    for choice in chunks:
        await response.write(f"data: {json.dumps(base | {'choices': [choice]})}\n\n".encode())
    usage_chunk = base | {"choices": [], "usage": full["usage"]}
    await response.write(f"data: {json.dumps(usage_chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _make_app(server: StubServer, handler: Handler, model_ids: Sequence[str]) -> web.Application:
    async def chat(http_request: web.Request) -> web.StreamResponse:
        body = await http_request.json()
        request = server._record(body, dict(http_request.headers))
        result = handler(request)
        if inspect.isawaitable(result):
            result = await result
        reply = StubReply(content=result) if isinstance(result, str) else result
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            error = {
                "error": {
                    "message": reply.error_message,
                    "type": _error_type(reply.status),
                    "code": str(reply.status),
                }
            }
            return web.json_response(error, status=reply.status, headers=reply.headers)
        if body.get("stream"):
            return await _stream(http_request, body, reply, request.index)
        return web.json_response(
            _completion_body(body, reply, request.index), headers=reply.headers
        )

    async def models(_http_request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": "stub"} for m in model_ids]
        return web.json_response({"object": "list", "data": data})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


@contextlib.contextmanager
def run_stub_server(
    handler: Handler | None = None, *, model_ids: Sequence[str] = ("stub-model",)
) -> Iterator[StubServer]:
    """Run a stub OpenAI chat server in a background thread for the ``with`` block.

    Args:
        handler: Called with each :class:`StubRequest`; returns the reply text or a
            :class:`StubReply` (may be a coroutine function). Defaults to a fixed
            ``"PROCESS_SCORE: 5"`` reply.
        model_ids: Models listed by ``GET /v1/models``.

    Yields:
        The running :class:`StubServer` (``base_url``, ``requests``, ``request_count``).
    """
    handler = handler or (lambda _request: "PROCESS_SCORE: 5")
    loop = asyncio.new_event_loop()
    server = StubServer(base_url="")
    # A short shutdown timeout: leaving the block must not wait for deliberately slow replies.
    runner = web.AppRunner(
        _make_app(server, handler, model_ids), access_log=None, shutdown_timeout=0.2
    )

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner.addresses[0][1]

    thread = threading.Thread(target=loop.run_forever, name="openai-stub-server", daemon=True)
    thread.start()
    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
        server.base_url = f"http://127.0.0.1:{port}/v1"
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
