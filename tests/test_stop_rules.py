"""A run whose coach scores none of its actions stops, naming the coach's last error."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import pytest

from mappa_env.errors import RunStoppedError
from mappa_train.stop_rules import UnscoredStopRule, unscored_share


def _actions(scored: int, unscored: int, error: str = "HTTP 500 from the judge"):
    ok = [SimpleNamespace(trainable_reward=0.5, coach={"valid": True})] * scored
    bad = [SimpleNamespace(trainable_reward=None, coach={"valid": False, "error": error})]
    return ok + bad * unscored


def test_the_rule_counts_steps_in_a_row_and_names_the_last_error():
    assert unscored_share(_actions(1, 3)) == (3, 4, "HTTP 500 from the judge")
    rule = UnscoredStopRule(threshold=1.0, patience=2)
    for step in (_actions(0, 4), _actions(1, 3), _actions(0, 4), []):
        rule.observe(step)
        rule.stop_if_due()  # an outage of one step, a partly scored one, an empty one
    assert rule.observe(_actions(0, 4, "timeout")) == {"rollout/unscored_rate": 1.0}
    with pytest.raises(RunStoppedError, match="2 steps in a row no action could be scored"):
        rule.stop_if_due()
    half = UnscoredStopRule(threshold=0.5, patience=1)
    half.observe(_actions(1, 1))
    with pytest.raises(RunStoppedError, match=r"50% of the actions could not be scored"):
        half.stop_if_due()
    never = UnscoredStopRule(patience=0)
    for _ in range(5):
        never.observe(_actions(0, 2))
        never.stop_if_due()


def test_a_run_whose_coach_scores_nothing_stops_with_its_error(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.trainer import Trainer
    from tests.fakes import FixedCoach
    from tests.toy_env import LetterEnv, toy_train_config

    config = toy_train_config(
        tmp_path, tiny_model_dir(tmp_path / "model"), steps=8, prompts_per_step=1,
        samples_per_prompt=2, max_new_tokens=4, train_batch_size=2, micro_batch_size=2,
    )  # fmt: skip
    make = functools.partial(LetterEnv, coach=FixedCoach(score=None))
    trainer = Trainer(config, env_factory=make, eval_env_factory=make)
    with pytest.raises(RunStoppedError) as caught:
        trainer.train()
    message = str(caught.value)
    assert "2 steps in a row no action could be scored" in message
    assert "The coach's last error: scripted failure" in message
    assert trainer.step == 2
    lines = [json.loads(x) for x in trainer.metrics_path.read_text().splitlines()]
    assert [(m["step"], m["rollout/unscored_rate"], m["train/tokens"]) for m in lines] == [
        (1, 1.0, 0),
        (2, 1.0, 0),
    ]


def test_a_run_that_trained_nothing_says_why():
    from mappa_train.cli import nothing_trained

    trained = [{"step": 1, "train/tokens": 0}, {"step": 2, "train/tokens": 12}]
    assert nothing_trained(trained) is None
    cut = [{"step": s, "train/tokens": 0, "a/masked_length": 4.0} for s in (1, 2, 3)]
    assert nothing_trained(cut) == (
        "the 3 steps trained no token: 12 actions were cut by max_new_tokens and masked "
        "(raise --max-new-tokens, or pass --no-mask-truncated)"
    )
