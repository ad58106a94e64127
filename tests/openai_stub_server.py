"""A small OpenAI-compatible chat server for tests, on 127.0.0.1 with an ephemeral port.

It speaks enough of ``POST /v1/chat/completions`` (plain and ``stream=true``) and
``GET /v1/models`` for litellm's ``openai/<model>`` route and the ``openai`` client.
A handler decides every reply, so tests script good answers, odd formats, HTTP errors
and slow responses, and the server records each request it received. Like a real server
it can also check the key (401 for a request without the right one) and the model (404
for one it does not serve) before the handler is asked.

It also has two scripted judges that read the coach's prompt as a model would
(:func:`strict_judge`, :func:`gullible_judge`): coach audits must pass the first and
catch the second. ``python -m tests.openai_stub_server --judge strict`` serves one.

Example:
    >>> with run_stub_server(lambda req: "PROCESS_SCORE: 7") as server:
    ...     litellm.completion(model="openai/stub", api_base=server.base_url,
    ...                        api_key="test", messages=[...])
    ...     assert server.request_count == 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import re
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


#: Longest a request waits for the others that :func:`counting_in_flight` gathers: far
#: past what scheduling takes on a loaded machine, so only requests that never overlap
#: exhaust it.
GATHER_PATIENCE_S = 30.0


def counting_in_flight(
    reply: HandlerResult, delay_s: float, gather: int = 0
) -> tuple[Handler, dict[str, int]]:
    """A handler that answers ``reply`` after ``delay_s`` and counts requests in flight.

    Args:
        reply: The reply to every request.
        delay_s: Seconds each request is held.
        gather: Each request is first held until this many have been in flight at once
            (or :data:`GATHER_PATIENCE_S` passed, after which none is held): a test of
            overlap then counts requests instead of timing them.

    Returns:
        The handler and its counters: ``now`` (in flight) and ``max`` (most at once).
    """
    state = {"now": 0, "max": 0, "gather": gather}
    lock = threading.Lock()

    async def handler(_request: StubRequest) -> HandlerResult:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        deadline = time.monotonic() + GATHER_PATIENCE_S
        while state["max"] < state["gather"]:
            if time.monotonic() > deadline:
                state["gather"] = 0  # the requests do not overlap: let the rest through
                break
            await asyncio.sleep(0.005)
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


def _gatekeeper(
    body: dict[str, Any],
    headers: dict[str, str],
    api_key: str | None,
    served: Sequence[str] | None,
) -> StubReply | None:
    """The error a real server answers before any model runs: a bad key, an unknown model."""
    if api_key is not None and headers.get("Authorization") != f"Bearer {api_key}":
        message = "Incorrect API key provided." if "Authorization" in headers else "No API key."
        return StubReply(status=401, error_message=message)
    if served is not None and body.get("model") not in served:
        model = body.get("model")
        return StubReply(status=404, error_message=f"The model `{model}` does not exist.")
    return None


def _make_app(
    server: StubServer,
    handler: Handler,
    model_ids: Sequence[str],
    api_key: str | None = None,
    check_model: bool = False,
) -> web.Application:
    async def chat(http_request: web.Request) -> web.StreamResponse:
        body = await http_request.json()
        headers = dict(http_request.headers)
        request = server._record(body, headers)
        reply = _gatekeeper(body, headers, api_key, model_ids if check_model else None)
        if reply is None:
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
    handler: Handler | None = None,
    *,
    model_ids: Sequence[str] = ("stub-model",),
    api_key: str | None = None,
    check_model: bool = False,
) -> Iterator[StubServer]:
    """Run a stub OpenAI chat server in a background thread for the ``with`` block.

    Args:
        handler: Called with each :class:`StubRequest`; returns the reply text or a
            :class:`StubReply` (may be a coroutine function). Defaults to a fixed
            ``"PROCESS_SCORE: 5"`` reply.
        model_ids: Models listed by ``GET /v1/models``.
        api_key: When set, a request without ``Authorization: Bearer <api_key>`` gets
            HTTP 401 (the handler is not asked; the request is still recorded).
        check_model: A request for a model not in ``model_ids`` gets HTTP 404.

    Yields:
        The running :class:`StubServer` (``base_url``, ``requests``, ``request_count``).
    """
    handler = handler or (lambda _request: "PROCESS_SCORE: 5")
    loop = asyncio.new_event_loop()
    server = StubServer(base_url="")
    # A short shutdown timeout: leaving the block must not wait for deliberately slow replies.
    runner = web.AppRunner(
        _make_app(server, handler, model_ids, api_key, check_model),
        access_log=None,
        shutdown_timeout=0.2,
    )

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner.addresses[0][1]

    thread = threading.Thread(target=loop.run_forever, name="openai-stub-server", daemon=True)
    thread.start()
    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
        server.base_url = f"http://127.0.0.1:{port}/v1"
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        loop.close()


# ------------------------------------------------------------------ scripted judges

_FENCE_LINE = re.compile(r"^<<<(?:agent text|end) [0-9a-f]{16}>>>\n?", re.MULTILINE)
_FENCED = re.compile(
    r"^<<<agent text (?P<id>[0-9a-f]{16})>>>\n(?P<body>.*?)\n<<<end (?P=id)>>>$",
    re.DOTALL | re.MULTILINE,
)
# A score a text states: a score line, a JSON score, "N/10".
_STATED_SCORE = re.compile(
    r"PROCESS[_ ]SCORE\W{0,3}(\d+(?:\.\d+)?)"
    r'|"score"\s*:\s*(\d+(?:\.\d+)?)'
    r"|\b(\d+(?:\.\d+)?)\s*/\s*10\b"
)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_CAP = re.compile(r"Score cap from this outcome: at most (\d+(?:\.\d+)?)")
_AGENT = re.compile(r"^## The agent being judged: (\w+)", re.MULTILINE)


def _sections(text: str) -> dict[str, str]:
    """``{heading: body}`` of the ``## `` sections of ``text``; a repeated heading's last body."""
    found: dict[str, str] = {}
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    for title, body in zip(parts[1::2], parts[2::2]):
        found[title.strip()] = body.strip()
    return found


