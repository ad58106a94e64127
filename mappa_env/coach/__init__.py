"""Coaches: judges that score every action of every agent.

- :class:`Coach` is the protocol; :class:`CoachRequest` / :class:`CoachVerdict` its data.
- :class:`RulesCoach` is the offline default (deterministic rubrics with the ground truth).
- :class:`~mappa_env.coach.llm.LLMCoach` scores with any LLM through litellm (extra ``llm``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

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
from mappa_env.coach.rules import RulesCoach
from mappa_env.coach.templates import TEMPLATE_VERSION, CoachTemplates

if TYPE_CHECKING:
    from mappa_env.coach.llm import LLMCoach
    from mappa_env.coach.report import CoachReport, coach_report, records_from_actions


def parse_spec_bool(raw: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` -> False (case insensitive).

    Raises:
        ValueError: For any other text.
    """
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def parse_model_spec(
    spec: str,
    *,
    prefix: str,
    options: Mapping[str, Callable[[str], Any]],
    aliases: Mapping[str, str] | None = None,
    what: str = "model",
) -> tuple[str, dict[str, Any]]:
    """Split ``"<prefix><model>[?key=value&...]"`` into the model and its typed options.

    The one reader of model specs with a query string: the LLM coach
    (``llm:<model>?...``) and API policies (``api:<model>?...``, in
    :func:`mappa_agents.models.load_policy`) both use it, so both read
    ``?api_base=http://127.0.0.1:8000/v1&timeout_s=30`` the same way.

    Args:
        spec: The spec; ``prefix`` is optional in it.
        prefix: The backend prefix, e.g. ``"llm:"`` or ``"api:"``.
        options: Known option -> converter from its text (``int``, ``float``,
            :func:`parse_spec_bool`, ...).
        aliases: Other names of options, e.g. ``{"timeout": "timeout_s"}``.
        what: What the spec describes, for error messages (``"coach"``, ``"API policy"``).

    Returns:
        ``(model, options)``, e.g. ``("openai/judge", {"api_base": "http://...", "max_tokens":
        512})`` for ``"llm:openai/judge?api_base=http://...&max_tokens=512"``.

    Raises:
        ValueError: On an empty model, a malformed query, an unknown option or a value
            its converter rejects.
    """
    body = spec.strip()
    if body.startswith(prefix):
        body = body[len(prefix) :]
    model, _, query = body.partition("?")
    if not model.strip():
        raise ValueError(f"{what} spec {spec!r} names no model: use '{prefix}<model>[?key=value]'")
    aliases = dict(aliases or {})
    parsed: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ValueError(f"cannot read the options of {what} spec {spec!r}: {exc}") from exc
    for key, raw in pairs:
        name = aliases.get(key, key)
        if name not in options:
            known = sorted({*options, *aliases})
            raise ValueError(f"unknown {what} option {key!r} in {spec!r}; known: {known}")
        try:
            parsed[name] = options[name](raw)
        except ValueError as exc:
            raise ValueError(f"{what} option {key}={raw!r} in {spec!r}: {exc}") from exc
    return model.strip(), parsed


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
        spec: A :class:`Coach`, ``"rules"``, or ``"llm:<litellm model>"`` such as
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
    "VersionedRubric",
    "cap_verdict",
    "coach_report",
    "make_coach",
    "parse_model_spec",
    "parse_reply",
    "parse_spec_bool",
    "records_from_actions",
]
