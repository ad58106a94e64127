"""Garbage, faults and adversaries through the environments' own entry points.

Each test keeps one attack running: agent text built to stall the text readers, cheap
DSBench work built to collect high coach scores, options that would turn a run into
nonsense, and (where bubblewrap confines) agent code that reaches for other sandboxes'
resources. The namespace boundary's own attack table is ``tests/test_isolation.py``.
Budget: the whole module runs in well under 30 s on two cores.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

import mappa_env
from mappa_env.coach import CoachTemplates, RulesCoach
from mappa_env.sandbox.base import ExecResult
from mappa_env.tasks import MathTask
from tests.fakes import FixedCoach

TASK = MathTask(id="t-add", prompt="What is 2 + 3?", answer="5")
#: The cap on an action's length (``max_action_chars``'s default).
ACTION_CHARS = 32_768
#: The most any agent text may add to a step.
STEP_BUDGET_S = 0.1


class EchoSandbox:
    """Prints the code it is given back as stdout: hostile text reaches the output readers."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = Path(workdir)

    @property
    def workdir(self) -> Path:
        return self._workdir

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        return ExecResult(stdout=code)

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        return self.run(code, timeout)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- hostile text


#: Pieces whose repetition once stalled a reader (backticks: cubic in the fence
#: expression; newlines: quadratic in the answer-line fallback; unclosed ``<think>``
#: tags and ``\boxed`` runs: quadratic), and neighbours of them.
HOSTILE_PIECES = [
    "`", "``", "```", "````\n", "```python\n", "\n", "\r\n", " ", "\t", "<think>",
    "</think>", "<think>`", "\\boxed", "\\boxed{", "{", "\\{", "$", "Answer:", "answer\n",
    "final answer", "the answer is ", "**", "%time ", "!", "1.", "\x1b[", "PROCESS_SCORE",
]  # fmt: skip


