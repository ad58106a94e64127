"""A seeded generator of competition-style math problems whose answers are computed by code.

Every problem has a single integer answer, as in the AIME. Kinds (category in brackets):

=================  ==============  =========================================================
kind               category        problem
=================  ==============  =========================================================
arithmetic         arithmetic      multi-step word problems (stock, savings, ticket sales)
divisor_sum        number_theory   sum of the positive divisors of N
modular_power      number_theory   remainder of a^b modulo m
gcd_lcm            number_theory   gcd / lcm of given numbers, or the sum of gcd(k, N)
prime_count        number_theory   number of primes in an interval
digit_count        counting        integers in [1, N] meeting a digit condition
lattice_paths      counting        monotone lattice paths avoiding given points
subset_sum         counting        subsets of a set whose sum is divisible by k
polynomial_roots   algebra         a quantity of the integer roots of a monic polynomial
series_sum         algebra         sum of the integers below N divisible by a or b, not c
linear_system      algebra         a combination of the solution of an integer linear system
expression         arithmetic      the value of an integer expression such as 47 * 83 - 215
word_change        word_problem    shopping: change, money left, money still needed
word_sharing       word_problem    equal sharing: each share, leftovers, full boxes, vans needed
word_rates         word_problem    rates: output over time, travel time, teams, filling a tank
word_ages          word_problem    ages now, in the past and in the future
word_units         word_problem    unit conversion (time, length, mass, volume)
word_totals        word_problem    multi-step totals (trays of rolls, shelves, legs, packs)
word_one_step      word_problem    one operation: gets more, gives away, groups, shares
=================  ==============  =========================================================

``expression`` is a starter family for small models, where one line of Python (a
``print`` of the expression as written) solves the problem and mental arithmetic on
the larger levels rarely does. Its prompt is its own solution
(:func:`~mappa_env.envs.mathchat.checks.is_own_solution`): success on it measures copying the
problem into code, not reading it. The ``word_*`` families
(:mod:`mappa_env.envs.mathchat.word_problems`) are stories in words with small numbers on
their easy level: an agent must turn the words into arithmetic, and no prompt is
Python. None of these is in the default rotation (:data:`DEFAULT_KINDS`), so adding
them left the tasks of every existing seed as they were; ask for them by name.

Difficulty levels: 1 (``"easy"``: small numbers, doable by hand), 2 (``"medium"``:
larger numbers, still doable by hand with care), 3 (``"hard"``: built so that a
solution by hand is impractical - arithmetic on numbers with many digits or an
enumeration over tens of thousands of cases - so an agent has to write code;
``needs_code`` is True exactly for these).

Task ``i`` of seed ``s`` is drawn from its own random stream, so the first ``n``
tasks do not depend on how many are requested, and the same arguments always give
the same tasks. The stream's key also holds a secret (by default the user's, see
:mod:`mappa_env.tasks.secret`): seeds are public, and without the secret nobody can
rebuild a task, and read its answer, from the seed and this code. The empty secret
``""`` gives the tasks every seed had before secrets existed.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from mappa_env.envs.mathchat.problem import Problem
from mappa_env.envs.mathchat.tasks import MathTask
from mappa_env.envs.mathchat.word_problems import WORD_KINDS
from mappa_env.options import integer_option
from mappa_env.tasks.secret import user_task_secret

DIFFICULTY_LEVELS = {"easy": 1, "medium": 2, "hard": 3}
"""Difficulty names and their levels; ``"mixed"`` draws a level per task."""


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------

_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def _primes_up_to(limit: int) -> bytearray:
    """Sieve of Eratosthenes: ``sieve[k]`` is 1 when k is prime."""
    sieve = bytearray([1]) * (limit + 1)
    sieve[0:2] = b"\x00\x00"[: min(2, limit + 1)]
    for p in range(2, math.isqrt(limit) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytes(len(range(p * p, limit + 1, p)))
    return sieve


def _random_prime(rng: random.Random, low: int, high: int) -> int:
    """A uniformly drawn prime in [low, high] (trial division; fine below ~10^7)."""
    while True:
        candidate = rng.randint(low, high)
        if candidate >= 2 and all(candidate % d for d in range(2, math.isqrt(candidate) + 1)):
            return candidate


def _factorize(n: int) -> dict[int, int]:
    """Prime factorisation by trial division (n up to ~10^7 here)."""
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def _binomial_paths(dx: int, dy: int) -> int:
    """Monotone lattice paths covering a displacement (dx, dy); 0 when it goes backwards."""
    return math.comb(dx + dy, dx) if dx >= 0 and dy >= 0 else 0


def _poly_latex(coefficients: Sequence[int], variable: str = "x") -> str:
    """LaTeX for a polynomial given by coefficients from the highest degree down."""
    degree = len(coefficients) - 1
    terms = []
    for position, coefficient in enumerate(coefficients):
        power = degree - position
        if coefficient == 0:
            continue
        magnitude = abs(coefficient)
        if power == 0:
            body = str(magnitude)
        else:
            body = ("" if magnitude == 1 else str(magnitude)) + variable
            body += f"^{{{power}}}" if power > 1 else ""
        sign = "-" if coefficient < 0 else "+"
        terms.append((sign, body))
    if not terms:
        return "0"
    first_sign, first_body = terms[0]
    text = ("-" if first_sign == "-" else "") + first_body
    return text + "".join(f" {sign} {body}" for sign, body in terms[1:])


def _linear_latex(coefficients: Sequence[int], names: Sequence[str]) -> str:
    """LaTeX for the left side of a linear equation, e.g. ``3x - y + 2z``."""
    parts = []
    for coefficient, name in zip(coefficients, names):
        if coefficient == 0:
            continue
        magnitude = "" if abs(coefficient) == 1 else str(abs(coefficient))
        sign = "-" if coefficient < 0 else "+"
        parts.append((sign, magnitude + name))
    first_sign, first = parts[0]
    text = ("-" if first_sign == "-" else "") + first
    return text + "".join(f" {sign} {body}" for sign, body in parts[1:])


def _determinant(matrix: Sequence[Sequence[int]]) -> Fraction:
    """Exact determinant by Gaussian elimination over the rationals."""
    rows = [[Fraction(v) for v in row] for row in matrix]
    size, det = len(rows), Fraction(1)
    for col in range(size):
        pivot = next((r for r in range(col, size) if rows[r][col] != 0), None)
        if pivot is None:
            return Fraction(0)
        if pivot != col:
            rows[col], rows[pivot] = rows[pivot], rows[col]
            det = -det
        det *= rows[col][col]
        for r in range(col + 1, size):
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    return det


def _mod_clause(modulus: int | None) -> str:
    return f" Find the remainder when this number is divided by {modulus}." if modulus else ""


# --------------------------------------------------------------------------------------
# Problem kinds: each takes (rng, level) and returns a Problem
# --------------------------------------------------------------------------------------


def _arithmetic(rng: random.Random, level: int) -> Problem:
    low, high = {1: (2, 12), 2: (12, 99), 3: (1_000, 99_999)}[level]
    template = rng.choice(("stock", "savings", "tickets"))
    if template == "stock":
        crates, days, boxes, items = (rng.randint(low, high) for _ in range(4))
        total = crates * days * boxes * items
        shipped = rng.randint(1, total - 1)
        answer = total - shipped
        prompt = (
            f"A warehouse receives {crates} crates every day for {days} days. Each crate "
            f"holds {boxes} boxes and each box holds {items} items. Afterwards {shipped} "
            "items are shipped out. How many items remain in the warehouse?"
        )
        params = {
            "template": template,
            "crates": crates,
            "days": days,
            "boxes": boxes,
            "items": items,
            "shipped": shipped,
        }
    elif template == "savings":
        first, increase = rng.randint(low, high), rng.randint(1, high)
        weeks = rng.randint(3, 12) if level == 1 else rng.randint(13, 60 * level * level)
        answer = weeks * first + increase * weeks * (weeks - 1) // 2
        prompt = (
            f"Maya saves {first} dollars in the first week. Every week after that she saves "
            f"{increase} dollars more than in the week before. How many dollars has she "
            f"saved in total at the end of week {weeks}?"
        )
        params = {"template": template, "first": first, "increase": increase, "weeks": weeks}
    else:
        adults, children = rng.randint(low, high), rng.randint(low, high)
        adult_price = rng.randint(low, high) + rng.randint(1, 9)
        child_price = rng.randint(1, adult_price - 1)
        revenue = adults * adult_price + children * child_price
        costs = rng.randint(1, revenue - 1)
        answer = revenue - costs
        prompt = (
            f"A theater sold {adults} adult tickets at {adult_price} dollars each and "
            f"{children} child tickets at {child_price} dollars each. The show cost "
            f"{costs} dollars to put on. What was the theater's profit, in dollars?"
        )
        params = {
            "template": template,
            "adults": adults,
            "adult_price": adult_price,
            "children": children,
            "child_price": child_price,
            "costs": costs,
        }
    return Problem(prompt, answer, params)


def _divisor_sum(rng: random.Random, level: int) -> Problem:
    # Build N from chosen prime powers so the divisor sum follows from the formula
    # prod (p^(e+1) - 1) / (p - 1) without factoring.
    low, high = {1: (12, 200), 2: (1_000, 20_000), 3: (10**8, 10**10)}[level]
    primes_pool = _SMALL_PRIMES if level < 3 else (*_SMALL_PRIMES, 53, 59, 61, 67, 71, 73, 79)
    while True:
        factors: dict[int, int] = {}
        n = 1
        while n < low:
            p = rng.choice(primes_pool)
            if level == 3 and rng.random() < 0.35:
                p = _random_prime(rng, 100, 5_000)
            factors[p] = factors.get(p, 0) + 1
            n *= p
        if n <= high and len(factors) >= 2:
            break
    sigma = math.prod((p ** (e + 1) - 1) // (p - 1) for p, e in factors.items())
    modulus = 1000 if level == 3 else None
    prompt = f"Let $S$ be the sum of all positive divisors of ${n}$."
    prompt += (
        f" Find the remainder when $S$ is divided by ${modulus}$." if modulus else " Find $S$."
    )
    answer = sigma % modulus if modulus else sigma
    return Problem(prompt, answer, {"n": n, "modulus": modulus})


def _modular_power(rng: random.Random, level: int) -> Problem:
    if level == 1:
        base, exponent, modulus = rng.randint(2, 12), rng.randint(5, 20), rng.randint(7, 50)
    elif level == 2:
        base, exponent, modulus = rng.randint(2, 99), rng.randint(100, 2_000), rng.randint(100, 999)
    else:
        base = rng.randint(1_000, 99_999)
        exponent = rng.randint(10**9, 10**12)
        modulus = rng.randint(10_000, 999_999)
    answer = pow(base, exponent, modulus)
    prompt = f"Find the remainder when ${base}^{{{exponent}}}$ is divided by ${modulus}$."
    return Problem(prompt, answer, {"base": base, "exponent": exponent, "modulus": modulus})


def _gcd_lcm(rng: random.Random, level: int) -> Problem:
    if level == 1:
        common = rng.randint(2, 15)
        a, b = common * rng.randint(2, 13), common * rng.randint(2, 13)
        return Problem(
            f"Find the greatest common divisor of ${a}$ and ${b}$.",
            math.gcd(a, b),
            {"question": "gcd", "numbers": [a, b]},
        )
    if level == 2:
        numbers = rng.sample(range(6, 100), 3)
        return Problem(
            f"Find the least common multiple of ${numbers[0]}$, ${numbers[1]}$ and ${numbers[2]}$.",
            math.lcm(*numbers),
            {"question": "lcm", "numbers": numbers},
        )
    if rng.random() < 0.5:
        common = rng.randint(10**4, 10**7)
        a = common * rng.randint(10**4, 10**6)
        b = common * rng.randint(10**4, 10**6)
        return Problem(
            f"Find the greatest common divisor of ${a}$ and ${b}$.",
            math.gcd(a, b),
            {"question": "gcd", "numbers": [a, b]},
        )
    # Sum of gcd(k, n) over k <= n, from Pillai's formula sum_{d | n} d * phi(n / d).
    n = rng.randint(20_000, 100_000)
    factors = _factorize(n)
    divisors = [1]
    for p, e in factors.items():
        divisors = [d * p**k for d in divisors for k in range(e + 1)]

    def phi(m: int) -> int:
        result = m
        for p in factors:
            if m % p == 0:
                result -= result // p
        return result

    total = sum(d * phi(n // d) for d in divisors)
    return Problem(
        f"Compute $\\sum_{{k=1}}^{{{n}}} \\gcd(k, {n})$.",
        total,
        {"question": "gcd_sum", "n": n},
    )


def _prime_count(rng: random.Random, level: int) -> Problem:
    if level == 1:
        low = rng.randint(1, 60)
        high = low + rng.randint(20, 60)
    elif level == 2:
        low = rng.randint(100, 9_000)
        high = low + rng.randint(200, 1_000)
    else:
        low = rng.randint(10_000, 1_000_000)
        high = low + rng.randint(20_000, 100_000)
    sieve = _primes_up_to(high)
    answer = sum(sieve[low : high + 1])
    prompt = f"How many prime numbers $p$ satisfy ${low} \\le p \\le {high}$?"
    return Problem(prompt, answer, {"low": low, "high": high})


def _count_digit_condition(limit: int, digit: int, modulus: int, condition: str) -> int:
    """Count n in [1, limit] meeting ``condition`` with a digit DP over the decimal string.

    State: (digit sum mod ``modulus``, whether ``digit`` occurred, whether the number
    has started) while walking the digits of ``limit`` with a tight/loose flag.
    """
    digits = [int(c) for c in str(limit)]
    # counts[(tight, started, seen, residue)] = how many prefixes are in that state
    counts: dict[tuple[bool, bool, bool, int], int] = {(True, False, False, 0): 1}
    for position_digit in digits:
        next_counts: dict[tuple[bool, bool, bool, int], int] = {}
        for (tight, started, seen, residue), count in counts.items():
            for d in range((position_digit if tight else 9) + 1):
                now_started = started or d != 0
                state = (
                    tight and d == position_digit,
                    now_started,
                    seen or (now_started and d == digit),
                    (residue + d) % modulus,
                )
                next_counts[state] = next_counts.get(state, 0) + count
        counts = next_counts
    total = 0
    for (_tight, started, seen, residue), count in counts.items():
        if not started:
            continue  # the number 0
        ok = {
            "digit_sum": residue == 0,
            "avoid_digit": not seen,
            "has_digit_and_sum": seen and residue == 0,
        }[condition]
        total += count if ok else 0
    return total


def _digit_count(rng: random.Random, level: int) -> Problem:
    limit = {1: rng.randint(50, 200), 2: rng.randint(1_000, 9_999)}.get(level) or rng.randint(
        20_000, 300_000
    )
    condition = rng.choice(("digit_sum", "avoid_digit", "has_digit_and_sum"))
    digit, modulus = rng.randint(1, 9), rng.randint(3, 13)
    if condition == "digit_sum":
        description = f"whose sum of decimal digits is divisible by ${modulus}$"
        digit = -1
    elif condition == "avoid_digit":
        description = f"whose decimal representation does not contain the digit ${digit}$"
        modulus = 1
    else:
        description = (
            f"whose decimal representation contains the digit ${digit}$ at least once and "
            f"whose sum of decimal digits is divisible by ${modulus}$"
        )
    answer = _count_digit_condition(limit, digit, modulus, condition)
    prompt = f"How many integers $n$ with $1 \\le n \\le {limit}$ are there {description}?"
    params = {"limit": limit, "condition": condition, "digit": digit, "modulus": modulus}
    return Problem(prompt, answer, params)


def _lattice_paths(rng: random.Random, level: int) -> Problem:
    low, high, blocked_count = {1: (3, 5, 1), 2: (6, 10, 2), 3: (15, 30, 3)}[level]
    width, height = rng.randint(low, high), rng.randint(low, high)
    inner = [(x, y) for x in range(width + 1) for y in range(height + 1)]
    inner = [p for p in inner if p not in ((0, 0), (width, height))]
    blocked = sorted(rng.sample(inner, blocked_count))
    # f(P): paths from the origin to P avoiding every earlier blocked point, by
    # inclusion-exclusion over blocked points that can precede P.
    first_hits: list[int] = []
    for i, (px, py) in enumerate(blocked):
        ways = _binomial_paths(px, py)
        for j in range(i):
            qx, qy = blocked[j]
            ways -= first_hits[j] * _binomial_paths(px - qx, py - qy)
        first_hits.append(ways)
    total = _binomial_paths(width, height) - sum(
        hits * _binomial_paths(width - px, height - py)
        for hits, (px, py) in zip(first_hits, blocked)
    )
    modulus = 1000 if level == 3 else None
    points = ", ".join(f"$({x}, {y})$" for x, y in blocked)
    avoid = f"do not pass through the point {points}"
    if len(blocked) > 1:
        avoid = f"pass through none of the points {points}"
    prompt = (
        f"A lattice path from $(0, 0)$ to $({width}, {height})$ is a sequence of unit steps, "
        "each going one unit right or one unit up. Let $N$ be the number of such paths that "
        f"{avoid}."
    )
    prompt += (
        f" Find the remainder when $N$ is divided by ${modulus}$." if modulus else " Find $N$."
    )
    answer = total % modulus if modulus else total
    params = {"width": width, "height": height, "blocked": blocked, "modulus": modulus}
    return Problem(prompt, answer, params)


def _subset_sum(rng: random.Random, level: int) -> Problem:
    if level == 1:
        size = rng.randint(4, 6)
        elements = list(range(1, size + 1))
        modulus = rng.randint(3, 5)
    elif level == 2:
        elements = sorted(rng.sample(range(1, 51), rng.randint(8, 12)))
        modulus = rng.randint(3, 9)
    else:
        elements = sorted(rng.sample(range(1, 1001), rng.randint(16, 20)))
        modulus = rng.randint(7, 40)
    # counts[r] = number of subsets of the elements seen so far with sum = r (mod modulus)
    counts = [1] + [0] * (modulus - 1)
    for element in elements:
        counts = [counts[r] + counts[(r - element) % modulus] for r in range(modulus)]
    shown = ", ".join(map(str, elements))
    prompt = (
        f"Let $S = \\{{{shown}\\}}$. How many subsets of $S$, including the empty set, have "
        f"a sum of elements divisible by ${modulus}$?"
    )
    return Problem(prompt, counts[0], {"elements": elements, "modulus": modulus})


def _polynomial_roots(rng: random.Random, level: int) -> Problem:
    degree, bound = {1: (2, 9), 2: (3, 12), 3: (5, 30)}[level]
    candidates = [r for r in range(-bound, bound + 1) if r != 0]
    roots = sorted(rng.sample(candidates, degree))
    coefficients = [1]
    for root in roots:  # multiply by (x - root)
        coefficients = [
            a - root * b for a, b in zip([*coefficients, 0], [0, *coefficients], strict=True)
        ]
    question = rng.choice(("sum_of_squares", "sum_of_abs", "range"))
    asked = {
        "sum_of_squares": ("the sum of the squares of its roots", sum(r * r for r in roots)),
        "sum_of_abs": ("the sum of the absolute values of its roots", sum(map(abs, roots))),
        "range": ("the largest root minus the smallest root", max(roots) - min(roots)),
    }[question]
    prompt = (
        f"The polynomial $P(x) = {_poly_latex(coefficients)}$ has {degree} distinct integer "
        f"roots. Find {asked[0]}."
    )
    return Problem(prompt, asked[1], {"coefficients": coefficients, "question": question})


def _sum_of_multiples_below(limit: int, step: int) -> int:
    count = (limit - 1) // step
    return step * count * (count + 1) // 2


def _series_sum(rng: random.Random, level: int) -> Problem:
    limit = {1: rng.randint(20, 60), 2: rng.randint(300, 2_000)}.get(level) or rng.randint(
        100_000, 400_000
    )
    a, b = rng.sample(range(2, 10 if level == 1 else 30), 2)
    c = rng.choice([k for k in range(2, 12 if level == 1 else 40) if k not in (a, b)])
    # Inclusion-exclusion: multiples of a or b, minus those that are also multiples of c.
    union = (
        _sum_of_multiples_below(limit, a)
        + _sum_of_multiples_below(limit, b)
        - _sum_of_multiples_below(limit, math.lcm(a, b))
    )
    union_and_c = (
        _sum_of_multiples_below(limit, math.lcm(a, c))
        + _sum_of_multiples_below(limit, math.lcm(b, c))
        - _sum_of_multiples_below(limit, math.lcm(a, b, c))
    )
    total = union - union_and_c
    modulus = 1000 if level == 3 else None
    prompt = (
        f"Let $T$ be the sum of all positive integers less than ${limit}$ that are divisible "
        f"by ${a}$ or by ${b}$ but not by ${c}$."
    )
    prompt += (
        f" Find the remainder when $T$ is divided by ${modulus}$." if modulus else " Find $T$."
    )
    answer = total % modulus if modulus else total
    return Problem(prompt, answer, {"limit": limit, "a": a, "b": b, "c": c, "modulus": modulus})


_UNKNOWNS = ("x", "y", "z", "w")


def _linear_system(rng: random.Random, level: int) -> Problem:
    size, coefficient_bound, value_bound = {1: (2, 5, 9), 2: (3, 9, 9), 3: (4, 30, 50)}[level]
    names = _UNKNOWNS[:size]
    solution = [rng.choice([v for v in range(-value_bound, value_bound + 1) if v]) for _ in names]
    while True:
        matrix = [
            [rng.randint(-coefficient_bound, coefficient_bound) for _ in names] for _ in names
        ]
        if all(any(row) for row in matrix) and _determinant(matrix) != 0:
            break
    rhs = [sum(a * v for a, v in zip(row, solution)) for row in matrix]
    equations = ",\\quad ".join(
        f"{_linear_latex(row, names)} = {value}" for row, value in zip(matrix, rhs)
    )
    question = rng.choice(("product", "weighted_sum"))
    if question == "product":
        asked, answer = f"${''.join(names)}$", math.prod(solution)
    else:
        weighted = " + ".join(f"{i}{name}" if i > 1 else name for i, name in enumerate(names, 1))
        asked, answer = f"${weighted}$", sum(i * v for i, v in enumerate(solution, 1))
    prompt = (
        f"The real numbers {', '.join(f'${n}$' for n in names)} satisfy the system "
        f"$${equations}.$$ Find {asked}."
    )
    params = {"matrix": matrix, "rhs": rhs, "question": question}
    return Problem(prompt, answer, params)


def _expression(rng: random.Random, level: int) -> Problem:
    # Level 1: a x b + c with one-digit factors; 2: two-digit factors; 3: four- to
    # five-digit factors and a third term, far beyond mental arithmetic.
    factor_range, term_range = {1: ((2, 9), (1, 20)), 2: ((12, 99), (10, 999))}.get(
        level, ((1_000, 99_999), (1_000, 999_999))
    )
    a, b = (rng.randint(*factor_range) for _ in range(2))
    c = rng.randint(*term_range)
    sign = rng.choice(("+", "-"))
    value = a * b + c if sign == "+" else a * b - c
    terms = [f"{a} * {b}", f"{sign} {c}"]
    params: dict[str, Any] = {"a": a, "b": b, "c": c, "sign": sign}
    if level == 3:
        d, e = rng.randint(100, 999), rng.randint(100, 999)
        value += d * e
        terms.append(f"+ {d} * {e}")
        params.update(d=d, e=e)
    # Plain-text operators, as code would write them: the family tests whether an agent
    # hands arithmetic to Python, not whether it can read LaTeX.
    prompt = f"Compute {' '.join(terms)}."
    return Problem(prompt, value, params)


KINDS: dict[str, tuple[str, Callable[[random.Random, int], Problem]]] = {
    "arithmetic": ("arithmetic", _arithmetic),
    "divisor_sum": ("number_theory", _divisor_sum),
    "modular_power": ("number_theory", _modular_power),
    "gcd_lcm": ("number_theory", _gcd_lcm),
    "prime_count": ("number_theory", _prime_count),
    "digit_count": ("counting", _digit_count),
    "lattice_paths": ("counting", _lattice_paths),
    "subset_sum": ("counting", _subset_sum),
    "polynomial_roots": ("algebra", _polynomial_roots),
    "series_sum": ("algebra", _series_sum),
    "linear_system": ("algebra", _linear_system),
    "expression": ("arithmetic", _expression),
    **{kind: ("word_problem", build) for kind, build in WORD_KINDS.items()},
}
"""Problem kinds: name -> (category, builder)."""

# Spelled out, not derived from KINDS: a kind added later must not change the tasks that
# the default rotation gives every existing seed.
DEFAULT_KINDS: tuple[str, ...] = (
    "arithmetic",
    "divisor_sum",
    "modular_power",
    "gcd_lcm",
    "prime_count",
    "digit_count",
    "lattice_paths",
    "subset_sum",
    "polynomial_roots",
    "series_sum",
    "linear_system",
)
"""Kinds used when none are named: the competition-style ones, in a fixed order."""


def _level_of(difficulty: str | int) -> int | None:
    """Level 1-3 for a difficulty name or number; None for ``"mixed"``."""
    if isinstance(difficulty, bool):
        raise ValueError(f"difficulty must be a name or 1-3, got {difficulty!r}")
    if isinstance(difficulty, int):
        if difficulty in (1, 2, 3):
            return difficulty
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
    name = str(difficulty).lower()
    if name == "mixed":
        return None
    if name in DIFFICULTY_LEVELS:
        return DIFFICULTY_LEVELS[name]
    raise ValueError(
        f"unknown difficulty {difficulty!r}; use one of {[*DIFFICULTY_LEVELS, 'mixed']} or 1-3"
    )


def _leaks_answer(prompt: str, answer: int) -> bool:
    """Whether a multi-character answer appears as a standalone number in the prompt."""
    text = str(answer)
    if len(text) < 2:
        return False
    return re.search(rf"(?<![\d.]){re.escape(text)}(?!\d|\.\d)", prompt) is not None


#: Most problems one call generates (about 0.1 ms each: ten seconds' work); ten million
#: took minutes with nothing said.
MAX_GENERATED_TASKS = 100_000


def _stream_key(secret: str, seed: int, index: int) -> str:
    """The key of task ``index``'s random stream; without a secret, the pre-secret key."""
    if not secret:
        return f"mappa-math-generator:{seed}:{index}"
    return f"mappa-math-generator:{secret}:{seed}:{index}"


