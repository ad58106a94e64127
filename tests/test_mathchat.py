"""MathChat-v0: PettingZoo conformance, scripted episodes, reward modes and bad input."""

from __future__ import annotations

import asyncio
import math
import types

import pettingzoo
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pettingzoo.test import api_test, max_cycles_test, parallel_api_test, seed_test
from pettingzoo.test.seed_test import parallel_seed_test

import mappa_env
from mappa_env.envs.mathchat import MathChatEnv
from mappa_env.tasks import MathTask, generate_math_tasks, problem_identity
from tests.fakes import FixedCoach, InProcessSandbox, RaisingCoach

TASK = MathTask(id="t-sum", prompt="What is 123456789 * 987654321?", answer="121932631112635269")
OTHER = MathTask(id="t-small", prompt="What is 2 + 3?", answer="5")


def make_env(**options) -> MathChatEnv:
    options.setdefault("tasks", [TASK, OTHER])
    options.setdefault("sandbox", InProcessSandbox)
    return mappa_env.make("MathChat-v0", **options)


def play(env: MathChatEnv, script: dict[str, list[str]], task: MathTask = TASK) -> dict:
    """Run one episode with scripted actions; return per-agent cumulative rewards seen by last()."""
    env.reset(options={"task": task})
    queues = {agent: list(actions) for agent, actions in script.items()}
    returns: dict[str, float] = {}
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last()
        returns[agent] = returns.get(agent, 0.0) + reward
        if terminated or truncated:
            env.step(None)
        else:
            env.step(queues[agent].pop(0))
    return returns


GOOD_SCRIPT = {
    "problem_solver": ["Multiply directly. \\boxed{121932631112635269}"],
    "code_executor": [
        "Let me check.\n```python\nprint(123456789 * 987654321)\n```",
        "The code confirms it: \\boxed{121932631112635269}",
    ],
    "verifier": ["The product is \\boxed{121932631112635269}."],
}


# ---------------------------------------------------------------- PettingZoo's own tests


def test_pettingzoo_api_test():
    env = make_env()
    api_test(env, num_cycles=200)
    env.close()


def test_pettingzoo_parallel_api_test_on_turn_based_conversion():
    par_env = mappa_env.make_parallel("MathChat-v0", tasks=[TASK, OTHER], sandbox=InProcessSandbox)
    parallel_api_test(par_env, num_cycles=50)
    par_env.close()


def test_pettingzoo_seed_test():
    seed_test(lambda: make_env(), num_cycles=20)
    parallel_seed_test(
        lambda: mappa_env.make_parallel("MathChat-v0", tasks=[TASK, OTHER], sandbox=None),
        num_cycles=20,
    )


@pytest.mark.xfail(
    strict=True,
    reason="max_cycles_test requires one parallel step to move every agent at once "
    "(max_cycles parallel steps while each agent acts max_cycles times); a turn-based "
    "pipeline moves one agent per step by construction",
)
def test_pettingzoo_max_cycles_test():
    module = types.SimpleNamespace(
        env=lambda max_cycles: make_env(max_cycles=max_cycles),
        parallel_env=lambda max_cycles: mappa_env.make_parallel(
            "MathChat-v0", tasks=[TASK], sandbox=None, max_cycles=max_cycles
        ),
    )
    max_cycles_test(module)


def test_max_cycles_truncates_the_episode():
    env = make_env(max_cycles=2)
    env.reset(options={"task": TASK})
    env.step("draft")
    env.step("```python\nprint(1)\n```")
    assert all(env.truncations.values())
    assert not any(env.terminations.values())
    assert env.infos["verifier"]["outcome"]["truncated"] is True
    assert env.infos["verifier"]["outcome"]["correct"] is False
    env.close()


