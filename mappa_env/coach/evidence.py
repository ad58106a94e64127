"""What an action's evidence shows without the reference answer.

The readers the rules rubrics build on: the numbers a problem states, where a piece of
code's literals come from (the problem, small constants, or a claimed answer: a copy),
and every ``a op b = c`` step of a draft recomputed. Pure functions of text; no scores.
"""

from __future__ import annotations

import ast
import itertools
import re

from mappa_env.grading.answers import numbers_in
from mappa_env.grading.math import answers_match
from mappa_env.text import ipython_as_python, strip_think

#: A boxed answer (``\\boxed{...}``, one level of nested braces), skipped where a draft's
#: own working is read.
BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")

#: Integers this small are not taken for a copied answer when they merely appear in code
#: (see :func:`copied_literal`); a printed one still is.
SMALL_INTEGER = 10


def _constant_text(node: ast.expr) -> str | None:
    """The text of a number or string constant, signed (``-5``); ``None`` for anything else."""
    sign = ""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign = "-" if isinstance(node.op, ast.USub) else ""
        node = node.operand
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return None
    if not isinstance(node.value, (int, float, str)):
        return None
    try:
        return sign + str(node.value)
    except ValueError:  # an integer too long to print (over 4300 digits): no answer
        return None


def _printed_literals(code: str) -> list[str]:
    """Numbers ``code`` prints as written rather than computes.

    The constants among its ``print(...)`` arguments (signed, and the literal text of
    f-strings, not their format specs), the constant last assigned to a name it prints
    (``x = 393482; print(x)``; not a name it updates with ``+=``), and a constant left
    as the cell's last expression (Jupyter displays it). ``print(x ** 2)`` computes:
    only a printed literal, not any number in the code, counts, so a small answer that
    also appears as an exponent is not taken for a copy. IPython's lines are read as
    :func:`mappa_env.text.ipython_as_python` does; in code that does not parse, every
    number counts.
    """
    try:
        tree = ast.parse(ipython_as_python(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # Code that ran but does not parse here (an integer literal over Python's
        # 4300-digit limit, say): every number written in it counts.
        return numbers_in(code)
    last: dict[str, ast.expr] = {}
    updated: set[str] = set()
    assignments = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))]
    for node in sorted(assignments, key=lambda n: (n.lineno, n.col_offset)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and node.value is not None:
                last[target.id] = node.value
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            updated.add(node.target.id)
    shown: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
            shown.extend(node.args)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        shown.append(tree.body[-1].value)
    literals: list[str] = []
    for expr in shown:
        if isinstance(expr, ast.Name):
            if expr.id in updated or expr.id not in last:
                continue
            expr = last[expr.id]
        parts = expr.values if isinstance(expr, ast.JoinedStr) else [expr]
        for part in parts:
            if isinstance(part, ast.FormattedValue):
                part = part.value
            text = _constant_text(part)
            if text is not None:
                literals.extend(numbers_in(text) if isinstance(part, ast.Constant)
                                and isinstance(part.value, str) else [text])  # fmt: skip
    return [literal.replace(",", "") for literal in literals]


def _code_literals(code: str) -> list[str]:
    """Every number written anywhere in ``code``.

    Its number constants, and the numbers inside its strings (``int('6534')``,
    ``float("6534")``, ``'6_534'``), but not the format specs of f-strings
    (``f'{x:.12}'`` formats, it states no number). In code that does not parse, every
    number in the text.
    """
    try:
        tree = ast.parse(ipython_as_python(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return numbers_in(code)
    in_format_spec: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            in_format_spec.update(id(inner) for inner in ast.walk(node.format_spec))
    literals: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in in_format_spec:
            continue
        if isinstance(node.value, str):
            # Python reads "6_534" as 6534 (int, float, Fraction, Decimal all do).
            literals.extend(numbers_in(node.value.replace("_", "")))
        else:
            text = _constant_text(node)
            if text is not None:
                literals.append(text)
    return literals


def same_magnitude(literal: str, number: str) -> bool:
    """Whether ``literal`` is ``number`` up to its sign, on the grader's fast path."""
    return answers_match(literal.lstrip("-"), number.lstrip("-"), timeout_s=0)


def _is_small_integer(number: str) -> bool:
    try:
        return abs(int(number)) <= SMALL_INTEGER
    except ValueError:
        return False


#: A literal this close to a printed number (relative to its size) is where the number
#: came from: ``print(6533 + 1)``, ``print(round(2187.4))``. Off by at most
#: :data:`SMALL_INTEGER`, or by 1% of a larger number.
NEAR_SHARE = 0.01


def _value(text: str) -> float | None:
    try:
        if "/" in text:
            top, _, bottom = text.partition("/")
            return float(top) / float(bottom)
        return float(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _near(literal: str, number: str) -> bool:
    """Whether ``literal`` is ``number``, or a step from it (up to sign; see NEAR_SHARE)."""
    if same_magnitude(literal, number):
        return True
    a, b = _value(literal.lstrip("-")), _value(number.lstrip("-"))
    if a is None or b is None:
        return False
    return abs(a - b) <= max(SMALL_INTEGER, NEAR_SHARE * abs(b))


def stated_numbers(problem: str) -> list[str]:
    """The numbers a problem states (magnitudes), for telling them from copied ones."""
    return [n.lstrip("-") for n in numbers_in(problem)]


def _from_problem(literal: str, stated: list[str]) -> bool:
    """Whether ``literal`` is a number the problem states, or one off it (a range bound)."""
    value = _value(literal.lstrip("-"))
    for number in stated:
        if same_magnitude(literal, number):
            return True
        other = _value(number)
        if value is not None and other is not None and abs(value - other) == 1:
            return True
    return False


def uses_problem_numbers(code: str, problem: str) -> bool:
    """Whether ``code`` writes a number the problem states (a sign it computes the problem).

    Args:
        code: The code.
        problem: The problem statement.

    Returns:
        True when some literal of the code (constants, numbers in strings) is one of the
        problem's numbers, or one off it.
    """
    stated = stated_numbers(problem)
    return any(same_magnitude(lit, n) for lit in _code_literals(code) for n in stated)


def foreign_literals(code: str, problem: str) -> list[str]:
    """The literals of ``code`` that neither the problem states nor are small constants."""
    stated = stated_numbers(problem)
    return [
        lit
        for lit in _code_literals(code)
        if not _is_small_integer(lit) and not _from_problem(lit, stated)
    ]


def copied_literal(number: str, code: str, problem: str) -> str | None:
    """The literal of ``code`` that ``number`` was derived from rather than computed, or None.

    The number was written, not computed, when

    1. ``code`` prints it as written: a printed constant, the constant last assigned to
       a printed name, or a cell's last expression (``print(6534)``, ``x = 6534;
       print(x)``), whatever the problem states; or
    2. a literal near it (:func:`_near`: equal up to its sign, or off by at most
       :data:`SMALL_INTEGER` or 1% of it) appears anywhere in ``code``: an expression
       around it (``print(6534 + 0)``, ``print(6533 + 1)``, ``print(round(2187.4))``), a
       name passed on (``x = 6534; y = x``), a string the code converts (``int('6534')``,
       ``int('6533') + 1``) or a comparison (``assert x == 6534``). The answer is
       reached by a derivation from a literal that holds it. Two exceptions: a number the
       problem itself states (``Compute 2 ** 10`` states 2 and 10: writing them is how
       the problem is computed), and integers up to :data:`SMALL_INTEGER` in magnitude,
       which honest code writes all the time (``range(2, n)``, ``x ** 2``).

    A small answer (up to :data:`SMALL_INTEGER`) cannot be told from the small
    constants around it, so its code must show it computes the problem instead: see
    :func:`copy_reason`.

    Args:
        number: A number the code printed.
        code: The code (IPython lines are read as :func:`mappa_env.text.ipython_as_python`
            does).
        problem: The problem statement.

    Returns:
        The copied literal as written in the code, or None when the number was computed.
    """
    for literal in _printed_literals(code):
        if same_magnitude(literal, number):
            return literal
    stated = stated_numbers(problem)
    if any(same_magnitude(n, number) for n in stated):
        return None  # the problem states the answer: writing it is no copy
    for literal in _code_literals(code):
        if _is_small_integer(literal) or any(same_magnitude(literal, n) for n in stated):
            continue
        if _near(literal, number):
            return literal
    return None


def copy_reason(number: str, code: str, problem: str) -> str | None:
    """Why ``code``'s printed ``number`` is not computed from the problem, or None.

    A copy (:func:`copied_literal`), or a small answer printed by code that writes none
    of the problem's numbers (``print(1 + 1)``: small answers are exempt from the
    literal check only for code that uses the problem's numbers).

    Args:
        number: A number the code printed.
        code: The code.
        problem: The problem statement.

    Returns:
        A short reason for the analysis, or None when the number was computed.
    """
    copied = copied_literal(number, code, problem)
    if copied is not None:
        return f"it is written in the code itself ({copied})"
    if _is_small_integer(number) and not uses_problem_numbers(code, problem):
        return "the code writes none of the problem's numbers"
    return None


_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_EXPR = rf"(?:[(\s]*-?\s*(?:{_NUM})[)\s]*(?:\*\*|//|[-+*/%])\s*)*[(\s]*-?\s*(?:{_NUM})[)\s]*"
_LEFT = re.compile(rf"(?P<expr>{_EXPR})$")
_RIGHT = re.compile(rf"^(?P<expr>{_EXPR})")
_LATEX_OPS = (
    ("\\times", "*"), ("\\cdot", "*"), ("×", "*"), ("·", "*"), ("\\div", "/"), ("÷", "/"),
    ("−", "-"), ("^", "**"), ("\\left", ""), ("\\right", ""), ("{", "("), ("}", ")"),
    ("$", " "), ("\\(", " "), ("\\)", " "), ("\\[", " "), ("\\]", " "),
)  # fmt: skip
#: The largest exponent a checked step may raise to (bigger steps are left unchecked).
MAX_STEP_EXPONENT = 64


def _evaluate(expression: str) -> float | int | None:
    """The value of an arithmetic expression of numbers, ``+ - * / **``, or None."""
    try:
        tree = ast.parse(expression.replace(",", "").strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def value(node: ast.expr) -> float | int:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div):
                return left / right
            if isinstance(node.op, ast.FloorDiv):
                return left // right
            if isinstance(node.op, ast.Mod):
                return left % right
            if isinstance(node.op, ast.Pow) and abs(right) <= MAX_STEP_EXPONENT:
                return left**right
        raise ValueError("not a checkable step")

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return None


def _decimals(expression: str) -> int:
    return max((len(n.partition(".")[2]) for n in re.findall(_NUM, expression)), default=0)


def checked_steps(text: str) -> tuple[list[str], list[str]]:
    """The arithmetic steps of ``text`` recomputed: ``(steps that hold, steps that do not)``.

    A step is an equation whose sides are arithmetic on written numbers, one side at
    least holding an operation (``76 * 89 = 6764``, ``6764 - 230 = 6534``, ``3 \\times 4
    = 12``, each link of ``12 * 11 - 10 = 132 - 10 = 122``). A side that runs on into a
    variable or a word (``2x + 3 = 7``) is no step: only what can be recomputed counts.
    A side with decimals or a division is compared to the precision written (``7 / 3 =
    2.33`` holds). Boxed answers are left out.

    Args:
        text: An agent's message (reasoning in ``<think>`` blocks is ignored).

    Returns:
        The steps as written, split by whether they hold.
    """
    visible = BOXED.sub(" ", strip_think(text))
    for latex, python in _LATEX_OPS:
        visible = visible.replace(latex, python)
    sides = visible.split("=")
    good: list[str] = []
    bad: list[str] = []
    for left_text, right_text in itertools.pairwise(sides):
        left = _LEFT.search(left_text)
        right = _RIGHT.search(right_text)
        if left is None or right is None:
            continue
        lhs, rhs = left.group("expr").strip(), right.group("expr").strip()
        start = left.start() + len(left.group("expr")) - len(left.group("expr").lstrip())
        end = right.start() + len(right.group("expr").rstrip())
        # A side that is part of a longer expression (a variable, an operator, a
        # comparison) cannot be recomputed alone: "4y - 17 = 15", "x = 3 + y".
        before, after = left_text[:start], right_text[end:]
        if before and not before[-1].isspace() and (before[-1].isalnum() or before[-1] in "_.)"):
            continue
        if before.rstrip()[-1:] in set("+-*/^_<>!") - {""}:
            continue
        if lhs.startswith("-") and (before.rstrip()[-1:].isalnum() or before.rstrip()[-1:] == ")"):
            continue
        if after and not after[0].isspace() and (after[0].isalnum() or after[0] in "(_"):
            continue
        if after.lstrip()[:1] in set("+-*/^(") - {""}:
            continue
        if not re.search(r"\d\s*\)*\s*(?:\*\*|//|[-+*/%])", f"{lhs} {rhs}"):
            continue  # "1 = 1", "x = 5": nothing to recompute
        a, b = _evaluate(lhs), _evaluate(rhs)
        if a is None or b is None:
            continue
        places = (
            min(_decimals(lhs), _decimals(rhs))
            if "/" not in lhs + rhs
            else max(_decimals(lhs), _decimals(rhs))
        )
        if "/" in lhs + rhs or "." in lhs + rhs:
            holds = abs(a - b) <= 0.5 * 10 ** (-places) + 1e-9 * max(1.0, abs(b))
        else:
            holds = a == b
        (good if holds else bad).append(f"{lhs} = {rhs}")
    return good, bad
