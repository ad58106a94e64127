"""Micro-batches by a token budget: the grouping rule, and an update that does not change."""

from __future__ import annotations

import pytest

from mappa_train.packing import token_budget_batches


def padded(run: list[int], lengths: list[int]) -> int:
    return len(run) * max(lengths[i] for i in run)


def test_runs_fill_the_budget_in_order_and_cover_every_row_once():
    lengths = [3, 3, 4, 5, 9, 10, 30]
    runs = token_budget_batches(lengths, budget=20)
    assert runs == [[0, 1, 2, 3], [4, 5], [6]]  # 4x5=20, 2x10=20, 30 alone
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    for run in runs[:-1]:
        assert padded(run, lengths) <= 20


def test_a_row_longer_than_the_budget_goes_alone_and_max_rows_caps_a_run():
    assert token_budget_batches([50, 2, 2], budget=10) == [[0], [1, 2]]
    assert token_budget_batches([1] * 7, budget=100, max_rows=3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert token_budget_batches([], budget=10) == []


def test_bad_budgets_are_refused():
    with pytest.raises(ValueError, match="budget"):
        token_budget_batches([1], budget=0)
    with pytest.raises(ValueError, match="max_rows"):
        token_budget_batches([1], budget=5, max_rows=0)


def test_the_update_is_the_same_whatever_the_grouping(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train import logprobs
    from mappa_train.config import TrainConfig
    from mappa_train.trainer import Trainer
    from tests.toy_env import LetterEnv

    model_dir = tiny_model_dir(tmp_path / "model")
    results = {}
    for name, grouping in {
        "rows": {"micro_batch_size": 1},
        "tokens": {"micro_batch_tokens": 100_000},
    }.items():
        config = TrainConfig(
            env="Letter-v0", system=str(model_dir), steps=1, prompts_per_step=4,
            samples_per_prompt=2, concurrency=8, max_new_tokens=8, lr=1e-2, kl_coef=0.0,
            mask_truncated=False, train_batch_size=8, warmup_ratio=0.0,
            gradient_checkpointing=False, save_every=0, tensorboard=False, progress=False,
            output_dir=str(tmp_path / name), seed=3, **grouping,
        )  # fmt: skip
        passes = []
        original = logprobs.response_logprobs

        def counting(model, batch, *args, _passes=passes, _original=original, **kwargs):
            _passes.append(batch.input_ids.shape[0])
            return _original(model, batch, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("mappa_train.local_learner.response_logprobs", counting)
            trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
            (metrics,) = trainer.train()
        weights = {
            k: v.detach().clone() for k, v in trainer.learners["writer"].model.state_dict().items()
        }
        results[name] = (metrics, weights, passes)
        trainer.close()
    rows, tokens = results["rows"], results["tokens"]
    assert max(rows[2]) == 1  # one row per pass
    assert max(tokens[2]) == 8  # the whole mini-batch in one pass
    assert len(tokens[2]) < len(rows[2])
    assert tokens[0]["writer/loss"] == pytest.approx(rows[0]["writer/loss"], abs=1e-5)
    for key, value in rows[1].items():
        assert torch.allclose(value, tokens[1][key], atol=1e-5), key
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert any(not torch.equal(start[k], v) for k, v in rows[1].items())  # it did learn
