"""Rule-based grading of math answers: find the final answer, decide if it equals the truth.

Two public steps:

* :func:`extract_boxed` pulls the final answer out of a model's output (one answer:
  a reply that boxes several different answers gives none; :func:`boxed_answers` lists
  them).
* :func:`answers_match` decides whether a predicted answer equals the ground truth.

``answers_match`` first tries a fast path (normalised strings and exact rational
numbers, microseconds) and only falls back to a symbolic check with math-verify
(sympy underneath) when the fast path cannot decide. math-verify bounds its own time
with ``signal.alarm``, which only works on the main thread; the environments grade
from worker threads and asyncio loops. So the symbolic check runs with math-verify's
timeouts disabled inside a small pool of persistent worker processes
(:class:`SymbolicChecker`). The caller waits at most ``timeout_s`` for an answer; a
worker that overruns is killed (a runaway sympy computation cannot be interrupted
from another thread, but a process can always be killed) and a fresh one is started
in its place. Workers also run under an address-space limit, so an expression such
as ``10^{10^{10}}`` fails with ``MemoryError`` inside the worker instead of eating
the machine's memory. The workers live in :mod:`mappa_env.envs.mathchat.symbolic`; this
module owns answer extraction, normalisation and the comparison API.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from math import gcd

from mappa_env.envs.mathchat.symbolic import SymbolicChecker, default_checker
from mappa_env.text import strip_think

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1_000
"""Answers longer than this (after box extraction) are compared as strings only."""

MAX_NUMBER_DIGITS = 400
"""Numbers with more digits than this are not parsed on the fast path."""

MAX_NESTING = 40
"""Answers nested deeper than this (braces, brackets, parentheses) skip the symbolic check."""

MAX_POWERS = 30
"""Answers with more ``^`` than this skip the symbolic check (power towers explode sympy)."""

# --------------------------------------------------------------------------------------
# Answer extraction
# --------------------------------------------------------------------------------------

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# Escaped characters (``\{``, ``\}``, ``\\``) and bare braces: the only tokens the
# brace matcher needs to look at.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
# ``\boxed 5``: the next token, up to a space, a dollar sign or the next box command (an
# argument that runs into another box wraps it, and is skipped: so every character is
# read for one box at most, where "\boxed\boxed..." read the rest of the text per box).
_UNBRACED_ARGUMENT = re.compile(r"\s*((?:(?!\\(?:boxed|fbox)(?![A-Za-z]))[^\s$])+)")
_FINAL_ANSWER = re.compile(r"final\s+answer\s*(?:is\b|:|=)\s*:?(?P<value>[^\n]*)", re.IGNORECASE)
# A line, not a run of lines: the prefix and the gaps before the colon never cross a line
# end (``\s`` there let every line start rescan all blank lines after it: 32,768 newlines
# took 4.5 s), and spaces around the emphasis belong to one repetition only, so the
# engine's retries stay linear. After the colon the value may start on the next line.
_INLINE_SPACE = r"[^\S\n]"
_ANSWER_LINE = re.compile(
    rf"^(?:{_INLINE_SPACE}|[*_#>-])*answer{_INLINE_SPACE}*(?:[*_]+{_INLINE_SPACE}*)?[:：]"
    r"\s*(?P<value>[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
_ANSWER_IS = re.compile(r"\banswer\s+is\s*:?(?P<value>[^\n]*)", re.IGNORECASE)
_LEADING_MATH = re.compile(
    r"^(?:\$\$(?P<a>.+?)\$\$|\$(?P<b>.+?)\$|\\\((?P<c>.+?)\\\)|\\\[(?P<d>.+?)\\\])", re.DOTALL
)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# What prompts show where the answer goes (``\boxed{NUMBER}``, ``\boxed{answer}``,
# ``\boxed{...}``) and the usual variants: a box holding one states no answer.
_PLACEHOLDER = re.compile(
    r"^(?:(?:the|your|final|a|an)[\s_]+)*(?:answer|number|value|result|solution)s?"
    r"(?:[\s_]+here)?$|^(?:\.{2,}|…|\\[lc]?dots|\?+|_+)$",
    re.IGNORECASE,
)


def _match_braces(text: str) -> dict[int, int]:
    """Map the index of every balanced ``{`` to the index of its ``}`` in one pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKEN.finditer(text):
        char = token.group()
        if char == "{":
            stack.append(token.start())
        elif char == "}" and stack:
            pairs[stack.pop()] = token.start()
    return pairs


