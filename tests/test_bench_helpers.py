"""Helpers of the GPU benchmarks that can be checked on a CPU."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from benchmarks.bench_train_gpu import (
    SHAPES,
    check_tokenizer_round_trip,
    free_trainer,
    random_model_dir,
    word_level_tokenizer,
)


def test_word_level_tokenizer_round_trip_is_checked(tmp_path):
    tokenizer = word_level_tokenizer(500)
    tokenizer.save_pretrained(tmp_path)
    check_tokenizer_round_trip(tokenizer, tmp_path)  # reads prompts as built

    # A saved tokenizer that lost its word splitting reads prompts differently.
    saved = tmp_path / "tokenizer.json"
    data = json.loads(saved.read_text())
    data["pre_tokenizer"] = None
    saved.write_text(json.dumps(data))
    with pytest.raises(RuntimeError, match="without real prompts"):
        check_tokenizer_round_trip(tokenizer, tmp_path)


def test_a_random_model_directory_reads_its_prompts(tmp_path, monkeypatch):
    # The model's config.json beside the tokenizer decides which tokenizer class
    # AutoTokenizer picks: with a qwen2 config, transformers 5 read every prompt as [].
    tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    monkeypatch.setitem(SHAPES, "tiny", tiny)
    directory = random_model_dir("tiny", tmp_path / "model")  # raises if it reads them wrongly
    assert (directory / "config.json").exists()


def test_a_shape_may_bring_its_own_vocabulary_and_tied_head(tmp_path, monkeypatch):
    # The 135m shape is SmolLM2-135M's: 49,152 words and one matrix for embedding and head.
    tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1,
            "vocab_size": 300, "tie_word_embeddings": True}  # fmt: skip
    monkeypatch.setitem(SHAPES, "tiny", tiny)
    directory = random_model_dir("tiny", tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    assert config["vocab_size"] == 300
    assert config["tie_word_embeddings"] is True
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == 300
    assert SHAPES["135m"]["vocab_size"] == 49_152


def test_a_freed_trainer_leaves_its_models_to_the_collector(tmp_path, capsys):
    # Benchmarks run trainer after trainer on one GPU: a model still referenced after
    # free_trainer keeps its memory (the in-process backend kept its learners' table).
    import weakref

    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.trainer import Trainer
    from tests.toy_env import LetterEnv, toy_train_config

    config = toy_train_config(tmp_path, tiny_model_dir(tmp_path / "model"), steps=1)
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    trainer.setup()
    trainer.train_step()
    models = [weakref.ref(learner.model) for learner in trainer.learners.values()]
    free_trainer(trainer)
    assert "still referenced" not in capsys.readouterr().out
    assert all(model() is None for model in models)
