"""LiteLLMPolicy: mocked replies, the real HTTP path, token ids from vLLM-style servers."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import re
import threading
from collections.abc import Iterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")
web = pytest.importorskip("aiohttp.web")

from mappa_agents.api import LiteLLMPolicy, parse_response  # noqa: E402
from mappa_agents.policy import GenerationError, Policy, SamplingParams  # noqa: E402
from mappa_env.api_errors import ApiSetupError  # noqa: E402
from tests.openai_stub_server import (  # noqa: E402
    StubReply,
    counting_in_flight,
    run_stub_server,
    scripted,
)

PROMPTS = [
    [{"role": "system", "content": "You solve problems."}, {"role": "user", "content": "2 + 3?"}],
    [{"role": "user", "content": "7 * 6?"}],
    [{"role": "user", "content": "10 - 4?"}],
]


# ---------------------------------------------------------------- litellm mock_response


def test_mock_response_fills_text_usage_and_cost():
    policy = LiteLLMPolicy("openai/gpt-4o-mini", mock_response="The answer is 5.")
    try:
        assert isinstance(policy, Policy)
        generations = policy.generate(PROMPTS, SamplingParams(max_new_tokens=32))
    finally:
        policy.close()
    assert [g.text for g in generations] == ["The answer is 5."] * 3
    for generation in generations:
        assert generation.finish_reason == "stop"
        assert generation.response_ids == []
        assert generation.prompt_ids == []
        assert not generation.trainable
        assert generation.usage is not None
        prompt_cost, completion_cost = litellm.cost_per_token(
            model="gpt-4o-mini",
            prompt_tokens=generation.usage["prompt_tokens"],
            completion_tokens=generation.usage["completion_tokens"],
        )
        assert generation.cost_usd == pytest.approx(prompt_cost + completion_cost)
        assert generation.num_response_tokens == generation.usage["completion_tokens"] > 0
        assert generation.info["latency_s"] >= 0


def test_mock_reasoning_is_split_off():
    policy = LiteLLMPolicy("openai/gpt-4o-mini", mock_response="<think>6 times 7</think> 42")
    try:
        (generation,) = policy.generate(PROMPTS[1:2], SamplingParams())
    finally:
        policy.close()
    assert generation.text == "42"
    assert generation.reasoning == "6 times 7"


def test_request_kwargs_map_sampling_params():
    policy = LiteLLMPolicy(
        "openai/served",
        api_base="http://127.0.0.1:1/v1",
        api_key="k",
        request_token_ids=True,
        chat_template_kwargs={"enable_thinking": False},
    )
    params = SamplingParams(
        max_new_tokens=7, temperature=0.6, top_p=0.9, top_k=20, stop="\n", seed=3
    )
    kwargs = policy.request_kwargs(PROMPTS[0], params, index=2)
    assert kwargs["max_tokens"] == 7
    assert kwargs["temperature"] == 0.6
    assert kwargs["top_p"] == 0.9
    assert kwargs["top_k"] == 20
    assert kwargs["stop"] == ["\n"]
    assert kwargs["seed"] == 5
    assert kwargs["logprobs"] is True
    assert kwargs["extra_body"] == {
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    plain = LiteLLMPolicy("openai/gpt-4o-mini").request_kwargs(PROMPTS[0], SamplingParams())
    for absent in ("top_p", "top_k", "stop", "seed", "logprobs", "extra_body", "api_base"):
        assert absent not in plain


def _texts_in_child(policy: LiteLLMPolicy, results: multiprocessing.Queue) -> None:
    generations = policy.generate(PROMPTS, SamplingParams(max_new_tokens=4))
    results.put([g.text for g in generations])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_its_own_loop():
    """The parent's loop thread does not exist in a forked child; the child starts one."""
    # One request at a time makes the batch wait on the semaphore, binding it to a loop.
    policy = LiteLLMPolicy("openai/gpt-4o-mini", mock_response="ok", max_concurrency=1)
    try:
        assert [g.text for g in policy.generate(PROMPTS, SamplingParams())] == ["ok"] * 3
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        child = context.Process(target=_texts_in_child, args=(policy, results), daemon=True)
        child.start()
        try:
            texts = results.get(timeout=60)
        except queue.Empty:
            texts = None
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
    finally:
        policy.close()
    assert texts == ["ok"] * 3
    assert child.exitcode == 0


