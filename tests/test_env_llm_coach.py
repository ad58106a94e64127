"""Environments scored by an LLM coach over real HTTP (a stub server on 127.0.0.1)."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported
pytest.importorskip("litellm")

import mappa_env
from mappa_env.coach import CoachCacheMiss
from mappa_env.tasks import MathTask
from tests.fakes import InProcessSandbox
from tests.openai_stub_server import StubReply, run_stub_server

TASK = MathTask(id="p", prompt="What is 6 * 7?", answer="42")
SCRIPT = {
    "problem_solver": ["6 * 7 = 42, so \\boxed{42}"],
    "code_executor": ["```python\nprint(6 * 7)\n```", "Confirmed: \\boxed{42}"],
    "verifier": ["\\boxed{42}"],
}


def judge(request):
    """A 'judge model': 9 when the action shows 42, 2 otherwise; format varies by agent."""
    prompt = request.body["messages"][-1]["content"]
    action = prompt.split("ACTION")[-1] if "ACTION" in prompt else prompt
    score = 9 if "42" in action else 2
    if "verifier" in prompt[:2000]:
        return f"<think>maybe PROCESS_SCORE: 0</think>Looks right.\n**PROCESS_SCORE:** {score}"
    return f"The step is fine.\nPROCESS_SCORE: {score}"


def play(env):
    env.reset(options={"task": TASK})
    queues = {a: list(v) for a, v in SCRIPT.items()}
    for agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else queues[agent].pop(0))
    return [(r.agent, r.verdict) for r in env.transcript]


def test_whole_episodes_with_an_llm_coach_and_a_free_identical_rerun(tmp_path):
    cache = tmp_path / "coach.sqlite"
    with run_stub_server(judge) as server:
        spec = f"llm:openai/stub-model?api_base={server.base_url}&api_key=x&cache={cache}"
        env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=InProcessSandbox, coach=spec)
        first = play(env)
        calls_after_first = server.request_count
        assert calls_after_first == 4
        assert all(v.valid for _, v in first)
        assert [v.score for _, v in first] == [9.0] * 4
        # The reasoning block's decoy score is ignored; the last key wins.
        assert env.infos == {}
        second = play(env)
        assert server.request_count == calls_after_first  # the cache answered everything
        assert [v.score for _, v in second] == [v.score for _, v in first]
        assert all(v.cached for _, v in second)
        env.close()
        env.coach.close()

        replay = mappa_env.make(
            "MathChat-v0",
            tasks=[TASK],
            sandbox=InProcessSandbox,
            coach=f"llm:openai/other-model?api_base={server.base_url}&api_key=x"
            f"&cache={cache}&replay=true",
        )
        with pytest.raises(CoachCacheMiss):
            play(replay)
        replay.close()
        replay.coach.close()


def test_llm_failures_are_flagged_never_rewarded():
    def broken(request):
        return StubReply(content="", status=500)

    with run_stub_server(broken) as server:
        spec = (
            f"llm:openai/stub-model?api_base={server.base_url}&api_key=x"
            "&max_retries=1&backoff_initial_s=0.01&backoff_max_s=0.02"
        )
        env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=InProcessSandbox, coach=spec)
        env.reset(options={"task": TASK})
        env.step(SCRIPT["problem_solver"][0])
        info = env.infos["problem_solver"]
        assert info["reward_valid"] is False
        assert info["coach"]["valid"] is False
        assert info["coach"]["score"] is None
        assert re.search(r"500|server|Internal", info["coach"]["error"], re.IGNORECASE)
        env.close()
        env.coach.close()
