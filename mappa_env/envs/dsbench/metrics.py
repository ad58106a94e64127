"""DSBench metrics: the registry of scoring metrics and the :class:`Score` record.

A :class:`Metric` says how a column is read, which value is perfect and what a no-skill
guess scores; :func:`get_metric` finds one by its name or an alias. The scorer that joins
a submission to the hidden answers by id and applies them is
:mod:`mappa_env.envs.dsbench.scoring`; what a score is worth (the paper's fair values,
the coach's caps) is in :mod:`mappa_env.envs.dsbench.outcomes` and
:mod:`mappa_env.envs.dsbench.caps`.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import stats
from sklearn import metrics as skm

logger = logging.getLogger(__name__)

MetricKind = Literal["classification", "regression", "ranking", "text"]
"""What a metric judges: class labels or probabilities, numbers, ranked label lists, or text."""

InputType = Literal["labels", "ordinal", "probabilities", "numeric", "ranked_labels", "text"]
"""How a column is read before a metric sees it (see :class:`Metric`)."""


# ----------------------------------------------------------------------------------------
# Metrics written here (the rest come from scikit-learn and scipy)
# ----------------------------------------------------------------------------------------


def smape(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Symmetric mean absolute percentage error, in percent (0 to 200, lower is better).

    ``SMAPE = 100 / n * sum_i |F_i - A_i| / ((|A_i| + |F_i|) / 2)`` with ``A`` the answers,
    ``F`` the forecasts, and a term of 0 where ``A_i = F_i = 0`` (Kaggle's convention).

    Args:
        y_true: True values ``A``.
        y_pred: Predicted values ``F``, same length.

    Returns:
        The SMAPE in percent.
    """
    actual = np.asarray(y_true, dtype=float)
    forecast = np.asarray(y_pred, dtype=float)
    denominator = (np.abs(actual) + np.abs(forecast)) / 2.0
    difference = np.abs(forecast - actual)
    ratio = np.divide(
        difference, denominator, out=np.zeros_like(difference), where=denominator != 0
    )
    return float(100.0 * ratio.mean())


def mcrmse(y_true: Any, y_pred: Any) -> float:
    """Mean column-wise root mean squared error (lower is better).

    ``MCRMSE = 1 / m * sum_j sqrt(1 / n * sum_i (y_ij - p_ij) ** 2)`` over ``m`` target
    columns and ``n`` rows: the RMSE of each column, averaged over columns.

    Args:
        y_true: True values, shape ``(n,)`` or ``(n, m)``.
        y_pred: Predictions, same shape.

    Returns:
        The MCRMSE.
    """
    truth = np.asarray(y_true, dtype=float)
    predicted = np.asarray(y_pred, dtype=float)
    if truth.ndim == 1:
        truth, predicted = truth[:, None], predicted[:, None]
    per_column = np.sqrt(np.mean((truth - predicted) ** 2, axis=0))
    return float(per_column.mean())