def test_registered_in_pettingzoo_registry():
    env = pettingzoo.make("aec", "mappa/MathChat-v0", tasks=[TASK], sandbox=None)
    assert isinstance(env, MathChatEnv)
    par = pettingzoo.make("parallel", "mappa/MathChat-v0", tasks=[TASK], sandbox=None)
    assert par.unwrapped.env_id == "MathChat-v0"
    env.close()
    par.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(actions=st.lists(st.text(max_size=400), min_size=4, max_size=4))
def test_random_unicode_actions_never_crash(actions):
    env = make_env()
    env.reset(seed=1)
    for _agent in env.agent_iter():
        _, _, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else actions.pop(0) if actions else "")
        assert isinstance(info, dict)
    env.close()


# ---------------------------------------------------------------- scripted episodes


def test_scripted_correct_episode_gets_high_rewards_for_everyone():
    env = make_env()
    returns = play(env, GOOD_SCRIPT)
    outcome = env.state()["outcome"]
    assert outcome["correct"] is True
    assert outcome["predicted"] == "121932631112635269"
    rewards = {r.agent + str(r.turn): r.reward for r in env.transcript}
    assert rewards == {
        "problem_solver0": 1.0,
        "code_executor0": 1.0,
        "code_executor1": 0.8,
        "verifier0": 1.0,
    }
    assert returns["code_executor"] == pytest.approx(1.8)
    env.close()


def test_rerunning_the_same_cell_is_not_paid_twice():
    script = {**GOOD_SCRIPT, "code_executor": [GOOD_SCRIPT["code_executor"][0]] * 2}
    env = make_env()
    play(env, script)
    rewards = [r.reward for r in env.transcript if r.agent == "code_executor"]
    # A later turn is paid what it adds: nothing, below handing over (0.8).
    assert rewards == [1.0, 0.0]
    env.close()


def test_infos_name_the_rubric_version_of_each_verdict():
    env = make_env()
    play(env, GOOD_SCRIPT)
    assert {r.verdict.rubric_version for r in env.transcript} == {"mathchat-rules-v5"}
    env.close()


def test_the_rules_coach_follows_the_papers_reveal_with_an_answer_blind_rubric():
    env = make_env(reveal="last_agent")
    script = {
        **GOOD_SCRIPT,
        "problem_solver": [
            "123456789 * 987654321 = 121932631112635269, so \\boxed{121932631112635269}"
        ],
    }
    play(env, script)
    versions = [(r.agent, r.verdict.valid, r.verdict.rubric_version) for r in env.transcript]
    assert versions == [
        ("problem_solver", True, "mathchat-rules-blind-v2"),
        ("code_executor", True, "mathchat-rules-blind-v2"),
        ("code_executor", True, "mathchat-rules-blind-v2"),
        ("verifier", True, "mathchat-rules-v5"),
    ]
    # Blind: the draft's answer reached by a step that holds, code computed from the
    # problem's numbers, a hand-over of its output.
    assert [r.reward for r in env.transcript] == [0.8, 0.8, 0.7, 1.0]
    env.close()


def test_an_answer_blind_coach_gets_no_answer_in_the_metadata():
    task = MathTask(
        id="two", prompt="Either works.", answer="080", metadata={"accepted_answers": ("080", "81")}
    )
    coach = FixedCoach()  # prefers reveal="last_agent"
    env = make_env(coach=coach, tasks=[task])
    play(env, GOOD_SCRIPT, task)
    by_agent = {r.agent: r for r in coach.requests}
    for agent in ("problem_solver", "code_executor"):
        assert "accepted_answers" not in by_agent[agent].metadata
        assert "accepted_answers" not in by_agent[agent].metadata["task_metadata"]
    assert by_agent["verifier"].metadata["accepted_answers"] == ["080", "81"]
    assert by_agent["code_executor"].metadata["draft_answer"] == "121932631112635269"
    env.close()


