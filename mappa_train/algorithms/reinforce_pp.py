r"""REINFORCE++ with per-action rewards: KL-shaped token rewards, returns, whitening, PPO clip.

Each action (one generation of one agent) is one sample: a row of response tokens
``o_1..o_T`` with a mask of the valid positions and one scalar reward ``s`` (the coach's
score scaled to [0, 1]). Tensors are ``[B, T]`` (batch of actions x response tokens),
right-padded; ``mask`` is 1.0 on real response tokens.

Read top to bottom:

1. :func:`kl_penalty` - per-token KL estimate to the frozen reference model.
2. :func:`token_rewards` - ``r_t = -beta * kl_t`` and ``r_T = s - beta * kl_T``.
3. :func:`discounted_returns` - ``G_t = sum_{i >= t} gamma^(i - t) r_i``.
4. :func:`whiten` - advantages normalised over all valid tokens of the batch.
5. :func:`reinforce_pp_advantages` - 1-4 together (``A_t = whiten(G_t)``).
6. :func:`reinforce_pp_estimate` - the trainer's estimator (``"reinforce_pp"``): 1-3 per
   agent, then 4 over each agent's tokens or over all agents' tokens together.
7. :func:`ppo_clip_loss` - the clipped surrogate, token-level mean, no critic.

No group baseline: in a pipeline, downstream agents start from different upstream
outputs, so samples rarely share a prompt (see :mod:`mappa_train.algorithms.grpo` and
:mod:`mappa_train.algorithms.rloo` for group baselines where they do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mappa_train.algorithms.registry import AdvantageEstimator, AgentAdvantages, AgentBatch

if TYPE_CHECKING:
    from mappa_train.config import TrainConfig

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    r"""Per-token estimate of ``KL(pi || pi_ref)`` from log-probs of the sampled tokens.

    With ``d = logprobs - ref_logprobs`` (``log pi(o_t) - log pi_ref(o_t)``):

    - ``k1``: ``d`` (unbiased, can be negative),
    - ``k2``: ``d^2 / 2`` (low variance, biased),
    - ``k3``: ``exp(-d) - 1 + d`` (unbiased and non-negative; Schulman's estimator).

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the policy.
        ref_logprobs: ``[B, T]`` log-probs of the same tokens under the reference model.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]`` per-token KL estimates (padding positions are not masked here).

    Raises:
        ValueError: For an unknown estimator or mismatched shapes.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"shape mismatch: {tuple(logprobs.shape)} vs {tuple(ref_logprobs.shape)}")
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; use one of {KL_ESTIMATORS}")


