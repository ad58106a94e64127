"""Checks of numeric constructor options: one message shape for every option.

An option that is the wrong type or out of range stops the constructor with the option's
name, the value given, the allowed range and, where it helps, what to pass instead; a
value is never silently rounded (``turns=2.7`` is refused, not read as 2) and never
NaN or infinite unless the option says so.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

#: Largest seed accepted. Seeds are 64-bit words: torch.manual_seed refuses larger ones,
#: so a seed an environment took would fail later in a trainer that reuses it.
MAX_SEED = 2**64 - 1


def _number_text(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _range_text(low: float, high: float | None, *, low_open: bool = False) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {_number_text(low)}"
    return f"in {'(' if low_open else '['}{_number_text(low)}, {_number_text(high)}]"


def integer_option(
    name: str, value: Any, *, low: int = 1, high: int | None = None, hint: str = ""
) -> int:
    """``value`` as an ``int`` in ``[low, high]``, or an error naming ``name``.

    Integers of any integer type pass (numpy's too); bools, floats (even ``2.0``) and
    strings do not.

    Args:
        name: The option's name, as the caller spells it.
        value: What was given.
        low: Smallest allowed value.
        high: Largest allowed value (``None``: no bound).
        hint: A sentence appended to the message (what to pass instead).

    Returns:
        The value as an ``int``.

    Raises:
        TypeError: For a value that is not an integer.
        ValueError: For an integer out of range.
    """
    allowed = f"an integer {_range_text(low, high)}"
    suffix = f"; {hint}" if hint else ""
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: {name} must be {allowed}, not a bool{suffix}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name}={value!r}: {name} must be {allowed}, got {type(value).__name__}{suffix}"
        ) from None
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name}={number!r} is out of range: {name} must be {allowed}{suffix}")
    return number


def number_option(
    name: str,
    value: Any,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a finite ``float`` in its range, or an error naming ``name``.

    Args:
        name: The option's name.
        value: What was given (any real number but a bool; not a string).
        low: Lower bound.
        high: Upper bound (``None``: any finite value above ``low``).
        low_open: Exclude ``low`` itself (``code_timeout_s`` must be above 0).
        hint: A sentence appended to the message.

    Returns:
        The value as a ``float``.

    Raises:
        TypeError: For a value that is not a real number.
        ValueError: For NaN, an infinity or a number out of range.
    """
    allowed = f"a finite number {_range_text(low, high, low_open=low_open)}"
    suffix = f"; {hint}" if hint else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name}={value!r}: {name} must be {allowed}, got {type(value).__name__}{suffix}"
        )
    number = float(value)
    below = number <= low if low_open else number < low
    if not math.isfinite(number) or below or (high is not None and number > high):
        raise ValueError(f"{name}={number!r} is out of range: {name} must be {allowed}{suffix}")
    return number


def seed_option(value: Any, name: str = "seed") -> int | None:
    """``value`` as a seed: ``None`` or an integer in ``[0, MAX_SEED]``.

    Args:
        name: The option's name (``"seed"``).
        value: What was given.

    Returns:
        The seed as an ``int``, or ``None``.

    Raises:
        TypeError: For a value that is not an integer (a bool or a float included).
        ValueError: For a negative seed or one above :data:`MAX_SEED`.
    """
    if value is None:
        return None
    return integer_option(
        name, value, low=0, high=MAX_SEED, hint="or None for a random one (seeds are 64-bit)"
    )
