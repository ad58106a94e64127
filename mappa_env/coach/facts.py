"""What an environment tells the coach about an action, typed.

An environment hands each :class:`~mappa_env.coach.base.CoachRequest` its facts: a
frozen dataclass of its own (so a misspelt fact is an error where it is made) that
follows :class:`CoachFacts`: the most the action may score, the sections an LLM coach's
prompt shows, and the plain-data form rule-based rubrics and records read
(``request.metadata``). This module names no environment: each brings its facts class.

A request built by hand from a plain mapping (``CoachRequest(metadata={...})``) holds
:class:`PlainFacts`; the LLM prompt reads such a mapping with the facts class that the
environment registered under the request's id names as its ``coach_facts_type``
(:func:`~mappa_env.coach.templates.request_facts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

#: The keys of the plain-data form whose values cap the action's score.
CAP_KEYS: tuple[str, ...] = ("outcome_cap", "skill_cap")


@dataclass(frozen=True)
class PromptSections:
    """An environment's own sections of the coach's user message, by where they go.

    Sections show what only that environment measures (checks of the files an agent
    made, a measured outcome and the score cap it sets); whatever agent code chose
    belongs inside :func:`~mappa_env.coach.templates.agent_text`.

    Attributes:
        facts: ``(title, body)`` pairs after the judged agent's role, before its input.
        evidence: ``(title, body)`` pairs after the tool result, the files and the
            reference answer, before the rubric.
    """

    facts: Sequence[tuple[str, str]] = ()
    evidence: Sequence[tuple[str, str]] = ()


@runtime_checkable
class CoachFacts(Protocol):
    """An environment's facts about one action, as every coach reads them.

    Implemented by a frozen dataclass per environment; an environment that also names
    it as its class's ``coach_facts_type`` gives it a ``from_dict(mapping)`` class
    method that reads :meth:`to_dict`'s form back (requests built by hand).
    """

    @property
    def score_cap(self) -> float | None:
        """The most the action may score (a rule the environment enforces), or ``None``."""
        ...

    def prompt_sections(self) -> PromptSections:
        """The sections an LLM coach's prompt shows, in order, by where they go."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The plain-data form: ``request.metadata``, what rubrics and records read."""
        ...


def cap_of(data: Mapping[str, Any]) -> float | None:
    """The lower of the caps a plain-data form holds (:data:`CAP_KEYS`), or ``None``.

    Args:
        data: A facts object's :meth:`~CoachFacts.to_dict` form.

    Returns:
        ``min`` of the caps that are set, as a float; ``None`` when none is.
    """
    given = [float(data[key]) for key in CAP_KEYS if data.get(key) is not None]
    return min(given) if given else None


@dataclass(frozen=True)
class PlainFacts:
    """Facts given as a plain mapping: shown in no prompt section.

    What a request built by hand from ``metadata`` holds, and what an environment
    that overrides only ``coach_metadata`` hands the coach.

    Attributes:
        data: The facts, read-only; ``"outcome_cap"`` and ``"skill_cap"``, when set,
            cap the action's score (:func:`cap_of`).
    """

    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.data, Mapping):
            raise TypeError(
                f"coach facts must be a mapping or a CoachFacts object, "
                f"got {type(self.data).__name__}"
            )

    @property
    def score_cap(self) -> float | None:
        """The lower of ``data["outcome_cap"]`` and ``data["skill_cap"]``, or ``None``."""
        return cap_of(self.data)

    def prompt_sections(self) -> PromptSections:
        """None: a plain mapping says nothing of how to show it."""
        return PromptSections()

    def to_dict(self) -> dict[str, Any]:
        """The mapping as given (a view of it when it is a dict)."""
        data = self.data
        return data if isinstance(data, dict) else dict(data)


#: The facts of a request that has none.
NO_FACTS = PlainFacts(MappingProxyType({}))
