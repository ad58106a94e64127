"""The episode outcome as one typed value, and "no reward" read one way.

:class:`EpisodeOutcome` is built from an environment's ``episode_outcome()`` dict and
read by attribute; its dict form is what is saved, byte for byte as before, and it still
reads like the dict it was. Every former encoding of "no reward" (NaN, a ``reward_valid``
flag beside a number, a missing outcome key, JSON ``null``) reads as ``None``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from mappa_agents.trajectory import ActionSample, EpisodeResult, load_jsonl, save_jsonl
from mappa_env.envs.outcome import EpisodeOutcome, usable_reward
from tests.fakes import FixedCoach
from tests.toy_env import LetterEnv, LetterPairEnv, share_of_a

# An outcome as MathChat-v0 returns it (plus the ``truncated`` the environment adds) and
# one as DSBench-v0 does: the key orders differ, and both must survive.
MATHCHAT = {
    "correct": True,
    "predicted": "12",
    "answer": "12",
    "reward": 1.0,
    "task_id": "gen-0001",
    "task_type": None,
    "agent_answers": {"problem_solver": "12", "verifier": "12"},
    "agent_correct": {"problem_solver": True, "verifier": True},
    "accepted_answers": ["12", "12.0"],
    "truncated": False,
}
DSBENCH = {
    "success": False,
    "metric": "rmse",
    "value": None,
    "normalized": 0.0,
    "fair_value": None,
    "reason": "no submission.csv",
    "task_id": "diabetes",
    "task_type": "regression",
    "reward": 0.0,
    "truncated": True,
}


@pytest.mark.parametrize("data", [MATHCHAT, DSBENCH, {"reward": 1}], ids=["math", "ds", "int"])
def test_the_dict_form_is_the_dict_it_was_built_from(data):
    outcome = EpisodeOutcome.from_dict(data)
    assert json.dumps(outcome.to_dict()) == json.dumps(data)
    assert repr(outcome.to_dict()) == repr(data)
    # Code written against the dict keeps working.
    assert outcome == data
    assert dict(outcome) == data
    assert list(outcome) == list(data)
    assert outcome["reward"] == data["reward"]
    assert outcome.get("no such key", "default") == "default"
    assert "reward" in outcome
    assert "error" not in outcome
    with pytest.raises(KeyError):
        outcome["error"]


def test_fields_are_read_by_attribute():
    math_outcome = EpisodeOutcome.from_dict(MATHCHAT)
    assert (math_outcome.reward, math_outcome.correct, math_outcome.success) == (1.0, True, None)
    assert math_outcome.agent_correct == {"problem_solver": True, "verifier": True}
    assert math_outcome.facts["predicted"] == "12"
    assert math_outcome.truncated is False
    assert not math_outcome.aborted
    assert math_outcome.succeeded
    ds_outcome = EpisodeOutcome.from_dict(DSBENCH)
    assert (ds_outcome.success, ds_outcome.task_type, ds_outcome.truncated) == (
        False,
        "regression",
        True,
    )
    assert not ds_outcome.succeeded
    # Neither key: a full reward is a success.
    assert EpisodeOutcome(reward=1.0).succeeded
    assert not EpisodeOutcome(reward=0.5).succeeded
    assert EpisodeOutcome(reward=1.0, task_id="t").to_dict() == {"reward": 1.0, "task_id": "t"}
    with pytest.raises(AttributeError):
        math_outcome.reward = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="must not repeat typed fields"):
        EpisodeOutcome(facts={"reward": 1.0})
    with pytest.raises(ValueError, match="must name every fact"):
        EpisodeOutcome(reward=1.0, facts={"note": "x"}, order=("reward",))


def test_an_aborted_episode_has_no_reward():
    outcome = EpisodeOutcome.aborted_with("the model is unreachable", "t-1")
    assert outcome.to_dict() == {
        "error": "the model is unreachable",
        "aborted": True,
        "task_id": "t-1",
    }
    assert outcome.aborted
    assert outcome.reward is None
    assert not outcome.succeeded
    assert EpisodeOutcome.aborted_with("boom").to_dict() == {"error": "boom", "aborted": True}


class _Graded(LetterPairEnv):
    """Two agents; an outcome with keys of its own in an order of its own."""

    async def episode_outcome(self) -> dict[str, Any]:
        share = share_of_a(self.last_record("editor").action)
        return {"share": share, "reward": share, "task_id": self.task.id, "note": "graded"}


def test_the_environment_holds_the_typed_outcome_and_saves_its_dict():
    env = _Graded()
    env.reset(seed=0)
    env.step("aaab")
    env.step("aaab")  # the episode ends: the agents still hold their last infos
    expected = {"share": 0.75, "reward": 0.75, "task_id": "toy-0", "note": "graded"}
    expected["truncated"] = False
    assert isinstance(env.outcome, EpisodeOutcome)
    assert env.outcome.reward == 0.75
    assert env.outcome.facts["note"] == "graded"
    for agent in ("writer", "editor"):
        shown = env.infos[agent]["outcome"]
        assert type(shown) is dict
        assert json.dumps(shown) == json.dumps(expected)
    state = env.state()
    assert json.dumps(state["outcome"]) == json.dumps(expected)
    json.dumps(state)  # the whole snapshot stays plain data
    assert f"=== outcome: {expected} ===" in env.transcript_text()
    env.close()


def _sample(**changes: Any) -> ActionSample:
    values: dict[str, Any] = {
        "episode_id": "ep-00000",
        "task_id": "t",
        "env_id": "Letter-v0",
        "agent": "writer",
        "turn": 0,
        "step": 0,
        "policy": "echo",
        "messages": [{"role": "user", "content": "go"}],
        "text": "aaab",
        "reasoning": None,
        "prompt_ids": [1],
        "response_ids": [2],
        "logprobs": [-1.0],
        "finish_reason": "stop",
        "reward": 0.75,
        "reward_valid": True,
    }
    return ActionSample(**{**values, **changes})


def test_trajectory_rows_keep_the_outcome_dict_and_old_files_load(tmp_path):
    sample = _sample(outcome=dict(MATHCHAT))
    assert isinstance(sample.outcome, EpisodeOutcome)
    row = sample.to_row()
    assert json.dumps(row["outcome"]) == json.dumps(MATHCHAT)
    # The row written from a typed outcome is the row written from the dict.
    assert sample.to_json() == _sample(outcome=EpisodeOutcome.from_dict(MATHCHAT)).to_json()
    path = save_jsonl(tmp_path / "t.jsonl", [sample])
    (loaded,) = load_jsonl(path)
    assert isinstance(loaded.outcome, EpisodeOutcome)
    assert loaded.outcome == MATHCHAT
    assert loaded.outcome_reward == 1.0
    assert loaded.to_json() == sample.to_json()
    episode = EpisodeResult("ep-00000", "t", "Letter-v0", [loaded], {"error": "x", "aborted": True})
    assert isinstance(episode.outcome, EpisodeOutcome)
    assert episode.aborted


# ---------------------------------------------------------------- "no reward" is None


@pytest.mark.parametrize(
    ("reward", "valid"),
    [
        (math.nan, False),  # the default invalid_reward, flagged
        (math.nan, True),  # NaN alone
        (0.0, False),  # invalid_reward=0.0: a number beside a False flag
        (-1.0, False),  # invalid_reward=-1.0
        (None, True),  # JSON null, a credit mode's unpaid action
        (math.inf, True),
        ("0.5", True),
    ],
)
def test_every_former_encoding_of_no_reward_reads_as_none(reward, valid):
    assert usable_reward(reward, valid) is None


def test_a_reward_that_is_there_reads_as_a_float():
    assert usable_reward(0.75) == 0.75
    assert usable_reward(1) == 1.0
    assert isinstance(usable_reward(1), float)
    assert usable_reward(-0.0, True) == 0.0


def test_each_seam_reads_no_reward_as_none(tmp_path):
    # An outcome without a "reward" key (an aborted episode's).
    assert EpisodeOutcome.from_dict({"error": "x", "aborted": True}).reward is None
    assert _sample(outcome={"error": "x", "aborted": True}).outcome_reward is None
    # A trajectory row whose reward was written as null (NaN in memory).
    row = json.loads(_sample(reward=math.nan, reward_valid=False).to_json())
    assert row["reward"] is None
    loaded = ActionSample.from_dict(row)
    assert math.isnan(loaded.reward)
    assert loaded.trainable_reward is None
    # A number with reward_valid False: the flag wins.
    assert _sample(reward=0.0, reward_valid=False).trainable_reward is None
    # An action resting on an invalid verdict, whatever invalid_reward it carries.
    for invalid_reward in (math.nan, 0.0, -1.0):
        env = LetterEnv(coach=FixedCoach(score=None), invalid_reward=invalid_reward)
        env.reset(seed=0)
        env.step("aaab")
        (record,) = env.transcript
        assert not record.reward_valid
        assert record.usable_reward is None
        assert env.infos["writer"]["action_rewards"] == [None]
        assert env.infos["writer"]["reward_valid"] is False
        env.close()
