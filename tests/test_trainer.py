"""The trainer: exact log-probs, learning on a toy task, checkpoints and exact resume."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_and_tokenizer, tiny_model_dir  # noqa: E402
from mappa_agents.trajectory import load_jsonl  # noqa: E402
from mappa_train import checkpoint as ckpt  # noqa: E402
from mappa_train.config import TrainConfig  # noqa: E402
from mappa_train.logprobs import pack, response_logprobs  # noqa: E402
from mappa_train.trainer import Trainer, warmup_cosine  # noqa: E402
from tests.toy_env import LetterEnv, toy_train_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def full_forward_logprobs(model, batch):
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.log_softmax(logits, -1)
    rows, width = batch.response_ids.shape
    out = torch.zeros(rows, width)
    for i, start in enumerate(batch.prompt_lengths):
        for j in range(width):
            if batch.response_mask[i, j]:
                out[i, j] = logp[i, start - 1 + j, batch.response_ids[i, j]]
    return out


def test_chunked_logprobs_match_a_full_forward_pass():
    model, tokenizer = tiny_model_and_tokenizer()
    prompts = [[5, 6, 7, 8], [9, 10]]
    responses = [[11, 12, 13], [14, 15, 16, 17, 18]]
    batch = pack(prompts, responses, tokenizer.pad_token_id)
    expected = full_forward_logprobs(model, batch)
    for chunk in (1, 3, 1024):
        with torch.no_grad():
            got = response_logprobs(model, batch, chunk_size=chunk)
        assert torch.allclose(got, expected, atol=1e-5)
    grads = []
    for recompute in (True, False):
        model.zero_grad(set_to_none=True)
        got = response_logprobs(model, batch, chunk_size=2, recompute_logits=recompute)
        assert torch.allclose(got, expected, atol=1e-5)
        got.sum().backward()
        grads.append(model.lm_head.weight.grad.clone())
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    model.zero_grad(set_to_none=True)
    full_forward_logprobs(model, batch).sum().backward()
    assert torch.allclose(grads[0], model.lm_head.weight.grad, atol=1e-5)


def test_warmup_cosine_schedule():
    factor = warmup_cosine(100, 0.03)
    assert factor(0) == pytest.approx(1 / 3)
    assert factor(2) == pytest.approx(1.0)
    assert factor(3) == pytest.approx(1.0)
    assert factor(99) < 0.01
    assert factor(51) == pytest.approx(0.5, abs=0.02)


_toy_config = toy_train_config


@pytest.mark.slow
@pytest.mark.parametrize("credit_mode", ["process", "outcome"])
def test_training_improves_a_learnable_behaviour(tmp_path, credit_mode):
    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(tmp_path, model_dir, credit_mode=credit_mode)
    envs = functools.partial(LetterEnv, credit_mode=credit_mode)
    trainer = Trainer(config, env_factory=envs, eval_env_factory=envs)
    history = trainer.train()
    rewards = [m["writer/mean_reward"] for m in history]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    # Measured with these settings: ~0.05 over the first steps, ~0.3 by step 14.
    assert last > first + 0.1, rewards
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert (tmp_path / "run" / "training.png").exists()
    assert ckpt.latest_checkpoint(trainer.checkpoint_root) is not None


@pytest.mark.parametrize("scope", ["agent", "all"])
def test_masks_length_cut_and_invalid_actions(tmp_path, scope):
    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(
        tmp_path, model_dir, steps=1, max_new_tokens=2, mask_truncated=True, normalize_scope=scope
    )
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    history = trainer.train()
    stats = history[0]
    # 2 new tokens rarely reach EOS: most actions are cut by the limit and masked.
    assert stats["writer/masked_length"] > 0
    assert stats["writer/actions"] + stats["writer/masked_length"] == 16


def test_gradient_checkpointing_trains(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(tmp_path, model_dir, steps=1, gradient_checkpointing=True)
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    (metrics,) = trainer.train()
    assert metrics["writer/grad_norm"] > 0
    model = trainer.learners["writer"].model
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


def test_auto_checkpointing_follows_the_free_memory(tmp_path, monkeypatch, caplog):
    from mappa_train import local_learner
    from mappa_train.activations import is_checkpointing
    from mappa_train.update import largest_micro_batch_tokens

    model_dir = tiny_model_dir(tmp_path / "model")
    free = {"bytes": 10**15}
    monkeypatch.setattr(local_learner, "free_memory_bytes", lambda device: free["bytes"])
    config = _toy_config(tmp_path, model_dir, steps=5, gradient_checkpointing="auto")
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    learner_model = None
    with caplog.at_level(logging.INFO, logger="mappa_train.local_learner"):
        trainer.setup()
        learner = trainer.learners["writer"]
        learner_model = learner.model
        assert trainer.train_step()["writer/grad_norm"] > 0
        assert learner.checkpointing is False  # plenty of memory: activations are kept
        assert "writer: activation checkpointing off" in caplog.text
        caplog.clear()
        free["bytes"] = 1  # nothing free: recompute
        assert trainer.train_step()["writer/grad_norm"] > 0
    assert learner.checkpointing is True
    assert "writer: activation checkpointing on" in caplog.text
    assert is_checkpointing(learner_model)
    free["bytes"] = 10**15  # room again: back off
    trainer.train_step()
    assert learner.checkpointing is False
    assert not is_checkpointing(learner_model)
    trainer.close()
    samples = [SimpleNamespace(prompt_ids=[1] * 5, response_ids=[2] * 3) for _ in range(6)]
    rows = _toy_config(tmp_path, model_dir, micro_batch_size=4, micro_batch_tokens=0)
    assert largest_micro_batch_tokens(samples, rows) == 4 * 8
    budget = _toy_config(tmp_path, model_dir, micro_batch_tokens=6)
    assert largest_micro_batch_tokens(samples, budget) == 8  # one row over the budget
    for wrong in ("sometimes", 1):  # 1 == True, but a typo would be read as off
        with pytest.raises(ValueError, match="gradient_checkpointing must be true, false or"):
            _toy_config(tmp_path, model_dir, gradient_checkpointing=wrong)


def _changed_share(trainer, initial):
    model = trainer.learners["writer"].model
    changed = total = 0
    for name, param in model.named_parameters():
        changed += int((param.detach().float() != initial[name]).sum())
        total += param.numel()
    return changed / total


@pytest.mark.parametrize("mixed", [True, False])
def test_bf16_training_keeps_float32_master_weights(tmp_path, mixed):
    # At lr 1e-6 an Adam step is ~1e-6 per weight, far below a bf16 weight's rounding
    # step (~1e-4 for weights near 0.02): stored in bf16 alone, the update is lost.
    from mappa_train.precision import MasterWeightAdamW

    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(
        tmp_path, model_dir, steps=2, lr=1e-6, dtype="bfloat16", mixed_precision=mixed
    )
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    trainer.setup()
    learner = trainer.learners["writer"]
    assert {p.dtype for p in learner.model.parameters()} == {torch.bfloat16}
    assert isinstance(learner.optimizer, MasterWeightAdamW) == mixed
    assert learner.policy.max_batch_size == config.rollout_batch_size
    assert config.compile_decode
    assert not trainer.compiles_decoding  # CUDA graphs only: off on this CPU run
    assert learner.policy.compile_decode == trainer.compiles_decoding
    trainer.device = "cuda:0"  # what the policies would get on a GPU
    assert trainer.compiles_decoding
    trainer.config = dataclasses.replace(config, lora_rank=8)
    assert not trainer.compiles_decoding  # adapters switch at every call
    trainer.config = dataclasses.replace(config, compile_decode=False)
    assert not trainer.compiles_decoding
    trainer.config, trainer.device = config, "cpu"
    initial = {n: p.detach().float().clone() for n, p in learner.model.named_parameters()}
    history = trainer.train()
    # Policy and reference compute alike before any update: the first KL is exactly 0.
    assert history[0]["writer/kl"] == 0.0
    assert history[0]["writer/grad_norm"] > 0
    # Gradients are released after the update, not held until the next step.
    assert all(p.grad is None for p in learner.model.parameters())
    if mixed:
        names = [n for n, p in learner.model.named_parameters() if p.requires_grad]
        changed = sum(int((m != initial[n]).sum()) for n, m in zip(names, learner.optimizer.master))
        assert changed / sum(m.numel() for m in learner.optimizer.master) > 0.5
        # The model holds the masters rounded to bf16.
        for param, master in zip(learner.optimizer.params, learner.optimizer.master):
            assert master.dtype == torch.float32
            assert torch.equal(param, master.to(torch.bfloat16))
    else:
        assert _changed_share(trainer, initial) < 0.05


def test_bf16_master_weights_resume_exactly(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    settings = dict(steps=3, lr=1e-4, dtype="bfloat16", save_every=1, keep_checkpoints=0)

    def trainer_for(name):
        config = _toy_config(tmp_path, model_dir, **settings)
        config.output_dir = str(tmp_path / name)
        return Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)

    straight = trainer_for("straight")
    straight.train()
    first = trainer_for("staged")
    first.train(until=2)
    first.close()
    resumed = trainer_for("staged")
    resumed.setup()
    assert resumed.step == 2
    resumed.train()
    a, b = straight.learners["writer"], resumed.learners["writer"]
    for x, y in zip(a.optimizer.master, b.optimizer.master):
        assert torch.equal(x, y)
    for (name, x), y in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(x, y), name
    assert straight.history[-1]["writer/loss"] == resumed.history[-1]["writer/loss"]
    # A checkpoint with masters refuses to resume without them, saying why.
    config = _toy_config(tmp_path, model_dir, **settings, mixed_precision=False)
    config.output_dir = str(tmp_path / "staged")
    with pytest.raises(ValueError, match="mixed_precision=True"):
        Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv).setup()


def test_float16_training_is_refused(tmp_path):
    config = _toy_config(tmp_path, tiny_model_dir(tmp_path / "model"), dtype="float16")
    with pytest.raises(ValueError, match="bfloat16"):
        Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)


def test_micro_batches_are_grouped_by_length():
    from types import SimpleNamespace

    from mappa_train.update import by_length as _by_length

    lengths = [(3, 9), (1, 1), (5, 2), (2, 2)]
    samples = [SimpleNamespace(prompt_ids=[1] * p, response_ids=[2] * r) for p, r in lengths]
    assert _by_length(samples, [0, 1, 2, 3]) == [1, 3, 2, 0]
    assert _by_length(samples, [2, 0]) == [2, 0]


def test_a_step_whose_episodes_all_failed_stops_the_run(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    trainer = Trainer(
        _toy_config(tmp_path, model_dir, steps=2), env_factory=LetterEnv, eval_env_factory=LetterEnv
    )
    trainer.setup()
    policy = trainer.learners["writer"].policy

    def broken(batch, params):
        raise OSError("the GPU went away")

    policy.generate = broken
    with pytest.raises(RuntimeError, match=r"every episode of step 0 failed.*GPU went away"):
        trainer.train()
    assert trainer.step == 0
    trainer.close()


def test_learn_trains_on_episodes_made_by_another_engine(tmp_path):
    # The rollout half and the update half are separate: episodes generated by one
    # trainer's policies (standing in for an outside engine) train another trainer.
    model_dir = tiny_model_dir(tmp_path / "model")
    source = Trainer(
        _toy_config(tmp_path / "a", model_dir, steps=1),
        env_factory=LetterEnv,
        eval_env_factory=LetterEnv,
    )
    source.setup()
    episodes = source.rollout(0)
    source.close()
    learner_side = Trainer(
        _toy_config(tmp_path / "b", model_dir, steps=1),
        env_factory=LetterEnv,
        eval_env_factory=LetterEnv,
    )
    learner_side.setup()
    before = {
        n: p.detach().clone() for n, p in learner_side.learners["writer"].model.named_parameters()
    }
    metrics = learner_side.learn(episodes)
    assert learner_side.step == 0  # learn() does not advance the step
    assert metrics["writer/actions"] == 16
    assert metrics["train/tokens"] > 0
    after = dict(learner_side.learners["writer"].model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    learner_side.close()


def test_a_subclass_can_roll_out_on_other_engines_and_sync_their_weights(tmp_path):
    import copy

    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.system import AgentSystem

    class CopiedEngineTrainer(Trainer):
        """Rollouts on separate copies of the models (as remote engines would be)."""

        def setup(self):
            super().setup()
            self.engines = {a: copy.deepcopy(x.model) for a, x in self.learners.items()}
            system = AgentSystem(
                {a: HFPolicy(m, self.learners[a].tokenizer) for a, m in self.engines.items()}
            )
            self.engine_runner = RolloutRunner(LetterEnv, system, concurrency=16, progress=False)
            self.syncs = 0

        def rollout(self, step):
            options = [{"task_id": t} for t in self.sample_task_ids(step) for _ in range(4)]
            self.engine_runner.sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
            return self.engine_runner.run(len(options), options, seed=step)

        def after_update(self):
            for agent, learner in self.learners.items():
                self.engines[agent].load_state_dict(learner.model.state_dict())
            self.syncs += 1

    model_dir = tiny_model_dir(tmp_path / "model")
    trainer = CopiedEngineTrainer(
        _toy_config(tmp_path, model_dir, steps=2),
        env_factory=LetterEnv,
        eval_env_factory=LetterEnv,
    )
    history = trainer.train()
    assert [m["step"] for m in history] == [1, 2]
    assert all(m["writer/actions"] == 16 for m in history)
    assert trainer.syncs == 2
    assert "train" not in trainer._runners  # the trainer's own runner never ran
    engine = dict(trainer.engines["writer"].named_parameters())
    for name, param in trainer.learners["writer"].model.named_parameters():
        assert torch.equal(param, engine[name]), name
    trainer.engine_runner.close()


def test_vllm_rollout_engines_get_the_new_weights_after_each_update(tmp_path, monkeypatch):
    # vLLM is not installed for this suite: a stand-in with VLLMPolicy's interface, on its
    # own copy of the model (as an engine holds its own weights), records what it gets.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mappa_agents import vllm_policy
    from mappa_agents.hf import HFPolicy

    built = []

    class EngineStandIn:
        def __init__(self, model, *, name, **options):
            self.name, self.options, self.loads, self.closed = name, options, 0, False
            self.model = AutoModelForCausalLM.from_pretrained(model)
            self.policy = HFPolicy(self.model, AutoTokenizer.from_pretrained(model), name=name)
            built.append(self)

        def prompt_ids(self, messages):
            return self.policy.prompt_ids(messages)

        def generate(self, batch, params):
            return self.policy.generate(batch, params)

        async def agenerate(self, batch, params):
            return await self.policy.agenerate(batch, params)

        def load_weights(self, weights):
            own = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in weights:
                    own[name].copy_(tensor)
            self.loads += 1

        def close(self):
            self.closed = True

    monkeypatch.setattr(vllm_policy, "VLLMPolicy", EngineStandIn)
    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(
        tmp_path, model_dir, steps=2, rollout_engine="vllm", vllm_options={"max_model_len": 64}
    )
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    history = trainer.train()
    (engine,) = built
    assert engine.options == {
        "dtype": "float32",
        "gpu_memory_utilization": 0.45,
        "seed": 1,
        "max_model_len": 64,
    }
    assert engine.loads == 3  # the starting weights, then after each of the 2 updates
    learner = trainer.learners["writer"].model
    for name, param in learner.named_parameters():
        assert torch.equal(param, dict(engine.model.named_parameters())[name]), name
    acted = {a.policy for a in load_jsonl(tmp_path / "run" / "rollouts" / "step-000001.jsonl")}
    assert acted == {engine.name}
    assert history[-1]["writer/grad_norm"] > 0
    trainer.close()
    assert engine.closed
    with pytest.raises(ValueError, match=r"rollout_engine='vllm'.*lora_rank=0"):
        _toy_config(tmp_path, model_dir, rollout_engine="vllm", lora_rank=8)
    with pytest.raises(ValueError, match=r"distributed='ray'.*engines_per_agent to 1"):
        _toy_config(tmp_path, model_dir, rollout_engine="vllm", distributed="ray")


@pytest.mark.slow
def test_training_with_real_vllm_engines(tmp_path, monkeypatch):
    # Runs where vLLM is installed (`make test-vllm`: the CPU build in its own venv).
    pytest.importorskip("vllm")
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, hidden_size=128).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    options = {"max_model_len": 256, "enforce_eager": True, "gpu_memory_utilization": 0.1}
    config = _toy_config(
        tmp_path, tmp_path / "model", steps=2, rollout_engine="vllm", vllm_options=options
    )
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    trainer.setup()  # train() would close the engines at its end
    history = [trainer.train_step() for _ in range(2)]
    assert all(m["writer/grad_norm"] > 0 for m in history)
    # The engine acts with the trained weights: its greedy replies are the model's own.
    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams

    learner = trainer.learners["writer"]
    prompts = [[{"role": "user", "content": "Write a letter."}]]
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    engine_ids = [g.response_ids for g in learner.engine.generate(prompts, greedy)]
    model_ids = [
        g.response_ids for g in HFPolicy(learner.model, learner.tokenizer).generate(prompts, greedy)
    ]
    trainer.close()
    assert engine_ids == model_ids


def _weights(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _cli(tmp_path, model_dir, out):
    env_options = json.dumps({"sandbox": None, "tasks": "gen:6"})
    return [
        sys.executable,
        "-m",
        "mappa_train",
        "train",
        "--env",
        "MathChat-v0",
        "--system",
        str(model_dir),
        "--coach",
        "rules",
        "--env-options",
        env_options,
        "--steps",
        "3",
        "--prompts-per-step",
        "2",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "8",
        "--lr",
        "1e-3",
        "--train-batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--save-every",
        "1",
        "--keep-checkpoints",
        "0",
        "--no-tensorboard",
        "--no-progress",
        "--no-gradient-checkpointing",
        "--output-dir",
        str(out),
        "--seed",
        "7",
        # Every action trains: the tiny model's 8-token replies are all cut at the limit,
        # and whitening over all agents' tokens gives even an agent whose rewards are all
        # alike an advantage, so every agent's weights move on every step.
        "--no-mask-truncated",
        "--normalize-scope",
        "all",
    ]


@pytest.mark.slow
def test_resume_after_kill_is_exact(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    straight = tmp_path / "straight"
    subprocess.run(
        _cli(tmp_path, model_dir, straight),
        check=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        capture_output=True,
    )
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _cli(tmp_path, model_dir, killed),
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while (
        time.time() < deadline
        and not (killed / "checkpoints" / "step-000001" / "COMPLETE").exists()
    ):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = ckpt.complete_checkpoints(killed / "checkpoints")
    assert done, "the run was killed before its first checkpoint"
    assert len(done) < 3, "the run finished before it could be killed"
    subprocess.run(
        _cli(tmp_path, model_dir, killed),
        check=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        capture_output=True,
    )
    initial = _weights(model_dir)
    for agent in ("problem_solver", "code_executor", "verifier"):
        a = _weights(straight / "checkpoints" / "step-000003" / "agents" / agent)
        b = _weights(killed / "checkpoints" / "step-000003" / "agents" / agent)
        assert a.keys() == b.keys()
        # Training moved them, so equal weights say the resume repeated the lost steps.
        assert not torch.equal(a["lm_head.weight"], initial["lm_head.weight"]), agent
        for name in a:
            assert torch.equal(a[name], b[name]), f"{agent}:{name} differs after resume"
    lines_a = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    lines_b = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines_b] == [1, 2, 3]
    for metrics in lines_a + lines_b:
        assert metrics["train/tokens"] > 0
        for agent in ("problem_solver", "code_executor", "verifier"):
            assert metrics[f"{agent}/grad_norm"] > 0, (metrics["step"], agent)
    for ma, mb in zip(lines_a, lines_b):
        same = {k: v for k, v in ma.items() if "seconds" not in k and "per_s" not in k}
        assert same == {k: mb[k] for k in same}


def test_incomplete_checkpoint_is_never_taken(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-000004").mkdir(parents=True)  # no COMPLETE marker: a killed save
    (root / ".tmp-step-000005-1").mkdir()
    good = root / "step-000002"
    good.mkdir()
    (good / ckpt.MARKER).write_text("step 2\n")
    assert ckpt.latest_checkpoint(root) == good


def test_config_rejects_bad_values_and_reads_yaml(tmp_path):
    with pytest.raises(ValueError, match="credit_mode"):
        TrainConfig(credit_mode="magic")
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainConfig(train_batch_size=2, micro_batch_size=4)
    path = tmp_path / "c.yaml"
    path.write_text("steps: 5\nlr: 0.001\nadam_betas: [0.9, 0.99]\n")
    config = TrainConfig.from_file(path, seed=3)
    assert (config.steps, config.lr, config.adam_betas, config.seed) == (5, 0.001, (0.9, 0.99), 3)
    path.write_text("stepz: 5\n")
    with pytest.raises(ValueError, match="unknown config fields"):
        TrainConfig.from_file(path)


def test_eval_at_start_logs_the_untrained_system_once(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(
        tmp_path, model_dir, steps=1, eval_every=1, eval_episodes=4, eval_at_start=True
    )
    Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv).train()
    path = tmp_path / "run" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert "eval/success_rate" in records[0]
    # What isolation resolved to is in the run's config and on every step's metrics.
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["isolation_resolved"]
    assert resolved["code_execution"] is False
    assert all(
        r["isolation/namespaces"] == float(resolved["isolation"] == "namespaces") for r in records
    )
    assert "rollout/episodes" not in records[0]  # an evaluation, not a training step
    # Every evaluation's episodes are kept, apart from the training rollouts.
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "eval").iterdir()) == [
        "step-000000.jsonl",
        "step-000001.jsonl",
    ]
    evaluated = load_jsonl(run / "eval" / "step-000000.jsonl")
    assert len({a.episode_id for a in evaluated}) == 4
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step-000000.jsonl"]
    # Continuing the run resumes from its checkpoint and does not evaluate step 0 again.
    longer = dataclasses.replace(config, steps=2)
    Trainer(longer, env_factory=LetterEnv, eval_env_factory=LetterEnv).train()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (tmp_path / "run" / "training.png").exists()


def test_further_eval_sets_are_evaluated_and_saved_apart(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    config = _toy_config(
        tmp_path,
        model_dir,
        env="tests.toy_env:LetterEnv",
        steps=1,
        eval_every=1,
        eval_episodes=4,
        eval_sets={"unseen": {"task_prefix": "unseen"}},
    )
    trainer = Trainer(config)
    (metrics,) = trainer.train()
    assert metrics["eval/success_rate"] is not None
    assert metrics["eval/unseen/success_rate"] is not None
    assert "eval/unseen/writer/mean_coach_score" in metrics
    main = load_jsonl(tmp_path / "run" / "eval" / "step-000001.jsonl")
    unseen = load_jsonl(tmp_path / "run" / "eval" / "unseen" / "step-000001.jsonl")
    assert {s.task_id for s in main} == {"toy-0", "toy-1", "toy-2", "toy-3"}
    assert {s.task_id for s in unseen} == {"unseen-0", "unseen-1", "unseen-2", "unseen-3"}
    with pytest.raises(ValueError, match="eval set names"):
        TrainConfig(eval_sets={"a/b": {}})
    with pytest.raises(ValueError, match="eval_sets"):
        Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)


def test_a_rollout_function_replaces_the_trainers_own_runner(tmp_path):
    # The seam without subclassing: a function makes each step's episodes (here on a
    # copy of the models, as an outside engine would) and syncs after the learners'.
    import copy

    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.system import AgentSystem

    engines: dict = {}
    steps = []

    def rollout(trainer, step):
        if not engines:
            engines.update({a: copy.deepcopy(x.model) for a, x in trainer.learners.items()})
            system = AgentSystem(
                {a: HFPolicy(m, trainer.learners[a].tokenizer) for a, m in engines.items()}
            )
            engines["runner"] = RolloutRunner(LetterEnv, system, concurrency=16, progress=False)
        else:  # the copies act with the weights of the last update
            for agent, learner in trainer.learners.items():
                engines[agent].load_state_dict(learner.model.state_dict())
        steps.append(step)
        options = [{"task_id": t} for t in trainer.sample_task_ids(step) for _ in range(4)]
        engines["runner"].sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
        return engines["runner"].run(len(options), options, seed=step)

    model_dir = tiny_model_dir(tmp_path / "model")
    trainer = Trainer(
        _toy_config(tmp_path, model_dir, steps=2),
        env_factory=LetterEnv,
        eval_env_factory=LetterEnv,
        rollout=rollout,
    )
    history = trainer.train()
    assert steps == [0, 1]
    assert all(m["writer/actions"] == 16 for m in history)
    assert "train" not in trainer._runners  # the trainer's own runner never ran
    engines["runner"].close()


def test_a_backend_of_ones_own_plugs_in_without_touching_the_loop(tmp_path):
    # A backend is a class with start / open_engines / close; its learners answer the
    # Learner protocol. This one wraps the in-process learners and records the calls.
    from mappa_train.learner import Started
    from mappa_train.local_backend import LocalBackend

    calls = []

    class Recording:
        def __init__(self, inner):
            self.inner, self.agent, self.tokenizer = inner, inner.agent, inner.tokenizer

        @property
        def rollout_policy(self):
            return self.inner.rollout_policy

        def start_logprobs(self, rows, **options):
            calls.append("logprobs")
            return self.inner.start_logprobs(rows, **options)

        def start_update(self, prep, **options):
            calls.append("update")
            return self.inner.start_update(prep, **options)

        def start_sync(self):
            calls.append("sync")
            return self.inner.start_sync()

        def save(self, directory):
            calls.append("save")
            self.inner.save(directory)

        def close(self):
            calls.append("close")
            self.inner.close()

    class RecordingBackend:
        def __init__(self):
            self.local = LocalBackend()

        def start(self, run):
            started = self.local.start(run)
            learners = {a: Recording(x) for a, x in started.learners.items()}
            return Started(learners, started.frozen)

        def open_engines(self):
            self.local.open_engines()

        def close(self):
            calls.append("backend closed")

    model_dir = tiny_model_dir(tmp_path / "model")
    trainer = Trainer(
        _toy_config(tmp_path, model_dir, steps=1, save_every=1),
        env_factory=LetterEnv,
        eval_env_factory=LetterEnv,
        backend=RecordingBackend(),
    )
    (metrics,) = trainer.train()
    assert metrics["writer/grad_norm"] > 0
    assert calls == ["logprobs", "update", "sync", "save", "close", "backend closed"]
    assert (tmp_path / "run" / "checkpoints" / "step-000001" / "agents" / "writer").is_dir()


def test_the_agents_are_read_from_the_environment_class():
    # Roles are declared by the class: reading them builds no environment.
    import functools

    from mappa_train.config import TrainConfig
    from mappa_train.environments import env_agents, make_env_factories
    from tests.toy_env import LetterPairEnv

    class Unbuildable(LetterPairEnv):
        def __init__(self, **options):
            raise AssertionError("built")

    assert env_agents(functools.partial(Unbuildable, credit_mode="process")) == [
        "writer",
        "editor",
    ]
    factories = make_env_factories(TrainConfig(env="MathChat-v0", env_options={"tasks": "gen:4"}))
    assert env_agents(factories.train) == ["problem_solver", "code_executor", "verifier"]
    assert env_agents(lambda: LetterPairEnv()) is None  # a function: only building tells