def _box_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed``/``\\fbox`` in ``text``, in order of their start."""
    commands = list(_BOX_COMMAND.finditer(text))
    if not commands:
        return []
    pairs = _match_braces(text)
    contents = []
    for command in commands:
        position = command.end()
        while position < len(text) and text[position].isspace():
            position += 1
        if position < len(text) and text[position] == "{":
            close = pairs.get(position)
            if close is None:  # unbalanced: the box never closes, so it holds no answer
                continue
            contents.append(text[position + 1 : close].strip())
        else:
            argument = _UNBRACED_ARGUMENT.match(text, command.end())
            if argument and _BOX_COMMAND.match(text, argument.end()):
                continue  # it runs into another box: it wraps that box, holds no answer
            if argument:
                contents.append(argument.group(1).rstrip(".,;}").strip())
    return contents


def _is_placeholder(content: str) -> bool:
    """Whether a box's content is a template's placeholder, not an answer."""
    if len(content) > 64:
        return False
    bare = _unwrap_text_commands(content).strip().strip("<>[](){}*$ ").strip()
    return _PLACEHOLDER.match(bare) is not None


def _answer_key(answer: str) -> object:
    """What two boxes must share to hold the same answer, decided on the fast path.

    The normalised text (see :func:`answers_match`), or the exact value of a written
    number, so ``6534``, ``6,534``, ``6534.0`` and ``x = 6534`` share a key, as do
    ``\\frac{1}{2}`` and ``0.5``. Forms only the symbolic check could equate
    (``\\sqrt{8}`` and ``2\\sqrt{2}``) get different keys: extraction stays fast.
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return answer
    try:
        normalized = _normalize(answer)
        number = _parse_number(normalized)
    except (ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
        logger.debug("normalising a boxed answer failed: %s", exc)
        return answer
    return normalized if number is None else number.value


def boxed_answers(text: str) -> list[str]:
    """The different answers boxed in ``text``, each once, in order of first appearance.

    Reasoning inside ``<think>...</think>`` is ignored. Empty boxes, boxes that only
    wrap other boxes and boxes holding a template's placeholder (``\\boxed{NUMBER}``,
    ``\\boxed{answer}``, ``\\boxed{...}``) hold no answer and are skipped. Boxes whose
    answers are equal on the fast path of :func:`answers_match` (the same normalised
    text or the same written number: ``\\boxed{6534}`` and ``\\boxed{6,534}``) hold one
    answer; its text is that of its last box.

    Args:
        text: A model's output.

    Returns:
        The boxed answers; empty for non-string input or text without one.
    """
    if not isinstance(text, str) or not text:
        return []
    return _different(_answer_boxes(strip_think(text)))


def _answer_boxes(visible: str) -> list[str]:
    """Contents of the boxes of ``visible`` that hold an answer, in order."""
    return [
        content
        for content in _box_contents(visible)
        # A box around other boxes is judged by the inner ones, which start later.
        if content and not _BOX_COMMAND.search(content) and not _is_placeholder(content)
    ]


def _different(contents: list[str]) -> list[str]:
    """``contents`` with equal answers merged (see :func:`boxed_answers`)."""
    if len(set(contents)) <= 1:  # the common case: no normalising needed
        return contents[-1:]
    answers: dict[object, str] = {}
    for content in contents:
        answers[_answer_key(content)] = content
    return list(answers.values())


def _clean_fallback(raw: str) -> str | None:
    """Turn the text after an "answer is" phrase into the answer itself."""
    value = raw.strip().strip("*_ ").strip()
    math = _LEADING_MATH.match(value)
    if math:
        return next(group for group in math.groups() if group is not None).strip() or None
    end = _SENTENCE_END.search(value)
    if end:
        value = value[: end.start()]
    value = value.strip().rstrip(",;:").strip("*_ ").strip("$").strip()
    return value or None


def extract_boxed(text: str, *, fallback: bool = True, last_box_wins: bool = False) -> str | None:
    """Extract the final answer from a model's output.

    Reasoning inside ``<think>...</think>`` is ignored (see
    :func:`mappa_env.text.strip_think`). The answer is searched in this order; the
    first rule that finds a non-empty answer wins:

    1. The boxed answer: ``\\boxed{...}`` or ``\\fbox{...}`` (also ``\\boxed {...}``
       and ``\\boxed 5``), read by :func:`boxed_answers`. Nested braces and escaped
       braces (``\\{``) are matched properly; in ``\\boxed{\\boxed{5}}`` the inner box
       is the answer, giving ``5``. Empty and unclosed boxes, boxes that only wrap
       other boxes, and boxes holding a placeholder (``\\boxed{NUMBER}``) are skipped.
       Several boxes holding the same answer (``\\boxed{6534} ... \\boxed{6,534}``)
       give it (the text of the last one). Several boxes holding **different**
       answers (``\\boxed{42} \\boxed{6534}``) give no answer, and no fallback is
       tried: a reply that offers two answers has not chosen one, and taking the
       last would let a hedge pass as an answer.
    2. Only with ``fallback=True``: the last "final answer is X" / "final answer: X".
    3. Only with ``fallback=True``: the last line that starts with "Answer:"
       (markdown emphasis allowed, e.g. ``**Answer:** X``).
    4. Only with ``fallback=True``: the last "the answer is X".

    For the phrase fallbacks, X is the rest of the line: a leading math span
    (``$...$``, ``\\(...\\)``, ``\\[...\\]``) is taken whole, otherwise X ends at
    the first sentence-ending period, and emphasis markers and dollar signs around
    it are removed. An X holding a box is skipped (its box was read by rule 1).

    Args:
        text: A model's output.
        fallback: Whether to use the phrase fallbacks (rules 2-4) when there is no box.
        last_box_wins: Take the last box when boxes hold different answers. For
            trusted text such as a dataset's reference solution, which may box
            intermediate results; never for an agent's output.

    Returns:
        The answer text, stripped, or None when nothing was found (also for
        non-string input, and for different boxed answers unless ``last_box_wins``).
    """
    if not isinstance(text, str) or not text:
        return None
    visible = strip_think(text)
    contents = _answer_boxes(visible)
    answers = _different(contents)
    if len(answers) == 1:
        return answers[0]
    if answers:
        return contents[-1] if last_box_wins else None
    if not fallback:
        return None
    for pattern in (_FINAL_ANSWER, _ANSWER_LINE, _ANSWER_IS):
        for found in reversed(list(pattern.finditer(visible))):
            value = _clean_fallback(found.group("value"))
            if value and not _BOX_COMMAND.search(value):
                return value
    return None


# --------------------------------------------------------------------------------------
# Normalisation and the fast path
# --------------------------------------------------------------------------------------

_MATH_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\\[dt]frac(?![A-Za-z])", r"\\frac"),
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle)(?![A-Za-z])", ""),
        (r"\\(?:quad|qquad)(?![A-Za-z])", " "),
        (r"\\[,;:! ]", " "),
        (r"~", " "),
        (r"\\(?:cdot|times)(?![A-Za-z])|[×·]", "*"),
        (r"\\div(?![A-Za-z])|÷", "/"),
        (r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|°", ""),
        (r"\\degree(?![A-Za-z])", ""),
        (r"\\%", "%"),
        (r"\\\$|\$", ""),
        (r"\{,\}", ","),
        (r"[−–]", "-"),
    )
)
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm|mathbf)\s*\{")
_UNIT_TEXT = re.compile(r"^[A-Za-z][A-Za-z\s.]*$")
_UNIT_POWER = re.compile(r"^\s*\^\s*(?:\{\s*[23]\s*\}|[23])")
_UNIT_WORD_LIST = """
cm mm m km in inch inches ft foot feet yd yard yards mi mile miles meter meters metre metres
centimeter centimeters kilometer kilometers g gram grams kg kilogram kilograms lb lbs pound
pounds oz ounce ounces s sec second seconds min minute minutes h hr hour hours day days week
weeks month months year years dollar dollars cent cents degree degrees unit units sq square
cubic ways people students
"""
_UNIT_WORDS = frozenset(_UNIT_WORD_LIST.split())
_NUMBER_THEN_UNITS = re.compile(r"^(?P<number>[-+]?[\d.,/]+)\s*(?P<units>[A-Za-z][A-Za-z ]*)$")
_ASSIGNMENT = re.compile(r"^\s*[A-Za-z\\][A-Za-z0-9\\_{}\s+\-*/()',]*=(?P<value>[^=<>]+)$")
_NEGATION = re.compile(r"\\(?:not|ne|neq)(?![A-Za-z])")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$", re.ASCII)
_SPACE_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?: \d{3})+(?:\.\d+)?$", re.ASCII)
_SPACES = re.compile(r"\s+")
_SPACE_NOT_BETWEEN_WORDS = re.compile(r"(?<![A-Za-z0-9]) | (?![A-Za-z0-9])")
# ASCII digits only: other Unicode digits are left to the symbolic check.
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)", re.ASCII)
_SLASH_FRACTION = re.compile(
    r"(?P<sign>[+-]?)\(?(?P<num>[+-]?\d+)\)?/\(?(?P<den>[+-]?\d+)\)?", re.ASCII
)
_LATEX_FRACTION = re.compile(
    r"(?P<sign>[+-]?)\\frac\s*(?:\{(?P<num>[+-]?\d+)\}|(?P<n1>\d))\s*(?:\{(?P<den>[+-]?\d+)\}|(?P<d1>\d))",
    re.ASCII,
)


