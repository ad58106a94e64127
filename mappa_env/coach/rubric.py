"""Rules-coach rubrics as one scoring function per agent, with the score's named parts.

A rubric of the rules coach is a mapping ``{agent: function(request) -> RubricScore}``
(:class:`AgentRubric`): :class:`~mappa_env.coach.rules.RulesCoach` calls the function of
the request's agent and no other. A :class:`RubricScore` holds the score, its analysis
and its named parts: the row of the score table the action earned (``"base"``) and each
cap or adjustment applied after it (``"skill_cap"``, ``"rerun_cap"``, ...), as what it
added to the score (a cap that lowers 9 to 5 is ``-4``). The parts add up to the score
(up to float rounding: the score itself is exact, it is what the rubric computed); the
verdict carries them (:attr:`~mappa_env.coach.base.CoachVerdict.parts`) and the trainer
logs each part's mean per agent.

An :class:`AgentRubric` is also a plain rubric: called on a request it returns
``(score, analysis)``, so it can be wrapped in a
:class:`~mappa_env.coach.base.VersionedRubric` and called like any rubric function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from mappa_env.coach.base import CoachRequest, VersionedRubric

__all__ = ["AgentRubric", "AgentScorer", "RubricScore", "judge"]

#: The name of the part that holds the score table's row.
BASE = "base"


@dataclass(frozen=True)
class RubricScore:
    """A rubric's score of one action, its analysis and its named parts.

    Attributes:
        score: The score on ``[0, SCORE_MAX]``, exactly as the rubric computed it.
        analysis: Why, for the verdict.
        parts: The score's parts by name, in the order they applied: ``"base"``, the
            row of the table, then each adjustment as what it added (negative for a
            cap). They sum to ``score`` up to float rounding; empty for a rubric that
            names none.
    """

    score: float
    analysis: str
    parts: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def row(cls, score: float, analysis: str) -> RubricScore:
        """The score of a row of the table: its only part is ``"base"``."""
        return cls(score, analysis, {BASE: score})

    def adjusted(self, name: str, score: float, analysis: str) -> RubricScore:
        """This score changed to ``score`` by the adjustment ``name``.

        The part ``name`` records what the adjustment added (``score - self.score``,
        added to an earlier part of that name); an adjustment that leaves the score as
        it was adds no part.

        Args:
            name: The adjustment, e.g. ``"skill_cap"``.
            score: The score after it.
            analysis: The analysis after it.

        Returns:
            The adjusted score.
        """
        if score == self.score:
            return replace(self, analysis=analysis)
        parts = dict(self.parts)
        parts[name] = parts.get(name, 0.0) + (score - self.score)
        return RubricScore(score, analysis, parts)

    def as_tuple(self) -> tuple[float, str]:
        """``(score, analysis)``: what a plain rubric function returns."""
        return self.score, self.analysis


#: Scores one agent's action: ``request -> RubricScore``.
AgentScorer = Callable[[CoachRequest], RubricScore]


class AgentRubric(Mapping[str, AgentScorer]):
    """A rubric as ``{agent: scorer}``: each agent's actions are scored by its function.

    Args:
        scorers: The scoring function of each agent.
        fallback: Scores an action of an agent ``scorers`` lacks (e.g. to raise the
            environment's own error); ``None`` raises ``ValueError`` naming the agent.
    """

    def __init__(
        self, scorers: Mapping[str, AgentScorer], fallback: AgentScorer | None = None
    ) -> None:
        self._scorers = dict(scorers)
        self.fallback = fallback

    def __getitem__(self, agent: str) -> AgentScorer:
        return self._scorers[agent]

    def __iter__(self) -> Iterator[str]:
        return iter(self._scorers)

    def __len__(self) -> int:
        return len(self._scorers)

    def judge(self, request: CoachRequest) -> RubricScore:
        """Score ``request`` by its agent's function.

        Raises:
            ValueError: When the agent has no function and there is no fallback.
        """
        scorer = self._scorers.get(request.agent)
        if scorer is not None:
            return scorer(request)
        if self.fallback is not None:
            return self.fallback(request)
        raise ValueError(f"no rubric for agent {request.agent!r}")

    def __call__(self, request: CoachRequest) -> tuple[float, str]:
        """``(score, analysis)`` of :meth:`judge`: the plain rubric's signature."""
        return self.judge(request).as_tuple()

    def __repr__(self) -> str:
        return f"AgentRubric(agents={sorted(self._scorers)})"


def judge(rubric: object, request: CoachRequest) -> RubricScore:
    """Score ``request`` by a rubric of any shape the rules coach accepts.

    Args:
        rubric: An :class:`AgentRubric`, a plain mapping ``{agent: scorer}``, a rubric
            function ``request -> (score, analysis)`` (or ``-> RubricScore``), or a
            :class:`~mappa_env.coach.base.VersionedRubric` wrapping any of them.
        request: The action to score.

    Returns:
        The score with its parts (none for a plain function's tuple).

    Raises:
        ValueError: When a mapping has no function for the request's agent.
    """
    fn = rubric.fn if isinstance(rubric, VersionedRubric) else rubric
    if isinstance(fn, AgentRubric):
        return fn.judge(request)
    if isinstance(fn, Mapping):
        return AgentRubric(fn).judge(request)
    if not callable(fn):
        raise TypeError(f"a rubric is a function or a mapping of agents, not {fn!r}")
    result = fn(request)
    if isinstance(result, RubricScore):
        return result
    score, analysis = result
    return RubricScore(score, analysis)