# ---------------------------------------------------------------- HTTP: the stub server


def test_http_round_trip_with_stub_server():
    def handler(request):
        answer = {"2 + 3?": "5", "7 * 6?": "42"}.get(request.last_user_text)
        if answer is None:
            return StubReply("cut off", finish_reason="length", completion_tokens=9)
        return StubReply(f"It is {answer}.", prompt_tokens=11, completion_tokens=4)

    with run_stub_server(handler) as server:
        policy = LiteLLMPolicy("openai/stub-model", api_base=server.base_url, api_key="test")
        try:
            params = SamplingParams(max_new_tokens=16, temperature=0.7, seed=10, stop=("##",))
            generations = policy.generate(PROMPTS, params)
        finally:
            policy.close()
        bodies = sorted((r.body for r in server.requests), key=lambda b: b["seed"])
    assert [g.text for g in generations] == ["It is 5.", "It is 42.", "cut off"]
    assert [g.finish_reason for g in generations] == ["stop", "stop", "length"]
    assert generations[0].usage == {"prompt_tokens": 11, "completion_tokens": 4}
    assert generations[2].num_response_tokens == 9
    assert [b["seed"] for b in bodies] == [10, 11, 12]
    for body in bodies:
        assert body["max_tokens"] == 16
        assert body["temperature"] == 0.7
        assert body["stop"] == ["##"]
        assert "logprobs" not in body


def test_concurrency_limit_is_respected():
    handler, state = counting_in_flight("ok", 0.2)
    with run_stub_server(handler) as server:
        policy = LiteLLMPolicy(
            "openai/stub-model", api_base=server.base_url, api_key="t", max_concurrency=2
        )
        try:
            generations = policy.generate(PROMPTS * 2, SamplingParams(max_new_tokens=4))
        finally:
            policy.close()
    assert len(generations) == 6
    assert 1 <= state["max"] <= 2


def test_failed_requests_raise_and_keep_the_rest():
    def handler(request):
        if request.last_user_text == "7 * 6?":
            # An error of this prompt only: the others' generations are kept.
            return StubReply(status=400, error_message="maximum context length is 8 tokens")
        return "fine"

    with run_stub_server(handler) as server:
        policy = LiteLLMPolicy(
            "openai/stub-model", api_base=server.base_url, api_key="t", num_retries=0
        )
        try:
            with pytest.raises(GenerationError) as caught:
                policy.generate(PROMPTS, SamplingParams(max_new_tokens=4))
        finally:
            policy.close()
    error = caught.value
    assert [g is None for g in error.generations] == [False, True, False]
    assert [e is None for e in error.errors] == [True, False, True]
    assert error.generations[0].text == "fine"
    assert "1 of 3" in str(error)


@pytest.mark.parametrize(
    ("options", "served", "words", "requests"),
    [
        ({"api_key": None}, "stub-model", "no API key to send", 0),
        ({"api_key": "wrong"}, "stub-model", "rejected the API key (HTTP 401", 1),
        ({"api_key": "right"}, "other-model", "has no model 'stub-model' (HTTP 404", 1),
    ],
)
def test_errors_every_call_would_meet_are_not_retried(
    monkeypatch, options, served, words, requests
):
    # litellm's own retries (num_retries) used to retry these too.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with run_stub_server(model_ids=[served], api_key="right", check_model=True) as server:
        policy = LiteLLMPolicy(
            "openai/stub-model", api_base=server.base_url, num_retries=3, **options
        )
        try:
            with pytest.raises(ApiSetupError, match=re.escape(words)) as caught:
                policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))
        finally:
            policy.close()
        assert server.request_count == requests
    assert str(caught.value).startswith("policy openai/stub-model: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_rate_limits_and_server_errors_are_retried(status):
    replies = [StubReply(status=status), StubReply(status=status), "fine"]
    with run_stub_server(scripted(replies)) as server:
        policy = LiteLLMPolicy(
            "openai/stub-model",
            api_base=server.base_url,
            api_key="t",
            num_retries=2,
            backoff_initial_s=0.001,
            backoff_max_s=0.001,
        )
        try:
            generations = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))
        finally:
            policy.close()
        assert server.request_count == 3
    assert generations[0].text == "fine"