def _strip_delimiters(text: str) -> str:
    """Remove one pair of enclosing math delimiters and a trailing period."""
    value = text.strip()
    changed = True
    while changed:
        changed = False
        if value.endswith(".") and not _DECIMAL.fullmatch(value):
            value, changed = value[:-1].rstrip(), True
        for opening, closing in _MATH_DELIMITERS:
            if (
                len(value) >= len(opening) + len(closing)
                and value.startswith(opening)
                and value.endswith(closing)
            ):
                value, changed = value[len(opening) : len(value) - len(closing)].strip(), True
                break
    return value


def _unwrap_text_commands(text: str) -> str:
    r"""Replace ``\text{...}``-style groups by their content, dropping unit labels.

    A group that holds only words and follows other content is a unit
    (``5\text{ cm}``) and is dropped together with a following ``^2``/``^3``; any
    other group is replaced by its content (``\text{yes}`` becomes ``yes``).
    """
    for _ in range(50):  # bounded: every pass removes one command
        command = _TEXT_COMMAND.search(text)
        if command is None:
            return text
        opening = command.end() - 1
        close = _match_braces(text).get(opening)
        if close is None:
            return text[: command.start()] + text[command.end() :]
        content = text[opening + 1 : close]
        before, after = text[: command.start()], text[close + 1 :]
        if before.strip() and _UNIT_TEXT.match(content.strip()):
            text = before + _UNIT_POWER.sub("", after, count=1)
        else:
            text = before + content + after
    return text


