"""The old-log-prob pass is skipped only where nothing needs it, and the update is the same."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train.advantages import fill_advantages  # noqa: E402
from mappa_train.algorithms import registry  # noqa: E402
from mappa_train.algorithms.registry import (  # noqa: E402
    AgentAdvantages,
    get_estimator,
    register_estimator,
    unregister_estimator,
)
from mappa_train.config import TrainConfig  # noqa: E402
from mappa_train.learner_rank import TokenRow  # noqa: E402
from mappa_train.update import PreparedRows, needs_old_logprobs, optimizer_steps  # noqa: E402
from tests.toy_env import LetterEnv, toy_train_config  # noqa: E402


def test_the_built_in_estimators_declare_what_they_read():
    assert get_estimator("reinforce_pp").uses_old_logprobs  # KL(old, ref) in its rewards
    assert not get_estimator("grpo").uses_old_logprobs
    assert not get_estimator("rloo").uses_old_logprobs
    assert registry.AdvantageEstimator(lambda b, c: {}).uses_old_logprobs  # safe default


def test_the_pass_is_needed_unless_unread_one_step_and_auto():
    config = TrainConfig(train_batch_size=8, micro_batch_size=4)
    assert optimizer_steps(8, config) == 1
    assert optimizer_steps(9, config) == 2
    assert not needs_old_logprobs(False, 8, config)
    assert needs_old_logprobs(False, 9, config)  # two optimizer steps
    assert needs_old_logprobs(True, 8, config)  # the estimator reads them
    always = TrainConfig(train_batch_size=8, micro_batch_size=4, old_logprob_pass="always")
    assert needs_old_logprobs(False, 8, always)
    with pytest.raises(ValueError, match="old_logprob_pass"):
        TrainConfig(old_logprob_pass="never")


def test_an_estimator_that_does_not_read_old_logprobs_gets_none():
    seen = []

    def estimate(batches, config):
        seen.extend(batch.old_logprobs for batch in batches.values())
        return {agent: AgentAdvantages(torch.zeros_like(b.mask)) for agent, b in batches.items()}

    register_estimator("no_old_test", estimate, uses_old_logprobs=False)
    try:
        config = TrainConfig(advantage_estimator="no_old_test")
        estimator = get_estimator("no_old_test")
        rows = torch.zeros(2, 3)
        for old in (None, rows - 1.0):  # skipped, or run with old_logprob_pass="always"
            samples = [TokenRow([1], [2, 3, 4]), TokenRow([5], [6, 7, 8])]
            prep = PreparedRows(samples, torch.ones(2), old, rows, rows + 1, 0, 0)
            fill_advantages({"a": prep}, estimator, config)
            assert ("kl" in prep.stats) == (old is not None)  # else the update logs it
        assert seen == [None, None]
    finally:
        unregister_estimator("no_old_test")


def _train(tmp_path, model_dir, name, **changes):
    """Train on Letter-v0: the last step's metrics, the writer's weights, its scoring passes."""
    from mappa_train import logprobs
    from mappa_train.trainer import Trainer

    settings = dict(
        steps=1, prompts_per_step=4, samples_per_prompt=2, concurrency=8, max_new_tokens=8,
        train_batch_size=8, micro_batch_size=8, kl_coef=0.05, kl_estimator="k3",
        dtype="float32", device="cpu",
    )  # fmt: skip
    config = toy_train_config(tmp_path / name, model_dir, **{**settings, **changes})
    passes: list[str] = []
    original = logprobs.response_logprobs
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)

    def counting(model, batch, *args, **kwargs):
        if not torch.is_grad_enabled():  # a scoring pass, not the update's loss pass
            learner = trainer.learners["writer"]
            passes.append("old" if model is learner.model else "ref")
        return original(model, batch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("mappa_train.local_learner.response_logprobs", counting)
        metrics = trainer.train()[-1]
    weights = {
        k: v.detach().clone() for k, v in trainer.learners["writer"].model.state_dict().items()
    }
    trainer.close()
    return metrics, weights, passes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def test_the_pass_is_skipped_for_grpo_in_one_step_and_kept_otherwise(tmp_path, model_dir):
    _, _, skipped = _train(tmp_path, model_dir, "grpo", advantage_estimator="grpo")
    assert skipped == ["ref"]  # 8 rows, one micro-batch: only the reference pass
    _, _, reinforce = _train(tmp_path, model_dir, "rpp", advantage_estimator="reinforce_pp")
    assert reinforce == ["old", "ref"]
    _, _, steps = _train(
        tmp_path, model_dir, "two", advantage_estimator="grpo", train_batch_size=4,
        micro_batch_size=4,
    )  # fmt: skip
    assert steps == ["old", "old", "ref", "ref"]  # two optimizer steps need the old weights


def test_skipping_the_pass_changes_no_weight(tmp_path, model_dir):
    # Two steps: the second starts away from the reference, so its KL is not 0.
    auto, auto_weights, auto_passes = _train(
        tmp_path, model_dir, "auto", advantage_estimator="grpo", steps=2
    )
    always, always_weights, always_passes = _train(
        tmp_path, model_dir, "always", advantage_estimator="grpo", old_logprob_pass="always",
        steps=2,
    )  # fmt: skip
    assert (auto_passes, always_passes) == (["ref"] * 2, ["old", "ref"] * 2)
    assert auto["writer/clip_fraction"] == 0.0  # ratio exactly 1
    # The KL statistic comes from the loss pass instead, the same weights.
    assert always["writer/kl"] > 0
    assert auto["writer/kl"] == pytest.approx(always["writer/kl"], rel=1e-5, abs=1e-7)
    assert auto["writer/loss"] == pytest.approx(always["writer/loss"], rel=1e-5, abs=1e-7)
    assert auto["writer/grad_norm"] > 0
    for key, value in always_weights.items():
        # float32 on CPU: the two differ by the old pass's rounding at most.
        assert torch.allclose(auto_weights[key], value, rtol=1e-5, atol=1e-6), key