def generate_math_tasks(
    n: int,
    seed: int = 0,
    kinds: Sequence[str] | None = None,
    difficulty: str | int = "mixed",
    secret: str | None = None,
) -> list[MathTask]:
    """Generate ``n`` math problems with integer answers computed by code.

    Kinds are used in turn (task ``i`` has kind ``kinds[i % len(kinds)]``). A draw
    whose answer (two or more characters) appears as a number in its own prompt is
    redrawn, so no prompt gives its answer away.

    Args:
        n: Number of tasks, at most :data:`MAX_GENERATED_TASKS`.
        seed: Seed; the same arguments always give the same tasks.
        kinds: Kinds to use (see :data:`KINDS`); :data:`DEFAULT_KINDS` when None.
        difficulty: ``"easy"``, ``"medium"``, ``"hard"`` (or 1, 2, 3), or ``"mixed"``
            to draw a level per task.
        secret: Mixed into every task's random stream so that the public seed alone
            does not determine the tasks. ``None`` (default) takes the user's secret
            (:func:`~mappa_env.tasks.secret.user_task_secret`: the same tasks on one
            machine, others elsewhere); a string pins the tasks for everyone who uses
            it (reproducible runs; agents never see it); ``""`` gives the unsalted tasks
            of earlier versions, which anyone can rebuild from the seed.

    Returns:
        Tasks with ids ``gen-s<seed>-<index>`` (index zero-padded to 5 digits, the same
        whatever the secret) and
        metadata ``source="generator"``, ``seed``, ``kind``, ``category``,
        ``difficulty`` (1-3), ``needs_code`` (True for level 3) and ``params`` (the
        numbers the problem was built from).

    Raises:
        ValueError: For ``n`` outside ``[0, MAX_GENERATED_TASKS]``, an unknown kind or
            difficulty.
        TypeError: For an ``n`` that is not an integer, a ``secret`` that is not a string.
    """
    n, chosen, fixed_level, secret = _checked(n, kinds, difficulty, secret)
    return [_task(index, seed, chosen, fixed_level, secret) for index in range(n)]