def _drop_plain_units(text: str) -> str:
    """Drop known unit words after a number: ``5 cm`` becomes ``5``."""
    match = _NUMBER_THEN_UNITS.match(text)
    if match and all(word.lower() in _UNIT_WORDS for word in match.group("units").split()):
        return match.group("number")
    return text


def _normalize(text: str) -> str:
    """Canonical string form of an answer for the fast path (not a full parser)."""
    value = _strip_delimiters(text)
    for pattern, replacement in _REWRITES:
        value = pattern.sub(replacement, value)
    value = _unwrap_text_commands(value)
    value = _SPACES.sub(" ", value).strip()
    assignment = _ASSIGNMENT.match(value)
    # "x \not= 5" states what x is not: no assignment to unpack.
    if assignment and value.count("=") == 1 and not _NEGATION.search(value):
        value = assignment.group("value").strip()
    value = _strip_delimiters(_drop_plain_units(value))
    if _THOUSANDS.match(value):
        value = value.replace(",", "")
    elif _SPACE_THOUSANDS.match(value):
        value = value.replace(" ", "")
    # Keep a space only where it separates two words or numbers ("1 2" is not "12").
    return _SPACE_NOT_BETWEEN_WORDS.sub("", value)


@dataclass(frozen=True)
class _Number:
    """An exactly parsed number: its value, how many decimals it was written with."""

    value: Fraction
    decimals: int  # digits after the decimal point; 0 for integers and fractions
    percent: bool  # written with a percent sign
    reduced: bool = True  # False for a fraction written with a common factor (144/12)


