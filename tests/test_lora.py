"""Agents sharing one base model with one LoRA adapter each: rollouts and training."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from mappa_agents.hf import HFPolicy  # noqa: E402
from mappa_agents.lora import adapter_parameters, lora_system  # noqa: E402
from mappa_agents.policy import SamplingParams  # noqa: E402
from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train import checkpoint as ckpt  # noqa: E402
from mappa_train.config import TrainConfig  # noqa: E402
from mappa_train.trainer import Trainer  # noqa: E402
from tests.toy_env import LetterEnv  # noqa: E402

AGENTS = ["solver", "checker"]
PROMPT = [[{"role": "user", "content": "the answer is"}]]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def test_adapters_start_as_the_base_and_diverge_independently(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "m")
    base = HFPolicy(model_dir)
    system = lora_system(model_dir, AGENTS)
    policy_a, policy_b = system.policy_for("solver"), system.policy_for("checker")
    assert policy_a.model is policy_b.model  # one base in memory
    expected = base.generate(PROMPT, GREEDY)[0].response_ids
    assert policy_a.generate(PROMPT, GREEDY)[0].response_ids == expected
    assert policy_b.generate(PROMPT, GREEDY)[0].response_ids == expected
    with torch.no_grad():
        for name, param in policy_a.model.named_parameters():
            if ".solver." in name and "lora_B" in name:
                param.normal_(0, 2.0)
    assert policy_a.generate(PROMPT, GREEDY)[0].response_ids != expected
    assert policy_b.generate(PROMPT, GREEDY)[0].response_ids == expected
    assert adapter_parameters(policy_a.model, "checker")


def _config(tmp_path, model_dir, out, steps, **changes):
    values = dict(
        env="Letter-v0",
        system=str(model_dir),
        steps=steps,
        prompts_per_step=4,
        samples_per_prompt=4,
        concurrency=16,
        max_new_tokens=12,
        lr=5e-2,
        kl_coef=0.0,
        mask_truncated=False,
        train_batch_size=16,
        micro_batch_size=8,
        warmup_ratio=0.0,
        gradient_checkpointing=False,
        save_every=1,
        keep_checkpoints=0,
        tensorboard=False,
        progress=False,
        output_dir=str(out),
        seed=3,
        lora_rank=8,
        lora_alpha=16,
    )
    values.update(changes)
    return TrainConfig(**values)


def _adapter_state(trainer):
    model = trainer.learners["writer"].model
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.slow
def test_lora_training_learns_saves_adapters_and_resumes_exactly(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "m")
    straight = Trainer(_config(tmp_path, model_dir, tmp_path / "s", 14), LetterEnv, LetterEnv)
    history = straight.train()
    rewards = [m["writer/mean_reward"] for m in history]
    # Slower than full fine-tuning here (the output head has no adapter): measured about
    # 0.03 over the first steps and 0.07-0.08 by step 12.
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.025, rewards
    saved = ckpt.latest_checkpoint(straight.checkpoint_root) / "agents" / "writer"
    assert (saved / "adapter_model.safetensors").exists()
    assert not (saved / "model.safetensors").exists()  # the base is not copied

    first = Trainer(_config(tmp_path, model_dir, tmp_path / "r", 14), LetterEnv, LetterEnv)
    first.train(until=6)  # as if the run had been stopped after step 6
    resumed = Trainer(_config(tmp_path, model_dir, tmp_path / "r", 14), LetterEnv, LetterEnv)
    resumed.setup()
    assert resumed.step == 6
    resumed.train()
    a, b = _adapter_state(straight), _adapter_state(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_lora_needs_one_base_model(tmp_path):
    config = TrainConfig(
        env="Letter-v0",
        system={"writer": "x"},
        lora_rank=4,
        output_dir=str(tmp_path / "o"),
        tensorboard=False,
        progress=False,
    )
    trainer = Trainer(config, LetterEnv, LetterEnv)
    assert trainer.agents == ["writer"]
    with pytest.raises(ValueError, match="lora_rank"):
        TrainConfig(lora_rank=-1)
