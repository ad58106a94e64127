r"""GRPO: rewards standardised within each prompt group (``advantage_estimator="grpo"``).

Meaningful only for agents whose samples share prompts (see :mod:`.groups`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from mappa_train.algorithms.groups import group_estimate, group_indices
from mappa_train.algorithms.registry import AdvantageEstimator


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
    for members in group_indices(group_ids).values():
        if len(members) == 1:
            singletons += 1
            continue
        values = rewards[members].float()
        advantages[members] = (values - values.mean()) / (values.std(unbiased=False) + eps)
    return advantages, singletons


GRPO = AdvantageEstimator(
    group_estimate(grpo_advantages), kl_in_reward=False, name="grpo", uses_old_logprobs=False
)
"""GRPO per agent; the trainer adds ``kl_coef * KL`` to the loss. It reads rewards and
group keys only (no old log-probs), so with one optimizer step the old-log-prob pass is
skipped."""
