r"""An agent's own final number: one reading for the rules coach and the environment.

The MathChat rules coach judges each agent by the number it gave, and
:meth:`mappa_env.envs.mathchat.MathChatEnv.episode_outcome` records that number per
agent (``agent_answers`` / ``agent_correct``). Both read it with these functions, so a
coach verdict and an outcome cannot disagree about what an agent answered.

* :func:`stated_answer`: the answer a message states (its boxed answer, else an
  "the answer is N" phrase; several different boxed answers or a placeholder box are
  no answer, see :func:`mappa_env.envs.mathchat.grading.extract_boxed`).
* :func:`last_number` / :func:`numbers_in`: the numbers written in a text, such as the
  output of code.
* :func:`printed_answer`: the last number printed over several code runs.
* :func:`code_executor_answer`: what a code-running agent answered: the number its
  code printed last, else what its final message states.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mappa_env.envs.mathchat.grading import extract_boxed

# Thousands separators are part of a number ("1,000"); a minus sign right before the
# digits is its sign. A fraction written with a slash is one number ("3/4").
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def numbers_in(text: str) -> list[str]:
    """Every number written in ``text``, in order, thousands separators removed.

    Args:
        text: Any text (code output, a problem statement).

    Returns:
        The numbers as written (``"-3"``, ``"2.5"``, ``"3/4"``, ``"1000"`` for
        ``1,000``); empty for text without one.
    """
    return [match.replace(",", "") for match in _NUMBER.findall(text)]


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (see :func:`numbers_in`), or None."""
    numbers = numbers_in(text)
    return numbers[-1] if numbers else None


def stated_answer(text: str | None, *, fallback: bool = True) -> str | None:
    r"""The final answer a message states.

    Args:
        text: An agent's message; reasoning in ``<think>`` blocks is ignored.
        fallback: Also accept "the answer is N" / "final answer: N" when nothing is
            boxed.

    Returns:
        The boxed answer (one answer: ``\boxed{42} \boxed{6534}`` gives None), else
        with ``fallback`` the phrase's answer, else None.
    """
    if not text:
        return None
    return extract_boxed(text, fallback=fallback)


def printed_answer(stdouts: Iterable[str | None]) -> str | None:
    """The last number printed by the most recent run that printed one.

    A run that printed its number and then raised still printed it; a later run that
    printed no number does not hide an earlier one.

    Args:
        stdouts: The standard output of each code run, oldest first (None for a turn
            that ran no code).

    Returns:
        That number, or None when no run printed one.
    """
    answer = None
    for stdout in stdouts:
        number = last_number(stdout or "")
        if number is not None:
            answer = number
    return answer


def code_executor_answer(stdouts: Iterable[str | None], final_message: str | None) -> str | None:
    """What an agent that runs code answered: its code's number, else its words.

    Args:
        stdouts: The standard output of each of its code runs, oldest first.
        final_message: Its last message (the answer it handed on when its code printed
            no number).

    Returns:
        :func:`printed_answer` of ``stdouts``, else :func:`stated_answer` of
        ``final_message`` (boxed or a phrase), else None.
    """
    return printed_answer(stdouts) or stated_answer(final_message)
