r"""Group baselines (GRPO, RLOO): valid only where samples share a prompt.

Both compare an action's reward with other samples *of the same prompt*. In MAPPA's
pipelines that holds only for the first agent (``problem_solver`` / ``data_engineer``)
when a task is sampled several times: every downstream agent starts from a different
upstream output, so its prompts are all different and a group baseline has nothing to
compare with. That is why REINFORCE++ (batch whitening, no group) is the default.
Actions alone in their group get advantage 0 and are counted, so the waste is visible.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(group_ids):
        groups.setdefault(key, []).append(i)
    return groups


def grpo_advantages(
    rewards: Tensor, group_ids: Sequence[Hashable], eps: float = 1e-6
) -> tuple[Tensor, int]:
    r"""GRPO: ``A_i = (r_i - mean_g) / (std_g + eps)`` within each prompt group ``g``.

    Args:
        rewards: ``[B]`` action rewards.
        group_ids: A group key per action (e.g. the prompt's token ids as a tuple).
        eps: Added to the group std.

    Returns:
        ``([B] advantages, number of actions alone in their group)``.
    """
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    singletons = 0
    for members in _groups(group_ids).values():
        if len(members) == 1:
            singletons += 1
            continue
        values = rewards[members].float()
        advantages[members] = (values - values.mean()) / (values.std(unbiased=False) + eps)
    return advantages, singletons


def rloo_advantages(rewards: Tensor, group_ids: Sequence[Hashable]) -> tuple[Tensor, int]:
    r"""RLOO: ``A_i = r_i - mean_{j != i in g} r_j`` (leave-one-out baseline).

    Args:
        rewards: ``[B]`` action rewards.
        group_ids: A group key per action.

    Returns:
        ``([B] advantages, number of actions alone in their group)``.
    """
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    singletons = 0
    for members in _groups(group_ids).values():
        k = len(members)
        if k == 1:
            singletons += 1
            continue
        values = rewards[members].float()
        advantages[members] = values - (values.sum() - values) / (k - 1)
    return advantages, singletons


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """Give every valid token of a row its action's advantage: ``[B] -> [B, T]``."""
    return advantages.to(mask.dtype)[:, None] * mask
