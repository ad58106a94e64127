"""DSBench data-modelling tasks: moved to :mod:`mappa_env.envs.dsbench`.

The environment's package holds its tasks, scoring and caps; this package and its
modules (``mappa_env.dsbench.metrics``, ``.tasks``, ``.builtin``, ``.inspections``,
``.reference``, ``.audit``) re-export their names for one release:

- :mod:`mappa_env.envs.dsbench.metrics` and :mod:`mappa_env.envs.dsbench.scoring`: the
  metric registry and :func:`score_submission`, which joins a submission to the hidden
  answers by id and scores every target column;
- :mod:`mappa_env.envs.dsbench.tasks`: :class:`DSBenchTask` and
  :func:`load_dsbench_tasks` for the real DSBench directory layout;
- :mod:`mappa_env.envs.dsbench.builtin`: :func:`builtin_tasks`, offline tasks written at
  run time from scikit-learn's bundled datasets and synthetic data.
"""

from mappa_env.envs.dsbench.builtin import BUILTIN_TASK_NAMES, BuiltinTaskSet, builtin_tasks
from mappa_env.envs.dsbench.caps import FAILED_SUBMISSION_CAP, outcome_cap, skill_cap
from mappa_env.envs.dsbench.metrics import (
    METRIC_ALIASES,
    METRICS,
    Metric,
    Score,
    get_metric,
    metric_names,
)
from mappa_env.envs.dsbench.outcomes import (
    fair_percent_of_range,
    fair_value,
    percent_of_range,
    prediction_skill,
)
from mappa_env.envs.dsbench.scoring import normalize_value, score_submission
from mappa_env.envs.dsbench.tasks import (
    BENCH_DIR_ENV,
    DSBenchTask,
    find_bench_dir,
    load_dsbench_tasks,
    read_cleaned_prompts,
    read_task_list,
)

__all__ = [
    "BENCH_DIR_ENV",
    "BUILTIN_TASK_NAMES",
    "FAILED_SUBMISSION_CAP",
    "METRICS",
    "METRIC_ALIASES",
    "BuiltinTaskSet",
    "DSBenchTask",
    "Metric",
    "Score",
    "builtin_tasks",
    "fair_percent_of_range",
    "fair_value",
    "find_bench_dir",
    "get_metric",
    "load_dsbench_tasks",
    "metric_names",
    "normalize_value",
    "outcome_cap",
    "percent_of_range",
    "prediction_skill",
    "read_cleaned_prompts",
    "read_task_list",
    "score_submission",
    "skill_cap",
]
