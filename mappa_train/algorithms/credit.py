r"""Credit assignment: the scalar reward each action is trained on.

Given an episode's actions ``a_0..a_{n-1}`` (all agents, in order), their coach scores
scaled to [0, 1] ``s_i`` (``None`` when the coach's verdict was invalid) and the
episode's outcome reward ``o`` in [0, 1]:

- ``process`` (the paper): ``r_i = s_i``.
- ``outcome``: ``r_i = o`` for every action (the outcome-only ablation).
- ``mixed``: ``r_i = (1 - w) s_i + w o``.
- ``backprop`` (an extension toward the paper's future work: passing blame backward from
  the outcome to upstream agents): the final action is re-scored by the verified outcome,
  and each upstream action moves toward it by a share of the final coach's error that
  decays with distance: ``e = o - s_{n-1}``,
  ``r_i = clip(s_i + lambda^(n-1-i) e, 0, 1)`` (so ``r_{n-1} = o``). If the coach was
  wrong about the last action, upstream scores that agreed with it are corrected too.

An action whose own coach score is invalid gets ``None`` in every mode that uses its
score: it is masked out of the loss, never filled in with a made-up value.
"""

from __future__ import annotations

from collections.abc import Sequence

CREDIT_MODES = ("process", "outcome", "mixed", "backprop")


def episode_action_rewards(
    scores: Sequence[float | None],
    outcome: float,
    mode: str = "process",
    outcome_weight: float = 0.5,
    backprop_decay: float = 0.5,
) -> list[float | None]:
    """Rewards of one episode's actions under a credit mode (see the module docstring).

    Args:
        scores: Coach scores of the actions in [0, 1], in episode order; ``None`` = invalid.
        outcome: The episode's outcome reward in [0, 1].
        mode: ``"process"``, ``"outcome"``, ``"mixed"`` or ``"backprop"``.
        outcome_weight: ``w`` of ``mixed``.
        backprop_decay: ``lambda`` of ``backprop``.

    Returns:
        One reward (or ``None``: masked) per action.

    Raises:
        ValueError: For an unknown mode or out-of-range weights.
    """
    if mode not in CREDIT_MODES:
        raise ValueError(f"unknown credit mode {mode!r}; use one of {CREDIT_MODES}")
    if not 0.0 <= outcome_weight <= 1.0:
        raise ValueError(f"outcome_weight must be in [0, 1], got {outcome_weight}")
    if not 0.0 <= backprop_decay <= 1.0:
        raise ValueError(f"backprop_decay must be in [0, 1], got {backprop_decay}")
    if mode == "process":
        return list(scores)
    if mode == "outcome":
        return [float(outcome)] * len(scores)
    if mode == "mixed":
        return [
            None if s is None else (1.0 - outcome_weight) * s + outcome_weight * outcome
            for s in scores
        ]
    if not scores:
        return []
    last = scores[-1]
    if last is None:
        # Without the final coach score there is no error to pass back.
        return list(scores)
    error = outcome - last
    n = len(scores)
    return [
        None if s is None else min(1.0, max(0.0, s + backprop_decay ** (n - 1 - i) * error))
        for i, s in enumerate(scores)
    ]
