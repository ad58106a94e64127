"""DSBench-v0's rules-coach rubric: moved to :mod:`mappa_env.envs.dsbench.rubric`.

Its names are re-exported here for one release.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.rubric import (
    MIN_TRAIN_SKILL,
    dsbench_rubric,
    engineer_problems,
    model_problems,
)

# Its name here, where it was private.
from mappa_env.envs.dsbench.rubric import cross_validated as _cross_validated  # noqa: F401

__all__ = [
    "MIN_TRAIN_SKILL",
    "dsbench_rubric",
    "engineer_problems",
    "model_problems",
]
