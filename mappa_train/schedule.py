"""The learning-rate schedule: a multiplier of ``lr`` per rollout step (no state to save)."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["warmup_cosine"]


def warmup_cosine(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warm-up, then cosine decay to 0 over ``total_steps``.

    ``f(s) = (s + 1) / w`` for ``s < w = ceil(warmup_ratio * total)``, else
    ``0.5 * (1 + cos(pi * (s - w) / (total - w)))``.
    """
    warmup = max(1, math.ceil(warmup_ratio * total_steps)) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        span = max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / span)))

    return factor