def _parse_number(text: str) -> _Number | None:
    """Parse an integer, decimal, ``a/b`` or ``\\frac{a}{b}`` exactly, or return None."""
    percent = text.endswith("%")
    body = text[:-1].strip() if percent else text
    if not body or len(body) > MAX_NUMBER_DIGITS:
        return None
    if _INTEGER.fullmatch(body):
        return _Number(Fraction(int(body)), 0, percent)
    if _DECIMAL.fullmatch(body):
        return _Number(Fraction(body), len(body.split(".")[1]), percent)
    for pattern in (_SLASH_FRACTION, _LATEX_FRACTION):
        match = pattern.fullmatch(body)
        if match:
            numerator = int(match.group("num") or match.group("n1"))
            denominator = int(match.group("den") or match.group("d1"))
            if denominator == 0:
                return None
            value = Fraction(numerator, denominator)
            reduced = gcd(numerator, denominator) == 1
            signed = -value if match.group("sign") == "-" else value
            return _Number(signed, 0, percent, reduced)
    return None


# What may surround a stated number without being part of it: trailing punctuation and
# LaTeX spacing, a leading label ("Answer: 5507"), grouping, unit words after it.
_TRAILING_NOISE = re.compile(r"(?:\s|[,;]|\\\\|\\ |\\hspace\*?\{[^{}]*\})+$")
_LABEL = re.compile(r"^[A-Za-z][A-Za-z ]*:\s*")
_NUMBER_THEN_WORDS = re.compile(r"^(?P<number>.*?[\d}])\s*(?P<words>[A-Za-z][A-Za-z ]*)$")
# Words that make a number part of a larger statement, not a label after it.
_STATEMENT_WORDS = frozenset(
    ["plus", "minus", "times", "divided", "over", "mod", "modulo", "squared", "cubed"]
)
# A text that states several values, a negation or a bound: not one final value.
_NOT_ONE_VALUE = re.compile(
    r"[,;!<>≠≈∼~]|\\(?:not|ne|neq|approx|sim|pm|mp)(?![A-Za-z])|\b(?:or|and|not|nor)\b",
    re.IGNORECASE,
)
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))", re.ASCII)
_GROUPS = (("(", ")"), ("{", "}"))