def _split_labels(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    return [str(item) for item in value]


def map_at_k(actual: Sequence[Any], predicted: Sequence[Any], k: int = 3) -> float:
    """Mean average precision at ``k`` (MAP@k, 0 to 1, higher is better).

    For one row with relevant labels ``R`` and a ranked prediction list ``P`` (first ``k``
    entries, a label counted only at its first occurrence)::

        AP@k = 1 / min(|R|, k) * sum_{i=1..k} precision@i * [P_i in R]

    and ``MAP@k`` is the mean of ``AP@k`` over rows. With one true label per row (the
    usual Kaggle case) a row scores ``1 / rank`` of the true label, or 0 when it is not
    among the first ``k`` predictions.

    Args:
        actual: Per row, the relevant label(s): a whitespace-separated string or a list.
        predicted: Per row, the ranked predictions: a whitespace-separated string or a list.
        k: How many predictions count.

    Returns:
        The MAP@k.

    Raises:
        ValueError: If ``k < 1`` or the inputs differ in length.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if len(actual) != len(predicted):
        raise ValueError(f"length mismatch: {len(actual)} answers vs {len(predicted)} predictions")
    if len(actual) == 0:
        return 0.0
    total = 0.0
    for relevant_value, predicted_value in zip(actual, predicted, strict=True):
        relevant = set(_split_labels(relevant_value))
        if not relevant:
            continue
        seen: set[str] = set()
        hits = 0
        precision_sum = 0.0
        for rank, label in enumerate(_split_labels(predicted_value)[:k], start=1):
            if label in relevant and label not in seen:
                hits += 1
                precision_sum += hits / rank
            seen.add(label)
        total += precision_sum / min(len(relevant), k)
    return total / len(actual)


def _gini(y_true: np.ndarray, y_score: np.ndarray) -> float:
    # Rows sorted by score, highest first; rows with tied scores form one step of the
    # Lorenz curve so that the result does not depend on row order.
    order = np.argsort(-y_score, kind="stable")
    sorted_scores = y_score[order]
    sorted_truth = y_true[order]
    n = len(sorted_truth)
    group_ends = np.flatnonzero(np.r_[sorted_scores[1:] != sorted_scores[:-1], True])
    y_truth_cumsum = np.cumsum(sorted_truth)[group_ends] / sorted_truth.sum()
    x_share = (group_ends + 1) / n
    previous_x = np.r_[0.0, x_share[:-1]]
    previous_y = np.r_[0.0, y_truth_cumsum[:-1]]
    area = np.sum((x_share - previous_x) * (y_truth_cumsum + previous_y) / 2.0)
    return float(area - 0.5)


def normalized_gini(y_true: Sequence[float], y_score: Sequence[float]) -> float:
    """Normalized Gini coefficient (-1 to 1, higher is better; Porto Seguro's metric).

    Sort rows by predicted score, highest first, and let ``L(x)`` be the share of the total
    of ``y_true`` held by the top ``x`` share of rows (the Lorenz curve). Then::

        Gini(y, s) = integral_0^1 L(x) dx - 1/2        (trapezoid rule over rows)
        NormalizedGini = Gini(y, score) / Gini(y, y)

    Rows with tied scores are one trapezoid, so ties count half, as in ROC-AUC; for a
    binary target the result equals ``2 * ROC-AUC - 1``.

    Args:
        y_true: Non-negative true values (0/1 for a binary target), not all zero.
        y_score: Predicted scores; only their order matters.

    Returns:
        The normalized Gini coefficient.

    Raises:
        ValueError: If the true values are all zero, negative, or all equal.
    """
    truth = np.asarray(y_true, dtype=float)
    score = np.asarray(y_score, dtype=float)
    if truth.shape != score.shape or truth.ndim != 1:
        raise ValueError("y_true and y_score must be 1-D arrays of the same length")
    if (truth < 0).any() or truth.sum() <= 0:
        raise ValueError("normalized Gini needs non-negative true values with a positive sum")
    best = _gini(truth, truth)
    if best == 0:
        raise ValueError("normalized Gini is undefined when all true values are equal")
    return _gini(truth, score) / best


def word_jaccard(y_true: Sequence[str], y_pred: Sequence[str]) -> float:
    """Mean word-level Jaccard similarity of two lists of texts (0 to 1, higher is better).

    For each row, with ``A`` and ``B`` the sets of lower-cased whitespace-separated words of
    the answer and the prediction: ``J = |A & B| / |A | B|``, and ``J = 1`` when both are
    empty. The result is the mean of ``J`` over rows (the tweet-sentiment-extraction metric).

    Args:
        y_true: Answer texts.
        y_pred: Predicted texts, same length.

    Returns:
        The mean Jaccard similarity.

    Raises:
        ValueError: If the inputs differ in length.
    """
    if len(y_true) != len(y_pred):
        raise ValueError(f"length mismatch: {len(y_true)} answers vs {len(y_pred)} predictions")
    if len(y_true) == 0:
        return 0.0
    total = 0.0
    for truth_text, predicted_text in zip(y_true, y_pred, strict=True):
        truth_words = set(str(truth_text).lower().split())
        predicted_words = set(str(predicted_text).lower().split())
        union = truth_words | predicted_words
        total += 1.0 if not union else len(truth_words & predicted_words) / len(union)
    return total / len(y_true)


# ----------------------------------------------------------------------------------------
# Thin wrappers over scikit-learn / scipy with the (y_true, y_pred) shape the scorer uses
# ----------------------------------------------------------------------------------------


def _accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.accuracy_score(y_true, y_pred))


def positive_label(labels: np.ndarray) -> str:
    """The positive class of a binary label column (see ``Metric`` docs for the rule)."""
    classes = sorted(set(labels.tolist()))
    for negative, positive in (("0", "1"), ("False", "True"), ("-1", "1")):
        if set(classes) <= {negative, positive}:
            return positive
    if len(classes) > 2:
        raise ValueError(
            f"a binary metric needs two classes in the answers, found {len(classes)}: "
            f"{classes[:10]}; use a multi-class metric (e.g. f1_macro, f1_micro)"
        )
    return classes[-1]


def _f1_binary(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    positive = positive_label(y_true)
    return float(skm.f1_score(y_true == positive, y_pred == positive, zero_division=0.0))


def _f1_average(average: str) -> Callable[[np.ndarray, np.ndarray], float]:
    def score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
        return float(skm.f1_score(y_true, y_pred, average=average, zero_division=0.0))

    score.__name__ = f"f1_{average}"
    return score


def _jaccard_binary(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    positive = positive_label(y_true)
    return float(skm.jaccard_score(y_true == positive, y_pred == positive, zero_division=0.0))


def _roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    if y_score.ndim == 2:
        return float(
            skm.roc_auc_score(
                y_true, y_score, multi_class="ovr", labels=list(range(y_score.shape[1]))
            )
        )
    return float(skm.roc_auc_score(y_true, y_score))


def _log_loss(y_true: np.ndarray, y_prob: np.ndarray) -> float:
    if y_prob.ndim == 2:
        return float(skm.log_loss(y_true, y_prob, labels=list(range(y_prob.shape[1]))))
    return float(skm.log_loss(y_true, y_prob, labels=[0, 1]))


def _qwk(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.cohen_kappa_score(y_true, y_pred, weights="quadratic"))


def _rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.root_mean_squared_error(y_true, y_pred))


def _rmsle(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.root_mean_squared_log_error(y_true, y_pred))


def _mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.mean_absolute_error(y_true, y_pred))


def _medae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.median_absolute_error(y_true, y_pred))


def _r2(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(skm.r2_score(y_true, y_pred))


def _pearson(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        return float(stats.pearsonr(y_true, y_pred).statistic)


def _spearman(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        return float(stats.spearmanr(y_true, y_pred).statistic)


def _majority(values: np.ndarray) -> Any:
    counts = Counter(values.tolist())
    best = max(counts.values())
    return sorted(label for label, count in counts.items() if count == best)[0]


def _median(values: np.ndarray) -> float:
    return float(np.median(values))


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values))


def _log_mean(values: np.ndarray) -> float:
    return float(np.expm1(np.mean(np.log1p(values))))


# ----------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One scoring metric and what it needs.

    Attributes:
        name: Canonical registry name, e.g. ``"roc_auc"``.
        function: ``function(y_true, y_pred) -> float`` on one target column, after the
            column was read as ``input_type`` says. Probability metrics also accept a 2-D
            ``y_pred`` (one column per class) with integer class codes as ``y_true``.
        higher_is_better: Whether larger values are better.
        kind: What the metric judges: ``"classification"`` (labels or probabilities),
            ``"regression"`` (numbers), ``"ranking"`` (ranked label lists, MAP@k) or
            ``"text"`` (word-level Jaccard between texts).
        needs_probabilities: Whether predictions must be probabilities / scores rather than
            hard labels (ROC-AUC, log loss, normalized Gini).
        value_range: ``(low, high)`` bounds of the value, ``math.inf`` for an open end.
        input_type: How columns are read: ``"labels"`` (canonical label text),
            ``"ordinal"`` (integer ratings), ``"probabilities"`` (answers are binary
            labels, predictions are numbers; for a binary metric the positive class is
            ``1``/``True`` when the labels are 0/1 or False/True, otherwise the larger of
            the two labels in sort order), ``"numeric"`` (floats), ``"ranked_labels"``
            (whitespace-separated label lists) or ``"text"`` (raw text; an empty cell is
            the empty text).
        perfect: The best attainable value.
        chance_value: The no-skill value when it does not depend on the data (0.5 for
            ROC-AUC, 0 for kappa and correlations), else ``None``.
        constant_guess: When ``chance_value`` is ``None``: maps the answers of a column to
            the constant prediction whose score is the no-skill baseline.
        description: One line saying what the metric is, for task descriptions.
    """

    name: str
    function: Callable[[np.ndarray, np.ndarray], float]
    higher_is_better: bool
    kind: MetricKind
    needs_probabilities: bool
    value_range: tuple[float, float]
    input_type: InputType
    perfect: float
    chance_value: float | None = None
    constant_guess: Callable[[np.ndarray], Any] | None = None
    description: str = ""


def _build_registry() -> dict[str, Metric]:
    inf = math.inf
    entries = [
        Metric("accuracy", _accuracy, True, "classification", False, (0.0, 1.0), "labels", 1.0,
               constant_guess=_majority, description="Classification accuracy (share of "
               "rows whose predicted class equals the true class), higher is better."),
        Metric("f1", _f1_binary, True, "classification", False, (0.0, 1.0), "labels", 1.0,
               constant_guess=_majority, description="F1 score of the positive class "
               "(harmonic mean of precision and recall), higher is better."),
        Metric("f1_micro", _f1_average("micro"), True, "classification", False, (0.0, 1.0),
               "labels", 1.0, constant_guess=_majority,
               description="Micro-averaged F1 score over all classes, higher is better."),
        Metric("f1_macro", _f1_average("macro"), True, "classification", False, (0.0, 1.0),
               "labels", 1.0, constant_guess=_majority,
               description="Macro-averaged F1 score (unweighted mean of per-class F1), "
               "higher is better."),
        Metric("f1_weighted", _f1_average("weighted"), True, "classification", False,
               (0.0, 1.0), "labels", 1.0, constant_guess=_majority,
               description="Support-weighted mean of per-class F1 scores, higher is better."),
        Metric("jaccard_score", _jaccard_binary, True, "classification", False, (0.0, 1.0),
               "labels", 1.0, constant_guess=_majority,
               description="Jaccard index of the positive class (intersection over union "
               "of predicted and true positives), higher is better."),
        Metric("roc_auc", _roc_auc, True, "classification", True, (0.0, 1.0),
               "probabilities", 1.0, chance_value=0.5,
               description="Area under the ROC curve of the predicted probabilities, "
               "higher is better."),
        Metric("log_loss", _log_loss, False, "classification", True, (0.0, inf),
               "probabilities", 0.0, constant_guess=_mean,
               description="Logarithmic loss of the predicted probabilities, lower is "
               "better."),
        Metric("normalized_gini", normalized_gini, True, "classification", True, (-1.0, 1.0),
               "numeric", 1.0, chance_value=0.0,
               description="Normalized Gini coefficient of the predicted scores "
               "(2 * AUC - 1 for a binary target), higher is better."),
        Metric("quadratic_weighted_kappa", _qwk, True, "classification", False, (-1.0, 1.0),
               "ordinal", 1.0, chance_value=0.0,
               description="Quadratic weighted kappa between predicted and true integer "
               "ratings, higher is better."),
        Metric("map_at_3", lambda a, p: map_at_k(a, p, 3), True, "ranking", False, (0.0, 1.0),
               "ranked_labels", 1.0, description="Mean average precision at 3 of up to 3 "
               "space-separated predicted labels, higher is better."),
        Metric("jaccard", word_jaccard, True, "text", False, (0.0, 1.0), "text", 1.0,
               chance_value=0.0, description="Mean word-level Jaccard similarity between "
               "predicted and true texts, higher is better."),
        Metric("rmse", _rmse, False, "regression", False, (0.0, inf), "numeric", 0.0,
               constant_guess=_mean, description="Root mean squared error, lower is better."),
        Metric("rmsle", _rmsle, False, "regression", False, (0.0, inf), "numeric", 0.0,
               constant_guess=_log_mean, description="Root mean squared logarithmic error "
               "(RMSE of log(1 + y)); values must be non-negative; lower is better."),
        Metric("mcrmse", _rmse, False, "regression", False, (0.0, inf), "numeric", 0.0,
               constant_guess=_mean, description="Mean column-wise root mean squared error "
               "(RMSE of each target column, averaged), lower is better."),
        Metric("mae", _mae, False, "regression", False, (0.0, inf), "numeric", 0.0,
               constant_guess=_median, description="Mean absolute error, lower is better."),
        Metric("medae", _medae, False, "regression", False, (0.0, inf), "numeric", 0.0,
               constant_guess=_median, description="Median absolute error, lower is better."),
        Metric("smape", smape, False, "regression", False, (0.0, 200.0), "numeric", 0.0,
               constant_guess=_median, description="Symmetric mean absolute percentage error "
               "in percent (0-200), lower is better."),
        Metric("r2", _r2, True, "regression", False, (-inf, 1.0), "numeric", 1.0,
               chance_value=0.0, description="Coefficient of determination R², higher is "
               "better."),
        Metric("pearson", _pearson, True, "regression", False, (-1.0, 1.0), "numeric", 1.0,
               chance_value=0.0, description="Pearson correlation between predictions and "
               "true values, higher is better."),
        Metric("spearman", _spearman, True, "regression", False, (-1.0, 1.0), "numeric", 1.0,
               chance_value=0.0, description="Spearman rank correlation between predictions "
               "and true values, higher is better."),
    ]  # fmt: skip
    return {metric.name: metric for metric in entries}


METRICS: Mapping[str, Metric] = _build_registry()
"""Canonical metric name -> :class:`Metric`. Use :func:`get_metric` to also resolve aliases."""

METRIC_ALIASES: Mapping[str, str] = {
    "qwk": "quadratic_weighted_kappa",
    "quadratic_kappa": "quadratic_weighted_kappa",
    "cohen_kappa_quadratic": "quadratic_weighted_kappa",
    "f1_binary": "f1",
    "f1_score": "f1",
    "auc": "roc_auc",
    "roc-auc": "roc_auc",
    "rocauc": "roc_auc",
    "logloss": "log_loss",
    "cross_entropy": "log_loss",
    "gini": "normalized_gini",
    "mse_root": "rmse",
    "root_mean_squared_error": "rmse",
    "root_mean_squared_log_error": "rmsle",
    "mean_absolute_error": "mae",
    "median_absolute_error": "medae",
    "r2_score": "r2",
    "pearsonr": "pearson",
    "spearmanr": "spearman",
    "jaccard_binary": "jaccard_score",
    "word_jaccard": "jaccard",
    "mapk": "map_at_3",
}
"""Alternative name -> canonical name. MAP@k for any k is also accepted as ``map_at_<k>``
or ``map@<k>`` (see :func:`get_metric`)."""

_MAP_AT_K = re.compile(r"^(?:map|mpa)(?:_at_|@|_)(\d+)$")


@lru_cache(maxsize=32)
def _map_metric(k: int) -> Metric:
    base = METRICS["map_at_3"]
    return Metric(
        f"map_at_{k}",
        lambda actual, predicted: map_at_k(actual, predicted, k),
        True,
        "ranking",
        False,
        (0.0, 1.0),
        "ranked_labels",
        1.0,
        description=base.description.replace("3", str(k)),
    )


def get_metric(name: str) -> Metric:
    """Look a metric up by name or alias (case-insensitive).

    Args:
        name: A canonical name (``"roc_auc"``), an alias (``"qwk"``, ``"f1_binary"``) or a
            MAP@k name (``"map_at_5"``, ``"map@5"``).

    Returns:
        The metric.

    Raises:
        KeyError: If the name is unknown; the message lists the known names.
    """
    key = str(name).strip().lower().replace(" ", "_")
    key = METRIC_ALIASES.get(key, key)
    if key in METRICS:
        return METRICS[key]
    match = _MAP_AT_K.match(key)
    if match and int(match.group(1)) >= 1:
        k = int(match.group(1))
        return METRICS["map_at_3"] if k == 3 else _map_metric(k)
    known = ", ".join(sorted(METRICS)) + ", map_at_<k>"
    raise KeyError(f"unknown metric {name!r}; known metrics: {known}")


def metric_names() -> list[str]:
    """Return the canonical metric names, sorted (MAP@k for other k is also accepted)."""
    return sorted(METRICS)


# ----------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """The result of scoring one submission.

    Attributes:
        success: Whether the submission could be scored.
        metric: Canonical name of the metric used.
        value: The aggregate metric value (mean over target columns, or the one number of
            a multi-class metric), ``None`` on failure.
        per_column: Target column -> that column's metric value (``None`` where it is
            undefined, e.g. ROC-AUC on a column whose answers hold a single class).
        reason: Why scoring failed, ``None`` on success.
        higher_is_better: Whether larger values of ``value`` are better.
        n_rows: Number of answer rows (the rows scored on success); 0 if the answers
            could not be read.
        normalized: Skill in ``[0, 1]`` against the no-skill baseline, higher is better
            (see the module docs); 0.0 on failure.
        baseline: The metric value of the no-skill constant guess on these answers, when
            the answers could be read.
        target_range: Mean over target columns of ``max - min`` of the answers, for
            numeric targets of regression metrics (used to express errors as % of range).
        warnings: Notes about things that did not stop scoring (ignored columns, labels
            not present in the answers, undefined columns).
    """

    success: bool
    metric: str
    value: float | None = None
    per_column: dict[str, float | None] = field(default_factory=dict)
    reason: str | None = None
    higher_is_better: bool = True
    n_rows: int = 0
    normalized: float = 0.0
    baseline: float | None = None
    target_range: float | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict of all fields."""
        data = asdict(self)
        data["per_column"] = dict(self.per_column)
        data["warnings"] = list(self.warnings)
        return data