def hostile(piece: str, wrap: bool = False) -> str:
    """An action of ``piece`` repeated to the length cap (inside a code fence if ``wrap``)."""
    if wrap:
        body = hostile(piece)[: ACTION_CHARS - 20]
        return f"```python\n{body}\n```"
    return (piece * (ACTION_CHARS // len(piece) + 1))[:ACTION_CHARS]


def timed_episode(env, actions: dict[str, str]) -> dict[str, float]:
    """Seconds each agent's step took in one episode of ``actions``."""
    env.reset(options={"task": TASK})
    took: dict[str, float] = {}
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        start = time.perf_counter()
        env.step(actions[agent])
        took[agent] = max(took.get(agent, 0.0), time.perf_counter() - start)
    return took


def test_no_hostile_action_slows_a_mathchat_step_past_the_budget():
    # The rules coach, the verifier's fallbacks and code output echoing the action: every
    # reader of agent text runs. Baseline: the same episode with plain actions.
    env = mappa_env.make(
        "MathChat-v0",
        tasks=[TASK],
        sandbox=EchoSandbox,
        isolation="none",
        strict_boxed=False,
        turns={"code_executor": 1},
    )
    plain = {"problem_solver": "2 + 3 = 5", "code_executor": "```python\nprint(5)\n```"}
    plain["verifier"] = "\\boxed{5}"
    try:
        baseline = max(min(timed_episode(env, plain).values()) for _ in range(3))
        for piece in HOSTILE_PIECES:
            for wrap in (False, True):
                actions = dict.fromkeys(plain, hostile(piece, wrap))
                # Up to three tries: other work on a busy machine slows one episode, a
                # reader that is not linear slows every one.
                for _ in range(3):
                    took = timed_episode(env, actions)
                    slowest = max(took, key=took.__getitem__)
                    if took[slowest] - baseline < STEP_BUDGET_S:
                        break
                assert took[slowest] - baseline < STEP_BUDGET_S, (piece, wrap, slowest, took)
    finally:
        env.close()


def test_the_llm_coachs_prompt_of_a_hostile_action_renders_quickly():
    coach = FixedCoach()
    env = mappa_env.make(
        "MathChat-v0", tasks=[TASK], sandbox=EchoSandbox, isolation="none", coach=coach
    )
    templates = CoachTemplates()
    try:
        for piece in HOSTILE_PIECES:
            timed_episode(env, dict.fromkeys(env.possible_agents, hostile(piece, wrap=True)))
        for request in coach.requests:
            start = time.perf_counter()
            templates.render(request)
            assert time.perf_counter() - start < STEP_BUDGET_S, request.action[:20]
    finally:
        env.close()


def test_reading_agent_text_never_blocks_other_episodes(monkeypatch):
    # A reader slowed on purpose stands for any expensive reading of agent text: it runs
    # in a worker thread, so other episodes in the same event loop keep stepping.
    import mappa_env.envs.mathchat as mathchat

    def slow_blocks(text: str) -> list[str]:
        time.sleep(0.6)
        return []

    monkeypatch.setattr(mathchat, "extract_code_blocks", slow_blocks)
    env = mappa_env.make(
        "MathChat-v0", tasks=[TASK], sandbox=EchoSandbox, isolation="none", coach=RulesCoach()
    )

    async def main() -> float:
        await env.areset(options={"task": TASK})
        await env.astep("The answer is 5.")  # the solver; the code executor is next
        gaps = []

        async def ticker() -> None:
            last = time.perf_counter()
            for _ in range(12):
                await asyncio.sleep(0.05)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.08)  # the other episode is under way
        await env.astep(hostile("`"))
        await ticking
        return max(gaps)

    try:
        assert asyncio.run(main()) < 0.3
    finally:
        env.close()


# ---------------------------------------------------------------- options


BAD_OPTIONS = [
    ("MathChat-v0", {"code_timeout_s": math.nan}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"code_timeout_s": math.inf}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"code_timeout_s": 0}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"turns": {"code_executor": 2.7}}, TypeError, "turns['code_executor']"),
    ("MathChat-v0", {"turns": {"code_executor": True}}, TypeError, "turns['code_executor']"),
    ("MathChat-v0", {"turns": 2}, TypeError, "turns"),
    ("MathChat-v0", {"invalid_reward": 5.0}, ValueError, "invalid_reward"),
    ("MathChat-v0", {"invalid_reward": math.inf}, ValueError, "invalid_reward"),
    ("MathChat-v0", {"tasks": "gen:10000000"}, ValueError, "tasks='gen:10000000'"),
    ("MathChat-v0", {"tasks": "gen:0"}, ValueError, "tasks='gen:0'"),
    ("MathChat-v0", {"tasks": {"n": 0}}, ValueError, "tasks['n']"),
    ("MathChat-v0", {"tasks": 42}, TypeError, "tasks=42"),
    ("MathChat-v0", {"tasks": []}, ValueError, "tasks=[]"),
    ("MathChat-v0", {"max_new_tokens": "4096"}, TypeError, "max_new_tokens"),
    ("MathChat-v0", {"max_new_tokens": math.nan}, TypeError, "max_new_tokens"),
    ("MathChat-v0", {"max_new_tokens": math.inf}, TypeError, "max_new_tokens"),
    ("MathChat-v0", {"max_new_tokens": 0}, ValueError, "max_new_tokens"),
    ("MathChat-v0", {"max_action_chars": 10.5}, TypeError, "max_action_chars"),
    ("MathChat-v0", {"max_cycles": 0.5}, TypeError, "max_cycles"),
    ("MathChat-v0", {"tool_output_chars": -1}, ValueError, "tool_output_chars"),
    ("MathChat-v0", {"seed": -1}, ValueError, "seed"),
    ("DSBench-v0", {"task_ids": "iris"}, TypeError, "task_ids='iris'"),
    ("DSBench-v0", {"tasks": 42}, TypeError, "tasks=42"),
    ("DSBench-v0", {"tasks": "iris"}, TypeError, "tasks='iris'"),
]


@pytest.mark.parametrize(("env_id", "options", "error", "named"), BAD_OPTIONS)
def test_bad_options_stop_the_constructor_naming_the_option(env_id, options, error, named):
    options = {"sandbox": None, "isolation": "none", **options}
    start = time.perf_counter()
    with pytest.raises(error) as raised:
        mappa_env.make(env_id, **options).close()
    message = str(raised.value)
    assert named in message, message
    assert "must" in message or "gives no tasks" in message, message  # the allowed range
    assert time.perf_counter() - start < 5.0  # refused, not worked through (imports aside)


def test_an_empty_task_file_is_refused_by_name(tmp_path):
    empty = tmp_path / "tasks.json"
    empty.write_text("[]")
    with pytest.raises(ValueError, match=r"tasks='.*tasks\.json' gives no tasks"):
        mappa_env.make("MathChat-v0", tasks=str(empty), sandbox=None, isolation="none")


def test_an_action_the_environment_cannot_carry_out_is_never_scored(monkeypatch):
    import mappa_env.envs.mathchat as mathchat

    async def broken(self, agent, action):
        raise RuntimeError("the workspace vanished")

    monkeypatch.setattr(mathchat.MathChatEnv, "run_action", broken)
    env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=None, isolation="none")
    try:
        env.reset()
        env.step("2 + 3 = 5")
        verdict = env.transcript[0].verdict
        assert verdict is not None
        assert not verdict.valid, verdict
        assert "could not carry out" in verdict.analysis
        assert env.infos["problem_solver"]["reward_valid"] is False
        assert math.isnan(env.rewards["problem_solver"])
    finally:
        env.close()
