"""The static memory estimate that warns before a run that cannot fit is loaded."""

from __future__ import annotations

import logging

import pytest

from mappa_train.memory import GIB, check_fits, static_memory_bytes

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_static_memory_by_hand():
    n = 10**9
    # Three bf16 agents with float32 masters: per agent 2 (weights) + 2 (reference)
    # + 8 (float32 Adam) + 4 (master) = 16 bytes per parameter; gradients of one agent,
    # 2 (bf16) + 4 (float32 master gradients).
    assert static_memory_bytes([n] * 3, weight_bytes=2, master_weights=True) == (48 + 6) * n
    # bf16 weights only: 2 + 2 + 4 (bf16 Adam) = 8 per agent, 2 for gradients.
    assert static_memory_bytes([n] * 3, weight_bytes=2) == (24 + 2) * n
    # float32 (CPU): 4 + 4 + 8 = 16 per agent, 4 for gradients.
    assert static_memory_bytes([n] * 3, weight_bytes=4) == (48 + 4) * n
    # Different sizes: gradients of the largest only.
    assert static_memory_bytes([1, 3], weight_bytes=4) == 16 * 4 + 12
    # LoRA on one shared base: the base in the compute dtype.
    assert static_memory_bytes([n] * 3, weight_bytes=2, shared_base=True) == 2 * n
    assert static_memory_bytes([], weight_bytes=2) == 0


def test_check_fits_names_what_to_change(caplog):
    assert check_fits(10 * GIB, 80 * GIB, lora=False, master_weights=True) is None
    with caplog.at_level(logging.WARNING, logger="mappa_train.memory"):
        text = check_fits(90 * GIB, 80 * GIB, lora=False, master_weights=True)
    assert "90.0 GiB" in text
    assert "lora_rank" in text
    assert "mixed_precision=False" in text
    assert text in caplog.text
    lora_text = check_fits(90 * GIB, 80 * GIB, lora=True, master_weights=False)
    assert "lora_rank" not in lora_text
    assert "mixed_precision" not in lora_text


def test_trainer_counts_real_parameters_without_loading(tmp_path):
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.config import TrainConfig
    from mappa_train.memory import count_parameters
    from mappa_train.trainer import Trainer
    from tests.toy_env import LetterEnv

    model_dir = str(tiny_model_dir(tmp_path / "model"))
    from transformers import AutoModelForCausalLM

    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    assert count_parameters(model_dir) == real
    config = TrainConfig(
        env="Letter-v0",
        system=model_dir,
        dtype="bfloat16",
        output_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
    )
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    needed = static_memory_bytes([real], weight_bytes=2, master_weights=True)
    assert trainer.check_memory([model_dir], available=10 * needed) is None
    warning = trainer.check_memory([model_dir], available=needed)
    assert f"{needed / GIB:.1f} GiB" in warning


def test_activation_estimate_by_hand():
    from types import SimpleNamespace

    from mappa_train.memory import activation_bytes, needs_checkpointing

    # SmolLM2-135M's shape: 30 layers, h = 576, i = 1536; bf16.
    smol = SimpleNamespace(hidden_size=576, num_hidden_layers=30, intermediate_size=1536)
    per_token = 30 * (10 * 576 + 4 * 1536) * 2
    assert per_token == 714_240
    assert activation_bytes(16_384, smol, 2) == 16_384 * per_token  # ~10.9 GiB
    # Checkpointed: every layer's input (h values) and one layer recomputed at a time.
    kept = (30 * 576 + 10 * 576 + 4 * 1536) * 2
    assert activation_bytes(16_384, smol, 2, checkpointing=True) == 16_384 * kept  # ~0.9 GiB
    no_mlp_size = SimpleNamespace(hidden_size=8, num_hidden_layers=2)  # i defaults to 4h
    assert activation_bytes(1, no_mlp_size, 4) == 2 * (80 + 128) * 4
    assert not needs_checkpointing(50, free=100)  # fits in half the free memory
    assert needs_checkpointing(51, free=100)
