"""TRL's GRPOTrainer takes a step on MathChat-v0 through the OpenEnv server (CPU, tiny model).

examples/trl_grpo_mathchat.py as a user runs it, with a tiny model built in-process and
a server on 127.0.0.1 that the test starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("openenv")
torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl_grpo_mathchat

    yield trl_grpo_mathchat
    sys.modules.pop("trl_grpo_mathchat", None)


@pytest.mark.slow
def test_the_tiny_run_takes_a_grpo_step_that_changes_the_weights(
    example, tmp_path, monkeypatch, capsys
):
    """`--tiny --steps 1` as a user runs it: its last line says the model learned."""
    before: dict = {}
    real_train = example.train

    def snapshot_then_train(model, *args, **kwargs):
        before.update({name: p.detach().clone() for name, p in model.named_parameters()})
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(example, "train", snapshot_then_train)
    result = example.main(["--tiny", "--steps", "1", "--output-dir", str(tmp_path)])

    trainer, rollouts = result["trainer"], result["rollouts"]
    assert trainer.state.global_step == 1
    assert len(rollouts) == 4  # one episode per generation, each through the server
    rewards = [r["reward"] for r in rollouts]
    for rollout in rollouts:  # the verifier's reward is its coach score (process credit)
        assert rollout["reward"] == pytest.approx(rollout["coach"]["score"] / 10)
    assert len(set(rewards)) > 1, rewards  # a group with different rewards: a real update
    (logged,) = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert logged["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert logged["grad_norm"] > 0
    changed = [
        n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])
    ]
    assert changed, "the GRPO step changed no weight"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("learned: 1 GRPO steps, 4 rollouts"), last
    assert "1 of 1 groups of 4 had different rewards" in last


class _Logged:
    def __init__(self, history):
        self.state = type("State", (), {"log_history": history})()


def test_a_run_whose_groups_all_earned_one_reward_says_why_it_learned_nothing(example):
    rollouts = [{"task_id": "product-0", "reward": 0.0} for _ in range(4)]
    history = [{"step": 1, "reward": 0.0, "loss": 0.0, "grad_norm": 0.0}]
    line = example.summary({"trainer": _Logged(history), "rollouts": rollouts, "generations": 4})
    assert line.startswith("learned nothing: 1 GRPO steps, 4 rollouts, mean reward 0.000")
    assert "0 of 1 groups of 4 had different rewards" in line
    assert "GRPO's advantages (a reward minus its group's mean) were all 0" in line
