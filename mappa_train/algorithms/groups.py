r"""Shared pieces of the group-baseline estimators (:mod:`.grpo`, :mod:`.rloo`).

A group baseline compares an action's reward with other samples *of the same prompt*.
In MAPPA's pipelines that holds only for the first agent (``problem_solver`` /
``data_engineer``) when a task is sampled several times: every downstream agent starts
from a different upstream output, so its prompts are all different and a group
baseline has nothing to compare with. That is why REINFORCE++ (batch whitening, no
group) is the default. Actions alone in their group get advantage 0 and are counted
(``group_singletons``), so the waste is visible.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from mappa_train.algorithms.registry import AgentAdvantages, AgentBatch, EstimateFn

if TYPE_CHECKING:
    from mappa_train.config import TrainConfig

GroupAdvantagesFn = Callable[[Tensor, Sequence[Hashable]], tuple[Tensor, int]]
"""``(rewards [B], group keys) -> ([B] advantages, number of singleton groups)``."""


def group_indices(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Row indices of each group, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(group_ids):
        groups.setdefault(key, []).append(i)
    return groups


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """Give every valid token of a row its action's advantage: ``[B] -> [B, T]``."""
    return advantages.to(mask.dtype)[:, None] * mask


def group_estimate(group_advantages: GroupAdvantagesFn) -> EstimateFn:
    """An estimator applying a per-action group baseline to each agent separately.

    Each agent's action advantages come from ``group_advantages(rewards, group_keys)``
    and every valid token of an action gets its action's advantage; the number of
    actions alone in their group is reported as the ``group_singletons`` stat. The KL
    penalty is left to the trainer's loss, and the old log-probs are never read (the
    estimator is registered with ``kl_in_reward=False`` and ``uses_old_logprobs=False``).

    Args:
        group_advantages: e.g. :func:`~mappa_train.algorithms.grpo.grpo_advantages`.

    Returns:
        An ``estimate`` function for :class:`~mappa_train.algorithms.AdvantageEstimator`.
    """

    def estimate(
        batches: Mapping[str, AgentBatch], config: TrainConfig
    ) -> dict[str, AgentAdvantages]:
        out = {}
        for agent, batch in batches.items():
            values, singletons = group_advantages(batch.rewards, batch.group_keys)
            out[agent] = AgentAdvantages(
                broadcast_to_tokens(values, batch.mask), {"group_singletons": singletons}
            )
        return out

    return estimate