def test_scripted_wrong_code_blames_the_code_executor():
    env = make_env()
    script = {
        "problem_solver": ["\\boxed{121932631112635269}"],
        "code_executor": [
            "```python\nprint(123456789 * 987654320)\n```",
            "So the answer is \\boxed{121932630124980948}",
        ],
        "verifier": ["\\boxed{121932630124980948}"],
    }
    play(env, script)
    by_turn = {(r.agent, r.turn): r for r in env.transcript}
    assert env.state()["outcome"]["correct"] is False
    assert by_turn[("problem_solver", 0)].reward == 1.0
    assert by_turn[("code_executor", 0)].reward <= 0.4
    assert by_turn[("code_executor", 1)].reward <= 0.2
    assert by_turn[("verifier", 0)].reward <= 0.2
    env.close()


def test_copying_the_problem_as_the_answer_earns_nothing():
    # Found in a GPU run: a trained verifier boxed the problem's own expression
    # ("\\boxed{91 * 64 - 317}"), which evaluates to the answer; it was graded correct
    # and the run learnt it instead of the arithmetic.
    task = MathTask(id="t-copy", prompt="Compute 91 * 64 - 317.", answer="5507")
    env = make_env(tasks=[task])
    script = {
        "problem_solver": ["We compute it: \\boxed{91 * 64 - 317}"],
        "code_executor": ["It is \\boxed{91 \\times 64 - 317}"],
        "verifier": ["The final answer is \\boxed{91 * 64 - 317}"],
    }
    play(env, script, task)
    assert env.state()["outcome"]["correct"] is False
    assert all(r.reward <= 0.3 for r in env.transcript), [r.reward for r in env.transcript]
    env.close()


def test_a_verifier_boxing_two_answers_is_not_correct():
    script = {**GOOD_SCRIPT, "verifier": ["\\boxed{42} \\boxed{121932631112635269}"]}
    env = make_env()
    play(env, script)
    assert env.state()["outcome"]["correct"] is False
    assert env.state()["outcome"]["predicted"] is None
    assert env.transcript[-1].reward == 0.0
    env.close()


def test_the_outcome_grades_each_agent_by_its_own_number():
    env = make_env()
    play(env, GOOD_SCRIPT)
    outcome = env.state()["outcome"]
    right = TASK.answer
    assert outcome["agent_answers"] == {
        "problem_solver": right,
        "code_executor": right,  # what its code printed
        "verifier": right,
    }
    assert outcome["agent_correct"] == dict.fromkeys(outcome["agent_answers"], True)
    env.close()


@pytest.mark.parametrize(
    ("script", "answers", "correct"),
    [
        (  # right draft, wrong code, a verifier that followed the code
            {
                "problem_solver": ["Multiply: \\boxed{5}"],
                "code_executor": ["```python\nprint(2 * 3)\n```", "So \\boxed{6}"],
                "verifier": ["\\boxed{6}"],
            },
            {"problem_solver": "5", "code_executor": "6", "verifier": "6"},
            {"problem_solver": True, "code_executor": False, "verifier": False},
        ),
        (  # a hedging draft, code that printed nothing after a run that did, an unboxed verdict
            {
                "problem_solver": ["\\boxed{5} or \\boxed{6}"],
                "code_executor": ["```python\nprint(2 + 3)\n```", "```python\nx = 1\n```"],
                "verifier": ["The final answer is 5."],
            },
            {"problem_solver": None, "code_executor": "5", "verifier": None},
            {"problem_solver": False, "code_executor": True, "verifier": False},
        ),
        (  # no code: the code executor's number is the one it states
            {
                "problem_solver": ["The answer is 4."],
                "code_executor": ["I agree with 4? No: \\boxed{5}"],
                "verifier": ["\\boxed{5}"],
            },
            {"problem_solver": "4", "code_executor": "5", "verifier": "5"},
            {"problem_solver": False, "code_executor": True, "verifier": True},
        ),
    ],
)
def test_agent_answers_and_correctness(script, answers, correct):
    env = make_env()
    play(env, script, OTHER)
    outcome = env.state()["outcome"]
    assert outcome["agent_answers"] == answers
    assert outcome["agent_correct"] == correct
    assert outcome["agent_correct"]["verifier"] == outcome["correct"]
    assert outcome["agent_answers"]["verifier"] == outcome["predicted"]
    env.close()