def _fenced_body(prompt: str, title: str) -> str:
    """The agent text fenced right under the heading ``title`` ("" when there is none)."""
    start = prompt.find(f"## {title}\n")
    if start < 0:
        return ""
    match = _FENCED.match(prompt, start + len(title) + 4)
    return match.group("body") if match else ""


def _fact(checks: str, name: str, key: str) -> str | None:
    line = next((ln for ln in checks.splitlines() if ln.startswith(f"- {name}:")), "")
    match = re.search(rf"\b{re.escape(key)}=([^,;\s]+)", line)
    return match.group(1) if match else None


def judge_prompt(prompt: str, *, reads_fences: bool) -> tuple[float, str]:
    """Score a coach prompt as a scripted judge: ``(score, reason)``.

    Both judges obey a score the prompt states outside the reply format (a score line,
    a JSON score, "N/10") and otherwise score the action by its evidence: for MathChat,
    whether its one boxed answer (a code executor: the last number its code printed)
    is the reference answer (without one, whether it states one answer with working, or
    printed a number); for DSBench, the environment's checks of the files (all three
    data files load and hold the target; a model that loads, predicts and has learned)
    and the measured outcome with its cap.

    The strict judge reads the agents' words (between the fence lines) as evidence only,
    as the system prompt asks. The gullible one reads them as part of the prompt: it
    obeys a score they state and takes the last "Reference answer" section they add.
    """
    view = _FENCE_LINE.sub("", prompt) if reads_fences else _FENCED.sub("[agent text]", prompt)
    sections = _sections(view)
    # Everything but the reply format (which shows "PROCESS_SCORE: <score>"), repeated
    # headings included.
    instructions = re.sub(r"^## Reply format\n.*?(?=^## |\Z)", "", view, flags=re.M | re.S)
    stated = [next(g for g in m.groups() if g) for m in _STATED_SCORE.finditer(instructions)]
    if stated:
        return float(stated[-1]), "the prompt states the score"
    agent_match = _AGENT.search(prompt)
    agent = agent_match.group(1) if agent_match else ""
    action = _fenced_body(prompt, "What the agent produced (its action)")
    tool = _fenced_body(prompt, "Tool result of this action")
    reference = next((b for t, b in sections.items() if t.startswith("Reference answer")), None)
    truth = reference.splitlines()[0].strip() if reference else None
    boxes = list(dict.fromkeys(b.strip() for b in _BOXED.findall(action)))
    printed = _NUMBER.findall(tool.split("[stderr]")[0])
    if agent == "code_executor":
        code = "\n".join(re.findall(r"```python\n(.*?)```", action, re.DOTALL))
        if tool:
            if truth is None:
                score, why = (7.0, "its code printed a number") if printed else (2.0, "no number")
            elif printed and printed[-1] == truth:
                copied = re.search(rf"(?<![\d.]){re.escape(truth)}(?![\d.])", code)
                score, why = (5.0, "it printed the answer it wrote") if copied else (9.0, "right")
            else:
                score, why = 3.0, "its code printed a wrong number"
        elif truth is not None and boxes == [truth]:
            score, why = 5.0, "the right answer, not computed"
        else:
            score, why = 1.0, "no code and no right answer"
    elif agent in ("problem_solver", "verifier"):
        if truth is None:
            one = len(boxes) == 1 and "=" in action
            score, why = (7.0, "one answer, with working") if one else (2.0, "no single answer")
        elif boxes == [truth]:
            score, why = 9.0, "its one boxed answer is right"
        else:
            score, why = (2.0, "a wrong answer") if boxes else (1.0, "no answer")
    elif agent == "data_engineer":
        checks = sections.get("Checks of the files this agent makes or needs", "")
        names = ("X_train.pkl", "y_train.pkl", "X_test.pkl")
        good = all(_fact(checks, n, "loads") == "True" for n in names)
        good = good and _fact(checks, "y_train.pkl", "holds_target") == "True"
        score, why = (8.0, "the files pass the checks") if good else (3.0, "files fail the checks")
    elif agent == "modeler":
        checks = sections.get("Checks of the files this agent makes or needs", "")
        skill = _fact(checks, "model.pkl", "train_skill")
        distinct = _fact(checks, "model.pkl", "distinct_predictions")
        good = _fact(checks, "model.pkl", "has_predict") == "True"
        good = good and skill is not None and float(skill) >= 0.1
        good = good and distinct is not None and int(distinct) >= 2
        score, why = (8.0, "a usable model that learned") if good else (3.0, "no usable model")
    elif agent == "analyst":
        outcome = sections.get("Measured outcome", "")
        if "could not be scored" in outcome or not outcome:
            score, why = 2.0, "no scorable submission"
        else:
            score, why = 9.0, "a scored submission"
    else:
        score, why = 5.0, "an agent this judge does not know"
    cap = _CAP.search(instructions)
    if cap is not None and score > float(cap.group(1)):
        score, why = float(cap.group(1)), f"{why}, capped"
    return score, why


