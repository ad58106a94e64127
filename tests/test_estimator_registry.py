"""Advantage estimators as plug-ins: one defined here, outside the package, trains."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train import (  # noqa: E402
    AdvantageEstimator,
    AgentAdvantages,
    TrainConfig,
    Trainer,
    estimator_names,
    get_estimator,
    register_estimator,
    unregister_estimator,
)
from tests.toy_env import LetterEnv, toy_train_config  # noqa: E402


class RecordingZeros:
    """Advantage 0 on every token, and a record of what it was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, tuple[int, ...]]] = []

    def __call__(self, batches, config):
        self.calls.append({agent: tuple(b.mask.shape) for agent, b in batches.items()})
        out = {}
        for agent, batch in batches.items():
            assert batch.rewards.shape == (batch.mask.shape[0],)
            assert batch.old_logprobs.shape == batch.ref_logprobs.shape == batch.mask.shape
            assert len(batch.group_keys) == batch.mask.shape[0]
            out[agent] = AgentAdvantages(
                torch.zeros_like(batch.mask), {"zeros_calls": float(len(self.calls))}
            )
        return out


@pytest.fixture
def zeros_estimators():
    """Two registered copies of the zero estimator (KL in the loss / in the reward);
    removed again after the test so no other test sees them."""
    in_loss, in_reward = RecordingZeros(), RecordingZeros()
    register_estimator("test_zeros", in_loss)  # kl_in_reward defaults to False
    register_estimator("test_zeros_kl_in_reward", AdvantageEstimator(in_reward, True))
    yield in_loss, in_reward
    unregister_estimator("test_zeros")
    unregister_estimator("test_zeros_kl_in_reward")
    assert "test_zeros" not in estimator_names()


def _config(tmp_path, estimator, **changes):
    settings = dict(
        steps=2, prompts_per_step=2, samples_per_prompt=2, concurrency=4, max_new_tokens=6,
        train_batch_size=4, micro_batch_size=4, advantage_estimator=estimator,
    )  # fmt: skip
    settings.update(changes)
    return toy_train_config(tmp_path, tiny_model_dir(tmp_path / "model"), **settings)


def _train(config):
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    trainer.setup()
    model = trainer.learners["writer"].model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    history = trainer.train()
    changed = any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    return history, changed


def test_an_estimator_registered_outside_the_package_drives_the_update(tmp_path, zeros_estimators):
    in_loss, _ = zeros_estimators
    history, changed = _train(_config(tmp_path, "test_zeros"))
    assert [list(call) for call in in_loss.calls] == [["writer"], ["writer"]]
    # Its stats are logged, and its zero advantages (no KL: kl_coef=0) make no update.
    assert [m["writer/zeros_calls"] for m in history] == [1.0, 2.0]
    assert all(m["writer/grad_norm"] == 0.0 for m in history)
    assert not changed
    # The same run with the built-in estimator does move the weights.
    _, changed = _train(_config(tmp_path / "b", "reinforce_pp"))
    assert changed


def test_the_trainer_asks_the_estimator_where_the_kl_goes(tmp_path, zeros_estimators):
    # Zero advantages, kl_coef > 0: an estimator that leaves the KL to the trainer gets
    # a KL term in its loss (whose gradient is not 0), one that folds it in gets none.
    history, changed = _train(_config(tmp_path / "a", "test_zeros", kl_coef=0.5))
    assert changed
    assert history[0]["writer/grad_norm"] > 0
    history, changed = _train(_config(tmp_path / "b", "test_zeros_kl_in_reward", kl_coef=0.5))
    assert not changed
    assert history[0]["writer/grad_norm"] == 0.0


def test_decorator_form_and_a_wrong_answer_is_reported(tmp_path):
    @register_estimator("test_wrong_shape")
    def wrong_shape(batches, config):
        return {a: AgentAdvantages(torch.zeros(len(b.rewards))) for a, b in batches.items()}

    try:
        assert isinstance(wrong_shape, AdvantageEstimator)
        assert get_estimator("test_wrong_shape").kl_in_reward is False
        trainer = Trainer(
            _config(tmp_path, "test_wrong_shape", steps=1),
            env_factory=LetterEnv,
            eval_env_factory=LetterEnv,
        )
        with pytest.raises(ValueError, match=r"test_wrong_shape.*shape \(\d+,\).*writer"):
            trainer.train()
        trainer.close()
    finally:
        unregister_estimator("test_wrong_shape")


def test_a_config_may_name_an_estimator_registered_after_it(tmp_path):
    # The config only names the estimator; the trainer looks it up when it is built.
    config = _config(tmp_path, "test_later", steps=1)
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'test_later'"):
        Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    register_estimator("test_later", get_estimator("rloo").estimate)
    try:
        trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
        assert trainer.estimator is get_estimator("test_later")
    finally:
        unregister_estimator("test_later")


def test_unknown_and_duplicate_names_are_refused():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'.*reinforce_pp"):
        get_estimator("nope")
    with pytest.raises(ValueError, match=r"register_estimator"):
        get_estimator("nope")
    with pytest.raises(ValueError, match="advantage_estimator must name a registered"):
        TrainConfig(advantage_estimator="")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo", lambda batches, config: {})
    with pytest.raises(ValueError, match="module:attribute"):
        register_estimator("test_bad_path", "no_colon_here")
    assert {"reinforce_pp", "grpo", "rloo"} <= set(estimator_names())
    assert "test_bad_path" not in estimator_names()
    assert get_estimator("reinforce_pp").kl_in_reward
    assert not get_estimator("grpo").kl_in_reward
    assert not get_estimator("rloo").kl_in_reward
