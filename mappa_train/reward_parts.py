"""The coach reward's named parts, averaged per agent for a step's metrics.

A rules-coach rubric names the parts of each score (:class:`~mappa_env.coach.rubric.
RubricScore`: the table's row ``"base"``, then each cap or adjustment as what it added);
the verdict carries them (``ActionSample.coach["parts"]``). A step's metrics hold each
part's mean per agent as ``<agent>/reward_part/<name>``, so a cap that starts to bind
(a falling ``modeler/reward_part/skill_cap``) shows in the run's history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mappa_agents.trajectory import ActionSample
from mappa_env.coach.base import SCORE_MAX

__all__ = ["reward_part_means"]


def reward_part_means(samples: Iterable[ActionSample]) -> dict[str, float]:
    """Each agent's mean of each named reward part, on the reward's scale.

    Averaged over the agent's actions whose verdict is valid and names parts; an
    action whose verdict lacks a part another action has counts it as 0 (the cap did
    not bind). Parts are divided by ``SCORE_MAX``, the scale of ``<agent>/mean_reward``'s
    coach reward. Actions of an invalid verdict, or of a coach that names no parts
    (an LLM coach, a plain rubric function), add nothing.

    Args:
        samples: A step's actions.

    Returns:
        ``{"<agent>/reward_part/<name>": mean}``, agents and parts in first-seen order;
        empty when no verdict names parts.
    """
    parts_by_agent: dict[str, list[Mapping[str, float]]] = {}
    for sample in samples:
        coach = sample.coach or {}
        parts = coach.get("parts")
        if coach.get("valid") and isinstance(parts, Mapping) and parts:
            parts_by_agent.setdefault(sample.agent, []).append(parts)
    metrics: dict[str, float] = {}
    for agent, rows in parts_by_agent.items():
        names = list(dict.fromkeys(name for row in rows for name in row))
        for name in names:
            total = sum(float(row.get(name, 0.0)) for row in rows)
            metrics[f"{agent}/reward_part/{name}"] = total / len(rows) / SCORE_MAX
    return metrics