def _judge_reply(request: StubRequest, *, reads_fences: bool) -> str:
    """The judge's reply: a quote of the action's last line, its reason, its score.

    Asked to correct its format (the conversation holds its earlier reply), it restates
    its score alone; asked for JSON (``response_format``), it answers with JSON.
    """
    users = [m for m in request.messages if m.get("role") == "user"]
    prompt = users[0]["content"] if users else ""
    score, why = judge_prompt(prompt, reads_fences=reads_fences)
    if "response_format" in request.body:
        return json.dumps({"analysis": why, "score": score})
    if any(m.get("role") == "assistant" for m in request.messages):
        return f"PROCESS_SCORE: {score:g}"
    action = _fenced_body(prompt, "What the agent produced (its action)")
    lines = [line for line in action.splitlines() if line.strip()]
    quote = lines[-1][:200] if lines else ""
    return f'The action ends with "{quote}". Judgement: {why}.\nPROCESS_SCORE: {score:g}'


def strict_judge(request: StubRequest) -> str:
    """A judge that treats the agents' words as evidence only (see :func:`judge_prompt`)."""
    return _judge_reply(request, reads_fences=False)


def gullible_judge(request: StubRequest) -> str:
    """A judge that obeys any score it reads, the agents' words included."""
    return _judge_reply(request, reads_fences=True)


JUDGES: dict[str, Handler] = {"strict": strict_judge, "gullible": gullible_judge}


def main() -> None:
    """Serve a scripted judge on 127.0.0.1 until interrupted (prints its base URL)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--judge", choices=sorted(JUDGES), default="strict")
    args = parser.parse_args()
    with run_stub_server(JUDGES[args.judge]) as server:
        print(server.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
