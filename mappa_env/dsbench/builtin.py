"""Built-in DSBench tasks: moved to :mod:`mappa_env.envs.dsbench.builtin`.

Its names are re-exported here for one release.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.builtin import (
    BUILTIN_PROMPTS_FILE,
    BUILTIN_TASK_NAMES,
    FEATURE_NOISE,
    ID_COLUMN,
    KEPT_ROWS,
    MAX_MIXING_WEIGHT,
    TARGET_NOISE,
    BuiltinTaskSet,
    builtin_tasks,
)

__all__ = [
    "BUILTIN_PROMPTS_FILE",
    "BUILTIN_TASK_NAMES",
    "FEATURE_NOISE",
    "ID_COLUMN",
    "KEPT_ROWS",
    "MAX_MIXING_WEIGHT",
    "TARGET_NOISE",
    "BuiltinTaskSet",
    "builtin_tasks",
]