def test_a_cut_episode_lists_only_the_agents_that_acted():
    env = make_env(max_cycles=2)
    env.reset(options={"task": OTHER})
    env.step("\\boxed{5}")
    env.step("```python\nprint(2 + 3)\n```")
    outcome = env.infos["verifier"]["outcome"]
    assert outcome["agent_answers"] == {"problem_solver": "5", "code_executor": "5"}
    assert outcome["agent_correct"] == {"problem_solver": True, "code_executor": True}
    assert outcome["correct"] is False
    env.close()


def test_code_error_is_reported_to_agent_and_coach():
    env = make_env()
    env.reset(options={"task": TASK})
    env.step("draft without answer")
    env.step("```python\n1/0\n```")
    info = env.infos["code_executor"]
    assert info["tool"]["error"]["name"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in info["tool_output"]
    assert info["coach"]["score"] == 2.0
    # The code executor's second turn sees its first turn and the error.
    obs = env.observe("code_executor")
    assert [m["role"] for m in obs["messages"]] == ["system", "user", "assistant", "user"]
    assert "ZeroDivisionError" in obs["messages"][-1]["content"]
    env.close()


def test_turn_without_code_ends_the_code_executor_slot():
    env = make_env()
    env.reset(options={"task": OTHER})
    env.step("\\boxed{5}")
    env.step("I agree: \\boxed{5}")
    assert env.agent_selection == "verifier"
    verifier_prompt = env.observe("verifier")["messages"][-1]["content"]
    assert "I agree" in verifier_prompt
    assert "(no code ran)" in verifier_prompt
    env.close()


def test_answerless_actions_score_low():
    env = make_env()
    play(
        env,
        {
            "problem_solver": ["I think this is hard."],
            "code_executor": ["No idea."],
            "verifier": ["Cannot tell."],
        },
    )
    assert all(r.reward <= 0.1 for r in env.transcript)
    env.close()


def test_verifier_sees_only_last_output_unless_configured():
    env = make_env(verifier_sees_solver=True)
    env.reset(options={"task": OTHER})
    env.step("SOLVER-DRAFT \\boxed{5}")
    env.step("```python\nprint(2+3)\n```")
    env.step("done \\boxed{5}")
    content = env.observe("verifier")["messages"][-1]["content"]
    assert "SOLVER-DRAFT" in content
    assert "[stdout]\n5" in content
    env.close()
    env = make_env()
    env.reset(options={"task": OTHER})
    env.step("SOLVER-DRAFT \\boxed{5}")
    assert "SOLVER-DRAFT" not in env.observe("verifier")["messages"][-1]["content"]
    env.close()


def test_verifier_reply_picks_the_closing_line_and_rejects_unknown_names():
    from mappa_env.envs.mathchat import VERIFIER_ASKS

    for reply, line in VERIFIER_ASKS.items():
        env = make_env(verifier_reply=reply)
        env.reset(options={"task": OTHER})
        env.step("draft")
        env.step("```python\nprint(2+3)\n```")
        env.step("done \\boxed{5}")
        content = env.observe("verifier")["messages"][-1]["content"]
        assert content.endswith(line)
        others = [other for name, other in VERIFIER_ASKS.items() if name != reply]
        assert not any(other in content for other in others)
        env.close()
    with pytest.raises(ValueError, match="one_line"):
        make_env(verifier_reply="short")


def test_observation_carries_role_instructions_and_budget():
    env = make_env(max_new_tokens=1234)
    env.reset()
    obs, *_ = env.last()
    system = obs["messages"][0]
    assert system["role"] == "system"
    assert "agent 1 of 3" in system["content"]
    assert "1234 tokens" in system["content"]
    assert env.task.prompt in obs["text"]
    env.close()


def test_turn_limits_are_configurable():
    env = make_env(turns={"code_executor": 3})
    env.reset(options={"task": OTHER})
    env.step("x")
    for _ in range(3):
        assert env.agent_selection == "code_executor"
        env.step("```python\nprint(5)\n```")
    assert env.agent_selection == "verifier"
    with pytest.raises(ValueError, match="unknown agent"):
        make_env(turns={"nobody": 1})
    env.close()


# ---------------------------------------------------------------- credit modes and coach failures


def test_outcome_mode_gives_the_outcome_to_every_action():
    env = make_env(credit_mode="outcome")
    returns = play(env, GOOD_SCRIPT)
    # Paid at the end: every action's final reward is the outcome.
    assert all(r.reward == 1.0 and r.reward_valid for r in env.transcript)
    assert returns == {"problem_solver": 1.0, "code_executor": 2.0, "verifier": 1.0}
    env.close()


def test_mixed_mode_weights_coach_and_outcome():
    env = make_env(credit_mode="mixed", outcome_weight=0.25)
    returns = play(env, GOOD_SCRIPT)
    assert returns["problem_solver"] == pytest.approx(0.75 * 1.0 + 0.25)
    assert returns["code_executor"] == pytest.approx(0.75 * 1.8 + 0.25 * 2)
    env.close()


def test_outcome_mode_runs_without_a_coach():
    env = make_env(coach=None, credit_mode="outcome")
    play(env, GOOD_SCRIPT)
    assert env.infos == {}  # all agents were removed by their dead steps
    assert env.state()["outcome"]["correct"] is True
    env.close()
    with pytest.raises(ValueError, match="needs a coach"):
        make_env(coach=None)


def test_invalid_verdict_is_flagged_never_a_reward():
    env = make_env(coach=FixedCoach(score=None))
    env.reset(options={"task": TASK})
    env.step("draft")
    info = env.infos["problem_solver"]
    assert info["reward_valid"] is False
    assert info["coach"]["valid"] is False
    assert info["coach"]["score"] is None
    assert math.isnan(env.rewards["problem_solver"])
    env.close()
    env = make_env(coach=FixedCoach(score=None), invalid_reward=0.0)
    env.reset()
    env.step("draft")
    assert env.rewards["problem_solver"] == 0.0
    assert env.infos["problem_solver"]["reward_valid"] is False
    env.close()


def test_coach_exception_is_flagged_and_episode_continues():
    env = make_env(coach=RaisingCoach())
    play(env, GOOD_SCRIPT)
    assert env.state()["outcome"]["correct"] is True
    assert all(not r.verdict.valid for r in env.transcript)
    assert "RuntimeError" in env.transcript[0].verdict.error
    env.close()


def test_reveal_policy_controls_ground_truth():
    coach = FixedCoach()
    env = make_env(coach=coach)  # FixedCoach prefers "last_agent"
    play(env, GOOD_SCRIPT)
    shown = [(r.agent, r.ground_truth) for r in coach.requests]
    assert shown[-1] == ("verifier", TASK.answer)
    assert all(truth is None for agent, truth in shown[:-1])
    env.close()
    coach = FixedCoach()
    env = make_env(coach=coach, reveal="never")
    play(env, GOOD_SCRIPT)
    assert all(r.ground_truth is None for r in coach.requests)
    env.close()


# ---------------------------------------------------------------- bad input


def test_non_string_action_is_a_clear_type_error():
    env = make_env()
    env.reset()
    for bad in (123, b"bytes", ["list"], None):
        with pytest.raises(TypeError, match=r"str|text|None"):
            env.step(bad)
    env.step("fine")  # the env is still usable
    env.close()


def test_dead_agent_step_follows_pettingzoo_rule():
    env = make_env()
    play(env, GOOD_SCRIPT)
    env.reset(options={"task": OTHER})
    for agent, action in [("problem_solver", "a"), ("code_executor", "b"), ("verifier", "c")]:
        assert env.agent_selection == agent
        env.step(action)
    assert env.terminations[env.agent_selection]
    with pytest.raises(ValueError, match="only valid action is None"):
        env.step("not allowed")
    while env.agents:
        env.step(None)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(None)
    env.close()


def test_oversize_action_is_cut_and_flagged():
    env = make_env(max_action_chars=100)
    env.reset()
    env.step("x" * 1000)
    info = env.infos["problem_solver"]
    assert info["action_truncated"] is True
    assert len(env.transcript[0].action) == 100
    env.close()


def test_unknown_options_are_rejected_clearly():
    with pytest.raises(ValueError, match="unknown credit mode 'best'"):
        make_env(credit_mode="best")
    with pytest.raises(ValueError, match="sandbox"):
        make_env(sandbox="docker")
    with pytest.raises(ValueError, match="unknown environment"):
        mappa_env.make("MathChat-v9")
    env = make_env()
    with pytest.raises(KeyError, match="no task with id"):
        env.reset(options={"task_id": "missing"})
    env.close()


# ---------------------------------------------------------------- render, state, close, seeding


def test_render_state_and_close(capsys):
    env = make_env(render_mode="ansi")
    play(env, GOOD_SCRIPT)
    text = env.render()
    assert "problem_solver" in text
    assert "coach: 10/10" in text
    state = env.state()
    assert state["task_id"] == TASK.id
    assert len(state["actions"]) == 4
    sandboxes = [s for s in InProcessSandbox.instances if s.calls == [GOOD_SCRIPT_CODE]]
    assert sandboxes
    assert sandboxes[-1].closed  # closed as soon as the episode ended
    env.close()
    env.close()  # idempotent
    human = make_env(render_mode="human")
    play(human, GOOD_SCRIPT)
    human.render()
    assert "verifier" in capsys.readouterr().out
    human.close()


GOOD_SCRIPT_CODE = "print(123456789 * 987654321)\n"


def test_seeded_task_order_is_reproducible():
    tasks = [MathTask(id=f"t{i}", prompt=f"What is {i}+0?", answer=str(i)) for i in range(20)]

    def order(seed):
        env = make_env(tasks=tasks)
        env.reset(seed=seed)
        ids = [env.task.id]
        for _ in range(5):
            env.reset()
            ids.append(env.task.id)
        env.close()
        return ids

    assert order(3) == order(3)
    assert order(3) != order(4)


def test_generated_tasks_are_the_offline_default():
    env = mappa_env.make("MathChat-v0", sandbox=None, seed=0)
    env.reset(seed=0)
    assert env.task.id.startswith("gen-")
    env.close()


# ---------------------------------------------------------------- async core


def test_async_core_overlaps_coach_latency_across_episodes():
    n_episodes = 8
    # Every coach call waits until all 8 episodes have one in flight: calls that ran one
    # after another would never get there.
    coach = FixedCoach(score=7.0, gather=n_episodes)

    async def one_episode(i: int) -> float:
        env = make_env(coach=coach, sandbox=None)
        await env.areset(seed=i)
        for _ in range(3):
            await env.astep("no code here")
        await env.aclose()
        return sum(r.reward for r in env.transcript)

    async def main():
        return await asyncio.gather(*(one_episode(i) for i in range(n_episodes)))

    totals = asyncio.run(main())
    assert totals == [pytest.approx(2.1)] * n_episodes
    assert coach.most_in_flight == n_episodes


def test_sync_api_works_inside_a_running_event_loop():
    async def notebook_cell():
        env = make_env(sandbox=None)
        env.reset(options={"task": OTHER})
        env.step("\\boxed{5}")
        reward = env.rewards["problem_solver"]
        env.close()
        return reward

    assert asyncio.run(notebook_cell()) == 1.0


@pytest.mark.slow
def test_real_jupyter_sandbox_episode():
    env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox="jupyter")
    play(env, GOOD_SCRIPT)
    assert env.state()["outcome"]["correct"] is True
    assert env.transcript[1].tool.result.stdout.strip() == TASK.answer
    env.close()


