"""Checks of a task set's design: is a problem its own solution?

A prompt such as "Compute 76 * 89 - 230." is valid Python once its leading verb and
trailing period are gone: an agent that copies it into ``print(...)`` gets the answer
without reading it as a problem. Success on such tasks measures copying, not
reasoning. :func:`is_own_solution` says whether a task is of that sort, by evaluating
the prompt's text as a Python expression of arithmetic on number literals - parsed with
:mod:`ast` and walked here, never passed to ``eval``.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

from mappa_env.envs.mathchat.tasks import MathTask

__all__ = ["arithmetic_value", "expression_candidates", "is_own_solution"]

_MAX_TEXT = 2_000
"""Longer texts are not read as one expression (parsing cost stays bounded)."""

_MAX_EXPONENT = 10_000
"""``a ** b`` with a larger ``|b|`` is not evaluated (``9 ** 9 ** 9`` would never end)."""

_MAX_DIGITS = 10_000
"""Intermediate integers longer than this are not evaluated further."""

# Leading words before the first character an expression can start with
# ("Compute", "What is", "Evaluate the expression"); trailing sentence punctuation.
_LEADING_WORDS = re.compile(r"^\s*(?:[A-Za-z]+[,:]?\s+)+(?=[-+(\d.])")
_TRAILING_PUNCTUATION = re.compile(r"[\s.?!:;=]+$")

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


class _NotArithmetic(ValueError):
    """The text is not (bounded) arithmetic on number literals."""


def _evaluate(node: ast.AST) -> Fraction:
    """Exact value of an arithmetic node; raises :class:`_NotArithmetic` otherwise."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        # bool is an int subclass; True is not a number literal here.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _NotArithmetic(f"not a number literal: {value!r}")
        # Through the literal's text: 0.1 is 1/10, not the nearest binary fraction.
        return Fraction(value) if isinstance(value, int) else Fraction(repr(value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        operand = _evaluate(node.operand)
        return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            value = _power(left, right)
        elif type(node.op) in _BINARY:
            if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
                raise _NotArithmetic("division by zero")
            value = _BINARY[type(node.op)](left, right)
        else:
            raise _NotArithmetic(f"operator {type(node.op).__name__} is not arithmetic here")
        value = Fraction(value)
        if max(len(str(value.numerator)), len(str(value.denominator))) > _MAX_DIGITS:
            raise _NotArithmetic("number too large")
        return value
    raise _NotArithmetic(f"{type(node).__name__} is not arithmetic on number literals")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """``base ** exponent`` for an integer exponent of bounded size."""
    if exponent.denominator != 1 or abs(exponent) > _MAX_EXPONENT:
        raise _NotArithmetic(f"exponent {exponent} is not a small integer")
    if base == 0 and exponent < 0:
        raise _NotArithmetic("zero to a negative power")
    digits = max(len(str(abs(base.numerator))), len(str(base.denominator)))
    if digits * abs(exponent) > _MAX_DIGITS and abs(base) != 1:
        raise _NotArithmetic("power too large")
    return base ** int(exponent)


def arithmetic_value(text: str) -> Fraction | None:
    """The exact value of ``text`` read as a Python expression of arithmetic on literals.

    Allowed: int and float literals, unary ``+``/``-``, and ``+ - * / // % **`` (integer
    exponents up to 10,000 in size). Anything else - names, calls, strings, comparisons,
    ``^`` - makes the text not arithmetic. The text is parsed with :mod:`ast` and its
    tree walked here; nothing is executed. ``/`` is exact division (``7 / 2`` is 7/2).

    Args:
        text: The text to read, e.g. ``"76 * 89 - 230"``.

    Returns:
        The value as a :class:`~fractions.Fraction`, or ``None`` when the text is not
        such an expression (or too long, or its numbers too large).
    """
    if len(text) > _MAX_TEXT:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _evaluate(tree)
    except (SyntaxError, ValueError, OverflowError, ZeroDivisionError, RecursionError):
        return None


def expression_candidates(prompt: str) -> list[str]:
    """Readings of a prompt that could be an expression, as :func:`is_own_solution` tries them.

    The prompt itself; without its trailing punctuation (``"... - 230."`` ->
    ``"... - 230"``); and without its leading words (``"Compute 76 * 89 - 230."`` ->
    ``"76 * 89 - 230"``); the same again with ``$`` signs dropped first. Duplicates are
    removed, first reading first.

    Args:
        prompt: A problem statement.

    Returns:
        The distinct readings, the prompt itself first.
    """
    readings = [prompt]
    for text in (prompt, prompt.replace("$", "")):
        stripped = _TRAILING_PUNCTUATION.sub("", text.strip())
        readings += [text, stripped, _LEADING_WORDS.sub("", stripped)]
    unique: list[str] = []
    for reading in (text.strip() for text in readings):
        if reading and reading not in unique:
            unique.append(reading)
    return unique


def _answer_value(answer: str) -> Fraction | None:
    try:
        return Fraction(answer.strip())
    except (ValueError, ZeroDivisionError):
        return None


def is_own_solution(task: MathTask) -> bool:
    """Whether the task's prompt, read as Python arithmetic, evaluates to its answer.

    Tries each reading of :func:`expression_candidates` (the prompt as written, without
    its trailing period, without its leading verb) with :func:`arithmetic_value`. True
    means that copying the problem into ``print(...)`` solves it: success on the task
    measures copying, not reasoning.

    Args:
        task: The task; its ``answer`` must be a number for the check to be True.

    Returns:
        True when some reading of the prompt is an arithmetic expression whose exact
        value equals the answer.
    """
    expected = _answer_value(task.answer)
    if expected is None:
        return False
    return any(arithmetic_value(text) == expected for text in expression_candidates(task.prompt))
