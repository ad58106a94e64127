"""DSBench tasks: moved to :mod:`mappa_env.envs.dsbench.tasks` (re-exported here for one release).

The built-in tasks (:func:`builtin_tasks`, :data:`BUILTIN_TASK_NAMES`) are re-exported
too, from :mod:`mappa_env.envs.dsbench.builtin`.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.builtin import (
    BUILTIN_TASK_NAMES,
    builtin_tasks,
)
from mappa_env.envs.dsbench.tasks import (
    ANSWERS_FILE,
    BENCH_DIR_ENV,
    CLEANED_PROMPTS_FILE,
    KNOWN_PROMPT_ISSUES,
    TASK_LIST_FILES,
    DSBenchTask,
    find_bench_dir,
    load_dsbench_tasks,
    read_cleaned_prompts,
    read_task_list,
)

__all__ = [
    "ANSWERS_FILE",
    "BENCH_DIR_ENV",
    "BUILTIN_TASK_NAMES",
    "CLEANED_PROMPTS_FILE",
    "KNOWN_PROMPT_ISSUES",
    "TASK_LIST_FILES",
    "DSBenchTask",
    "builtin_tasks",
    "find_bench_dir",
    "load_dsbench_tasks",
    "read_cleaned_prompts",
    "read_task_list",
]
