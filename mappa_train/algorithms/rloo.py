r"""RLOO: a leave-one-out baseline within each prompt group (``advantage_estimator="rloo"``).

Meaningful only for agents whose samples share prompts (see :mod:`.groups`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from mappa_train.algorithms.groups import group_estimate, group_indices
from mappa_train.algorithms.registry import AdvantageEstimator


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
    for members in group_indices(group_ids).values():
        k = len(members)
        if k == 1:
            singletons += 1
            continue
        values = rewards[members].float()
        advantages[members] = values - (values.sum() - values) / (k - 1)
    return advantages, singletons


RLOO = AdvantageEstimator(
    group_estimate(rloo_advantages), kl_in_reward=False, name="rloo", uses_old_logprobs=False
)
"""RLOO per agent; the trainer adds ``kl_coef * KL`` to the loss. It reads rewards and
group keys only (no old log-probs), so with one optimizer step the old-log-prob pass is
skipped."""