def _stated_numbers(text: str) -> list[str] | None:
    """The written numbers a normalised answer states, as texts.

    None when it states several different things (``x=3, y=-3``, ``5 or 6``,
    ``x != 5``). The sides of ``a = b = c`` are the candidates; a side that is an expression
    (``91*64-317``) states no number and is left out. Each side loses grouping
    (``(5507)``, ``{5507}``), unit words after it (``5507 apples``) and a label
    before it (``Answer: 5507``).
    """
    value = _LABEL.sub("", _TRAILING_NOISE.sub("", text))
    value = _THOUSANDS_COMMA.sub("", value)
    if _NOT_ONE_VALUE.search(value):
        return None
    numbers = []
    for side in value.split("="):
        side = side.strip()
        words = _NUMBER_THEN_WORDS.match(side)
        if words and not _STATEMENT_WORDS & set(words.group("words").lower().split()):
            side = words.group("number").strip()
        changed = True
        while changed:
            changed = False
            for opening, closing in _GROUPS:
                inner = side[1:-1]
                if side.startswith(opening) and side.endswith(closing) and _balanced(inner):
                    side, changed = inner.strip(), True
        if _INTEGER.fullmatch(side) or _parse_number(side) is not None:
            numbers.append(side)
    return numbers


def _balanced(text: str) -> bool:
    """Whether every bracket of ``text`` closes in order (so ``(1)+(2)`` is not one group)."""
    depth = 0
    for char in text:
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _canonical_integer(text: str) -> str:
    """An integer's text without ``+`` and leading zeros (``-007`` is ``-7``)."""
    digits = text.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if text.startswith("-") and digits != "0" else digits


def _written_number_verdict(pred: str, truth: str) -> bool | None:
    """Whether ``pred`` (normalised) writes out the number ``truth`` as its final value.

    None when ``truth`` is not a plain number: the symbolic check decides then. A
    true answer that is a number needs a number: an integer, a decimal, a percentage
    or a fraction in lowest terms (unless the truth itself is not). An expression that
    evaluates to it (``91*64-317``, ``2^{10}``, ``\\sqrt{4}``, ``144/12``) is the
    computation still to be done, and an agent can write it by copying the problem.
    Every number the answer states (``91*64-317 = 5507``) must be the same one, and
    one of them written out (``144/12 = 12``).
    """
    truth_number = _parse_number(truth)
    if truth_number is None and not _INTEGER.fullmatch(truth):
        return None
    stated = _stated_numbers(pred)
    if not stated:
        return False
    if truth_number is None:  # an integer too long to parse: compared as digits
        wanted = _canonical_integer(truth)
        return all(
            _INTEGER.fullmatch(s) is not None and _canonical_integer(s) == wanted for s in stated
        )
    numbers = [_parse_number(s) for s in stated]
    if any(n is None or not _numbers_equal(n, truth_number) for n in numbers):
        return False
    # An unreduced fraction (144/12) is still a computation: it may lead to the value,
    # not be it.
    return any(n.reduced or not truth_number.reduced for n in numbers if n is not None)


def _number_candidates(number: _Number) -> list[Fraction]:
    """The values a written number may stand for: ``50%`` is 50 or 0.5."""
    if number.percent:
        return [number.value, number.value / 100]
    return [number.value]


def _numbers_equal(pred: _Number, truth: _Number) -> bool:
    """Exact equality, or agreement to the places of a decimal written with >= 6 of them.

    A truth written as a percentage matches a plain number that is its number or its
    fraction (``50%``: 50 or 0.5). A predicted percentage stands for the number written
    only (against a percentage, the two compare as written): taking it for both would
    let one answer cover two truths a hundredfold apart (``4200%`` for 42 and 4200).
    """
    truths = _number_candidates(truth) if truth.percent and not pred.percent else [truth.value]
    places = max(pred.decimals, truth.decimals)
    for value in truths:
        if pred.value == value:
            return True
        if places >= 6 and round(pred.value, places) == round(value, places):
            return True
    return False