def last_token_index(mask: Tensor) -> Tensor:
    """Index of the last valid token of each row (``-1`` for an all-padding row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values


def token_rewards(
    action_rewards: Tensor, kl: Tensor, mask: Tensor, kl_coef: float = 0.01
) -> Tensor:
    r"""Dense token rewards: ``r_t = -beta * kl_t``, plus the action's reward on its last token.

    ``r_t = -beta * kl_t`` for ``t < T`` and ``r_T = s - beta * kl_T``, with ``beta`` =
    ``kl_coef`` and ``T`` the last valid token of the row. Padding positions are 0.

    Args:
        action_rewards: ``[B]`` reward of each action (e.g. coach score / 10).
        kl: ``[B, T]`` per-token KL estimates.
        mask: ``[B, T]`` 1.0 on valid response tokens.
        kl_coef: ``beta``, the KL penalty weight (0.01 in the paper).

    Returns:
        ``[B, T]`` token rewards.
    """
    mask = mask.to(kl.dtype)
    rewards = -kl_coef * kl * mask
    last = last_token_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] += action_rewards.to(rewards.dtype)[rows]
    return rewards


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    r"""Reward-to-go ``G_t = sum_{i >= t} gamma^(i - t) r_i`` along each row.

    Computed right to left: ``G_t = r_t + gamma * G_{t+1}``. Padding positions are 0 and
    contribute nothing.

    Args:
        rewards: ``[B, T]`` token rewards.
        mask: ``[B, T]`` 1.0 on valid tokens.
        gamma: Discount factor (1.0 in the paper).

    Returns:
        ``[B, T]`` returns.
    """
    mask = mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] * mask[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    r"""Normalise ``values`` to zero mean and unit variance over the valid tokens.

    ``A = (x - mean) / (std + eps)`` where mean and (population) std are taken over all
    masked positions of the whole batch together (not per row or per prompt). Padding
    positions are 0.

    Args:
        values: ``[B, T]`` values (returns).
        mask: ``[B, T]`` 1.0 on valid tokens.
        eps: Added to the std to avoid division by zero.

    Returns:
        ``[B, T]`` whitened values; all zeros when no token is valid.
    """
    mask = mask.to(values.dtype)
    count = mask.sum()
    if count == 0:
        return torch.zeros_like(values)
    mean = (values * mask).sum() / count
    std = (((values - mean).square() * mask).sum() / count).sqrt()
    return (values - mean) / (std + eps) * mask


def reinforce_pp_advantages(
    action_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float = 0.01,
    gamma: float = 1.0,
    kl_estimator: str = "k1",
) -> Tensor:
    r"""REINFORCE++ advantages of one batch: KL-shaped token rewards -> returns -> whitening.

    ``kl_t = kl_penalty(logprobs, ref_logprobs)``; ``r_t = -beta kl_t`` (``+ s`` on the
    last valid token); ``G_t = sum_{i>=t} gamma^(i-t) r_i``; ``A = whiten(G)`` over all
    valid tokens of the batch. Masked positions are 0.

    Args:
        action_rewards: ``[B]`` one reward per action.
        logprobs: ``[B, T]`` sampled tokens' log-probs under the policy that sampled them.
        ref_logprobs: ``[B, T]`` the same under the frozen reference model.
        mask: ``[B, T]`` 1.0 on valid response tokens.
        kl_coef: ``beta``.
        gamma: Discount factor.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]`` advantages.
    """
    returns = reinforce_pp_returns(
        action_rewards, logprobs, ref_logprobs, mask, kl_coef, gamma, kl_estimator
    )
    return whiten(returns, mask)


def reinforce_pp_returns(
    action_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float = 0.01,
    gamma: float = 1.0,
    kl_estimator: str = "k1",
) -> Tensor:
    r"""REINFORCE++ returns before whitening: ``G_t = sum_{i>=t} gamma^(i-t) r_i``.

    ``kl_t = kl_penalty(logprobs, ref_logprobs)``, ``r_t = -beta kl_t`` (``+ s`` on the
    last valid token). Arguments as :func:`reinforce_pp_advantages`.

    Returns:
        ``[B, T]`` returns (no gradient).
    """
    with torch.no_grad():
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        rewards = token_rewards(action_rewards.float(), kl, mask, kl_coef)
        return discounted_returns(rewards, mask, gamma)


def whiten_together(values: Sequence[Tensor], masks: Sequence[Tensor]) -> list[Tensor]:
    r""":func:`whiten` over the union of several batches' valid tokens.

    The batches may differ in width ``T``: each is right-padded with zeros to the widest,
    all are whitened as one batch (one mean, one std), then cut back to their widths.

    Args:
        values: ``[B_k, T_k]`` values of each batch.
        masks: ``[B_k, T_k]`` their valid-token masks.

    Returns:
        The whitened values of each batch, in order and in their own shapes.
    """
    width = max(v.shape[1] for v in values)
    stacked = torch.cat([_pad_to(v, width) for v in values])
    whitened = whiten(stacked, torch.cat([_pad_to(m, width) for m in masks]))
    out, row = [], 0
    for v in values:
        n, w = v.shape
        out.append(whitened[row : row + n, :w])
        row += n
    return out


def reinforce_pp_estimate(
    batches: Mapping[str, AgentBatch], config: TrainConfig
) -> dict[str, AgentAdvantages]:
    r"""The ``reinforce_pp`` estimator: :func:`reinforce_pp_returns` per agent, whitened.

    ``A = whiten(G)`` over each agent's tokens (``config.normalize_scope == "agent"``,
    the reference code) or over every agent's tokens together (``"all"``). The KL
    penalty is in the token rewards (``config.kl_coef``, ``config.kl_estimator``), with
    ``config.gamma`` as the discount.

    Args:
        batches: Agent -> its usable actions of the step.
        config: The run's settings.

    Returns:
        Agent -> advantages.
    """
    for agent, batch in batches.items():
        if batch.old_logprobs is None:
            raise ValueError(f"reinforce_pp needs old log-probs; agent {agent!r} has none")
    returns = {
        agent: reinforce_pp_returns(
            batch.rewards,
            batch.old_logprobs,
            batch.ref_logprobs,
            batch.mask,
            config.kl_coef,
            config.gamma,
            config.kl_estimator,
        )
        for agent, batch in batches.items()
    }
    if config.normalize_scope == "agent":
        return {
            agent: AgentAdvantages(whiten(values, batches[agent].mask))
            for agent, values in returns.items()
        }
    if not returns:
        return {}
    whitened = whiten_together(list(returns.values()), [batches[a].mask for a in returns])
    return {agent: AgentAdvantages(values) for agent, values in zip(returns, whitened)}


REINFORCE_PP = AdvantageEstimator(
    reinforce_pp_estimate, kl_in_reward=True, name="reinforce_pp", uses_old_logprobs=True
)
"""REINFORCE++ (the paper's algorithm): KL folded into the token rewards, batch whitening."""


def _pad_to(values: Tensor, width: int) -> Tensor:
    if values.shape[1] == width:
        return values
    pad = torch.zeros((values.shape[0], width - values.shape[1]), dtype=values.dtype)
    return torch.cat([values, pad], dim=1)


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> Tensor:
    r"""PPO's clipped surrogate loss, averaged over valid tokens (no critic, no entropy).

    ``ratio_t = exp(log pi_theta(o_t) - log pi_old(o_t))``;
    ``L = -mean_t min(ratio_t A_t, clip(ratio_t, 1 - eps, 1 + eps_high) A_t)``
    with the mean over all masked tokens of the batch (token-level mean).
    ``eps_high`` defaults to ``eps`` (set it higher for asymmetric "clip-higher").
    At ``ratio = 1`` the gradient equals the REINFORCE gradient
    ``-mean_t A_t grad log pi_theta(o_t)``.

    Args:
        logprobs: ``[B, T]`` log-probs under the policy being trained (with grad).
        old_logprobs: ``[B, T]`` log-probs under the policy that sampled (no grad).
        advantages: ``[B, T]``.
        mask: ``[B, T]`` 1.0 on tokens that count.
        clip_eps: Lower clip range ``eps`` (0.2 in the paper).
        clip_eps_high: Upper clip range; ``None`` means ``clip_eps``.

    Returns:
        A scalar loss (0 when no token is valid).
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def clip_fraction(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> Tensor:
    """Share of valid tokens whose ratio lies outside the clip range (a training diagnostic)."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)).to(mask.dtype) * mask
    return outside.sum() / mask.sum().clamp(min=1.0)
