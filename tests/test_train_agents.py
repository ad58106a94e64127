"""Training only some agents: the others act, are scored and logged, and stay bit-identical."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train import TrainConfig, Trainer  # noqa: E402
from mappa_train import checkpoint as ckpt  # noqa: E402
from mappa_train.cli import config_from_args  # noqa: E402
from mappa_train.command import build_parser  # noqa: E402

AGENTS = ["problem_solver", "code_executor", "verifier"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def _config(out, system, **changes):
    values = dict(
        env="MathChat-v0",
        env_options={"sandbox": None, "tasks": "gen:6"},
        system=system,
        coach="rules",
        steps=2,
        prompts_per_step=2,
        samples_per_prompt=2,
        concurrency=4,
        max_new_tokens=8,
        lr=1e-2,
        kl_coef=0.0,
        mask_truncated=False,
        train_batch_size=4,
        micro_batch_size=4,
        gradient_checkpointing=False,
        save_every=1,
        keep_checkpoints=0,
        tensorboard=False,
        progress=False,
        output_dir=str(out),
        seed=5,
    )
    values.update(changes)
    return TrainConfig(**values)


def _state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_frozen_agents_act_are_logged_and_keep_their_weights(tmp_path, model_dir):
    from safetensors.torch import load_file

    config = _config(tmp_path / "run", str(model_dir), train_agents=["code_executor"])
    trainer = Trainer(config)
    trainer.setup()
    assert list(trainer.learners) == ["code_executor"]
    assert list(trainer.frozen_policies) == ["problem_solver", "verifier"]
    frozen = trainer.frozen_policies["verifier"].model
    # Frozen agents with one spec share one model: no reference, no optimizer, no grad.
    assert trainer.frozen_policies["problem_solver"].model is frozen
    assert not any(p.requires_grad for p in frozen.parameters())
    before = {"frozen": _state(frozen), "trained": _state(trainer.learners["code_executor"].model)}
    history = trainer.train()

    initial = load_file(str(model_dir / "model.safetensors"))
    for name, param in frozen.named_parameters():
        assert torch.equal(param, before["frozen"][name]), name
        assert param.grad is None
        if name in initial:
            assert torch.equal(param, initial[name]), name
    trained = trainer.learners["code_executor"].model
    assert any(not torch.equal(p, before["trained"][n]) for n, p in trained.named_parameters())

    # Frozen agents' actions are in the step's trajectories and their stats are logged.
    rollout = tmp_path / "run" / "rollouts" / "step-000000.jsonl"
    acted = {json.loads(line)["agent"] for line in rollout.read_text().splitlines()}
    assert acted == set(AGENTS)
    for metrics in history:
        for agent in ("problem_solver", "verifier"):
            assert metrics[f"{agent}/actions"] > 0
            assert f"{agent}/mean_reward" in metrics
            assert f"{agent}/mean_response_tokens" in metrics
            assert f"{agent}/loss" not in metrics
        assert "code_executor/loss" in metrics
    # Checkpoints hold only what is trained.
    saved = ckpt.latest_checkpoint(trainer.checkpoint_root)
    assert sorted(p.name for p in (saved / "agents").iterdir()) == ["code_executor"]


def test_a_staged_run_with_frozen_agents_resumes_exactly(tmp_path, model_dir):
    def trainer_for(name):
        return Trainer(_config(tmp_path / name, str(model_dir), train_agents="verifier"))

    straight = trainer_for("straight")
    straight.train()
    first = trainer_for("staged")
    first.train(until=1)
    first.close()
    resumed = trainer_for("staged")
    resumed.setup()
    assert resumed.step == 1
    resumed.train()
    a, b = straight.learners["verifier"].model, resumed.learners["verifier"].model
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(x, y), name
    timing = ("seconds", "per_s")
    for ma, mb in zip(straight.history, resumed.history):
        same = {k: v for k, v in ma.items() if not any(t in k for t in timing)}
        assert same == {k: mb[k] for k in same}
    # Resuming with an agent trained that the checkpoint has no weights for says so.
    config = _config(tmp_path / "staged", str(model_dir), train_agents=["problem_solver"])
    with pytest.raises(
        ValueError, match=r"this run trains \['problem_solver'\] \(--train-agents verifier\)"
    ):
        Trainer(config).setup()


def test_frozen_agents_share_the_lora_base_through_untrained_adapters(tmp_path, model_dir):
    pytest.importorskip("peft")
    config = _config(
        tmp_path / "run", str(model_dir), train_agents=["problem_solver"], lora_rank=4, steps=1
    )
    trainer = Trainer(config)
    trainer.setup()
    model = trainer.learners["problem_solver"].model
    assert trainer.frozen_policies["verifier"].model is model  # one base in memory
    assert trainer.frozen_policies["verifier"].adapter == "verifier"
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    trainer.train()
    after = dict(model.named_parameters())
    for name, value in before.items():
        if ".problem_solver." not in name:
            assert torch.equal(value, after[name]), name  # a frozen agent's adapter
        if ".verifier." in name and "lora_B" in name:
            assert not after[name].any(), name  # B = 0: the adapter is the base itself
    assert any(".problem_solver." in n and not torch.equal(v, after[n]) for n, v in before.items())
    saved = ckpt.latest_checkpoint(trainer.checkpoint_root)
    assert sorted(p.name for p in (saved / "agents").iterdir() if p.is_dir()) == ["problem_solver"]


def test_unknown_agents_and_agents_without_local_weights_fail_at_start(tmp_path, model_dir):
    with pytest.raises(ValueError, match=r"\['writer'\].*MathChat-v0.*problem_solver"):
        Trainer(_config(tmp_path, str(model_dir), train_agents=["verifier", "writer"]))
    system = {
        "problem_solver": str(model_dir),
        "code_executor": str(model_dir),
        "verifier": "api:openai/some-model",
    }
    with pytest.raises(ValueError, match=r"cannot train \{'verifier'.*api:.*train_agents"):
        Trainer(_config(tmp_path, system))  # every agent trained, one of them an API model
    trainer = Trainer(_config(tmp_path, system, train_agents=["problem_solver", "code_executor"]))
    assert trainer.trained_agents == ["problem_solver", "code_executor"]


def test_a_frozen_api_agent_acts_in_training(tmp_path, model_dir, monkeypatch):
    pytest.importorskip("litellm")
    pytest.importorskip("aiohttp")
    from tests.openai_stub_server import run_stub_server

    system = {a: str(model_dir) for a in AGENTS} | {"verifier": "api:openai/stub-verifier"}
    with run_stub_server(lambda request: "The answer is correct. \\boxed{1}") as server:
        # litellm's openai route reads these when the spec gives no api_base.
        monkeypatch.setenv("OPENAI_API_BASE", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        config = _config(
            tmp_path / "run", system, steps=1, train_agents="problem_solver,code_executor"
        )
        trainer = Trainer(config)
        (metrics,) = trainer.train()
        assert server.request_count > 0
    assert metrics["verifier/actions"] > 0
    assert "problem_solver/loss" in metrics
    assert "verifier/loss" not in metrics


def test_train_agents_flag_takes_a_comma_separated_list(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["train", "--train-agents", "problem_solver, code_executor"])
    assert config_from_args(args).train_agents == ["problem_solver", "code_executor"]
    args = parser.parse_args(["train", "--train-agents", '["verifier"]'])
    assert config_from_args(args).train_agents == ["verifier"]
    path = tmp_path / "c.yaml"
    path.write_text("train_agents: [verifier, problem_solver]\n")
    assert TrainConfig.from_file(path).train_agents == ["verifier", "problem_solver"]
    assert TrainConfig().train_agents is None
    with pytest.raises(ValueError, match="at least one agent"):
        TrainConfig(train_agents=[])
    with pytest.raises(ValueError, match="more than once"):
        TrainConfig(train_agents="verifier,verifier")


def test_gradient_checkpointing_flag_takes_true_false_or_auto():
    parser = build_parser()
    cases = {
        (): "auto",
        ("--gradient-checkpointing",): True,
        ("--gradient-checkpointing", "auto"): "auto",
        ("--gradient-checkpointing", "false"): False,
        ("--no-gradient-checkpointing",): False,
    }
    for flags, expected in cases.items():
        args = parser.parse_args(["train", *flags])
        assert config_from_args(args).gradient_checkpointing == expected, flags