def _checked(
    n: int, kinds: Sequence[str] | None, difficulty: str | int, secret: str | None
) -> tuple[int, list[str], int | None, str]:
    """``n``, the kinds, the fixed level and the secret of a call, checked."""
    n = integer_option(
        "n",
        n,
        low=0,
        high=MAX_GENERATED_TASKS,
        hint=f"generating takes about 0.1 ms a problem ({MAX_GENERATED_TASKS:,} in ~10 s)",
    )
    chosen = list(kinds) if kinds is not None else list(DEFAULT_KINDS)
    unknown = [kind for kind in chosen if kind not in KINDS]
    if unknown or not chosen:
        raise ValueError(f"unknown kinds {unknown or '(none given)'}; choose from {list(KINDS)}")
    fixed_level = _level_of(difficulty)
    if secret is None:
        secret = user_task_secret()
    if not isinstance(secret, str):
        raise TypeError(f"secret must be a string or None, got {type(secret).__name__}")
    return n, chosen, fixed_level, secret


def _task(index: int, seed: int, kinds: Sequence[str], level: int | None, secret: str) -> MathTask:
    """Task ``index`` of ``seed``: drawn from its own random stream."""
    kind = kinds[index % len(kinds)]
    category, build = KINDS[kind]
    # A string seed is hashed deterministically (not with PYTHONHASHSEED).
    rng = random.Random(_stream_key(secret, seed, index))
    level = level or rng.choice((1, 2, 3))
    for _ in range(100):
        problem = build(rng, level)
        if not _leaks_answer(problem.prompt, problem.answer):
            break
    else:
        raise RuntimeError(f"could not draw a {kind} problem that hides its answer")
    return MathTask(
        id=f"gen-s{seed}-{index:05d}",
        prompt=problem.prompt,
        answer=str(problem.answer),
        metadata={
            "source": "generator",
            "seed": seed,
            "kind": kind,
            "category": category,
            "difficulty": level,
            "needs_code": level == 3,
            "params": problem.params,
        },
    )


