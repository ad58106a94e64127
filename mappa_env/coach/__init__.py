"""Coaches: judges that score every action of every agent.

- :class:`Coach` is the protocol; :class:`CoachRequest` / :class:`CoachVerdict` its data.
- :class:`RulesCoach` is the offline default (deterministic rubrics with the ground truth).
- :class:`~mappa_env.coach.llm.LLMCoach` scores with any LLM through litellm (extra ``llm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mappa_env.coach.base import (
    SCORE_MAX,
    Coach,
    CoachRequest,
    CoachStop,
    CoachVerdict,
    FileInfo,
    RevealPolicy,
)
from mappa_env.coach.cache import CachedVerdict, CoachCache, CoachCacheMiss
from mappa_env.coach.ledger import CoachLedger
from mappa_env.coach.parsing import parse_reply
from mappa_env.coach.rules import RulesCoach
from mappa_env.coach.templates import TEMPLATE_VERSION, CoachTemplates

if TYPE_CHECKING:
    from mappa_env.coach.llm import LLMCoach
    from mappa_env.coach.report import CoachReport, coach_report, records_from_actions


def make_coach(spec: Coach | str, **options: Any) -> Coach:
    """Build a coach from a spec string, or return a coach object unchanged.

    Args:
        spec: A :class:`Coach`, ``"rules"``, or ``"llm:<litellm model>"`` such as
            ``"llm:gemini/gemini-2.5-flash"`` (optionally with a query string, e.g.
            ``"llm:openai/judge?api_base=http://127.0.0.1:8000/v1"``).
        **options: Keyword arguments for the coach's constructor.

    Returns:
        A coach.

    Raises:
        ValueError: For an unknown spec.
        MissingExtraError: When ``llm:`` is used without the ``llm`` extra installed.
    """
    if not isinstance(spec, str):
        if not isinstance(spec, Coach):
            raise TypeError(
                f"coach must be a Coach (with name, score, ascore) or a spec string, "
                f"got {type(spec).__name__}"
            )
        return spec
    if spec == "rules":
        return RulesCoach(**options)
    if spec.startswith("llm:"):
        from mappa_env.coach.llm import LLMCoach

        return LLMCoach.from_spec(spec, **options)
    raise ValueError(f"unknown coach {spec!r}: use 'rules', 'llm:<model>' or a Coach object")


def __getattr__(name: str) -> Any:
    # LLMCoach uses the optional `llm` extra and the report imports scikit-learn:
    # import them only when asked for.
    if name == "LLMCoach":
        from mappa_env.coach.llm import LLMCoach

        return LLMCoach
    if name in ("coach_report", "CoachReport", "records_from_actions"):
        from mappa_env.coach import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCORE_MAX",
    "TEMPLATE_VERSION",
    "CachedVerdict",
    "Coach",
    "CoachCache",
    "CoachCacheMiss",
    "CoachLedger",
    "CoachReport",
    "CoachRequest",
    "CoachStop",
    "CoachTemplates",
    "CoachVerdict",
    "FileInfo",
    "LLMCoach",
    "RevealPolicy",
    "RulesCoach",
    "coach_report",
    "make_coach",
    "parse_reply",
    "records_from_actions",
]
