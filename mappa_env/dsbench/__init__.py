"""DSBench data-modelling tasks: scoring submissions and producing tasks.

- :mod:`mappa_env.dsbench.metrics`: the metric registry and :func:`score_submission`,
  which joins a submission to the hidden answers by id and scores every target column.
- :mod:`mappa_env.dsbench.tasks`: :class:`DSBenchTask` and :func:`load_dsbench_tasks` for
  the real DSBench directory layout.
- :mod:`mappa_env.dsbench.builtin`: :func:`builtin_tasks`, offline tasks written at run
  time from scikit-learn's bundled datasets (disguised, so that test rows cannot be
  looked up) and synthetic data, all keyed by a secret as well as the seed.
"""

from mappa_env.dsbench.builtin import BUILTIN_TASK_NAMES, BuiltinTaskSet, builtin_tasks
from mappa_env.dsbench.metrics import (
    FAILED_SUBMISSION_CAP,
    METRIC_ALIASES,
    METRICS,
    Metric,
    Score,
    fair_percent_of_range,
    fair_value,
    get_metric,
    metric_names,
    normalize_value,
    outcome_cap,
    percent_of_range,
    prediction_skill,
    score_submission,
    skill_cap,
)
from mappa_env.dsbench.tasks import (
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