def problem_identity(task: MathTask) -> tuple[str, str] | None:
    """What makes a generated problem the same problem: its kind, template and numbers.

    Two tasks with one identity state the same arithmetic in the same template; only
    the names and objects of the story may differ (a paraphrase, not an unseen
    problem). Read from the generator's record of the draw (``metadata["kind"]`` and
    ``metadata["params"]``, which holds the template and every number), not from the
    text.

    Returns:
        ``(kind, params as sorted JSON)``; ``None`` for a task the generator did not make.
    """
    params = task.metadata.get("params")
    if task.metadata.get("source") != "generator" or not isinstance(params, Mapping):
        return None
    return str(task.metadata.get("kind")), json.dumps(params, sort_keys=True)


def generate_unseen_tasks(
    n: int,
    seen: Iterable[MathTask],
    seed: int = 0,
    kinds: Sequence[str] | None = None,
    difficulty: str | int = "mixed",
    secret: str | None = None,
    max_draws: int = MAX_GENERATED_TASKS,
) -> list[MathTask]:
    """``n`` generated problems, none of them a problem of ``seen`` and none repeated.

    Tasks of ``seed`` are drawn in order, as :func:`generate_math_tasks` draws them, and
    a task is skipped when its :func:`problem_identity` (kind, template and numbers) is
    one of ``seen``'s or of a task kept before it: held-out problems that are not
    paraphrases of training ones. Task ids keep the index of the draw
    (``gen-s<seed>-<index>``).

    Args:
        n: Number of tasks.
        seen: Tasks none of the result may repeat, e.g. a run's training set.
        seed: As :func:`generate_math_tasks`.
        kinds: As :func:`generate_math_tasks`.
        difficulty: As :func:`generate_math_tasks`.
        secret: As :func:`generate_math_tasks`.
        max_draws: Tasks drawn at most before giving up.

    Raises:
        ValueError: When ``max_draws`` draws do not give ``n`` unseen problems (the
            family's space is nearly covered by ``seen``), and as
            :func:`generate_math_tasks`.
    """
    n, chosen, fixed_level, secret = _checked(n, kinds, difficulty, secret)
    taken = {identity for task in seen if (identity := problem_identity(task)) is not None}
    tasks: list[MathTask] = []
    draws = min(max_draws, MAX_GENERATED_TASKS)
    for index in range(draws):
        if len(tasks) == n:
            break
        task = _task(index, seed, chosen, fixed_level, secret)
        identity = problem_identity(task)
        if identity not in taken:
            taken.add(identity)  # type: ignore[arg-type]  # generated tasks have one
            tasks.append(task)
    if len(tasks) < n:
        raise ValueError(
            f"only {len(tasks)} of the {n} problems asked for are unseen in "
            f"{draws:,} draws of seed {seed}: ask for fewer, or draw them from another "
            "difficulty or kinds"
        )
    return tasks
