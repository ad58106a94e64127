"""Helpers of the GPU benchmarks that can be checked on a CPU."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from benchmarks.bench_train_gpu import (
    check_tokenizer_round_trip,
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
