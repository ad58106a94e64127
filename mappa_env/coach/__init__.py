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
    CoachVerdict,
    FileInfo,
    RevealPolicy,
)
from mappa_env.coach.rules import RulesCoach

if TYPE_CHECKING:
    from mappa_env.coach.llm import LLMCoach


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
    # LLMCoach lives behind the optional `llm` extra: import it only when asked for.
    if name == "LLMCoach":
        from mappa_env.coach.llm import LLMCoach

        return LLMCoach
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCORE_MAX",
    "Coach",
    "CoachRequest",
    "CoachVerdict",
    "FileInfo",
    "LLMCoach",
    "RevealPolicy",
    "RulesCoach",
    "make_coach",
]
