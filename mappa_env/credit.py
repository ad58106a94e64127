r"""Credit assignment: the reward each action is trained on, owned by the environment.

An environment turns its coach's verdicts and the episode's outcome into one reward per
action under its ``credit_mode``; ``env.rewards``, the trajectories, the saved rollouts
and a trainer's loss all read that one number. Given an episode's actions
``a_0..a_{n-1}`` (all agents, in order), their coach scores scaled to [0, 1] ``s_i``
(``None`` when the coach's verdict was invalid), the episode's outcome reward ``o`` in
[0, 1] and, for ``agent_oracle``, whether the acting agent's own final answer was right
``c_i`` in {0, 1}:

- ``process`` (the paper): ``r_i = s_i``, the coach's graded judgement of the action.
- ``outcome`` (the paper's baseline): ``r_i = o`` for every action: one shared signal.
- ``agent_oracle``: ``r_i = c_i``: each agent is paid for its own final answer by the
  ground truth, 1 or 0. It gives credit per agent without a graded judgement, so
  comparing it with ``process`` tells "credit per agent" apart from "the coach's
  grading", and comparing it with ``outcome`` measures what per-agent credit alone buys.
- ``mixed``: ``r_i = (1 - w) s_i + w o``.
- ``backprop`` (toward the paper's future work: blame passed backward from the outcome
  to upstream agents): the final action is re-scored by the verified outcome, and each
  upstream action moves toward it by a share of the final coach's error that decays
  with distance: ``e = o - s_{n-1}``, ``r_i = clip(s_i + lambda^(n-1-i) e, 0, 1)`` (so
  ``r_{n-1} = o``). Without a valid final score there is no error to pass back.

An action whose own coach score is invalid gets ``None`` in every mode that uses its
score: it is masked out of a loss, never filled in with a made-up value.

During an episode an environment pays each action its **provisional** reward
(:func:`provisional_reward`: the part known when the action is taken) and at the end the
difference to the final reward, so an agent's cumulative return is the sum of its
actions' final rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

CreditMode = Literal["process", "outcome", "mixed", "backprop", "agent_oracle"]
CREDIT_MODES: tuple[str, ...] = ("process", "outcome", "mixed", "backprop", "agent_oracle")
#: Modes whose rewards use the coach's scores (the others need no coach at all).
COACH_MODES: tuple[str, ...] = ("process", "mixed", "backprop")


def check_credit(mode: str, outcome_weight: float = 0.5, backprop_decay: float = 0.5) -> None:
    """Refuse an unknown mode or a weight outside [0, 1], naming the setting.

    Raises:
        ValueError: With the allowed values.
    """
    if mode not in CREDIT_MODES:
        raise ValueError(f"unknown credit mode {mode!r}; use one of {CREDIT_MODES}")
    for name, value in (("outcome_weight", outcome_weight), ("backprop_decay", backprop_decay)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if not 0.0 <= value <= 1.0:  # also refuses NaN
            raise ValueError(f"{name} must be in [0, 1], got {value}")


def provisional_reward(score: float | None, mode: str, outcome_weight: float = 0.5) -> float | None:
    """The reward an action gets when it is taken, before the episode's outcome is known.

    ``process`` and ``backprop``: ``s``; ``mixed``: ``(1 - w) s``; ``outcome`` and
    ``agent_oracle``: ``0`` (everything they pay is known only at the end).

    Args:
        score: The action's coach score in [0, 1], ``None`` when invalid.
        mode: The credit mode.
        outcome_weight: ``w`` of ``mixed``.

    Returns:
        The reward, or ``None`` when it rests on an invalid score.
    """
    if mode in ("outcome", "agent_oracle"):
        return 0.0
    if score is None:
        return None
    return (1.0 - outcome_weight) * score if mode == "mixed" else score


def episode_action_rewards(
    scores: Sequence[float | None],
    outcome: float,
    mode: str = "process",
    outcome_weight: float = 0.5,
    backprop_decay: float = 0.5,
    agent_correct: Sequence[float | None] | None = None,
) -> list[float | None]:
    """Final rewards of one finished episode's actions (see the module docstring).

    Args:
        scores: Coach scores of the actions in [0, 1], in episode order; ``None`` = invalid.
        outcome: The episode's outcome reward in [0, 1].
        mode: One of :data:`CREDIT_MODES`.
        outcome_weight: ``w`` of ``mixed``.
        backprop_decay: ``lambda`` of ``backprop``.
        agent_correct: ``agent_oracle`` only: per action, 1.0 when the acting agent's own
            final answer is right, else 0.0 (``None``: the environment could not tell).

    Returns:
        One reward (or ``None``: masked) per action.

    Raises:
        ValueError: For an unknown mode, out-of-range weights, or ``agent_oracle``
            without one correctness value per action.
    """
    check_credit(mode, outcome_weight, backprop_decay)
    if mode == "process":
        return list(scores)
    if mode == "outcome":
        return [float(outcome)] * len(scores)
    if mode == "agent_oracle":
        if agent_correct is None or len(agent_correct) != len(scores):
            raise ValueError(
                "agent_oracle credit needs whether each acting agent's own final answer "
                "was right: the environment's episode_outcome() must return "
                "'agent_correct': {agent: bool} for every agent that acted"
            )
        return [None if c is None else float(c) for c in agent_correct]
    if mode == "mixed":
        return [
            None if s is None else (1.0 - outcome_weight) * s + outcome_weight * outcome
            for s in scores
        ]
    if not scores:
        return []
    last = scores[-1]
    if last is None:
        return list(scores)
    error = outcome - last
    n = len(scores)
    return [
        None if s is None else min(1.0, max(0.0, s + backprop_decay ** (n - 1 - i) * error))
        for i, s in enumerate(scores)
    ]
