"""Each agent's reward spread per step: what the repro's void rule reads as a signal."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mappa_train.advantages import fill_advantages, reward_std  # noqa: E402
from mappa_train.algorithms.registry import get_estimator  # noqa: E402
from mappa_train.config import TrainConfig  # noqa: E402
from mappa_train.learner_rank import TokenRow  # noqa: E402
from mappa_train.update import PreparedRows  # noqa: E402


def test_the_spread_is_the_population_standard_deviation():
    assert reward_std(torch.tensor([0.0, 0.0, 1.0, 1.0])) == pytest.approx(0.5)
    # One success in 32 actions: sqrt(p * (1 - p)) with p = 1/32.
    assert reward_std(torch.tensor([1.0] + [0.0] * 31)) == pytest.approx((31 / 32**2) ** 0.5)
    assert reward_std(torch.tensor([0.7, 0.7, 0.7])) == 0.0  # no direction to learn in
    assert reward_std(torch.tensor([0.3])) == 0.0


def test_every_agent_with_actions_gets_its_spread():
    config = TrainConfig()
    rows = torch.zeros(2, 3)
    prepared = {
        agent: PreparedRows(
            [TokenRow([1], [2, 3, 4]), TokenRow([5], [6, 7, 8])],
            torch.tensor(rewards),
            rows,
            rows,
            rows + 1,
            0,
            0,
        )
        for agent, rewards in (("same", [1.0, 1.0]), ("apart", [0.0, 1.0]))
    }
    prepared["idle"] = PreparedRows([], torch.zeros(0), rows, rows, rows, 0, 0)
    fill_advantages(prepared, get_estimator("reinforce_pp"), config)
    assert prepared["same"].stats["reward_std"] == 0.0
    assert prepared["apart"].stats["reward_std"] == pytest.approx(0.5)
    assert "reward_std" not in prepared["idle"].stats
