"""An update never sets torch's process-global generator, which a sampling thread uses.

A sweep runs one run's update in a thread while another run samples: a backward pass
that saved and restored the generator (a checkpoint replaying its forward) changed the
other run's sampled tokens mid-reply (every row of a batch at the same decode step).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_and_tokenizer  # noqa: E402
from mappa_train.activations import (  # noqa: E402
    disable_checkpointing,
    draws_random_numbers,
    enable_checkpointing,
)
from mappa_train.logprobs import pack, response_logprobs  # noqa: E402


@pytest.fixture
def generator_sets(monkeypatch):
    """Every call that sets the global generator's state, by its function's name."""
    calls: list[str] = []
    for name in ("set_rng_state", "manual_seed"):
        original = getattr(torch, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
        monkeypatch.setattr(torch.random, name, spy)
    return calls


@pytest.mark.parametrize("layers_checkpointed", [False, True])
def test_a_backward_pass_leaves_the_global_generator_alone(generator_sets, layers_checkpointed):
    model, tokenizer = tiny_model_and_tokenizer()
    assert not draws_random_numbers(model)  # no dropout: nothing to replay
    if layers_checkpointed:
        enable_checkpointing(model)
    model.train()
    batch = pack([[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 11]], tokenizer.pad_token_id)
    generator_sets.clear()  # building the model seeds it (a fork of the generator)
    logprobs = response_logprobs(model, batch, chunk_size=2)  # the head's chunks recomputed
    logprobs.sum().backward()
    assert generator_sets == []
    disable_checkpointing(model)


def test_a_model_with_dropout_keeps_its_generator_state_for_the_replay():
    model, _ = tiny_model_and_tokenizer()
    model.config.attention_dropout = 0.1
    assert draws_random_numbers(model)
    model.config.attention_dropout = 0.0
    model.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.2))
    assert draws_random_numbers(model)
