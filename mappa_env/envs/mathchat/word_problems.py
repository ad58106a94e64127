"""Everyday word problems for small models: the generator's ``word_*`` kinds.

Each family states a short story in words ("A baker makes 7 trays of 12 rolls and
sells 30 of them. How many rolls are left?"), so no prompt is a Python expression: an
agent has to turn the words into arithmetic itself, instead of copying the problem
into a ``print``. Every family has several templates (phrasings and question types),
chosen per problem and recorded in ``params["template"]``, and three levels:

* 1: one or two steps on one-digit numbers;
* 2: two or three steps on two-digit numbers;
* 3: the same stories with four- to six-digit numbers, where arithmetic by hand is
  impractical and an agent has to compute.

``word_one_step`` is the exception: one operation at every level (the same stories
with larger numbers), for models that cannot yet chain two.

Answers are positive integers computed from the drawn numbers, and never equal a
number the prompt states (one-digit answers included: a model that boxes a number
of the prompt must not be right by chance).

Builders take ``(rng, level)`` and return a :class:`~mappa_env.envs.mathchat.problem.Problem`,
like the generator's other kinds; :data:`WORD_KINDS` maps each kind to its builder.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from mappa_env.envs.mathchat.problem import Problem

_PEOPLE = (
    ("Ana", "she"),
    ("Ben", "he"),
    ("Carla", "she"),
    ("Dev", "he"),
    ("Emma", "she"),
    ("Farid", "he"),
    ("Grace", "she"),
    ("Hugo", "he"),
    ("Iris", "she"),
    ("Jon", "he"),
    ("Kim", "she"),
    ("Leo", "he"),
    ("Nadia", "she"),
    ("Omar", "he"),
    ("Priya", "she"),
    ("Sam", "he"),
)

_MAX_DRAWS = 1_000

_Draw = Callable[[random.Random, int], tuple[str, int, dict[str, Any]]]


def _numbers_stated(prompt: str) -> set[int]:
    """Every integer written in ``prompt`` (numbers are written as plain digits)."""
    return {int(text) for text in re.findall(r"\d+", prompt)}


def _hidden(draw: _Draw, rng: random.Random, level: int) -> Problem:
    """Draw until the answer is positive and is none of the numbers the prompt states."""
    for _ in range(_MAX_DRAWS):
        prompt, answer, params = draw(rng, level)
        if answer > 0 and answer not in _numbers_stated(prompt):
            return Problem(prompt, answer, params)
    raise RuntimeError(f"{draw.__name__}: no draw in {_MAX_DRAWS} hid its answer")


# --------------------------------------------------------------------------------------
# word_change: shopping, change and budgets
# --------------------------------------------------------------------------------------

_GOODS = (
    ("notebook", "notebooks"),
    ("pen", "pens"),
    ("ticket", "tickets"),
    ("sandwich", "sandwiches"),
    ("toy car", "toy cars"),
    ("book", "books"),
    ("cup", "cups"),
    ("plant", "plants"),
)
_CHANGE_TEMPLATES = ("change", "left", "budget", "short")


def _draw_change(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    count_range, price_range = {1: ((2, 5), (2, 9)), 2: ((3, 12), (5, 40))}.get(
        level, ((100, 999), (1_000, 9_999))
    )
    template = rng.choice(_CHANGE_TEMPLATES)
    name, pronoun = rng.choice(_PEOPLE)
    # One kind of item at level 1 (two steps: a product, then a difference); two kinds
    # from level 2 on (a sum of products first).
    goods = rng.sample(_GOODS, 1 if level == 1 else 2)
    counts = [rng.randint(*count_range) for _ in goods]
    prices = [rng.randint(*price_range) for _ in goods]
    cost = sum(c * p for c, p in zip(counts, prices))
    purchase = " and ".join(
        f"{count} {plural} at {price} dollars each"
        for count, (_singular, plural), price in zip(counts, goods, prices)
    )
    if template == "short":
        money = cost - rng.randint(1, max(1, cost // 2))
        answer = cost - money
        prompt = (
            f"{name} wants to buy {purchase}, but {pronoun} has only {money} dollars. "
            f"How many more dollars does {pronoun} need?"
        )
    else:
        # Round sums of money, as people pay and budget.
        step = {1: 10, 2: 50}.get(level, 10_000)
        money = (cost // step + 1 + rng.randint(0, 3)) * step
        answer = money - cost
        if template == "change":
            prompt = (
                f"{name} buys {purchase} and pays with {money} dollars. "
                f"How many dollars of change does {pronoun} get?"
            )
        elif template == "left":
            prompt = (
                f"{name} has {money} dollars and buys {purchase}. "
                f"How many dollars does {pronoun} have left?"
            )
        else:
            prompt = (
                f"{name}'s club has {money} dollars to spend. It buys {purchase}. "
                "How many dollars of its money are not spent?"
            )
    params = {"template": template, "counts": counts, "prices": prices, "money": money}
    return prompt, answer, params


def _word_change(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_change, rng, level)


# --------------------------------------------------------------------------------------
# word_sharing: equal sharing, division with a remainder
# --------------------------------------------------------------------------------------

_SHARED_THINGS = ("marbles", "stickers", "cookies", "coins", "seeds", "crayons")
_CONTAINERS = (("bag", "bags"), ("box", "boxes"), ("basket", "baskets"), ("team", "teams"))
_TRAVELLERS = ("students", "fans", "tourists", "campers")
_VEHICLES = (("bus", "buses"), ("van", "vans"), ("boat", "boats"))
_SHARING_TEMPLATES = ("leftover", "each", "full", "needed")


def _draw_sharing(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    divisor_range, quotient_range = {1: ((2, 9), (2, 9)), 2: ((6, 30), (10, 60))}.get(
        level, ((100, 9_999), (1_000, 99_999))
    )
    template = rng.choice(_SHARING_TEMPLATES)
    name, pronoun = rng.choice(_PEOPLE)
    divisor, quotient = rng.randint(*divisor_range), rng.randint(*quotient_range)
    # A remainder of 0 would make "left over" trivial and "needed" a plain quotient.
    remainder = rng.randint(1, divisor - 1)
    total = divisor * quotient + remainder
    things = rng.choice(_SHARED_THINGS)
    if template == "leftover":
        answer = remainder
        prompt = (
            f"{name} shares {total} {things} equally among {divisor} friends, giving each "
            f"friend as many as possible. How many {things} are left over?"
        )
    elif template == "each":
        container, containers = rng.choice(_CONTAINERS)
        answer = quotient
        prompt = (
            f"{name} splits {total} {things} equally between {divisor} {containers}, with "
            f"as many as possible in each. How many {things} does each {container} get?"
        )
    elif template == "full":
        answer = quotient
        prompt = (
            f"{name} packs {total} {things} into boxes of {divisor}. "
            f"How many boxes can {pronoun} fill completely?"
        )
    else:
        travellers = rng.choice(_TRAVELLERS)
        vehicle, vehicles = rng.choice(_VEHICLES)
        answer = quotient + 1
        prompt = (
            f"{name} takes {total} {travellers} on a trip, and each {vehicle} carries "
            f"{divisor} {travellers}. How many {vehicles} are needed to carry all of them?"
        )
    return prompt, answer, {"template": template, "total": total, "divisor": divisor}


def _word_sharing(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_sharing, rng, level)


# --------------------------------------------------------------------------------------
# word_rates: work, speed and flow rates
# --------------------------------------------------------------------------------------

_PRODUCERS = (
    ("printer", "prints", "print", "pages"),
    ("machine", "fills", "fill", "bottles"),
    ("workshop", "builds", "build", "chairs"),
    ("bakery", "bakes", "bake", "loaves"),
)
_WORKERS = (("pack", "boxes"), ("plant", "trees"), ("bake", "pies"), ("fold", "shirts"))
_TRAVEL = ("car", "train", "bus", "boat", "bike")
_RATE_TEMPLATES = ("output", "trip", "team", "fill")


def _draw_rates(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    rate_range, time_range, crew_range, start_range = {
        1: ((2, 9), (2, 9), (2, 5), (1, 20)),
        2: ((12, 60), (6, 30), (3, 12), (10, 200)),
    }.get(level, ((1_000, 9_999), (100, 999), (12, 99), (1_000, 99_999)))
    template = rng.choice(_RATE_TEMPLATES)
    name, pronoun = rng.choice(_PEOPLE)
    rate, time = rng.randint(*rate_range), rng.randint(*time_range)
    params: dict[str, Any] = {"template": template, "rate": rate}
    if template == "output":
        subject, verb, verb_base, things = rng.choice(_PRODUCERS)
        answer = rate * time
        prompt = (
            f"{name}'s {subject} {verb} {rate} {things} every minute. "
            f"How many {things} does it {verb_base} in {time} minutes?"
        )
        params["time"] = time
    elif template == "trip":
        distance = rate * time
        answer = time
        prompt = (
            f"{name} travels {rate} kilometers every hour by {rng.choice(_TRAVEL)}. "
            f"How many hours does {pronoun} take to travel {distance} kilometers?"
        )
        params["distance"] = distance
    elif template == "team":
        crew = rng.randint(*crew_range)
        verb, things = rng.choice(_WORKERS)
        answer = crew * rate * time
        prompt = (
            f"In {name}'s team, {crew} workers each {verb} {rate} {things} per hour. "
            f"How many {things} do they {verb} together in {time} hours?"
        )
        params.update(crew=crew, time=time)
    else:
        start = rng.randint(*start_range)
        capacity = start + rate * time
        answer = time
        prompt = (
            f"{name}'s tank holds {capacity} liters and already contains {start} liters. "
            f"Water flows in at {rate} liters per minute. After how many minutes is the "
            "tank full?"
        )
        params.update(capacity=capacity, start=start)
    return prompt, answer, params


def _word_rates(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_rates, rng, level)


# --------------------------------------------------------------------------------------
# word_ages: ages now, then and later
# --------------------------------------------------------------------------------------

_AGE_TEMPLATES = ("older_future", "times_past", "future_past", "sum_difference")


def _draw_ages(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    # Level 3 counts in days, where ages have four or five digits.
    age_range, gap_range, years_range, factor_range, unit = {
        1: ((4, 15), (2, 9), (2, 9), (2, 4), "years"),
        2: ((16, 60), (10, 40), (10, 30), (2, 6), "years"),
    }.get(level, ((1_000, 30_000), (1_000, 20_000), (100, 9_999), (2, 9), "days"))
    template = rng.choice(_AGE_TEMPLATES)
    (first, _), (second, _) = rng.sample(_PEOPLE, 2)
    age, gap, years = rng.randint(*age_range), rng.randint(*gap_range), rng.randint(*years_range)
    params: dict[str, Any] = {"template": template, "unit": unit}
    if template == "older_future":
        answer = age + gap + years
        prompt = (
            f"{first} is {age} {unit} old. {second} is {gap} {unit} older than {first}. "
            f"How many {unit} old will {second} be {years} {unit} from now?"
        )
        params.update(age=age, gap=gap, years=years)
    elif template == "times_past":
        factor = rng.randint(*factor_range)
        years = rng.randint(1, factor * age - 1) if years >= factor * age else years
        answer = factor * age - years
        prompt = (
            f"{second} is {age} {unit} old, and {first} is {factor} times as old as "
            f"{second}. How many {unit} old was {first} {years} {unit} ago?"
        )
        params.update(age=age, factor=factor, years=years)
    elif template == "future_past":
        ago = rng.randint(1, age - 1)
        later = age + years
        answer = age - ago
        prompt = (
            f"In {years} {unit}, {first} will be {later} {unit} old. "
            f"How many {unit} old was {first} {ago} {unit} ago?"
        )
        params.update(years=years, later=later, ago=ago)
    else:
        together = 2 * age + gap
        answer = age
        prompt = (
            f"{first} and {second} are {together} {unit} old together, and {first} is "
            f"{gap} {unit} older than {second}. How many {unit} old is {second}?"
        )
        params.update(together=together, gap=gap)
    return prompt, answer, params


def _word_ages(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_ages, rng, level)


# --------------------------------------------------------------------------------------
# word_units: unit conversion
# --------------------------------------------------------------------------------------

# (large unit, small unit, small units per large unit, things measured in them), each
# thing as (singular, plural, verb, words after the amount).
_MEASURES = (
    (
        "hours",
        "minutes",
        60,
        (("movie", "movies", "lasts", ""), ("bus ride", "bus rides", "takes", "")),
    ),
    (
        "minutes",
        "seconds",
        60,
        (("song", "songs", "lasts", ""), ("phone call", "phone calls", "lasts", "")),
    ),
    (
        "meters",
        "centimeters",
        100,
        (("rope", "ropes", "is", " long"), ("ribbon", "ribbons", "is", " long")),
    ),
    (
        "kilograms",
        "grams",
        1000,
        (("bag of rice", "bags of rice", "weighs", ""), ("parcel", "parcels", "weighs", "")),
    ),
    (
        "liters",
        "milliliters",
        1000,
        (("jug", "jugs", "holds", ""), ("bucket", "buckets", "holds", "")),
    ),
    (
        "weeks",
        "days",
        7,
        (("holiday", "holidays", "lasts", ""), ("course", "courses", "lasts", "")),
    ),
    (
        "days",
        "hours",
        24,
        (("journey", "journeys", "takes", ""), ("festival", "festivals", "lasts", "")),
    ),
    (
        "kilometers",
        "meters",
        1000,
        (("trail", "trails", "is", " long"), ("bike ride", "bike rides", "is", " long")),
    ),
)
_UNIT_TEMPLATES = ("to_small", "mixed", "to_large", "several")


def _draw_units(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    amount_range, count_range = {1: ((2, 9), (2, 5)), 2: ((10, 99), (3, 12))}.get(
        level, ((1_000, 99_999), (100, 999))
    )
    template = rng.choice(_UNIT_TEMPLATES)
    large, small, factor, measured = rng.choice(_MEASURES)
    thing, things, verb, after = rng.choice(measured)
    # An owner's name multiplies the phrasings, so that small numbers still give enough
    # distinct problems for disjoint training and held-out sets.
    name, _pronoun = rng.choice(_PEOPLE)
    amount = rng.randint(*amount_range)
    # The conversion factor is never stated: knowing it is part of the problem.
    params: dict[str, Any] = {"template": template, "large": large, "small": small}
    if template == "to_small":
        answer = amount * factor
        prompt = f"{name}'s {thing} {verb} {amount} {large}{after}. How many {small} is that?"
        params["amount"] = amount
    elif template == "mixed":
        extra = rng.randint(1, factor - 1)
        answer = amount * factor + extra
        prompt = (
            f"{name}'s {thing} {verb} {amount} {large} and {extra} {small}{after}. "
            f"How many {small} is that in all?"
        )
        params.update(amount=amount, extra=extra)
    elif template == "to_large":
        answer = amount
        prompt = (
            f"{name}'s {thing} {verb} {amount * factor} {small}{after}. How many {large} is that?"
        )
        params["small_amount"] = amount * factor
    else:
        count = rng.randint(*count_range)
        answer = count * amount * factor
        prompt = (
            f"{name} has {count} {things}, and each {verb} {amount} {large}{after}. "
            f"How many {small} is that altogether?"
        )
        params.update(count=count, amount=amount)
    return prompt, answer, params


def _word_units(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_units, rng, level)


# --------------------------------------------------------------------------------------
# word_totals: multi-step totals
# --------------------------------------------------------------------------------------

_TOTAL_TEMPLATES = ("bakery", "library", "legs", "packs")
# How many legs each has is not stated: knowing it is part of the problem.
_FOUR_LEGGED = ("cows", "horses", "goats", "sheep", "pigs")
_TWO_LEGGED = ("chickens", "ducks", "geese")


def _draw_totals(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    factor_range = {1: (2, 9), 2: (10, 60)}.get(level, (1_000, 9_999))
    extra_range = {1: (1, 20), 2: (10, 200)}.get(level, (1_000, 99_999))
    template = rng.choice(_TOTAL_TEMPLATES)
    name, _pronoun = rng.choice(_PEOPLE)
    first, second = rng.randint(*factor_range), rng.randint(*factor_range)
    if template == "bakery":
        sold = rng.randint(1, first * second - 1)
        baked = rng.choice(("rolls", "muffins", "cookies"))
        answer = first * second - sold
        prompt = (
            f"{name} bakes {first} trays of {second} {baked} and sells {sold} of them. "
            f"How many {baked} are left?"
        )
        params = {"template": template, "trays": first, "per_tray": second, "sold": sold}
    elif template == "library":
        bought = rng.randint(*extra_range)
        given = rng.randint(1, first * second)
        answer = first * second + bought - given
        prompt = (
            f"{name}'s library has {first} shelves with {second} books on each. It buys "
            f"{bought} new books and gives away {given} old ones. How many books does it "
            "have now?"
        )
        params = {
            "template": template,
            "shelves": first,
            "per_shelf": second,
            "bought": bought,
            "given": given,
        }
    elif template == "legs":
        four_legged, two_legged = rng.choice(_FOUR_LEGGED), rng.choice(_TWO_LEGGED)
        answer = 4 * first + 2 * second
        prompt = (
            f"{name}'s farm has {first} {four_legged} and {second} {two_legged}. "
            "How many legs do the animals have in total?"
        )
        params = {"template": template, "four_legged": first, "two_legged": second}
    else:
        third, fourth = rng.randint(*factor_range), rng.randint(*factor_range)
        answer = first * second + third * fourth
        prompt = (
            f"{name}'s school orders {first} packs of {second} pencils and {third} packs of "
            f"{fourth} erasers. How many pencils and erasers does it get in all?"
        )
        params = {"template": template, "packs": [[first, second], [third, fourth]]}
    return prompt, answer, params


def _word_totals(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_totals, rng, level)


# --------------------------------------------------------------------------------------
# word_one_step: one operation
# --------------------------------------------------------------------------------------

_COUNTED = (
    "apples",
    "stickers",
    "marbles",
    "cards",
    "pencils",
    "shells",
    "coins",
    "books",
    "stamps",
    "beads",
    "balloons",
    "crayons",
    "buttons",
    "toy cars",
    "cookies",
    "feathers",
)
# Verbs and containers vary too: with one-digit numbers, the words are what keeps the
# problems of different seeds apart.
_GAINS = ("gets", "finds", "buys")
_LOSSES = ("gives {} of them away", "loses {} of them", "sells {} of them")
_BAGS = (("bag", "bags"), ("box", "boxes"), ("jar", "jars"), ("basket", "baskets"))
_SHARERS = ("friends", "cousins", "classmates")
_ONE_STEP_TEMPLATES = ("more", "give_away", "groups", "share")


def _draw_one_step(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    # The simplest stories: one addition, subtraction, multiplication or exact division,
    # for models that cannot yet chain two steps.
    small_range, large_range = {1: ((2, 9), (10, 20)), 2: ((11, 99), (100, 999))}.get(
        level, ((1_000, 99_999), (100_000, 9_999_999))
    )
    template = rng.choice(_ONE_STEP_TEMPLATES)
    name, pronoun = rng.choice(_PEOPLE)
    things = rng.choice(_COUNTED)
    first, second = rng.randint(*small_range), rng.randint(*small_range)
    if template == "more":
        answer = first + second
        prompt = (
            f"{name} has {first} {things}. {pronoun.capitalize()} {rng.choice(_GAINS)} "
            f"{second} more. How many {things} does {pronoun} have now?"
        )
        params = {"template": template, "first": first, "second": second}
    elif template == "give_away":
        total = rng.randint(*large_range)
        answer = total - second
        prompt = (
            f"{name} has {total} {things} and {rng.choice(_LOSSES).format(second)}. "
            f"How many {things} does {pronoun} have left?"
        )
        params = {"template": template, "total": total, "given": second}
    elif template == "groups":
        answer = first * second
        bag, bags = rng.choice(_BAGS)
        prompt = (
            f"{name} has {first} {bags} with {second} {things} in each {bag}. "
            f"How many {things} does {pronoun} have in all?"
        )
        params = {"template": template, "bags": first, "per_bag": second}
    else:
        answer = first
        sharers = rng.choice(_SHARERS)
        prompt = (
            f"{name} shares {first * second} {things} equally among {second} {sharers}. "
            f"How many {things} does each of them get?"
        )
        params = {"template": template, "total": first * second, "friends": second}
    return prompt, answer, params


def _word_one_step(rng: random.Random, level: int) -> Problem:
    return _hidden(_draw_one_step, rng, level)


WORD_KINDS: dict[str, Callable[[random.Random, int], Problem]] = {
    "word_change": _word_change,
    "word_sharing": _word_sharing,
    "word_rates": _word_rates,
    "word_ages": _word_ages,
    "word_units": _word_units,
    "word_totals": _word_totals,
    "word_one_step": _word_one_step,
}
"""Word-problem kinds: name -> builder (all in the ``word_problem`` category)."""


# --------------------------------------------------------------------------------------
# Solutions: each kind's answer as arithmetic on the numbers the problem states
# --------------------------------------------------------------------------------------

#: Small units per large unit, by (large, small): the facts ``word_units`` never states.
UNIT_FACTORS = {(large, small): factor for large, small, factor, _ in _MEASURES}


def _cost(p: Mapping[str, Any]) -> str:
    """``word_change``: what the purchase costs, as a sum of count * price."""
    return " + ".join(f"{c} * {q}" for c, q in zip(p["counts"], p["prices"]))


def _factor(p: Mapping[str, Any]) -> int:
    """``word_units``: small units per large unit."""
    return UNIT_FACTORS[(p["large"], p["small"])]


_Solution = Callable[[Mapping[str, Any]], str]

#: Kind -> template -> the answer as arithmetic on the problem's parameters.
_SOLUTIONS: dict[str, dict[str, _Solution]] = {
    "word_change": {
        "change": lambda p: f"{p['money']} - ({_cost(p)})",
        "left": lambda p: f"{p['money']} - ({_cost(p)})",
        "budget": lambda p: f"{p['money']} - ({_cost(p)})",
        "short": lambda p: f"({_cost(p)}) - {p['money']}",
    },
    "word_sharing": {
        "leftover": lambda p: f"{p['total']} % {p['divisor']}",
        "each": lambda p: f"{p['total']} // {p['divisor']}",
        "full": lambda p: f"{p['total']} // {p['divisor']}",
        # Never an exact division: the last vehicle carries the remainder.
        "needed": lambda p: f"{p['total']} // {p['divisor']} + 1",
    },
    "word_rates": {
        "output": lambda p: f"{p['rate']} * {p['time']}",
        "trip": lambda p: f"{p['distance']} // {p['rate']}",
        "team": lambda p: f"{p['crew']} * {p['rate']} * {p['time']}",
        "fill": lambda p: f"({p['capacity']} - {p['start']}) // {p['rate']}",
    },
    "word_ages": {
        "older_future": lambda p: f"{p['age']} + {p['gap']} + {p['years']}",
        "times_past": lambda p: f"{p['factor']} * {p['age']} - {p['years']}",
        "future_past": lambda p: f"{p['later']} - {p['years']} - {p['ago']}",
        "sum_difference": lambda p: f"({p['together']} - {p['gap']}) // 2",
    },
    "word_units": {
        "to_small": lambda p: f"{p['amount']} * {_factor(p)}",
        "mixed": lambda p: f"{p['amount']} * {_factor(p)} + {p['extra']}",
        "to_large": lambda p: f"{p['small_amount']} // {_factor(p)}",
        "several": lambda p: f"{p['count']} * {p['amount']} * {_factor(p)}",
    },
    "word_totals": {
        "bakery": lambda p: f"{p['trays']} * {p['per_tray']} - {p['sold']}",
        "library": lambda p: f"{p['shelves']} * {p['per_shelf']} + {p['bought']} - {p['given']}",
        "legs": lambda p: f"4 * {p['four_legged']} + 2 * {p['two_legged']}",
        "packs": lambda p: " + ".join(f"{a} * {b}" for a, b in p["packs"]),
    },
    "word_one_step": {
        "more": lambda p: f"{p['first']} + {p['second']}",
        "give_away": lambda p: f"{p['total']} - {p['given']}",
        "groups": lambda p: f"{p['bags']} * {p['per_bag']}",
        "share": lambda p: f"{p['total']} // {p['friends']}",
    },
}


def solution_expression(kind: str, params: Mapping[str, Any]) -> str | None:
    """A word problem's answer as a Python expression of the numbers its story states.

    For honest actions where a coach audit needs them (the problem worked out, code that
    computes the answer rather than printing it): integers, ``+ - * // %`` and
    parentheses. Besides the story's numbers it writes only what a reader supplies: the
    conversion factors of ``word_units`` (60, 24, 1000, ...) and the constants of a
    story's logic (one more vehicle, two and four legs, half of a sum).

    Args:
        kind: A generated task's ``metadata["kind"]``.
        params: Its ``metadata["params"]``.

    Returns:
        The expression, e.g. ``"(3 * 12 + 2 * 5) - 50"``; ``None`` for a kind that is not
        a word problem.
    """
    by_template = _SOLUTIONS.get(kind)
    if by_template is None:
        return None
    # An unknown template is a new phrasing without its arithmetic: KeyError, not a guess.
    return by_template[params["template"]](params)
