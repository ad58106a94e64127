"""Credit: the environment is the one owner of each action's reward.

The pure functions against hand-computed numbers; then the same number in every place a
reward is read: ``env.rewards`` (summed by PettingZoo's ``last()``), the transcript,
``infos``, the runner's trajectories, the saved JSONL and what the trainer trains on.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from mappa_env.credit import (
    CREDIT_MODES,
    episode_action_rewards,
    provisional_reward,
)
from tests.fakes import FixedCoach
from tests.toy_env import LetterEnv, LetterPairEnv, share_of_a

# ---------------------------------------------------------------- the pure functions


def test_credit_modes_by_hand():
    scores = [0.9, 0.8, None, 1.0]
    assert episode_action_rewards(scores, 0.0, "process") == scores
    assert episode_action_rewards(scores, 0.0, "outcome") == [0.0] * 4
    mixed = episode_action_rewards(scores, 0.0, "mixed", outcome_weight=0.25)
    assert mixed[0] == pytest.approx(0.675)
    assert mixed[2] is None
    back = episode_action_rewards(scores, 0.0, "backprop", backprop_decay=0.5)
    # error = 0 - 1.0 = -1, shares 0.5^(3 - i): last -> 0, third invalid,
    # second 0.8 - 0.25 = 0.55, first 0.9 - 0.125 = 0.775
    assert back == [pytest.approx(0.775), pytest.approx(0.55), None, 0.0]
    assert episode_action_rewards([0.5, None], 1.0, "backprop") == [0.5, None]
    # agent_oracle pays each action its agent's own correctness, whatever the coach said.
    oracle = episode_action_rewards(scores, 0.0, "agent_oracle", agent_correct=[1, 0, 1, None])
    assert oracle == [1.0, 0.0, 1.0, None]
    with pytest.raises(ValueError, match="agent_correct"):
        episode_action_rewards(scores, 0.0, "agent_oracle")
    with pytest.raises(ValueError, match="unknown credit mode"):
        episode_action_rewards(scores, 0.0, "magic")
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="outcome_weight"):
            episode_action_rewards(scores, 0.0, "mixed", outcome_weight=bad)


def test_provisional_rewards_are_what_is_known_when_the_action_is_taken():
    assert provisional_reward(0.8, "process") == 0.8
    assert provisional_reward(0.8, "backprop") == 0.8
    assert provisional_reward(0.8, "mixed", 0.25) == pytest.approx(0.6)
    assert provisional_reward(0.8, "outcome") == 0.0
    assert provisional_reward(None, "agent_oracle") == 0.0
    assert provisional_reward(None, "process") is None
    assert provisional_reward(None, "mixed") is None


# ---------------------------------------------------------------- the environment


class JudgedPairEnv(LetterPairEnv):
    """Two agents; the episode succeeds on the editor's text, each agent on its own."""

    reports_agent_correct = True

    async def episode_outcome(self) -> dict[str, Any]:
        editor = self.last_record("editor")
        share = share_of_a(editor.action) if editor else 0.0
        return {
            "success": share > 0.5,
            "reward": float(share > 0.5),
            "agent_correct": {r.agent: share_of_a(r.action) > 0.5 for r in self.transcript},
        }


def play(env: LetterPairEnv, replies: dict[str, str]) -> dict[str, float]:
    """One episode; each agent's return as PettingZoo's ``last()`` reports it."""
    env.reset(seed=0)
    returns: dict[str, float] = {}
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last()
        returns[agent] = returns.get(agent, 0.0) + reward
        env.step(None if terminated or truncated else replies[agent])
    return returns


REPLIES = {"writer": "aaab", "editor": "abab"}  # writer 0.75 (right), editor 0.5 (wrong)
SCORES = {"writer": 0.75, "editor": 0.5}