def _too_complex(text: str) -> bool:
    """Cheap screen for shapes that only ever time out in sympy: deep nesting, power towers."""
    if text.count("^") > MAX_POWERS:
        return True
    depth = 0
    for char in text:
        if char in "{([":
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif char in "})]":
            depth = max(depth - 1, 0)
    return False


def _symbolic_form(text: str) -> str:
    """Light clean-up of an answer before math-verify parses it."""
    value = _strip_delimiters(text).replace("\\$", "").replace("$", "").strip()
    value = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), value)
    return f"${value}$"


# --------------------------------------------------------------------------------------
# Public comparison API
# --------------------------------------------------------------------------------------


def _as_text(value: object) -> str | None:
    """Accept strings and plain numbers (AMC files store 18.0); reject everything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Fraction)):
        return str(value)
    return value if isinstance(value, str) else None


def _is_plain_integer(text: str) -> bool:
    return len(text) <= MAX_NUMBER_DIGITS and _INTEGER.fullmatch(text.strip()) is not None


def _final_form(text: str) -> str:
    """The boxed part of an answer that still carries its box, else the text itself."""
    if _BOX_COMMAND.search(text):
        # A box that holds nothing (``\\boxed{}``) means no answer, not the literal text.
        return extract_boxed(text, fallback=False) or ""
    return text.strip()


def answers_match(
    pred: str,
    truth: str,
    *,
    timeout_s: float = 2.0,
    checker: SymbolicChecker | None = None,
) -> bool:
    """Whether a predicted final answer is mathematically equal to the ground truth.

    Steps, cheapest first:

    1. Both answers are normalised: a surrounding ``\\boxed{}`` is unpacked, math
       delimiters and dollar signs removed, ``\\dfrac``/``\\tfrac`` become
       ``\\frac``, ``\\left``/``\\right`` and LaTeX spacing dropped, ``\\cdot`` and
       ``\\times`` become ``*``, degree marks (``^\\circ``) dropped, ``\\text{}``
       /``\\mbox{}`` unwrapped, unit labels after a number dropped
       (``5\\text{ cm}``, ``5 cm``), a leading ``x =`` dropped, thousands
       separators removed (``1,000``), a trailing period removed.
    2. Equal normalised strings match.
    3. When the truth is a plain number (an integer, decimal, ``a/b``,
       ``\\frac{a}{b}``), the prediction must write a number out: an expression
       that evaluates to it (``91 * 64 - 317``, ``2^{10}``, ``\\sqrt{4}``,
       ``144/12``) does not match, because it is the computation the problem asks
       for and an agent can write it by copying the problem. A fraction must be in
       lowest terms (unless the truth is not). The sides of ``=`` that are numbers
       must all be the truth (``91 * 64 - 317 = 5507`` and ``m+n=23`` match,
       ``5506 = 5507`` does not); grouping, trailing punctuation, a label and unit
       words around the number are ignored (``(5507)``, ``Answer: 5507``,
       ``5507 apples``); several values, a negation or a bound (``x=3, y=-3``,
       ``5 or 6``, ``x \\ne 5``, ``\\approx 5``) never match. Numbers are compared
       exactly as rationals, so ``023`` equals ``23``, ``18.0`` equals ``18`` and
       ``0.75`` equals ``3/4``, while ``23`` vs ``230`` and ``-5`` vs ``5`` do not
       match. A decimal written with six or more places also matches a value that
       rounds to it (``0.333333`` vs ``1/3``).
       Percentages: a truth written with ``%`` may stand for the number shown or
       for that number divided by 100, so a truth ``50\\%`` is matched by ``50``
       and by ``0.5``; a predicted ``50\\%`` stands for 50 only (taking it for
       both would let one answer cover two truths a hundredfold apart), and
       ``50`` vs ``0.5`` does not match.
    4. Otherwise math-verify decides (``\\sqrt{2}``, ``\\pi``, powers, tuples,
       intervals, sets, ...), in a worker process, waiting at most ``timeout_s``
       (see :class:`SymbolicChecker`). Answers longer than
       :data:`MAX_ANSWER_CHARS`, nested deeper than :data:`MAX_NESTING` or with
       more than :data:`MAX_POWERS` powers skip this step (and do not match).

    Safe to call from any thread and from inside a running event loop (it blocks
    for at most about ``timeout_s``; see :func:`answers_match_async`). Never raises
    on malformed input.

    Args:
        pred: The predicted answer (a bare answer, or text whose box holds it).
        truth: The ground-truth answer. Plain ints and floats are accepted too.
        timeout_s: Longest wait for the symbolic check; 0 skips it.
        checker: Symbolic checker to use; the process-wide default when None.

    Returns:
        True when the answers are judged equal; False otherwise, including for
        non-string input, empty answers and checks that ran out of time.
    """
    pred_text, truth_text = _as_text(pred), _as_text(truth)
    if pred_text is None or truth_text is None:
        return False
    # Plain integers (every AIME answer) need nothing else: "023" equals "23".
    if _is_plain_integer(pred_text) and _is_plain_integer(truth_text):
        return int(pred_text) == int(truth_text)
    try:
        # Plain numbers ("18.0", "3/4") skip normalisation too.
        pred_number, truth_number = (
            _parse_number(pred_text.strip()),
            _parse_number(truth_text.strip()),
        )
        if pred_number is not None and truth_number is not None:
            reduced = pred_number.reduced or not truth_number.reduced
            return reduced and _numbers_equal(pred_number, truth_number)
        pred_text, truth_text = _final_form(pred_text), _final_form(truth_text)
        if not pred_text or not truth_text:
            return False
        pred_norm, truth_norm = _normalize(pred_text), _normalize(truth_text)
        if not pred_norm or not truth_norm:
            return False
        if pred_norm == truth_norm:
            return True
        verdict = _written_number_verdict(pred_norm, truth_norm)
    except (ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
        logger.debug("fast answer comparison failed: %s", exc)
        return False
    if verdict is not None:
        return verdict
    if timeout_s <= 0 or max(len(pred_text), len(truth_text)) > MAX_ANSWER_CHARS:
        return False
    if _too_complex(pred_text) or _too_complex(truth_text):
        return False
    checker = checker or default_checker()
    return checker.check(_symbolic_form(pred_text), _symbolic_form(truth_text), timeout_s)


def answers_match_any(
    pred: str,
    truths: Iterable[str],
    *,
    timeout_s: float = 2.0,
    checker: SymbolicChecker | None = None,
) -> bool:
    """Whether ``pred`` matches any of several accepted answers.

    Some problems accept more than one answer (see the ``accepted_answers`` entry
    of :class:`mappa_env.envs.mathchat.tasks.MathTask` metadata).

    Args:
        pred: The predicted answer.
        truths: Accepted answers.
        timeout_s: Longest wait for each symbolic check.
        checker: Symbolic checker to use; the process-wide default when None.

    Returns:
        True when one of ``truths`` matches.
    """
    return any(answers_match(pred, truth, timeout_s=timeout_s, checker=checker) for truth in truths)


async def answers_match_async(
    pred: str,
    truth: str,
    *,
    timeout_s: float = 2.0,
    checker: SymbolicChecker | None = None,
) -> bool:
    """:func:`answers_match` run in a thread, so an event loop keeps serving others.

    Args:
        pred: The predicted answer.
        truth: The ground-truth answer.
        timeout_s: Longest wait for the symbolic check.
        checker: Symbolic checker to use; the process-wide default when None.

    Returns:
        Same as :func:`answers_match`.
    """
    return await asyncio.to_thread(answers_match, pred, truth, timeout_s=timeout_s, checker=checker)
