"""What DSBench-v0 tells the coach about an action: :class:`DSBenchFacts`.

The environment makes them for each action it judges
(:meth:`~mappa_env.envs.dsbench.DSBenchEnv.coach_facts`); the rules coach reads their
plain-data form (``request.metadata``, :func:`~mappa_env.envs.dsbench.rubric.dsbench_rubric`),
an LLM coach their sections (:func:`~mappa_env.envs.dsbench.coach_prompts.prompt_sections`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mappa_env.coach.facts import PromptSections, cap_of
from mappa_env.envs.dsbench.coach_prompts import prompt_sections

#: Keys of the plain-data form left out when their value is ``None`` (set only for some actions).
_OPTIONAL = ("skill_cap", "skill_cap_reason", "outcome", "outcome_cap")


@dataclass(frozen=True)
class DSBenchFacts:
    """DSBench's facts about one action, in the order its plain-data form lists them.

    Attributes:
        task_type: ``"classification"`` or ``"regression"``.
        metric: The task's metric, e.g. ``"accuracy"``.
        artifacts: For each file the agent makes or needs, the environment's checks of
            it (``exists``, ``loads``, ``shape``, ``test_skill``, ...).
        missing_upstream: The files the agent needs that were not there when its slot
            began (their failures belong to earlier agents).
        earlier_codes: The code of the agent's earlier cells (a cell run again adds
            nothing).
        skill_cap: For the data engineer and the modeler, the cap the skill of their
            files' test predictions sets; ``None``: no cap.
        skill_cap_reason: Why ``skill_cap`` (may quote an error their files raised).
        earlier_turns: What the coach was told about each earlier code turn of the
            agent's slot (``action``, ``tool_result``, ``metadata``).
        outcome: For the analyst, the measured score of its submission
            (``Score.to_dict()``); ``None`` before one is scored.
        outcome_cap: The cap that outcome sets (only for a submission on disk).
    """

    task_type: str | None = None
    metric: str | None = None
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    missing_upstream: Sequence[str] = ()
    earlier_codes: Sequence[str] = ()
    skill_cap: float | None = None
    skill_cap_reason: str | None = None
    earlier_turns: Sequence[Mapping[str, Any]] = ()
    outcome: Mapping[str, Any] | None = None
    outcome_cap: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DSBenchFacts:
        """Facts read back from their plain-data form (a request built by hand).

        Args:
            data: A mapping with keys of :meth:`to_dict`; other keys are not facts of
                DSBench and are left out.

        Returns:
            The facts ``data`` holds; the others at their defaults.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: data[name] for name in names if name in data})

    @property
    def score_cap(self) -> float | None:
        """The lower of :attr:`outcome_cap` and :attr:`skill_cap`, or ``None``."""
        return cap_of(self.to_dict())

    def prompt_sections(self) -> PromptSections:
        """Task facts; checks of the files and the measured outcome, with their caps."""
        return prompt_sections(self.to_dict(), self.score_cap)

    def to_dict(self) -> dict[str, Any]:
        """The plain-data form: every fact by its name, the unset optional ones left out."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not (f.name in _OPTIONAL and getattr(self, f.name) is None)
        }
