"""DSBench metrics and scoring: moved to :mod:`mappa_env.envs.dsbench`.

The metric registry is :mod:`mappa_env.envs.dsbench.metrics`, the scorer
:mod:`mappa_env.envs.dsbench.scoring`, fair values and the skill of predictions
:mod:`mappa_env.envs.dsbench.outcomes`, the score caps :mod:`mappa_env.envs.dsbench.caps`.
This module re-exports their names for one release.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.caps import (
    FAILED_SUBMISSION_CAP,
    MIN_REGRESSION_SKILL,
    outcome_cap,
    skill_cap,
)
from mappa_env.envs.dsbench.metrics import (
    METRIC_ALIASES,
    METRICS,
    InputType,
    Metric,
    MetricKind,
    Score,
    get_metric,
    map_at_k,
    mcrmse,
    metric_names,
    normalized_gini,
    smape,
    word_jaccard,
)
from mappa_env.envs.dsbench.outcomes import (
    MIN_SKILL_ROWS,
    fair_percent_of_range,
    fair_value,
    percent_of_range,
    prediction_skill,
)
from mappa_env.envs.dsbench.scoring import (
    CONSTANT_LABELS_TRIED,
    MAX_COLUMNS,
    MAX_HEADER_BYTES,
    canonical_ids,
    normalize_value,
    read_answers,
    score_submission,
)

__all__ = [
    "CONSTANT_LABELS_TRIED",
    "FAILED_SUBMISSION_CAP",
    "MAX_COLUMNS",
    "MAX_HEADER_BYTES",
    "METRICS",
    "METRIC_ALIASES",
    "MIN_REGRESSION_SKILL",
    "MIN_SKILL_ROWS",
    "InputType",
    "Metric",
    "MetricKind",
    "Score",
    "canonical_ids",
    "fair_percent_of_range",
    "fair_value",
    "get_metric",
    "map_at_k",
    "mcrmse",
    "metric_names",
    "normalize_value",
    "normalized_gini",
    "outcome_cap",
    "percent_of_range",
    "prediction_skill",
    "read_answers",
    "score_submission",
    "skill_cap",
    "smape",
    "word_jaccard",
]
