"""Stop rules: a run that cannot learn stops, with the cause and the fix.

Without them such a run trains on nothing to its last step and exits 0.

:class:`UnscoredStopRule` watches the share of the trained agents' actions that got no
usable reward: an invalid coach verdict (garbage, a timeout, an HTTP error, a dead
server) is masked out of the loss, as it should be, and a step whose every action is
masked trains nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mappa_env.errors import RunStoppedError

logger = logging.getLogger(__name__)

__all__ = ["UnscoredStopRule", "unscored_share"]


def unscored_share(samples: Iterable[Any]) -> tuple[int, int, str | None]:
    """How many actions got no usable reward, of how many, and the coach's last error.

    Args:
        samples: Actions (:class:`~mappa_agents.trajectory.ActionSample`): an action is
            unscored when its ``trainable_reward`` is ``None``.

    Returns:
        ``(unscored, actions, last_error)``; ``last_error`` is the ``error`` of the last
        unscored action's coach verdict, if it has one.
    """
    unscored = actions = 0
    last_error = None
    for sample in samples:
        actions += 1
        if sample.trainable_reward is None:
            unscored += 1
            coach = sample.coach or {}
            last_error = coach.get("error") or last_error
    return unscored, actions, last_error


@dataclass
class UnscoredStopRule:
    """Stops a run after ``patience`` steps in a row left too many actions unscored.

    With ``u_t = unscored_t / actions_t``, the share of step ``t``'s actions (of the
    trained agents) without a usable reward, the run stops after step ``t`` when
    ``u_s >= threshold`` for every ``s`` in ``t - patience + 1 .. t``. A step without
    actions neither counts nor breaks the streak. ``threshold = 1`` stops only on steps
    where no action could be scored (training on nothing); ``patience = 0`` never stops.

    Args:
        threshold: The unscored share at or above which a step counts.
        patience: Steps in a row that must count before the run stops.
    """

    threshold: float = 1.0
    patience: int = 2
    streak: int = 0
    """Steps in a row so far at or above ``threshold``."""
    last_share: float | None = None
    last_error: str | None = None
    """The coach's last error among the unscored actions of the streak."""
    _due: bool = field(default=False, repr=False)

    def observe(self, samples: Iterable[Any]) -> dict[str, Any]:
        """Take one step's actions into account.

        Returns:
            The step's metrics of the rule: ``rollout/unscored_rate``.
        """
        unscored, actions, error = unscored_share(samples)
        if actions == 0:
            return {"rollout/unscored_rate": None}
        share = unscored / actions
        self.last_share = share
        if share >= self.threshold:
            self.streak += 1
            self.last_error = error or self.last_error
        else:
            self.streak = 0
            self.last_error = None
        self._due = self.patience > 0 and self.streak >= self.patience
        return {"rollout/unscored_rate": share}

    def stop_if_due(self) -> None:
        """Raise when the last observed step completed a streak of ``patience`` steps.

        Raises:
            RunStoppedError: With the share, the coach's last error and the fix.
        """
        if not self._due:
            return
        what = (
            "no action could be scored"
            if self.threshold >= 1.0
            else f"{self.last_share:.0%} of the actions could not be scored (stop "
            f"threshold {self.threshold:.0%})"
        )
        error = self.last_error or "none recorded"
        raise RunStoppedError(
            f"{self.streak} steps in a row {what}: every such action is masked, so the run "
            f"trains (next to) nothing. The coach's last error: {error}. "
            "Fix the coach (its server, api_base, key, timeout= or max_tokens= in --coach; "
            "`mappa coach audit` tries it), then rerun the same command to resume from the "
            "last checkpoint; --stop-unscored-steps 0 trains on regardless"
        )
