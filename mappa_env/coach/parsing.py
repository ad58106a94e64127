"""Reading a score out of a coach model's reply, strictly.

The rules, in order:

1. Reasoning is ignored: anything inside ``<think>...</think>`` (or before a stray
   ``</think>``) never counts, so a number the model weighed while thinking cannot
   become the score.
2. A JSON object with a ``score`` field is read first: the whole reply, a fenced
   ```` ```json ```` block, or a ``{...}`` object in the text (the last one that has
   ``score``), unless a ``PROCESS_SCORE`` key comes after it: the reply's last
   statement is its verdict.
3. Otherwise the **last** ``PROCESS_SCORE`` key is read. Markdown around it is
   tolerated (``**PROCESS_SCORE:** 7``, ``PROCESS_SCORE = 7/10``, ``PROCESS_SCORE: **7.5**``).
4. No other number is ever taken: a reply without a JSON score or the key is an error.
5. Scores outside ``[0, SCORE_MAX]``, NaN and infinities are errors. They are never clamped
   (95 does not become 10): the caller asks the model to correct its format once and
   otherwise marks the verdict invalid.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from mappa_env.coach.base import SCORE_MAX
from mappa_env.text import strip_think

#: The key the text reply format asks for.
SCORE_KEY = "PROCESS_SCORE"

# The key, allowing markdown emphasis/backticks around it and ":" or "=" after it.
_KEY = re.compile(r"PROCESS[_ ]SCORE", re.IGNORECASE)
_AFTER_KEY = re.compile(
    r"""[\s*_`"']*           # closing emphasis or quotes of the key
        [:=]                 # separator
        [\s*_`"'\[(]*        # emphasis, quotes or a bracket before the value
        (?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|nan|[-+]?inf(?:inity)?)
        (?:\s*/\s*(?P<denominator>\d+(?:\.\d*)?))?   # optional "/10"
    """,
    re.IGNORECASE | re.VERBOSE,
)
# "7-8" or "7 to 8" is a range, not a score: refuse rather than pick an end.
_RANGE_AFTER = re.compile(r"\s*(?:-|–|to)\s*\d", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(?P<body>.*?)```", re.DOTALL)
_OBJECT_START = re.compile(r"\{(?=\s*[\"}])")
_ANALYSIS_KEYS = ("analysis", "reasoning", "explanation", "rationale")


@dataclass(frozen=True)
class ParsedReply:
    """The outcome of parsing one reply.

    Attributes:
        score: The score on ``[0, SCORE_MAX]``, or ``None`` when the reply is unusable.
        analysis: The coach's reasoning (JSON ``analysis`` field, or the text before the
            final score key); the visible reply when nothing better is found.
        error: Why the reply is unusable; ``None`` when ``score`` is set.
        source: ``"json"`` or ``"key"`` for a usable reply, ``None`` otherwise.
    """

    score: float | None
    analysis: str
    error: str | None = None
    source: str | None = None

    @property
    def ok(self) -> bool:
        """True when the reply gave a usable score."""
        return self.error is None


def visible_text(reply: str) -> str:
    """The part of a reply that is an answer, not reasoning.

    Args:
        reply: Raw model output.

    Returns:
        The reply without ``<think>`` blocks (see :func:`mappa_env.text.strip_think`).
    """
    return strip_think(reply).strip()


def parse_reply(reply: str | None, *, score_max: float = SCORE_MAX) -> ParsedReply:
    """Parse a coach reply into a score and an analysis, or an error.

    Args:
        reply: The model's reply text (``None`` when the API returned no content).
        score_max: Largest allowed score.

    Returns:
        A :class:`ParsedReply`; ``error`` says what was wrong when no score is usable.
    """
    if reply is None or not reply.strip():
        return ParsedReply(None, "", error="empty reply")
    text = visible_text(reply)
    if not text:
        return ParsedReply(None, "", error="reply has reasoning only, no answer after it")

    found = find_json_verdict(text)
    key_matches = list(_KEY.finditer(text))
    # The verdict is the reply's last statement: a JSON object wins unless a score key
    # comes after it (JSON quoted inside the analysis must not override the final key).
    if found is not None and (not key_matches or found[1] >= key_matches[-1].start()):
        return _from_json(found[0], text, score_max)
    if not key_matches:
        return ParsedReply(
            None,
            text,
            error=f"no {SCORE_KEY} line and no JSON object with a 'score' field",
        )
    last = key_matches[-1]
    analysis = _strip_markdown_tail(text[: last.start()])
    match = _AFTER_KEY.match(text, last.end())
    if match is None:
        snippet = text[last.start() : last.end() + 30].strip()
        return ParsedReply(None, analysis, error=f"no number after the last key: {snippet!r}")
    if match.group("denominator") is None and _RANGE_AFTER.match(text, match.end()):
        snippet = text[last.start() : match.end() + 10].strip()
        return ParsedReply(None, analysis, error=f"a range, not a single score: {snippet!r}")
    value = _to_float(match.group("value"))
    denominator = match.group("denominator")
    if denominator is not None and float(denominator) != score_max:
        return ParsedReply(
            None,
            analysis,
            error=f"score given out of {denominator}, expected a score out of {score_max:g}",
        )
    return _checked(value, analysis, "key", score_max)


def find_json_verdict(text: str) -> tuple[dict[str, Any], int] | None:
    """Find the JSON object carrying a ``score`` field in a reply.

    The whole text is tried first; otherwise the object that ends last among fenced
    code blocks and ``{...}`` objects embedded in the text.

    Args:
        text: The visible reply.

    Returns:
        ``(object, end offset in text)``, or ``None`` when no JSON object with a
        ``score`` key is present.
    """
    whole = _loads_object(text.strip())
    if whole is not None and "score" in whole:
        return whole, len(text)
    best: tuple[dict[str, Any], int] | None = None
    for fence in _FENCE.finditer(text):
        payload = _loads_object(fence.group("body").strip())
        if payload is not None and "score" in payload:
            best = (payload, fence.end())
    decoder = json.JSONDecoder()
    # Only where an object can start ("{" then a key or "}"): a reply of many braces
    # would otherwise cost a failed decode per brace.
    for start in (m.start() for m in _OBJECT_START.finditer(text)):
        if best is not None and start < best[1]:
            continue
        try:
            payload, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):  # deeply nested replies
            continue
        if isinstance(payload, dict) and "score" in payload:
            best = (payload, end)
    return best


def _loads_object(candidate: str) -> dict[str, Any] | None:
    try:
        payload = json.loads(candidate)
    except (json.JSONDecodeError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


def _from_json(payload: dict[str, Any], text: str, score_max: float) -> ParsedReply:
    analysis = next(
        (str(payload[k]) for k in _ANALYSIS_KEYS if isinstance(payload.get(k), str)), text
    )
    raw = payload["score"]
    if isinstance(raw, bool) or raw is None:
        return ParsedReply(None, analysis, error=f"JSON 'score' is not a number: {raw!r}")
    if isinstance(raw, (int, float)):
        return _checked(float(raw), analysis, "json", score_max)
    if isinstance(raw, str):
        # Models sometimes quote the number ("7" or "7/10"); read it with the key's rules.
        match = _AFTER_KEY.match(":" + raw.strip())
        if match is not None and match.end() == len(raw.strip()) + 1:
            denominator = match.group("denominator")
            if denominator is None or float(denominator) == score_max:
                return _checked(_to_float(match.group("value")), analysis, "json", score_max)
    return ParsedReply(None, analysis, error=f"JSON 'score' is not a number: {raw!r}")


def _checked(value: float, analysis: str, source: str, score_max: float) -> ParsedReply:
    if not math.isfinite(value):
        return ParsedReply(None, analysis, error=f"score is not finite: {value}")
    if not 0.0 <= value <= score_max:
        return ParsedReply(
            None, analysis, error=f"score {value:g} is outside the range 0 to {score_max:g}"
        )
    return ParsedReply(value, analysis, error=None, source=source)


def _to_float(token: str) -> float:
    lowered = token.lower().lstrip("+")
    if lowered.startswith("-inf"):
        return -math.inf
    if lowered.startswith("inf"):
        return math.inf
    return float(lowered)  # also handles "nan"


def _strip_markdown_tail(text: str) -> str:
    # Drop emphasis/heading markers left dangling before the key ("**", "##").
    return text.rstrip().rstrip("*#_`>- \t\n").rstrip()