@pytest.mark.parametrize("mode", CREDIT_MODES)
def test_every_place_holds_the_environments_final_reward(mode):
    env = JudgedPairEnv(credit_mode=mode, outcome_weight=0.25, backprop_decay=0.5)
    returns = play(env, REPLIES)
    expected = episode_action_rewards(
        [SCORES["writer"], SCORES["editor"]],
        0.0,  # the editor's text is not mostly "a": the episode failed
        mode,
        outcome_weight=0.25,
        backprop_decay=0.5,
        agent_correct=[1.0, 0.0],
    )
    assert [r.reward for r in env.transcript] == expected
    assert all(r.reward_valid for r in env.transcript)
    state = env.state()["actions"]
    assert [a["reward"] for a in state] == expected
    for agent, value in zip(("writer", "editor"), expected):
        assert returns[agent] == pytest.approx(value, abs=1e-12)
    env.close()


def test_the_end_pays_what_the_steps_did_not():
    env = JudgedPairEnv(credit_mode="outcome")
    env.reset(seed=0)
    env.step("aaaa")
    assert env.rewards["writer"] == 0.0  # the outcome is not known yet
    assert env.infos["writer"]["credit"] == {
        "mode": "outcome",
        "outcome_weight": 0.5,
        "backprop_decay": 0.5,
    }
    env.step("aaaa")
    # The episode succeeded: both agents are paid 1 at the end.
    assert env.rewards == {"writer": 1.0, "editor": 1.0}
    assert env.infos["writer"]["action_rewards"] == [1.0]
    assert env.infos["editor"]["action_rewards"] == [1.0]
    env.close()


def test_an_invalid_verdict_stays_masked_in_the_modes_that_use_it():
    for mode, valid in (("process", False), ("mixed", False), ("outcome", True)):
        env = JudgedPairEnv(coach=FixedCoach(score=None), credit_mode=mode)
        play(env, REPLIES)
        assert [r.reward_valid for r in env.transcript] == [valid, valid], mode
        if not valid:
            assert all(math.isnan(r.reward) for r in env.transcript)
            assert env.infos == {}  # dead steps removed the agents
        env.close()


def test_credit_settings_are_checked_and_the_old_name_still_works():
    with pytest.raises(ValueError, match="unknown credit mode"):
        JudgedPairEnv(credit_mode="best")
    with pytest.raises(ValueError, match="needs a coach"):
        JudgedPairEnv(coach=None, credit_mode="mixed")
    JudgedPairEnv(coach=None, credit_mode="agent_oracle").close()
    # An environment whose outcome does not say which agent was right cannot pay it.
    with pytest.raises(ValueError, match="reports_agent_correct"):
        LetterEnv(credit_mode="agent_oracle")
    with pytest.warns(DeprecationWarning, match="credit_mode"):
        env = JudgedPairEnv(reward_mode="outcome")
    assert env.credit_mode == "outcome"
    env.close()


# ---------------------------------------------------------------- runner, saved rollouts, trainer


class _Echo:
    """A policy that replies with a fixed text per agent (no model needed)."""

    name = "echo"

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies

    async def agenerate(self, batch, params):
        from mappa_agents.policy import Generation

        outputs = []
        for messages in batch:
            agent = "writer" if "writer" in messages[0]["content"] else "editor"
            text = self.replies[agent]
            outputs.append(Generation(text=text, prompt_ids=[1], response_ids=[2], logprobs=[-1.0]))
        return outputs


