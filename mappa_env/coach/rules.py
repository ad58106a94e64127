"""The rules coach: deterministic, offline per-role rubrics that use the ground truth.

It is the offline default coach and the reference for tests. Each environment has a
rubric: a mapping ``{agent: function(request) -> RubricScore}``
(:class:`~mappa_env.coach.rubric.AgentRubric`), whose scores name their parts (the
table's row, each cap), or a plain function ``CoachRequest -> (score, analysis)``.
:class:`RulesCoach` picks the rubric by ``request.env_id`` and, for a mapping, the
function by ``request.agent``; the verdict carries the parts
(:attr:`~mappa_env.coach.base.CoachVerdict.parts`). Users add rubrics for their own environments by
passing ``rubrics={"MyEnv-v0": my_rubric}``. A rubric wrapped in
:class:`~mappa_env.coach.base.VersionedRubric` names the version of its score table,
and every verdict it scores carries that version.

The coach names no environment: an environment class supplies its rubric as its
``rules_rubric`` attribute (:class:`~mappa_env.envs.pipeline.PipelineEnv` puts it on
every request it builds, and a request built by hand finds it through the registry by
its ``env_id``). Each environment's package holds its rubric and score table (MathChat-v0's
in :mod:`mappa_env.envs.mathchat.rubric`). The MathChat names this module used to hold
(``mathchat_rubric``, ``MATHCHAT_RUBRIC_VERSION``, ...) still import from here for one
release.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from typing import Any

from mappa_env.coach.base import CoachRequest, CoachVerdict, RevealPolicy, Rubric
from mappa_env.coach.reruns import repeats_code
from mappa_env.coach.rubric import judge
from mappa_env.registry import registered_env_attribute

__all__ = ["RulesCoach", "repeats_code", "rubric_version"]

# Names that moved to an environment's own package, and where they live now: importing
# them from here keeps working for one release (a module attribute looked up on use, so
# this module imports no environment).
MOVED_NAMES: Mapping[str, str] = {
    name: "mappa_env.envs.mathchat.rubric"
    for name in (
        "MATHCHAT_BLIND_RUBRIC_VERSION",
        "MATHCHAT_RUBRIC_VERSION",
        "earlier_runs",
        "mathchat_blind_rubric",
        "mathchat_rubric",
        "shows_working",
    )
}


def __getattr__(name: str) -> Any:
    home = MOVED_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def rubric_version(rubric: Rubric | None) -> str | None:
    """The version a rubric names (its ``version`` attribute, a string), else None."""
    version = getattr(rubric, "version", None)
    return version if isinstance(version, str) else None


class RulesCoach:
    """Deterministic coach: each environment brings its own rubric.

    An environment's rubric arrives with every request (``request.rules_rubric``, from
    the environment class's ``rules_rubric``; for a request without one, the rubric of
    the environment registered under ``request.env_id``), so a new environment needs no
    change here. An action of an agent other than the last that arrives without the
    ground truth (``reveal="last_agent"`` or ``"never"``) is judged by the rubric's
    answer-blind companion (:attr:`~mappa_env.coach.base.VersionedRubric.blind`) when it
    has one. Every verdict carries the version of the rubric that scored it
    (:attr:`~mappa_env.coach.base.CoachVerdict.rubric_version`; ``None`` for a plain
    rubric function).

    Args:
        rubrics: Rubrics keyed by environment id that replace the environment's own
            (or give one to an environment that has none).

    Attributes:
        default_reveal: ``"always"``: rubrics judge correctness, so they need the truth
            (opt in to the paper's ``"last_agent"`` for an environment whose rubric has
            an answer-blind companion, as MathChat's has).
    """

    default_reveal: RevealPolicy = "always"

    def __init__(self, rubrics: Mapping[str, Rubric] | None = None) -> None:
        self.rubrics: dict[str, Rubric] = dict(rubrics or {})

    @property
    def name(self) -> str:
        """``"rules"``."""
        return "rules"

    def _rubric(self, env_id: str, carried: Rubric | None = None) -> Rubric | None:
        return (
            self.rubrics.get(env_id)
            or carried
            # A request built by hand carries none: the registered environment's.
            or registered_env_attribute(env_id, "rules_rubric")
        )

    def rubric_versions(self, env_id: str) -> dict[str, str | None]:
        """The versions of the rubrics this coach would score ``env_id`` by.

        For a results file to record before any verdict exists.

        Args:
            env_id: An environment id, e.g. ``"MathChat-v0"``.

        Returns:
            ``{"truth_aware": ..., "answer_blind": ...}``: the version of the rubric
            that judges actions with the ground truth in view, and of the one that
            judges the other agents' actions without it (the same rubric when it has
            no answer-blind companion); ``None`` for a rubric that names no version.

        Raises:
            ValueError: When ``env_id`` has no rules rubric.
        """
        rubric = self._rubric(env_id)
        if rubric is None:
            raise ValueError(_no_rubric_message(env_id))
        blind = getattr(rubric, "blind", None) or rubric
        return {"truth_aware": rubric_version(rubric), "answer_blind": rubric_version(blind)}

    def score(self, request: CoachRequest) -> CoachVerdict:
        """Score ``request`` by its environment's rubric.

        A rubric that maps agents to functions (:class:`~mappa_env.coach.rubric.AgentRubric`
        or a plain mapping) scores the action by its agent's function only, and the
        verdict carries the score's named parts.

        Returns an invalid verdict (never a made-up score) when no rubric applies or the
        rubric cannot judge the request.
        """
        rubric = self._rubric(request.env_id, request.rules_rubric)
        if rubric is None:
            return CoachVerdict.invalid(_no_rubric_message(request.env_id), coach=self.name)
        if request.ground_truth is None and not request.is_last_agent:
            rubric = getattr(rubric, "blind", None) or rubric
        version = rubric_version(rubric)
        try:
            scored = judge(rubric, request)
        except (ValueError, KeyError, TypeError) as exc:
            return CoachVerdict.invalid(
                f"rubric failed: {exc}", coach=self.name, rubric_version=version
            )
        return CoachVerdict(
            score=float(scored.score),
            valid=True,
            analysis=scored.analysis,
            coach=self.name,
            rubric_version=version,
            parts={name: float(value) for name, value in scored.parts.items()},
        )

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        """:meth:`score` in a worker thread: a symbolic answer check can take seconds."""
        return await asyncio.to_thread(self.score, request)

    def __repr__(self) -> str:
        return f"RulesCoach(overrides={sorted(self.rubrics)})"


def _no_rubric_message(env_id: str) -> str:
    return (
        f"{env_id!r} has no rules rubric: give its environment class a rules_rubric, "
        "pass RulesCoach(rubrics={env_id: fn}), or use an LLM coach"
    )