def test_sync_generate_inside_a_running_loop_and_agenerate():
    with run_stub_server(lambda request: f"echo {request.last_user_text}") as server:
        policy = LiteLLMPolicy("openai/stub-model", api_base=server.base_url, api_key="t")

        async def main():
            blocking = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))
            awaited = await policy.agenerate(PROMPTS[1:], SamplingParams(max_new_tokens=4))
            return blocking + awaited

        try:
            generations = asyncio.run(main())
            # The loop thread restarts after close().
            policy.close()
            again = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))
        finally:
            policy.close()
    assert [g.text for g in generations] == ["echo 2 + 3?", "echo 7 * 6?", "echo 10 - 4?"]
    assert again[0].text == "echo 2 + 3?"


# ---------------------------------------------------------------- HTTP: token ids


@contextlib.contextmanager
def vllm_like_server(with_token_id_fields: bool) -> Iterator[tuple[str, list[dict]]]:
    """A tiny server answering like ``vllm serve`` asked for token ids and logprobs."""
    bodies: list[dict] = []

    async def chat(request):
        body = await request.json()
        bodies.append(body)
        ids = [101, 102, 2]
        logprobs = [-0.25, -1.5, -0.125]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi!"},
            "finish_reason": "stop",
            "logprobs": {
                "content": [
                    {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for i, lp in zip(ids, logprobs)
                ]
            },
        }
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        }
        if with_token_id_fields:
            choice["token_ids"] = ids
            reply["prompt_token_ids"] = [1, 7, 8, 9]
        return web.json_response(reply)

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)

    async def start() -> int:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
        yield f"http://127.0.0.1:{port}/v1", bodies
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        loop.close()


@pytest.mark.parametrize("with_token_id_fields", [True, False])
def test_token_ids_and_logprobs_from_a_vllm_server(with_token_id_fields):
    with vllm_like_server(with_token_id_fields) as (base_url, bodies):
        policy = LiteLLMPolicy(
            "openai/served", api_base=base_url, api_key="t", request_token_ids=True
        )
        try:
            (generation,) = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8))
        finally:
            policy.close()
    assert bodies[0]["return_token_ids"] is True
    assert bodies[0]["return_tokens_as_token_ids"] is True
    assert bodies[0]["logprobs"] is True
    assert generation.text == "Hi!"
    assert generation.response_ids == [101, 102, 2]
    assert generation.logprobs == [-0.25, -1.5, -0.125]
    if with_token_id_fields:
        assert generation.prompt_ids == [1, 7, 8, 9]
        assert generation.trainable
    else:
        # Without the prompt ids the action cannot be trained on.
        assert generation.prompt_ids == []
        assert not generation.trainable
        assert generation.num_prompt_tokens == 4


def test_parse_response_accepts_plain_dicts():
    response = {
        "model": "m",
        "choices": [
            {
                "message": {"content": "Answer: 3", "reasoning_content": "count them"},
                "finish_reason": "max_tokens",
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 5},
    }
    generation = parse_response(response)
    assert generation.text == "Answer: 3"
    assert generation.reasoning == "count them"
    assert generation.finish_reason == "length"
    assert generation.info["raw_finish_reason"] == "max_tokens"
    assert generation.cost_usd is None
    assert generation.usage == {"prompt_tokens": 2, "completion_tokens": 5}


def test_invalid_settings():
    with pytest.raises(ValueError):
        LiteLLMPolicy("")
    with pytest.raises(ValueError):
        LiteLLMPolicy("openai/x", max_concurrency=0)
