"""An episode's outcome, and the one way "no reward" is written in memory.

Owns :class:`EpisodeOutcome`, the typed outcome an environment's ``episode_outcome()``
dict becomes when the episode ends (:meth:`EpisodeOutcome.from_dict`, called by the
environment and by the rollout runner for an aborted episode), and :func:`usable_reward`.

**No reward is ``None``.** A reward can be missing for several reasons, which the saved
formats keep as they always were: an action's reward resting on an invalid coach verdict
is recorded as ``invalid_reward`` (NaN, or a number in ``[-1, 0]``) with
``reward_valid=False``; a trajectory row writes NaN as JSON ``null``; an aborted
episode's outcome has no ``"reward"`` key; credit modes return ``None`` for an action they
cannot pay. Code that reads a reward goes through one seam that turns every one of these
into ``None``: :func:`usable_reward` for an action's reward and
:attr:`EpisodeOutcome.reward` for the outcome's. ``None`` is chosen because it cannot be
summed by accident (NaN silently poisons a mean; a flag beside a number can be forgotten;
a missing key read with ``.get(key, 0.0)`` pays a failure as a zero) and because it is
what JSON, the credit rules and the reports already use.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The outcome keys :class:`EpisodeOutcome` holds as typed fields, in field order.
TYPED_KEYS = (
    "reward",
    "correct",
    "success",
    "task_id",
    "task_type",
    "agent_correct",
    "truncated",
    "error",
    "aborted",
)


def usable_reward(reward: Any, valid: bool = True) -> float | None:
    """A reward as a number to train on or report, or ``None`` when there is none.

    The one reader of "no reward": a reward flagged invalid (``valid=False``, whatever
    number it carries, e.g. ``invalid_reward=0.0``), ``None`` (a JSON ``null``, a credit
    mode's unpaid action, a missing outcome reward), NaN or an infinity, and anything
    that is not a number all give ``None``.

    Args:
        reward: The recorded reward.
        valid: Its ``reward_valid`` flag.

    Returns:
        ``float(reward)``, or ``None``.
    """
    if not valid or not isinstance(reward, (int, float)):
        return None
    return float(reward) if math.isfinite(reward) else None


@dataclass(frozen=True, eq=False)
class EpisodeOutcome(Mapping[str, Any]):
    """How an episode ended, graded by rule.

    Read the fields as attributes (``outcome.reward``). It is also a read-only
    ``Mapping`` of the dict the environment returned, so ``outcome["reward"]``,
    ``outcome.get("predicted")``, ``"correct" in outcome`` and ``dict(outcome)`` keep
    working for code written against the dict; it equals that dict. What is saved
    (``infos[agent]["outcome"]``, :meth:`PipelineEnv.state`, trajectory rows) is
    :meth:`to_dict`, the dict with its keys in the environment's order.

    Attributes:
        reward: The outcome reward in [0, 1]; ``None`` when the episode has none (it was
            aborted), the one encoding of "no reward" (see the module docstring).
        correct: Whether the final answer was right (MathChat-v0 and environments that
            grade an answer); ``None`` when the environment does not say.
        success: Whether the submission could be scored (DSBench-v0); ``None`` when the
            environment does not say.
        task_id: The task's id.
        task_type: The task's kind or source, which groups tasks in reports.
        agent_correct: Per agent, whether its own answer was right (``agent_oracle``
            credit and reports read it); ``None`` when not reported.
        truncated: True when the episode hit ``max_cycles`` before its last agent
            finished; ``None`` for an aborted episode, which was never graded.
        error: Why the episode was aborted; ``None`` for a finished one.
        aborted: True when the episode could not be finished (a failed generation or
            environment step): it has no reward and none of its actions is trained on.
        facts: The environment's other keys (``predicted``, ``answer``, ``metric``,
            ``value``, ...), as it returned them.
        order: Every key of the dict form, in its order (typed fields included); filled
            from the fields that are set when not given.
    """

    reward: float | None = None
    correct: bool | None = None
    success: bool | None = None
    task_id: str | None = None
    task_type: str | None = None
    agent_correct: Mapping[str, bool | None] | None = None
    truncated: bool | None = None
    error: str | None = None
    aborted: bool = False
    facts: Mapping[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        clash = sorted(set(self.facts) & set(TYPED_KEYS))
        if clash:
            raise ValueError(f"EpisodeOutcome facts must not repeat typed fields: {clash}")
        if not self.order:
            typed = [
                key
                for key in TYPED_KEYS
                if getattr(self, key) is not None and (key != "aborted" or self.aborted)
            ]
            object.__setattr__(self, "order", (*typed, *self.facts))
        unknown = [k for k in self.order if k not in TYPED_KEYS and k not in self.facts]
        if unknown or not set(self.facts) <= set(self.order):
            raise ValueError(
                f"EpisodeOutcome order {self.order} must name every fact and only known keys"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeOutcome:
        """The outcome of a dict: an environment's ``episode_outcome()`` or a saved one.

        Keys it does not type go to :attr:`facts`; the keys' order is kept, so
        ``from_dict(d).to_dict() == d`` with the same order.
        """
        # Values are kept as given (an int reward stays an int), so the dict form and
        # the files written from it do not change.
        typed = {key: data[key] for key in TYPED_KEYS if key in data}
        facts = {key: value for key, value in data.items() if key not in TYPED_KEYS}
        return cls(**typed, facts=facts, order=tuple(data))

    @classmethod
    def aborted_with(cls, error: str, task_id: str = "") -> EpisodeOutcome:
        """The outcome of an episode that could not be finished: no reward.

        Args:
            error: Why it stopped.
            task_id: Its task's id, when known (an empty id is left out).
        """
        data: dict[str, Any] = {"error": error, "aborted": True}
        if task_id:
            data["task_id"] = task_id
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The plain dict, keys in the environment's order: what is saved and shown."""
        return {key: self[key] for key in self.order}

    @property
    def succeeded(self) -> bool:
        """Whether the episode succeeded.

        By ``correct`` (MathChat) or ``success`` (DSBench) when the outcome has the key;
        for an environment whose outcome has neither, by a full outcome reward (1.0).
        """
        for key in ("correct", "success"):
            if key in self.order:
                return bool(getattr(self, key))
        reward = self.reward
        return isinstance(reward, (int, float)) and not isinstance(reward, bool) and reward >= 1.0

    def __getitem__(self, key: str) -> Any:
        if key not in self.order:
            raise KeyError(key)
        if key in TYPED_KEYS:
            return getattr(self, key)
        return self.facts[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, key: object) -> bool:
        return key in self.order

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
