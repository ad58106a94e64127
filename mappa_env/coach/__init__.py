"""Coaches: judges that score every action of every agent.

- :class:`Coach` is the protocol; :class:`CoachRequest` / :class:`CoachVerdict` its data.
- :class:`RulesCoach` is the offline default (deterministic rubrics with the ground truth).
- :class:`~mappa_env.coach.llm.LLMCoach` scores with any LLM through litellm (extra ``llm``).
- :func:`make_coach` builds one from a spec by name (:mod:`mappa_env.coach.registry`:
  :func:`register_coach` adds a name).
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
    VersionedRubric,
    cap_verdict,
)
from mappa_env.coach.cache import CachedVerdict, CoachCache, CoachCacheMiss
from mappa_env.coach.ledger import CoachLedger
from mappa_env.coach.parsing import parse_reply
from mappa_env.coach.registry import (
    coach_forms,
    coach_names,
    get_coach_factory,
    register_coach,
    unregister_coach,
)
from mappa_env.coach.rules import RulesCoach
from mappa_env.coach.specs import parse_model_spec, parse_spec_bool
from mappa_env.coach.templates import TEMPLATE_VERSION, CoachTemplates

if TYPE_CHECKING:
    from mappa_env.coach.llm import LLMCoach
    from mappa_env.coach.report import CoachReport, coach_report, records_from_actions


def make_coach(spec: Coach | str, **options: Any) -> Coach:
    """Build a coach from a spec string, or return a coach object unchanged.

    Sizing an LLM coach: its reply must fit the analysis and the score, so give it
    ``max_tokens`` of about 512 for a plain model and 2048 or more for a reasoning model
    (thinking tokens come out of the same budget; a reply cut by the budget is an
    invalid verdict saying ``cut at max_tokens``). ``timeout_s`` (alias ``timeout``)
    limits one call: allow ``max_tokens`` / the judge's tokens per second plus the
    time to first token, e.g. 512 tokens at 50 tokens/s -> about 10 s, so 30 s. A call
    that times out is retried ``max_retries`` times within ``deadline_s``, then the
    verdict is invalid (it is masked out of the rewards).

    Args:
        spec: A :class:`Coach`, ``"rules"``, ``"llm:<litellm model>"`` or the name of a
            coach added with :func:`~mappa_env.coach.registry.register_coach`; such as
            ``"llm:gemini/gemini-2.5-flash"`` (optionally with a query string, e.g.
            ``"llm:openai/judge?api_base=http://127.0.0.1:8000/v1&max_tokens=512&timeout=30"``;
            see :meth:`~mappa_env.coach.llm.LLMCoach.from_spec` for the options).
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
    found = get_coach_factory(spec)
    if found is None:
        forms = ", ".join(f"'{form}'" for form in coach_forms())
        raise ValueError(f"unknown coach {spec!r}: use {forms} or a Coach object")
    factory, takes_spec = found
    return factory(spec, **options) if takes_spec else factory(**options)


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
    "VersionedRubric",
    "cap_verdict",
    "coach_names",
    "coach_report",
    "make_coach",
    "parse_model_spec",
    "parse_reply",
    "parse_spec_bool",
    "records_from_actions",
    "register_coach",
    "unregister_coach",
]
