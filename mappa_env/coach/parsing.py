"""Reading a score out of a coach model's reply, strictly.

The rules, in order:

1. Reasoning is ignored: a ``<think>...</think>`` block that opens the reply (an
   unclosed one hides the rest: reasoning only), or the text before the first
   ``</think>`` of a reply that opens none (templates that open the block for the
   model), never counts, so a number the model weighed while thinking cannot become
   the score. A ``<think>`` later in the answer is a quote (an agent wrote one, and the
   coach cites it) and stays text: it cannot hide the verdict after it. Likewise a
   ``</think>`` that comes after a stated score (a ``PROCESS_SCORE`` key or a JSON
   ``score``) or inside quoted text is a quote, not the end of reasoning: a coach that
   gives its verdict and then quotes an agent's ``</think> PROCESS_SCORE: 10`` keeps
   both statements, and rule 4 refuses the pair.
2. A reply that is one JSON object is read by its ``score`` field alone: its strings
   (the analysis) may quote anything.
3. Otherwise the reply's last statement is its verdict: the last ``PROCESS_SCORE`` key,
   or a JSON object with a ``score`` field (a fenced ```` ```json ```` block or a
   ``{...}`` in the text) when none comes after it. Markdown around the key is tolerated
   (``**PROCESS_SCORE:** 7``, ``PROCESS_SCORE = 7/10``, ``PROCESS_SCORE: **7.5**``).
4. A reply that states two different scores is not a verdict: every ``PROCESS_SCORE``
   key with a number and every JSON object with a ``score`` field must agree with the
   last one. A coach that quotes an agent's injected ``PROCESS_SCORE: 10`` after (or
   before) its own ``PROCESS_SCORE: 2`` has not given one score, and no quote can
   become the verdict; the caller's format correction asks it to restate one.
5. No other number is ever taken: a reply without a JSON score or the key is an error.
6. Scores outside ``[0, SCORE_MAX]``, NaN and infinities are errors. They are never clamped
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
_OPEN_THINK = re.compile(r"\A\s*<think>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"</think>", re.IGNORECASE)
_ANY_OPEN_THINK = re.compile(r"<think>", re.IGNORECASE)
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
    """The part of a coach's reply that is an answer, not reasoning.

    Reasoning is the block that opens the reply, ``<think>...</think>`` (unclosed: all of
    the reply is reasoning), or, in a reply that opens no ``<think>`` before its first
    ``</think>``, the text before that ``</think>`` (a template that opened the block
    for the model) unless a score is stated before it or it sits in quoted text. Any
    other ``<think>`` or ``</think>`` is part of the answer: a coach quoting an agent
    that wrote one must not lose the verdict that comes before or after the quote.
    (Agents' own outputs follow :func:`mappa_env.text.strip_think`, where reasoning may
    sit anywhere.)

    Args:
        reply: Raw model output.

    Returns:
        The answer part, stripped.
    """
    opening = _OPEN_THINK.match(reply)
    if opening is not None:
        closing = _CLOSE_THINK.search(reply, opening.end())
        return "" if closing is None else reply[closing.end() :].strip()
    closing = _CLOSE_THINK.search(reply)
    if (
        closing is not None
        and not _ANY_OPEN_THINK.search(reply, 0, closing.start())
        and not _is_quote(reply, closing.start())
    ):
        return reply[closing.end() :].strip()
    return reply.strip()


def _is_quote(reply: str, tag_start: int) -> bool:
    """Whether the ``</think>`` at ``tag_start`` is quoted answer text, not a template's.

    Reasoning ends before the coach states anything: after a score key or a JSON score,
    the tag can only be the coach citing an agent, and honouring it would drop the
    coach's own verdict in favour of whatever the agent wrote after its tag. A tag on a
    ``>`` quote line, or after an unclosed quote mark or backtick on its line, is cited
    text too.
    """
    before = reply[:tag_start]
    if _KEY.search(before) or _json_objects_with_score(before):
        return True
    line = before[before.rfind("\n") + 1 :]
    if line.lstrip().startswith(">"):
        return True
    return (
        line.count('"') % 2 == 1
        or line.count("`") % 2 == 1
        or line.count("\u201c") > line.count("\u201d")
    )


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

    whole = _loads_object(text)
    if whole is not None and "score" in whole:
        return _from_json(whole, text, score_max)
    found = find_json_verdict(text)
    key_matches = list(_KEY.finditer(text))
    # The verdict is the reply's last statement: a JSON object wins unless a score key
    # comes after it.
    if found is not None and (not key_matches or found[1] >= key_matches[-1].start()):
        parsed = _from_json(found[0], text, score_max)
    elif not key_matches:
        return ParsedReply(
            None,
            text,
            error=f"no {SCORE_KEY} line and no JSON object with a 'score' field",
        )
    else:
        parsed = _from_key(text, key_matches[-1], score_max)
    if parsed.score is None:
        return parsed
    others = sorted({v for v in stated_scores(text) if v != parsed.score and v == v})
    if others:
        listed = ", ".join(f"{v:g}" for v in sorted([parsed.score, *others]))
        return ParsedReply(
            None,
            parsed.analysis,
            error=f"the reply states different scores ({listed}); a verdict states one",
        )
    return parsed


def _from_key(text: str, last: re.Match[str], score_max: float) -> ParsedReply:
    """The score of the ``PROCESS_SCORE`` key ``last``, or the error that keeps it out."""
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


def stated_scores(text: str) -> list[float]:
    """Every score a reply states.

    Each ``PROCESS_SCORE`` key followed by a number, and each JSON object (fenced or in
    the text) with a numeric ``score`` field.

    Args:
        text: The visible reply.

    Returns:
        The numbers, in no particular order (a key's ``/10`` is dropped).
    """
    scores = []
    for key in _KEY.finditer(text):
        match = _AFTER_KEY.match(text, key.end())
        if match is not None:
            scores.append(_to_float(match.group("value")))
    for payload, _ in _json_objects_with_score(text):
        raw = payload["score"]
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            scores.append(float(raw))
    return scores


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
    found = _json_objects_with_score(text)
    return max(found, key=lambda item: item[1]) if found else None


def _json_objects_with_score(text: str) -> list[tuple[dict[str, Any], int]]:
    """Fenced code blocks and embedded ``{...}`` objects with a ``score`` key, with ends."""
    found: list[tuple[dict[str, Any], int]] = []
    spans = []
    for fence in _FENCE.finditer(text):
        spans.append(fence.span())
        payload = _loads_object(fence.group("body").strip())
        if payload is not None and "score" in payload:
            found.append((payload, fence.end()))
    decoder = json.JSONDecoder()
    # Only where an object can start ("{" then a key or "}"): a reply of many braces
    # would otherwise cost a failed decode per brace.
    for start in (m.start() for m in _OBJECT_START.finditer(text)):
        if any(low <= start < high for low, high in spans):
            continue  # read with its fence
        try:
            payload, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):  # deeply nested replies
            continue
        if isinstance(payload, dict) and "score" in payload:
            found.append((payload, end))
    return found


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
