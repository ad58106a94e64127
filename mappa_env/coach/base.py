"""The coach protocol: a judge that scores one action of one agent."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol, runtime_checkable

from mappa_env.coach.facts import NO_FACTS, CoachFacts, PlainFacts

#: Highest coach score. Scores live on [0, SCORE_MAX]; rewards are score / SCORE_MAX.
SCORE_MAX = 10.0

RevealPolicy = Literal["never", "last_agent", "always"]
"""Who gets the ground truth shown to the coach:

- ``"never"``: no action is judged with the answer in view.
- ``"last_agent"``: only the final agent (verifier / analyst), as in the paper's code.
- ``"always"``: every action.
"""


class CoachStop(Exception):
    """Raised by a coach to stop the run rather than return an invalid verdict.

    Environments turn any other exception from a coach into an invalid verdict (a
    coach bug must not lose the episode), but re-raise these: e.g. a replaying coach
    meeting an uncached action, where going on would silently change an experiment.
    """


@dataclass(frozen=True)
class FileInfo:
    """A file in an episode's workspace, as shown to agents and coaches.

    Attributes:
        name: Path relative to the workspace.
        size: Size in bytes.
    """

    name: str
    size: int


@dataclass(frozen=True)
class CoachRequest:
    """Everything the coach sees to score one action.

    Attributes:
        env_id: Environment id, as registered; selects rubrics/templates.
        task_id: Identifier of the task.
        task: The task statement as given to the system.
        agent: Agent id, e.g. ``"code_executor"``.
        system_description: What the multiagent system is and how agents hand over work.
        role_description: This agent's job.
        agent_input: The exact chat messages the agent was prompted with.
        action: The agent's output, exactly as produced.
        turn: 0-based turn index of this agent within the episode.
        is_last_agent: True for the final agent of the pipeline.
        tool_result: Result of running the action's code (``ExecResult.to_dict()``),
            or ``None`` when the action ran nothing.
        tool_output: The tool result rendered as the agent saw it.
        files: Files present in the workspace after the action (environments
            that keep one).
        upstream_files: Files that earlier agents saved (environments that keep a
            workspace).
        ground_truth: The reference answer, present only when the reveal policy allows.
        facts: The environment's facts about the action (task type, metric, outcome
            so far, ...): its :class:`~mappa_env.coach.facts.CoachFacts`, which say the
            most the action may score (:attr:`score_cap`) and what an LLM coach's
            prompt shows of them. A plain mapping is taken as
            :class:`~mappa_env.coach.facts.PlainFacts`; so is ``metadata=``, the
            keyword requests were built with before facts were typed, which replaces
            ``facts`` when given (``dataclasses.replace(request, metadata={})`` too).
        rubric: The environment's rubric text for this role (LLM coaches); ``None``
            leaves the coach's general rubric.
        shows_workspace: The environment keeps a workspace whose file list the coach
            should see, even when it is empty.
        rules_rubric: The environment's rule-based scorer (the ``"rules"`` coach);
            not part of the request's value (equality, repr).
    """

    env_id: str
    task_id: str
    task: str
    agent: str
    system_description: str
    role_description: str
    agent_input: Sequence[Mapping[str, str]]
    action: str
    turn: int = 0
    is_last_agent: bool = False
    tool_result: Mapping[str, Any] | None = None
    tool_output: str | None = None
    files: Sequence[FileInfo] = ()
    upstream_files: Sequence[FileInfo] = ()
    ground_truth: str | None = None
    facts: CoachFacts = NO_FACTS
    rubric: str | None = None
    shows_workspace: bool = False
    rules_rubric: Rubric | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.facts, Mapping):
            object.__setattr__(self, "facts", PlainFacts(self.facts))
        elif not isinstance(self.facts, CoachFacts):
            raise TypeError(
                "CoachRequest.facts must be a CoachFacts object (score_cap, "
                f"prompt_sections(), to_dict()) or a mapping, got {type(self.facts).__name__}"
            )

    @functools.cached_property
    def metadata(self) -> Mapping[str, Any]:
        """The facts' plain-data form (:meth:`~mappa_env.coach.facts.CoachFacts.to_dict`).

        What rule-based rubrics read; the same keys and values environments gave as
        ``metadata`` before their facts were typed. Made once per request.
        """
        return self.facts.to_dict()

    @property
    def score_cap(self) -> float | None:
        """The most this action may score, set by the environment from a measured outcome.

        The facts' :attr:`~mappa_env.coach.facts.CoachFacts.score_cap`: for plain
        facts the lower of ``metadata["outcome_cap"]`` and ``metadata["skill_cap"]``
        (e.g. caps on an agent for its submission's metric or for the skill of its
        files' test predictions), or ``None``. The coach is told it, and the
        environment lowers any verdict above it (:func:`cap_verdict`): a cap is a rule,
        not advice.
        """
        return self.facts.score_cap


def _taking_metadata(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` that also takes ``metadata=``: plain facts, which replace ``facts``.

    Not a field: ``dataclasses.replace`` passes ``facts`` on, and passes ``metadata``
    only where its caller gives it, so ``replace(request, metadata={})`` clears the
    facts as it did when ``metadata`` was the field.
    """

    @functools.wraps(init)
    def __init__(
        self: CoachRequest, *args: Any, metadata: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if metadata is not None:
            kwargs["facts"] = PlainFacts(metadata)
        init(self, *args, **kwargs)

    return __init__


CoachRequest.__init__ = _taking_metadata(CoachRequest.__init__)  # type: ignore[method-assign]


#: A rule-based scorer: ``request -> (score on [0, SCORE_MAX], analysis)``.
Rubric = Callable[[CoachRequest], tuple[float, str]]


@dataclass(frozen=True)
class VersionedRubric:
    """A rule-based rubric that names the version of its score table.

    Verdicts it scores carry ``version`` (:attr:`CoachVerdict.rubric_version`), so
    results scored by different tables are never mixed unknowingly. A plain function
    is a rubric too; its verdicts carry no version. Call it like the function it wraps.

    Attributes:
        fn: The scorer, ``request -> (score, analysis)``.
        version: Names the score table, e.g. ``"<env>-rules-v5"``; change it
            whenever any score changes.
        blind: The rubric for actions judged without the ground truth (the
            request's ``ground_truth`` is ``None``) by agents other than the last:
            with ``reveal="last_agent"`` (the paper's setting) or ``"never"``.
            ``None``: this rubric judges those too.
    """

    fn: Rubric
    version: str
    blind: Rubric | None = None

    def __call__(self, request: CoachRequest) -> tuple[float, str]:
        """Score ``request`` with :attr:`fn`."""
        return self.fn(request)


@dataclass(frozen=True)
class CoachVerdict:
    """The coach's judgement of one action.

    A verdict with ``valid=False`` carries no score: callers must not turn it into
    a reward (it is flagged in ``infos`` and masked out of training losses).

    Attributes:
        score: Score on ``[0, SCORE_MAX]``, or ``None`` when invalid.
        valid: True when ``score`` is a usable judgement.
        analysis: The coach's reasoning (or the reason the verdict is invalid).
        coach: Name of the coach, e.g. ``"rules"`` or ``"llm:gemini/gemini-2.5-flash"``.
        latency_s: Wall-clock seconds spent producing the verdict.
        cost_usd: Money spent on it, when known.
        prompt_tokens: Tokens sent to an LLM coach.
        completion_tokens: Tokens the LLM coach generated.
        attempts: Calls made (retries and format corrections included).
        cached: True when the verdict came from a cache.
        error: What went wrong when invalid.
        rubric_version: The version of what judged the action: a
            :class:`VersionedRubric` of the rules coach, or an LLM coach's template
            version with a digest of its rubric for the agent
            (:meth:`~mappa_env.coach.templates.CoachTemplates.rubric_version`); ``None``
            when the judge names none (a plain rubric function).
        capped_from: The coach's own score when the environment lowered it to the
            action's cap (:func:`cap_verdict`); ``None`` when no cap applied.
        failure: Why an invalid verdict has no score, by cause: ``"timeout"``,
            ``"connection"`` (no server answered), ``"http_<status>"`` (e.g.
            ``"http_429"``, ``"http_500"``), ``"format"`` (replies without a usable
            score), ``"api_error"`` (another API error); ``None`` when valid or unknown.
        parts: The score's named parts, from a rules-coach rubric that names them
            (:class:`~mappa_env.coach.rubric.RubricScore`): ``{"base": 9.0,
            "skill_cap": -4.0}``, summing to the rubric's score; empty otherwise.
    """

    score: float | None
    valid: bool
    analysis: str = ""
    coach: str = ""
    latency_s: float = 0.0
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 1
    cached: bool = False
    error: str | None = None
    rubric_version: str | None = None
    capped_from: float | None = None
    failure: str | None = None

    def __post_init__(self) -> None:
        if self.valid:
            if self.score is None or not math.isfinite(self.score):
                raise ValueError("a valid verdict needs a finite score")
            if not 0.0 <= self.score <= SCORE_MAX:
                raise ValueError(f"score {self.score} is outside [0, {SCORE_MAX}]")
        elif self.score is not None:
            raise ValueError("an invalid verdict must not carry a score")

    @property
    def reward(self) -> float | None:
        """The score scaled to ``[0, 1]``, or ``None`` for an invalid verdict."""
        return None if self.score is None else self.score / SCORE_MAX

    @classmethod
    def invalid(cls, error: str, **fields: Any) -> CoachVerdict:
        """An invalid verdict recording ``error``."""
        fields.setdefault("analysis", error)
        return cls(score=None, valid=False, error=error, **fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form for ``infos`` (adds ``reward``)."""
        # Every field but ``parts`` is a number, a string, a bool or None: a shallow copy
        # is a deep one there, without ``asdict``'s deep copy of each value (two verdict
        # dicts per action); ``parts`` is copied, so the dict never aliases the verdict's.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["parts"] = dict(self.parts)
        data["reward"] = self.reward
        return data

    # Last, so that positional construction keeps its order; a dict, so out of the hash.
    parts: Mapping[str, float] = field(default_factory=dict, hash=False)


def cap_verdict(verdict: CoachVerdict, cap: float | None) -> CoachVerdict:
    """``verdict`` with its score lowered to ``cap`` when it is above it.

    The rule for every environment that caps an action (:attr:`CoachRequest.score_cap`):
    a coach that scores above the cap (an LLM that ignores the prompt's cap, or obeys a
    "cap lifted" an agent wrote) is held to it. The coach's own score is kept in
    :attr:`CoachVerdict.capped_from` and the analysis says so. An invalid verdict, a
    score within the cap and ``cap=None`` leave the verdict as it is.

    Args:
        verdict: The coach's verdict.
        cap: The most the action may score, or ``None``.

    Returns:
        The verdict the environment pays.
    """
    if cap is None or not verdict.valid or verdict.score is None or verdict.score <= cap:
        return verdict
    note = f"[the environment capped the score {verdict.score:g} at {cap:g} for this outcome]"
    # Named parts (a rubric's) keep adding up to the score: the cap is one more.
    parts = (
        {**verdict.parts, "environment_cap": float(cap) - verdict.score} if verdict.parts else {}
    )
    return replace(
        verdict,
        score=float(cap),
        capped_from=verdict.score,
        analysis=f"{verdict.analysis}\n{note}" if verdict.analysis else note,
        parts=parts,
    )


@runtime_checkable
class Coach(Protocol):
    """Scores actions. Implementations must be safe to call from many episodes at once."""

    @property
    def name(self) -> str:
        """Short identifier recorded in every verdict."""
        ...

    def score(self, request: CoachRequest) -> CoachVerdict:
        """Judge one action, blocking until the verdict is ready."""
        ...

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        """Judge one action without blocking the event loop."""
        ...


def pay_what_it_adds(
    score: float, analysis: str, earlier_scores: Sequence[float], over: str
) -> tuple[float, str]:
    """A later turn's pay: what it adds over the best earlier turn of its slot.

    ``paid = max(score - max(earlier_scores, 0), 0)``. Summed over a slot, turns pay no
    more than its best turn alone would: a rerun or padding earns 0, splitting the work
    never out-earns doing it and handing over, a turn that fixes an error earns the
    difference.

    Args:
        score: The turn's score judged as a first turn.
        analysis: That score's analysis.
        earlier_scores: The slot's earlier turns, each judged as a first turn.
        over: What the earlier turns were, for the analysis, with ``{best}`` where the
            best earlier score goes (e.g. ``"its earlier cells (the best scored {best})"``).

    Returns:
        ``(score, analysis)`` unchanged where the turn earns its full score, else the
        paid score and an analysis that says so.
    """
    best = max([0.0, *earlier_scores])
    paid = max(score - best, 0.0)
    if paid >= score:
        return score, analysis
    earlier = over.format(best=f"{best:g}")
    return paid, f"{analysis} A later turn: paid what it adds over {earlier}, {paid:g}."