def test_every_accepted_answer_counts():
    task = MathTask(
        id="two-answers",
        prompt="Either works.",
        answer="080",
        metadata={"accepted_answers": ("080", "081")},
    )
    env = make_env(tasks=[task])
    play(
        env,
        {"problem_solver": ["\\boxed{81}"], "code_executor": ["ok"], "verifier": ["\\boxed{81}"]},
        task,
    )
    assert env.state()["outcome"]["correct"] is True
    assert env.state()["outcome"]["accepted_answers"] == ["080", "081"]
    assert env.transcript[-1].reward == 1.0
    env.close()


def test_lone_surrogates_in_actions_are_replaced_not_fatal():
    env = make_env()
    env.reset(options={"task": OTHER})
    env.step("draft \ud800")
    env.step("```python\nprint(2 + 3)  # \udcff\n```")
    assert env.transcript[0].action == "draft ?"
    assert env.infos["code_executor"]["tool"]["stdout"].strip() == "5"
    env.close()


def test_generated_task_sets_from_a_mapping():
    spec = {"n": 5, "seed": 3, "kinds": ["expression"], "difficulty": "medium"}
    env = mappa_env.make("MathChat-v0", tasks=spec, sandbox=None)
    assert [t.id for t in env.tasks] == [f"gen-s3-{i:05d}" for i in range(5)]
    assert {t.metadata["kind"] for t in env.tasks} == {"expression"}
    env.close()
    env = mappa_env.make("MathChat-v0", tasks={"n": 2, "kinds": "expression,gcd_lcm"}, seed=4)
    assert [t.metadata["kind"] for t in env.tasks] == ["expression", "gcd_lcm"]
    assert env.tasks[0].metadata["seed"] == 4  # the env's seed when the spec names none
    env.close()
    with pytest.raises(ValueError, match="mapping with 'n'"):
        mappa_env.make("MathChat-v0", tasks={"count": 3})
    with pytest.raises(ValueError, match="got keys"):
        mappa_env.make("MathChat-v0", tasks={"n": 3, "level": 2})
    # "exclude": none of another set's problems (kind, template, numbers), none twice.
    easy = {"kinds": ["word_one_step"], "difficulty": "easy", "secret": ""}
    train = {"n": 64, "seed": 1, **easy}
    env = mappa_env.make("MathChat-v0", tasks={"n": 8, "seed": 2, **easy, "exclude": train})
    seen = {problem_identity(t) for t in generate_math_tasks(**train)}
    held_out = {problem_identity(t) for t in env.tasks}
    assert len(held_out) == 8
    assert not held_out & seen
    env.close()
    with pytest.raises(ValueError, match="'exclude' must be a generated task set"):
        mappa_env.make("MathChat-v0", tasks={"n": 3, "exclude": "gen:4"})


def test_every_prompt_ends_with_what_to_do_now():
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=None, seed=0)
    env.reset(seed=0)
    endings = {}
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        endings.setdefault(agent, env.observe(agent)["messages"][-1]["content"].splitlines()[-1])
        env.step("```python\nprint(1)\n```" if agent == "code_executor" else "It is 1.")
    assert endings == {
        "problem_solver": "Solve it step by step and end with your answer in \\boxed{}.",
        "code_executor": "Check it with Python: reply with one ```python block that prints "
        "the answer.",
        "verifier": "Give the final answer as \\boxed{}.",
    }
    env.close()