def test_trajectories_hold_the_final_reward_and_aborted_episodes_none():
    pytest.importorskip("mappa_agents")
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.system import AgentSystem

    class RoleEnv(JudgedPairEnv):
        def agent_messages(self, agent):  # the echo policy reads the role from the prompt
            return [{"role": "system", "content": agent}, {"role": "user", "content": "go"}]

    policy = _Echo({"writer": "aaaa", "editor": "aaab"})
    system = AgentSystem({"writer": policy, "editor": policy})
    with RolloutRunner(
        lambda: RoleEnv(credit_mode="outcome"), system, concurrency=2, progress=False
    ) as runner:
        episodes = runner.run(2)
    for episode in episodes:
        assert episode.outcome["reward"] == 1.0
        assert [(a.reward, a.reward_valid) for a in episode.actions] == [(1.0, True)] * 2
        assert all(a.credit["mode"] == "outcome" for a in episode.actions)
        assert [a.trainable_reward for a in episode.actions] == [1.0, 1.0]
    # An episode whose policy fails is aborted: none of its rewards is settled.
    policy.replies = {"writer": "aaaa"}  # the editor's generation raises KeyError
    with RolloutRunner(lambda: RoleEnv(credit_mode="process"), system, progress=False) as runner:
        (aborted,) = runner.run(1)
    assert aborted.aborted
    assert [a.trainable_reward for a in aborted.actions] == [None]
    assert math.isnan(aborted.actions[0].reward)


def test_the_trainer_trains_on_the_saved_reward_and_refuses_other_credit(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import functools

    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_agents.trajectory import load_jsonl
    from mappa_train.trainer import Trainer
    from tests.toy_env import toy_train_config

    model_dir = tiny_model_dir(tmp_path / "model")
    envs = functools.partial(JudgedPairEnv, credit_mode="outcome")
    config = toy_train_config(tmp_path, model_dir, env="LetterPair-v0", steps=1)
    config.credit_mode = "outcome"
    trainer = Trainer(config, env_factory=envs, eval_env_factory=envs)
    (metrics,) = trainer.train()
    saved = load_jsonl(tmp_path / "run" / "rollouts" / "step-000000.jsonl")
    # Under outcome credit the saved column is the outcome, the number trained on.
    assert all(s.reward == s.outcome["reward"] for s in saved)
    for agent in ("writer", "editor"):
        mine = [s.reward for s in saved if s.agent == agent]
        assert metrics[f"{agent}/mean_reward"] == pytest.approx(sum(mine) / len(mine))
    # Episodes paid under process credit are not trained on as outcome credit.
    process = functools.partial(JudgedPairEnv, credit_mode="process")
    other = Trainer(
        toy_train_config(tmp_path / "b", model_dir, env="LetterPair-v0", credit_mode="outcome"),
        env_factory=process,
        eval_env_factory=process,
    )
    other.setup()
    try:
        with pytest.raises(ValueError, match="credit_mode='outcome'"):
            other.learn(other.rollout(0))
    finally:
        other.close()
    with pytest.raises(ValueError, match="disagree with the config"):
        Trainer(
            toy_train_config(
                tmp_path / "c", model_dir, env="Letter-v0", env_options={"credit_mode": "mixed"}
            )
        )


def test_mathchat_pays_agent_oracle_credit_from_each_agents_own_number():
    import mappa_env
    from mappa_env.tasks import MathTask
    from tests.fakes import InProcessSandbox

    task = MathTask(id="t", prompt="Compute 76 * 89 - 230.", answer="6534")
    env = mappa_env.make(
        "MathChat-v0",
        tasks=[task],
        sandbox=InProcessSandbox,
        coach=None,
        credit_mode="agent_oracle",
    )
    env.reset(options={"task": task})
    env.step("76 * 89 is 6764, minus 230 gives \\boxed{6434}.")  # wrong draft
    env.step("```python\nprint(76 * 89 - 230)\n```")  # computes the right number
    env.step("No more code: \\boxed{6534}")
    env.step("The final answer is \\boxed{6534}")
    assert env.outcome["agent_correct"] == {
        "problem_solver": False,
        "code_executor": True,
        "verifier": True,
    }
    assert [(r.agent, r.reward) for r in env.transcript] == [
        ("problem_solver", 0.0),
        ("code_executor", 1.0),
        ("code_executor", 1.0),
        ("verifier", 1.0),
    ]
    env.close()
