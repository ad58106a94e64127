"""From a step's actions to each agent's prepared rows: usable actions, KL, advantages.

An action trains its agent when it has exact response ids with their sampling
log-probs and a valid reward; actions cut by the length limit (with ``mask_truncated``)
and actions whose reward is invalid are counted, not trained. The agents' rows then go
to the advantage estimator together (REINFORCE++ may whiten across agents).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mappa_train.algorithms.registry import AdvantageEstimator, AgentBatch
from mappa_train.algorithms.reinforce_pp import kl_penalty
from mappa_train.config import TrainConfig
from mappa_train.update import PreparedRows

__all__ = ["Usable", "fill_advantages", "prepared_rows", "reward_std", "usable_actions"]

Usable = tuple[list[Any], int, int]
"""An agent's usable actions, and how many were cut by the length limit or invalid."""


def usable_actions(samples: Sequence[Any], agent: str, mask_truncated: bool) -> Usable:
    """``agent``'s actions that can be trained on, and the counts of those that cannot.

    Returns:
        ``(kept, cut, invalid)``: ``cut`` ended at the length limit (with
        ``mask_truncated``); ``invalid`` have no exact ids or no valid reward.
    """
    kept, cut, invalid = [], 0, 0
    for sample in samples:
        if sample.agent != agent:
            continue
        if not sample.response_ids or len(sample.logprobs) != len(sample.response_ids):
            invalid += 1  # an untrainable generation (no exact ids)
        elif sample.finish_reason == "length" and mask_truncated:
            cut += 1
        elif sample.trainable_reward is None:
            invalid += 1
        else:
            kept.append(sample)
    return kept, cut, invalid


def prepared_rows(
    usable: Usable, scored: tuple[torch.Tensor | None, torch.Tensor] | None
) -> PreparedRows:
    """One agent's rows: rewards, old and reference log-probs ``[N, T]``, response mask.

    Args:
        usable: From :func:`usable_actions`.
        scored: Old and reference log-probs of the kept actions (``None`` when none; old
            ``None`` when its pass was skipped, see
            :func:`~mappa_train.update.needs_old_logprobs`).
    """
    kept, cut, invalid = usable
    if not kept or scored is None:
        empty = torch.zeros((0, 1))
        return PreparedRows([], torch.zeros(0), empty, empty, empty, cut, invalid)
    old, ref = scored
    mask = torch.zeros_like(ref)
    for i, sample in enumerate(kept):
        mask[i, : len(sample.response_ids)] = 1.0
    values = torch.tensor([s.trainable_reward for s in kept])
    return PreparedRows(kept, values, old, ref, mask, cut, invalid)


def reward_std(rewards: torch.Tensor) -> float:
    r"""The spread of one agent's rewards in a step: ``sqrt((1 / N) * sum_i (r_i - mean r)^2)``.

    Over the ``N`` actions the agent trains on in the step, the group REINFORCE++
    whitens over. It is 0 exactly when every action got the same reward: the reward
    then points nowhere, and only the KL term moves the agent (a group baseline's
    advantages are all 0). A run whose agents show no spread step after step has no
    learning signal, whatever its KL or gradient norm (whitening blows tiny KL
    differences up to unit scale).

    Args:
        rewards: ``[N]`` the agent's action rewards, ``N >= 1``.

    Returns:
        The population standard deviation (0.0 for one action).
    """
    values = rewards.double()
    return float((values - values.mean()).square().mean().sqrt())


def fill_advantages(
    prepared: dict[str, PreparedRows], estimator: AdvantageEstimator, config: TrainConfig
) -> None:
    """Fill ``advantages`` (and the ``kl`` and ``reward_std`` statistics) of every agent.

    Agents without actions are left as they are.

    ``kl`` is the mask-weighted mean of :func:`~mappa_train.algorithms.reinforce_pp.kl_penalty`
    of old against reference log-probs: ``sum(kl * mask) / sum(mask)``. An agent whose
    old-log-prob pass was skipped gets the same statistic from its update's loss pass
    (:func:`~mappa_train.update.update_agent`), under the same name.

    The estimator gets ``old_logprobs=None`` when it declared ``uses_old_logprobs=False``,
    whether or not the pass ran.

    Raises:
        ValueError: When the estimator leaves an agent out or answers in a wrong shape,
            or reads old log-probs that were not computed.
    """
    batches: dict[str, AgentBatch] = {}
    for agent, prep in prepared.items():
        if not prep.samples:
            continue
        prep.stats["reward_std"] = reward_std(prep.rewards)
        if prep.old_logprobs is not None:
            kl = kl_penalty(prep.old_logprobs, prep.ref_logprobs, config.kl_estimator)
            prep.stats["kl"] = float((kl * prep.mask).sum() / prep.mask.sum())
        elif estimator.uses_old_logprobs:
            raise ValueError(
                f"advantage estimator {config.advantage_estimator!r} reads old log-probs, "
                f"but agent {agent!r}'s were not computed"
            )
        batches[agent] = AgentBatch(
            rewards=prep.rewards,
            old_logprobs=prep.old_logprobs if estimator.uses_old_logprobs else None,
            ref_logprobs=prep.ref_logprobs,
            mask=prep.mask,
            group_keys=[tuple(s.prompt_ids) for s in prep.samples],
        )
    if not batches:
        return  # nothing usable this step: every agent's update is skipped
    results = estimator(batches, config)
    for agent, batch in batches.items():
        result = results.get(agent)
        if result is None:
            raise ValueError(
                f"advantage estimator {config.advantage_estimator!r} returned no "
                f"advantages for agent {agent!r} (it got {list(batches)})"
            )
        if tuple(result.advantages.shape) != tuple(batch.mask.shape):
            raise ValueError(
                f"advantage estimator {config.advantage_estimator!r} returned advantages "
                f"of shape {tuple(result.advantages.shape)} for agent {agent!r}; "
                f"expected its mask's {tuple(batch.mask.shape)}"
            )
        prepared[agent].advantages = result.advantages.detach().to("cpu", torch.float32)
        prepared[agent].stats.update(result.stats)
