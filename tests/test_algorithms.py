"""REINFORCE++ numerics pinned on hand-computed cases; credit modes; group baselines."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mappa_train.algorithms.baselines import (  # noqa: E402
    broadcast_to_tokens,
    grpo_advantages,
    rloo_advantages,
)
from mappa_train.algorithms.reinforce_pp import (  # noqa: E402
    clip_fraction,
    discounted_returns,
    kl_penalty,
    last_token_index,
    ppo_clip_loss,
    reinforce_pp_advantages,
    token_rewards,
    whiten,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_kl_estimators_by_hand():
    logp = t([[-1.0, -2.0]])
    ref = t([[-1.5, -1.0]])
    d = [0.5, -1.0]
    assert torch.allclose(kl_penalty(logp, ref, "k1"), t([d]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), t([[0.125, 0.5]]))
    k3 = [math.exp(-x) - 1 + x for x in d]
    assert torch.allclose(kl_penalty(logp, ref, "k3"), t([k3]))
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k9")
    with pytest.raises(ValueError, match="shape mismatch"):
        kl_penalty(logp, ref[:, :1], "k1")


def test_token_rewards_put_the_score_on_the_last_valid_token():
    kl = t([[0.1, 0.2, 0.3], [1.0, 2.0, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    rewards = token_rewards(t([0.7, 0.4]), kl, mask, kl_coef=0.1)
    expected = t([[-0.01, -0.02, 0.7 - 0.03], [-0.1, 0.4 - 0.2, 0.0]])
    assert torch.allclose(rewards, expected)
    assert last_token_index(t([[1, 1, 0], [0, 0, 0]])).tolist() == [1, -1]


def test_discounted_returns_by_hand():
    rewards = t([[1.0, 2.0, 3.0], [1.0, 1.0, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    assert torch.allclose(discounted_returns(rewards, mask, 1.0), t([[6, 5, 3], [2, 1, 0]]))
    assert torch.allclose(
        discounted_returns(rewards, mask, 0.5),
        t([[1 + 0.5 * 2 + 0.25 * 3, 2 + 1.5, 3], [1.5, 1, 0]]),
    )


def test_whiten_uses_all_valid_tokens_of_the_batch():
    values = t([[1.0, 3.0], [5.0, 100.0]])
    mask = t([[1, 1], [1, 0]])
    out = whiten(values, mask, eps=0.0)
    mean, std = 3.0, math.sqrt(8 / 3)
    assert torch.allclose(out, t([[-2 / std, 0.0], [2 / std, 0.0]]))
    assert torch.allclose((out * mask).sum(), torch.tensor(0.0), atol=1e-6)
    assert mean == 3.0
    assert torch.equal(whiten(values, torch.zeros_like(mask)), torch.zeros_like(values))


def test_reinforce_pp_advantages_hand_computed():
    # Two actions: rewards 1.0 and 0.0; zero KL (policy == reference), gamma 1.
    logp = t([[-1.0, -1.0], [-1.0, -1.0]])
    mask = t([[1, 1], [1, 0]])
    adv = reinforce_pp_advantages(t([1.0, 0.0]), logp, logp.clone(), mask)
    # Returns: row0 [1, 1], row1 [0, -]; mean 2/3, std sqrt(2/9).
    std = math.sqrt(2 / 9)
    expected = t([[(1 - 2 / 3) / std, (1 - 2 / 3) / std], [(0 - 2 / 3) / std, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    # With KL: k1 kl = 0.5 on every token, beta 0.1 -> r = [-.05, 1-.05], [-.05 + 0, pad].
    ref = logp - 0.5
    adv_kl = reinforce_pp_advantages(t([1.0, 0.0]), logp, ref, mask, kl_coef=0.1)
    returns = [[0.9, 0.95], [-0.05]]
    flat = [0.9, 0.95, -0.05]
    m = sum(flat) / 3
    s = math.sqrt(sum((x - m) ** 2 for x in flat) / 3)
    assert adv_kl[0, 0].item() == pytest.approx((returns[0][0] - m) / s, rel=1e-4)
    assert adv_kl[1, 0].item() == pytest.approx((returns[1][0] - m) / s, rel=1e-4)
    assert adv_kl[1, 1].item() == 0.0


def test_ppo_clip_loss_by_hand():
    adv = t([[1.0, -1.0, 2.0]])
    mask = t([[1, 1, 0]])
    old = t([[0.0, 0.0, 0.0]])
    new = torch.log(t([[1.5, 0.5, 1.0]]))
    # token 0: ratio 1.5, A=1 -> min(1.5, 1.2) = 1.2; token 1: ratio .5, A=-1 -> min(-.5, -.8) = -.8
    loss = ppo_clip_loss(new, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-(1.2 - 0.8) / 2)
    high = ppo_clip_loss(new, old, adv, mask, clip_eps=0.2, clip_eps_high=0.6)
    assert high.item() == pytest.approx(-(1.5 - 0.8) / 2)
    assert clip_fraction(new, old, mask).item() == pytest.approx(1.0)
    assert ppo_clip_loss(new, old, adv, torch.zeros_like(mask)).item() == 0.0


def test_clipped_loss_gradient_equals_reinforce_gradient_at_ratio_one():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, requires_grad=True)
    tokens = torch.randint(0, 7, (3, 5))
    mask = t([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    adv = torch.randn(3, 5) * mask
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    loss = ppo_clip_loss(logp, logp.detach(), adv, mask)
    (grad_ppo,) = torch.autograd.grad(loss, logits)
    logp2 = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    reinforce = -(adv * logp2 * mask).sum() / mask.sum()
    (grad_reinforce,) = torch.autograd.grad(reinforce, logits)
    assert torch.allclose(grad_ppo, grad_reinforce, atol=1e-6)
    assert grad_ppo.abs().sum() > 0


def test_group_baselines_and_singletons():
    rewards = t([1.0, 0.0, 0.5, 0.2])
    groups = ["a", "a", "a", "b"]
    grpo, single = grpo_advantages(rewards, groups)
    values = torch.tensor([1.0, 0.0, 0.5])
    expected = (values - values.mean()) / (values.std(unbiased=False) + 1e-6)
    assert torch.allclose(grpo[:3], expected)
    assert grpo[3] == 0.0
    assert single == 1
    rloo, single = rloo_advantages(rewards, groups)
    assert rloo.tolist()[:3] == pytest.approx([1 - 0.25, 0 - 0.75, 0.5 - 0.5])
    assert single == 1
    tokens = broadcast_to_tokens(rloo, t([[1, 1], [1, 0], [0, 0], [1, 1]]))
    assert tokens[1].tolist() == pytest.approx([-0.75, 0.0])


def _random_batches():
    from mappa_train.algorithms import AgentBatch

    gen = torch.Generator().manual_seed(0)
    batches = {}
    for agent, (rows, width) in {"a": (3, 5), "b": (4, 2)}.items():
        lengths = torch.randint(1, width + 1, (rows,), generator=gen)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
        batches[agent] = AgentBatch(
            rewards=torch.rand(rows, generator=gen),
            old_logprobs=-torch.rand(rows, width, generator=gen),
            ref_logprobs=-torch.rand(rows, width, generator=gen),
            mask=mask,
            group_keys=[i % 2 for i in range(rows)],
        )
    return batches


@pytest.mark.parametrize("scope", ["agent", "all"])
def test_registered_reinforce_pp_is_reinforce_pp_advantages(scope):
    from mappa_train import TrainConfig, get_estimator

    config = TrainConfig(kl_coef=0.1, gamma=0.9, kl_estimator="k3", normalize_scope=scope)
    batches = _random_batches()
    got = get_estimator("reinforce_pp")(batches, config)
    if scope == "agent":
        for agent, b in batches.items():
            expected = reinforce_pp_advantages(
                b.rewards, b.old_logprobs, b.ref_logprobs, b.mask, 0.1, 0.9, "k3"
            )
            assert torch.equal(got[agent].advantages, expected)
        return
    # One whitening over both agents' valid tokens: zero mean, unit std together.
    values = torch.cat([(got[a].advantages * b.mask).flatten() for a, b in batches.items()])
    masks = torch.cat([b.mask.flatten() for b in batches.values()])
    valid = values[masks > 0]
    assert valid.mean().abs() < 1e-6
    assert valid.std(unbiased=False) == pytest.approx(1.0, abs=1e-5)
    per_agent = got["a"].advantages[batches["a"].mask > 0]
    assert per_agent.mean().abs() > 1e-3  # not whitened per agent


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_registered_group_estimators_broadcast_their_baselines(name):
    from mappa_train import TrainConfig, get_estimator

    function = grpo_advantages if name == "grpo" else rloo_advantages
    batches = _random_batches()
    got = get_estimator(name)(batches, TrainConfig(advantage_estimator=name))
    for agent, b in batches.items():
        values, singletons = function(b.rewards, b.group_keys)
        assert torch.equal(got[agent].advantages, broadcast_to_tokens(values, b.mask))
        assert got[agent].stats == {"group_singletons": singletons}
