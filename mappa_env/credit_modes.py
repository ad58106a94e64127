"""The built-in credit modes: ``process``, ``outcome``, ``mixed``, ``backprop``, ``agent_oracle``.

Each is a :class:`~mappa_env.credit.CreditRule` that :mod:`mappa_env.credit` registers by
import path and loads on first use; the module docstring there gives their formulas. A
mode of one's own is a file like this one with one rule, registered with
:func:`~mappa_env.credit.register_credit_mode`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mappa_env.credit import CreditRule, CreditSettings

__all__ = ["AGENT_ORACLE", "BACKPROP", "MIXED", "OUTCOME", "PROCESS"]


def _score(score: float | None, credit: CreditSettings) -> float | None:
    # process and backprop: the coach's score; the end pays the rest.
    return score


def _nothing_yet(score: float | None, credit: CreditSettings) -> float | None:
    # outcome and agent_oracle: everything they pay is known only at the end.
    return 0.0


def _mixed_now(score: float | None, credit: CreditSettings) -> float | None:
    if score is None:
        return None
    return (1.0 - credit.outcome_weight) * score


def _process(
    scores: Sequence[float | None],
    outcome: float,
    credit: CreditSettings,
    agent_correct: Sequence[float | None] | None,
) -> list[float | None]:
    return list(scores)


def _outcome(
    scores: Sequence[float | None],
    outcome: float,
    credit: CreditSettings,
    agent_correct: Sequence[float | None] | None,
) -> list[float | None]:
    return [float(outcome)] * len(scores)


def _agent_oracle(
    scores: Sequence[float | None],
    outcome: float,
    credit: CreditSettings,
    agent_correct: Sequence[float | None] | None,
) -> list[float | None]:
    if agent_correct is None or len(agent_correct) != len(scores):
        raise ValueError(
            "agent_oracle credit needs whether each acting agent's own final answer "
            "was right: the environment's episode_outcome() must return "
            "'agent_correct': {agent: bool} for every agent that acted"
        )
    return [None if c is None else float(c) for c in agent_correct]


def _mixed(
    scores: Sequence[float | None],
    outcome: float,
    credit: CreditSettings,
    agent_correct: Sequence[float | None] | None,
) -> list[float | None]:
    outcome_weight = credit.outcome_weight
    return [
        None if s is None else (1.0 - outcome_weight) * s + outcome_weight * outcome for s in scores
    ]


def _backprop(
    scores: Sequence[float | None],
    outcome: float,
    credit: CreditSettings,
    agent_correct: Sequence[float | None] | None,
) -> list[float | None]:
    if not scores:
        return []
    last = scores[-1]
    if last is None:
        return list(scores)
    error = outcome - last
    n = len(scores)
    backprop_decay = credit.backprop_decay
    return [
        None if s is None else min(1.0, max(0.0, s + backprop_decay ** (n - 1 - i) * error))
        for i, s in enumerate(scores)
    ]


PROCESS = CreditRule(_score, _process, uses_coach=True)
"""``r_i = s_i``: the coach's graded judgement of the action (the paper)."""

OUTCOME = CreditRule(_nothing_yet, _outcome, uses_coach=False)
"""``r_i = o`` for every action: one shared signal (the paper's baseline)."""

MIXED = CreditRule(_mixed_now, _mixed, uses_coach=True, weights=("outcome_weight",))
"""``r_i = (1 - w) s_i + w o``."""

BACKPROP = CreditRule(_score, _backprop, uses_coach=True, weights=("backprop_decay",))
"""``r_i = clip(s_i + lambda^(n-1-i) (o - s_{n-1}), 0, 1)``: the outcome's error with
the final coach score passed back upstream, decaying with distance."""

AGENT_ORACLE = CreditRule(_nothing_yet, _agent_oracle, uses_coach=False, needs_agent_correct=True)
"""``r_i = c_i``: whether the acting agent's own final answer is right, 1 or 0."""
