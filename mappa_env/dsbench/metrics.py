"""Scoring DSBench submissions: a metric registry and a scorer that joins by id.

A DSBench submission is a CSV with an id column and one or more target columns. It is
joined to the hidden answers **by id** (row order never matters) and every target column
is scored with the task's own metric; the per-column values are combined into one
aggregate (their mean, except multi-class log loss over one-hot class columns, which is a
single number over all columns).

:func:`score_submission` never raises on a bad submission: a missing or unreadable file,
missing, duplicate or extra ids, missing columns, missing or non-numeric values and
values outside a metric's domain all give ``Score(success=False, reason=...)``.

How values are compared:

* **Ids** are compared as text after stripping surrounding whitespace; a decimal with only
  zeros after the point loses them, so ``1``, ``"1"``, ``" 1 "``, ``1.0`` and ``"1.0"``
  are the same id (CSV round trips through pandas often turn integer ids into floats).
  Leading zeros are kept: ``"007"`` and ``"7"`` are different ids, because real ids such
  as ``"0013_01"`` or ``"000d118"`` are text.
* **Class labels** are compared as text after the same stripping; numbers are written in
  one canonical form (``1``, ``1.0`` and ``"1.0"`` are the label ``"1"``; ``"007"`` is
  ``"7"``) and ``true``/``false`` in any case are ``"True"``/``"False"``.
* **Column names** match after stripping whitespace; when there is no exact match, a
  unique case-insensitive match is used. Extra columns in a submission are ignored.

Each :class:`Score` also carries ``normalized``, a number in ``[0, 1]`` (higher is
better) that can serve as an outcome reward. It is a *skill score* against a no-skill
baseline computed from the answers alone::

    normalized = clip((value - baseline) / (perfect - baseline), 0, 1)

where ``perfect`` is the metric's best value and ``baseline`` is the value of a constant
guess: the best single label for label metrics (the majority for accuracy, every
frequent label tried: a constant positive label has F1 ``2p/(1+p)``), the class
frequencies for probability
metrics, the answers' mean (median for MAE, MedAE and SMAPE; geometric-style
``expm1(mean(log1p(y)))`` for RMSLE) for error metrics, the most frequent ``k`` classes
for MAP@k, and the fixed chance level for ROC-AUC (0.5), normalized Gini, Cohen's kappa,
R², correlations and word-level Jaccard (0). So 0 means "no better than a constant guess"
and 1 means perfect. For error metrics this is ``1 - err / err_baseline``; for RMSE it is
``1 - RMSE / std(y)``.
"""

from __future__ import annotations

import io
import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy import stats
from sklearn import metrics as skm

logger = logging.getLogger(__name__)

MetricKind = Literal["classification", "regression", "ranking", "text"]
"""What a metric judges: class labels or probabilities, numbers, ranked label lists, or text."""

InputType = Literal["labels", "ordinal", "probabilities", "numeric", "ranked_labels", "text"]
"""How a column is read before a metric sees it (see :class:`Metric`)."""

# Integers above this lose precision as floats; such numbers stay as written.
_MAX_EXACT_FLOAT_INT = 2**53


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


def _positive_label(labels: np.ndarray) -> str:
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
    positive = _positive_label(y_true)
    return float(skm.f1_score(y_true == positive, y_pred == positive, zero_division=0.0))


def _f1_average(average: str) -> Callable[[np.ndarray, np.ndarray], float]:
    def score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
        return float(skm.f1_score(y_true, y_pred, average=average, zero_division=0.0))

    score.__name__ = f"f1_{average}"
    return score


def _jaccard_binary(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    positive = _positive_label(y_true)
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


class _ScoringFailure(Exception):
    """Internal: a submission (or the answers) cannot be scored; carries the reason."""


def _csv_input(source: str | Path | bytes) -> Any:
    """What ``read_csv`` reads: a path, or a fresh buffer over bytes (a read consumes it)."""
    return io.BytesIO(source) if isinstance(source, bytes) else Path(source)


#: Most columns a table may have, and bytes its header line may take: pandas parses a
#: header of a million columns for minutes and gigabytes, far past any real table.
MAX_COLUMNS = 10_000
MAX_HEADER_BYTES = 1024 * 1024


def _check_header(source: str | Path | bytes, label: str) -> None:
    """Refuse a table whose header line is too long or has too many columns, unparsed."""
    if isinstance(source, bytes):
        head = source[: MAX_HEADER_BYTES + 1]
    else:
        with Path(source).open("rb") as handle:
            head = handle.read(MAX_HEADER_BYTES + 1)
    line, newline, _ = head.partition(b"\n")
    if not newline and len(head) > MAX_HEADER_BYTES:
        raise _ScoringFailure(f"{label} has a header line over {MAX_HEADER_BYTES} bytes")
    columns = line.count(b",") + 1
    if columns > MAX_COLUMNS:
        raise _ScoringFailure(f"{label} has {columns} columns, more than {MAX_COLUMNS}")


def _read_table(
    source: pd.DataFrame | str | Path | bytes, what: str, id_column: str | None = None
) -> pd.DataFrame:
    if isinstance(source, pd.DataFrame):
        table = source.copy()
    else:
        if isinstance(source, bytes):
            # Content the caller already read (e.g. safely, from an agent's workspace).
            label = f"{what} file"
        else:
            path = Path(source)
            label = f"{what} file {path.name}"
            if not path.exists():
                raise _ScoringFailure(f"{what} file not found: {path.name}")
            if not path.is_file():
                raise _ScoringFailure(f"{what} path is not a file: {path.name}")
        try:
            # The id column is read as text so that ids keep their spelling ("0013_01",
            # "007"); other columns are parsed by pandas, which is much faster than parsing
            # numbers from text later. Only empty cells are missing, so texts such as "NA"
            # or "null" survive.
            _check_header(source, label)
            header = pd.read_csv(_csv_input(source), nrows=0).columns
            id_name = None if id_column is None else _find_column(header, id_column)
            table = pd.read_csv(
                _csv_input(source),
                dtype=None if id_name is None else {id_name: str},
                keep_default_na=False,
                na_values=[""],
            )
        except pd.errors.EmptyDataError:
            raise _ScoringFailure(f"{label} is empty") from None
        except (OSError, ValueError) as exc:
            raise _ScoringFailure(
                f"{label} is not a readable CSV: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
    table.columns = [str(column).strip() for column in table.columns]
    # Index.duplicated is linear; counting each name in the list was quadratic (minutes
    # for a 20,000-column file).
    duplicated = sorted(set(table.columns[pd.Index(table.columns).duplicated()]))
    if duplicated:
        raise _ScoringFailure(f"{what} has duplicate column names: {duplicated}")
    return table


def read_answers(path: str | Path, id_column: str) -> pd.DataFrame:
    """Read a hidden-answers CSV exactly as :func:`score_submission` reads tables.

    The id column stays text (``"007"`` keeps its zeros) and only empty cells are
    missing (labels such as ``"NA"`` survive), so answers loaded once and kept in memory
    join with submissions the same way as answers read from disk.

    Raises:
        ValueError: Naming the file and the problem when it cannot be read.
    """
    try:
        return _read_table(path, "answers", id_column)
    except _ScoringFailure as exc:
        raise ValueError(str(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def _find_column(columns: Sequence[Any], name: str) -> str | None:
    """The column whose stripped name is ``name``, else a unique case-insensitive match."""
    wanted = str(name).strip()
    exact = [column for column in columns if str(column).strip() == wanted]
    if exact:
        return exact[0]
    folded = [column for column in columns if str(column).strip().lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


def _examples(values: Any, limit: int = 5) -> str:
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return ", ".join(repr(item) for item in items[:limit])


def _format_number(value: float) -> str:
    if value.is_integer() and abs(value) < _MAX_EXACT_FLOAT_INT:
        return str(int(value))
    return repr(float(value))


def canonical_ids(values: pd.Series | Sequence[Any]) -> pd.Series:
    """Canonical text form of ids, as used to join a submission to the answers.

    Surrounding whitespace is stripped and an all-zero decimal part is dropped
    (``1``, ``"1"``, ``1.0`` and ``" 1.0 "`` all become ``"1"``); leading zeros are kept.

    Args:
        values: The ids.

    Returns:
        A Series of ``str`` ids, with ``None`` where an id is missing or empty.
    """
    series = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    missing = series.isna().to_numpy()
    if pd.api.types.is_bool_dtype(series) or pd.api.types.is_integer_dtype(series):
        text = series.astype(str).astype(object)
    elif pd.api.types.is_float_dtype(series):
        text = pd.Series(
            [
                None if isnan else _format_number(float(v))
                for v, isnan in zip(series, missing, strict=True)
            ],
            index=series.index,
            dtype=object,
        )
    else:
        if pd.api.types.is_string_dtype(series) and not pd.api.types.is_object_dtype(series):
            stripped = series.str.strip()
        else:
            stripped = series.astype(object).where(~missing, "").map(str).str.strip()
        stripped = stripped.astype(object)
        # Only ids with a decimal point can need "1.0" -> "1"; the regex runs on those alone.
        has_point = stripped.str.contains(".", regex=False).fillna(False).to_numpy(dtype=bool)
        if has_point.any():
            stripped[has_point] = stripped[has_point].str.replace(
                r"^([+-]?\d+)\.0*$", r"\1", regex=True
            )
        text = stripped
    text = text.where(~missing, None)
    return text.where(text != "", None)


_MISSING_WORDS = frozenset({"nan", "na", "n/a", "null", "none"})


def _canonical_label(value: Any) -> str | None:
    """Canonical text of one class label (see the module docs), ``None`` when missing."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return None
        return _format_number(float(value)) if math.isfinite(value) else str(value)
    text = str(value).strip()
    lowered = text.lower()
    if not text or lowered == "nan":
        return None
    if lowered in ("true", "false"):
        return lowered.capitalize()
    try:
        number = float(text)
    except ValueError:
        return text
    # Huge integers would lose digits as floats; they keep their spelling.
    if math.isfinite(number) and abs(number) < _MAX_EXACT_FLOAT_INT:
        return _format_number(number)
    return text


def _canonical_labels(series: pd.Series) -> np.ndarray:
    # Columns of labels hold few distinct values: canonicalise those, then map back.
    codes, uniques = pd.factorize(series, use_na_sentinel=True)
    lookup = np.array([_canonical_label(value) for value in uniques] + [None], dtype=object)
    return lookup[codes]


def _numeric(series: pd.Series, description: str) -> np.ndarray:
    missing = series.isna().to_numpy()
    if pd.api.types.is_bool_dtype(series) or pd.api.types.is_numeric_dtype(series):
        values = series.to_numpy(dtype=float, na_value=np.nan)
        bad_text = np.zeros(len(values), dtype=bool)
    else:
        text = series.astype(object).where(~missing, "").map(str).str.strip()
        missing = missing | text.str.lower().isin(_MISSING_WORDS | {""}).to_numpy()
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
        bad_text = np.isnan(values) & ~missing
        if bad_text.any():
            raise _ScoringFailure(
                f"{description} has {int(bad_text.sum())} non-numeric values where numbers "
                f"are needed, e.g. {_examples(text[bad_text].unique())}"
            )
    if missing.any() or np.isnan(values).any():
        count = int((missing | np.isnan(values)).sum())
        raise _ScoringFailure(f"{description} has {count} missing (empty or NaN) values")
    if np.isinf(values).any():
        raise _ScoringFailure(f"{description} has {int(np.isinf(values).sum())} infinite values")
    return values


def _labels(series: pd.Series, description: str) -> np.ndarray:
    labels = _canonical_labels(series)
    missing = pd.isna(labels)
    if missing.any():
        raise _ScoringFailure(f"{description} has {int(missing.sum())} missing (empty) values")
    # Fixed-width text sorts and compares much faster than Python objects in numpy.
    return labels.astype(str)


def _ordinal(series: pd.Series, description: str) -> np.ndarray:
    values = _numeric(series, description)
    fractional = values != np.round(values)
    if fractional.any():
        raise _ScoringFailure(
            f"{description} must hold integer ratings but has {int(fractional.sum())} "
            f"non-integer values, e.g. {_examples(np.unique(values[fractional]))}"
        )
    return values.astype(np.int64)


def _binary_truth(series: pd.Series, description: str) -> np.ndarray:
    labels = _labels(series, description)
    try:
        positive = _positive_label(labels)
    except ValueError as exc:
        raise _ScoringFailure(f"{description}: {exc}") from None
    return (labels == positive).astype(np.int64)


def _texts(series: pd.Series) -> np.ndarray:
    missing = series.isna().to_numpy()
    return series.astype(object).where(~missing, "").map(str).to_numpy(dtype=object)


def _prepare_truth(metric: Metric, series: pd.Series, column: str) -> np.ndarray:
    description = f"answers column {column!r}"
    if metric.input_type == "labels":
        return _labels(series, description)
    if metric.input_type == "ordinal":
        return _ordinal(series, description)
    if metric.input_type == "probabilities":
        return _binary_truth(series, description)
    if metric.input_type == "numeric":
        truth = _numeric(series, description)
        if metric.name == "rmsle" and (truth < 0).any():
            raise _ScoringFailure(f"{description} has negative values; RMSLE is undefined")
        return truth
    if metric.input_type == "ranked_labels":
        return _ranked_texts(series)
    return _texts(series)


def _ranked_texts(series: pd.Series) -> np.ndarray:
    """Space-separated ranked labels, each label in its canonical form."""
    return np.array(
        [" ".join(_canonical_token(t) for t in str(v).split()) for v in _texts(series)],
        dtype=object,
    )


def _canonical_token(token: str) -> str:
    label = _canonical_label(token)
    return token if label is None else label


def _prepare_prediction(metric: Metric, series: pd.Series, column: str) -> np.ndarray:
    description = f"submission column {column!r}"
    if metric.input_type == "labels":
        return _labels(series, description)
    if metric.input_type == "ordinal":
        return _ordinal(series, description)
    if metric.input_type in ("probabilities", "numeric"):
        values = _numeric(series, description)
        if metric.name == "log_loss" and ((values < 0) | (values > 1)).any():
            bad = values[(values < 0) | (values > 1)]
            raise _ScoringFailure(
                f"{description} must hold probabilities in [0, 1] for log loss, but has "
                f"{len(bad)} values outside, e.g. {_examples(np.unique(bad))}"
            )
        if metric.name == "rmsle" and (values < 0).any():
            raise _ScoringFailure(
                f"{description} has {int((values < 0).sum())} negative values; RMSLE needs "
                "predictions >= 0 (clip them at 0)"
            )
        return values
    if metric.input_type == "ranked_labels":
        return _ranked_texts(series)
    return _texts(series)


def _baseline_prediction(metric: Metric, truth: np.ndarray) -> np.ndarray | None:
    if metric.input_type == "ranked_labels":
        counts = Counter(label for row in truth for label in str(row).split())
        top = sorted(counts, key=lambda label: (-counts[label], label))
        k = int(metric.name.rsplit("_", 1)[-1])
        return np.full(len(truth), " ".join(top[:k]), dtype=object)
    if metric.constant_guess is None:
        return None
    guess = metric.constant_guess(truth)
    # Labels keep the answers' dtype; numbers are floats (a prior of 0.3 must not become 0).
    dtype = truth.dtype if truth.dtype.kind in "OU" else float
    return np.full(len(truth), guess, dtype=dtype)


def _evaluate(metric: Metric, truth: np.ndarray, prediction: np.ndarray) -> float | None:
    """Metric value, or None where it is undefined for these answers."""
    with warnings.catch_warnings():
        # Undefined cases (one class present, constant input) are reported through the
        # return value, not through warnings that would flood training logs.
        warnings.simplefilter("ignore")
        try:
            value = metric.function(truth, prediction)
        except ValueError as exc:
            # scikit-learn reports inputs a metric cannot take (e.g. three classes for a
            # binary metric) as ValueError; such a submission or task is not scorable.
            raise _ScoringFailure(f"{metric.name} cannot score this: {_first_line(exc)}") from None
    if not math.isfinite(value):
        if metric.name in ("pearson", "spearman"):
            # A constant prediction has no correlation with anything; count it as 0.
            return 0.0
        return None
    return float(value)


_POSITIVE_CLASS_METRICS = ("f1", "jaccard_score")
CONSTANT_LABELS_TRIED = 20
"""For label metrics, how many of the answers' most frequent labels are tried as constant
submissions; the best of them is the no-skill baseline."""


def _baseline_value(metric: Metric, truth: np.ndarray) -> float | None:
    """The no-skill value: the best that a submission of one constant value scores.

    For label metrics every frequent label is tried, not only the majority: a positive
    class's F1 or Jaccard index is 0 for the majority (negative) label but ``2p/(1+p)``
    or ``p`` for a constant positive one, which must not count as skill.
    """
    if metric.chance_value is not None:
        return metric.chance_value
    guess = _baseline_prediction(metric, truth)
    if guess is None:
        return None
    guesses = [guess]
    # Only a positive class's F1 and Jaccard index can favour a label other than the
    # majority; for accuracy and the averaged F1s the majority is the best constant.
    if metric.name in _POSITIVE_CLASS_METRICS:
        counts = Counter(truth.tolist())
        frequent = sorted(counts, key=lambda label: (-counts[label], str(label)))
        guesses += [
            np.full(len(truth), label, dtype=guess.dtype)
            for label in frequent[:CONSTANT_LABELS_TRIED]
            if label != guess[0]
        ]
    values = []
    for candidate in guesses:
        try:
            value = _evaluate(metric, truth, candidate)
        except _ScoringFailure as exc:
            logger.debug("no baseline for %s: %s", metric.name, exc)
            continue
        if value is not None:
            values.append(value)
    if not values:
        return None
    return max(values) if metric.higher_is_better else min(values)


def normalize_value(value: float, baseline: float | None, metric: Metric | str) -> float:
    """Map a metric value to a ``[0, 1]`` skill against a baseline (1 = perfect).

    ``clip((value - baseline) / (perfect - baseline), 0, 1)``; when the baseline is
    already perfect, 1.0 for a perfect value and 0.0 otherwise. Without a baseline the
    metric's lower bound (upper bound for error metrics with a finite one) stands in.

    Args:
        value: The metric value.
        baseline: The no-skill value, e.g. :attr:`Score.baseline`.
        metric: The metric or its name.

    Returns:
        The skill in ``[0, 1]``.
    """
    spec = get_metric(metric) if isinstance(metric, str) else metric
    if baseline is None:
        low, high = spec.value_range
        baseline = low if spec.higher_is_better else high
        if not math.isfinite(baseline):
            return 0.0
    if not math.isfinite(value):
        return 0.0
    span = spec.perfect - baseline
    if span == 0 or (span > 0) != spec.higher_is_better:
        return 1.0 if value == spec.perfect else 0.0
    return float(min(1.0, max(0.0, (value - baseline) / span)))


def _class_columns(submission: pd.DataFrame, classes: Sequence[str]) -> dict[str, str] | None:
    """Map each class label to a submission column named after it, if all are present."""
    by_label: dict[str, str] = {}
    for column in submission.columns:
        label = _canonical_label(column)
        if label is not None:
            by_label.setdefault(label, column)
            by_label.setdefault(label.lower(), column)
    mapping = {}
    for label in classes:
        column = by_label.get(label) or by_label.get(label.lower())
        if column is None:
            return None
        mapping[label] = column
    return mapping


def _probability_matrix(
    submission: pd.DataFrame, columns: Sequence[str], metric: Metric
) -> np.ndarray:
    matrix = np.column_stack(
        [_prepare_prediction(metric, submission[column], column) for column in columns]
    )
    if metric.name == "log_loss":
        totals = matrix.sum(axis=1)
        if (totals <= 0).any():
            raise _ScoringFailure(
                f"{int((totals <= 0).sum())} submission rows have all-zero class probabilities"
            )
        # Like Kaggle, rows are rescaled to sum to one before the loss is taken.
        matrix = matrix / totals[:, None]
    return matrix


def _is_one_hot(answers: pd.DataFrame, columns: Sequence[str]) -> bool:
    try:
        values = np.column_stack([_numeric(answers[column], "answers") for column in columns])
    except _ScoringFailure:
        return False
    return bool(np.isin(values, (0.0, 1.0)).all() and (values.sum(axis=1) == 1).all())


def score_submission(
    submission: pd.DataFrame | str | Path | bytes,
    answers: pd.DataFrame | str | Path,
    metric: str | Metric,
    id_column: str,
    target_columns: str | Sequence[str] | None = None,
) -> Score:
    """Score a submission against the hidden answers, joining rows by id.

    Every target column is scored; the aggregate is the mean of the per-column values,
    except log loss over several one-hot class columns (e.g. ``winner_model_a``,
    ``winner_model_b``, ``winner_tie``), which is one multi-class log loss (submission
    rows rescaled to sum to 1) with per-column binary log losses reported beside it. A
    probability metric on one multi-class label column needs one probability column per
    class in the submission, named after the class labels (multi-class ROC-AUC is one-vs-
    rest, macro-averaged).

    Bad submissions never raise: see the module docs for the checks. An extra submission
    row (an id not in the answers) is a failure, as on Kaggle; extra columns are ignored.

    Args:
        submission: The submission as a DataFrame, the path of a CSV file, or the bytes
            of a CSV file (read by the caller, e.g. without following links).
        answers: The hidden answers as a DataFrame or the path of a CSV file.
        metric: Metric name (aliases accepted) or :class:`Metric`.
        id_column: Name of the id column (in both tables).
        target_columns: Target column name(s); ``None`` means every answers column except
            the id column.

    Returns:
        The :class:`Score`; ``success=False`` with a ``reason`` when it cannot be scored.

    Raises:
        KeyError: If ``metric`` is not a known metric name (a caller error, not a bad
            submission).
    """
    spec = metric if isinstance(metric, Metric) else get_metric(metric)
    context: dict[str, Any] = {"n_rows": 0, "baseline": None, "target_range": None}
    notes: list[str] = []

    def failure(reason: str) -> Score:
        return Score(
            success=False,
            metric=spec.name,
            reason=reason,
            higher_is_better=spec.higher_is_better,
            warnings=tuple(notes),
            **context,
        )

    try:
        return _score(submission, answers, spec, id_column, target_columns, context, notes)
    except _ScoringFailure as exc:
        return failure(str(exc))
    except Exception as exc:
        # A metric implementation can raise on inputs no check above anticipated; the
        # submission is then unscorable, and the event is logged with its traceback.
        logger.exception("scoring with %s failed unexpectedly", spec.name)
        return failure(f"scoring error: {type(exc).__name__}: {_first_line(exc)}")


def _score(
    submission_source: pd.DataFrame | str | Path | bytes,
    answers_source: pd.DataFrame | str | Path,
    spec: Metric,
    id_column: str,
    target_columns: str | Sequence[str] | None,
    context: dict[str, Any],
    notes: list[str],
) -> Score:
    answers = _read_table(answers_source, "answers", id_column)
    answers_id = _find_column(list(answers.columns), id_column)
    if answers_id is None:
        raise _ScoringFailure(
            f"answers lack the id column {id_column!r} (columns: {list(answers.columns)[:20]})"
        )
    if target_columns is None:
        wanted = [column for column in answers.columns if column != answers_id]
    elif isinstance(target_columns, str):
        wanted = [target_columns]
    else:
        wanted = list(target_columns)
    if not wanted:
        raise _ScoringFailure("no target columns to score")
    targets = []
    for name in wanted:
        found = _find_column(list(answers.columns), name)
        if found is None:
            raise _ScoringFailure(
                f"answers lack the target column {name!r} (columns: {list(answers.columns)[:20]})"
            )
        targets.append(found)
    if len(answers) == 0:
        raise _ScoringFailure("answers have no rows")
    context["n_rows"] = len(answers)
    answer_ids = canonical_ids(answers[answers_id])
    if answer_ids.isna().any():
        raise _ScoringFailure(f"answers have {int(answer_ids.isna().sum())} missing ids")
    if answer_ids.duplicated().any():
        raise _ScoringFailure(
            f"answers have duplicate ids, e.g. {_examples(answer_ids[answer_ids.duplicated()])}"
        )

    mode = "columns"
    classes: list[str] = []
    if spec.input_type == "probabilities" and len(targets) == 1:
        labels = _labels(answers[targets[0]], f"answers column {targets[0]!r}")
        classes = sorted(set(labels.tolist()))
        if len(classes) > 2:
            mode = "class_columns"
            truth_codes = np.searchsorted(np.array(classes), labels)
    elif spec.name == "log_loss" and len(targets) > 1 and _is_one_hot(answers, targets):
        mode = "one_hot"

    truths: dict[str, np.ndarray] = {}
    if mode == "class_columns":
        truths[targets[0]] = truth_codes
    else:
        for column in targets:
            truths[column] = _prepare_truth(spec, answers[column], column)

    if spec.kind == "regression":
        ranges = [float(np.ptp(values)) for values in truths.values()]
        context["target_range"] = float(np.mean(ranges))

    baseline = _baseline(spec, mode, truths, len(classes))
    context["baseline"] = baseline

    submission = _read_table(submission_source, "submission", id_column)
    submission_id = _find_column(list(submission.columns), id_column)
    if submission_id is None:
        raise _ScoringFailure(
            f"submission lacks the id column {id_column!r}; its columns are "
            f"{list(submission.columns)[:20]}"
        )
    submission_ids = canonical_ids(submission[submission_id])
    if submission_ids.isna().any():
        raise _ScoringFailure(f"submission has {int(submission_ids.isna().sum())} missing ids")
    duplicated = submission_ids[submission_ids.duplicated()]
    if len(duplicated):
        raise _ScoringFailure(
            f"submission has {len(duplicated)} duplicate id rows, e.g. "
            f"{_examples(duplicated.unique())}"
        )
    answer_index = pd.Index(answer_ids.to_numpy(dtype=object))
    submission_index = pd.Index(submission_ids.to_numpy(dtype=object))
    missing_ids = answer_index.difference(submission_index, sort=False)
    extra_ids = submission_index.difference(answer_index, sort=False)
    if len(missing_ids):
        raise _ScoringFailure(
            f"submission lacks {len(missing_ids)} of the {len(answer_index)} ids, e.g. "
            f"{_examples(missing_ids)} (it has {len(submission_index)} rows)"
        )
    if len(extra_ids):
        raise _ScoringFailure(
            f"submission has {len(extra_ids)} ids that are not in the test set, e.g. "
            f"{_examples(extra_ids)}"
        )
    submission.index = submission_index
    aligned = submission.loc[answer_index]

    per_column: dict[str, float | None] = {}
    if mode == "class_columns":
        mapping = _class_columns(aligned, classes)
        if mapping is None:
            raise _ScoringFailure(
                f"{spec.name} on the {len(classes)}-class column {targets[0]!r} needs one "
                f"probability column per class, named after the classes: {classes[:20]}"
            )
        matrix = _probability_matrix(aligned, [mapping[c] for c in classes], spec)
        value = _evaluate(spec, truths[targets[0]], matrix)
        per_column[targets[0]] = value
    else:
        predicted_columns = {}
        for column in targets:
            found = _find_column(list(aligned.columns), column)
            if found is None:
                raise _ScoringFailure(
                    f"submission lacks the target column {column!r}; its columns are "
                    f"{list(aligned.columns)[:20]}"
                )
            predicted_columns[column] = found
        for column in targets:
            prediction = _prepare_prediction(spec, aligned[predicted_columns[column]], column)
            if spec.input_type == "labels":
                unknown = np.setdiff1d(np.unique(prediction), np.unique(truths[column]))
                if len(unknown):
                    notes.append(
                        f"column {column!r}: predicted labels not among the answers' classes: "
                        f"{_examples(unknown)}"
                    )
            per_column[column] = _evaluate(spec, truths[column], prediction)
            if per_column[column] is None:
                notes.append(f"column {column!r}: {spec.name} is undefined for these answers")
        if mode == "one_hot":
            matrix = _probability_matrix(aligned, [predicted_columns[c] for c in targets], spec)
            codes = np.argmax(np.column_stack([truths[c] for c in targets]), axis=1)
            value = _evaluate(spec, codes, matrix)
        else:
            defined = [v for v in per_column.values() if v is not None]
            value = float(np.mean(defined)) if defined else None
    used = set(predicted_columns.values()) if mode != "class_columns" else set()
    ignored = [c for c in submission.columns if c != submission_id and c not in used]
    if ignored and mode != "class_columns":
        notes.append(f"ignored submission columns: {ignored[:10]}")
    if value is None:
        raise _ScoringFailure(f"{spec.name} is undefined for these answers")
    return Score(
        success=True,
        metric=spec.name,
        value=value,
        per_column=per_column,
        reason=None,
        higher_is_better=spec.higher_is_better,
        n_rows=len(answer_index),
        normalized=normalize_value(value, baseline, spec),
        baseline=baseline,
        target_range=context["target_range"],
        warnings=tuple(notes),
    )


def _baseline(
    spec: Metric, mode: str, truths: Mapping[str, np.ndarray], n_classes: int
) -> float | None:
    if spec.chance_value is not None:
        return spec.chance_value
    if mode in ("class_columns", "one_hot"):
        if mode == "class_columns":
            codes = next(iter(truths.values()))
        else:
            codes = np.argmax(np.column_stack(list(truths.values())), axis=1)
            n_classes = len(truths)
        prior = np.bincount(codes, minlength=n_classes) / len(codes)
        prior = np.clip(prior, 1e-15, None)
        guess = np.tile(prior / prior.sum(), (len(codes), 1))
        try:
            return _evaluate(spec, codes, guess)
        except _ScoringFailure as exc:
            logger.debug("no baseline for %s: %s", spec.name, exc)
            return None
    values = [_baseline_value(spec, truth) for truth in truths.values()]
    defined = [value for value in values if value is not None]
    return float(np.mean(defined)) if defined else None


# ----------------------------------------------------------------------------------------
# The paper's "fair" aggregates and the analyst's outcome cap
# ----------------------------------------------------------------------------------------

FAILED_SUBMISSION_CAP = 2
"""Analyst score cap when the submission is not scorable: below every cap of a scorable
submission (at least 3), so producing any valid submission always raises the ceiling."""

_FAIR_FAILURE_FIXED = {"accuracy": 0.5, "roc_auc": 0.5}
_HALF_RANGE_ON_FAILURE = ("rmse", "mcrmse", "mae", "medae")


def fair_value(
    score: Score, metric: str | Metric | None = None, target_range: float | None = None
) -> float | None:
    """The value a run contributes to the paper's "fair" aggregates.

    A successful run contributes its value. A failed run counts as accuracy 0.5,
    ROC-AUC 0.5, any F1 0, and RMSE (also MCRMSE, MAE, MedAE) equal to 50% of the target
    range, as in the paper; for other metrics it counts as the no-skill baseline
    (:attr:`Score.baseline`, e.g. log loss of the class frequencies), which extends the
    paper's rule of scoring a failure like an uninformed guess.

    Args:
        score: The run's score.
        metric: The metric, if not ``score.metric``.
        target_range: Target range (max - min) for error metrics; defaults to
            ``score.target_range``.

    Returns:
        The fair value, or ``None`` for a failed run whose fair value needs a target range
        or baseline that is unknown (``score_submission`` fills both in whenever the
        answers are readable, even when the submission file is missing).
    """
    if score.success and score.value is not None:
        return float(score.value)
    spec = get_metric(score.metric if metric is None else str(getattr(metric, "name", metric)))
    if spec.name in _FAIR_FAILURE_FIXED:
        return _FAIR_FAILURE_FIXED[spec.name]
    if spec.name.startswith("f1"):
        return 0.0
    if spec.name in _HALF_RANGE_ON_FAILURE:
        value_range = score.target_range if target_range is None else target_range
        if value_range is None:
            logger.warning("fair %s of a failed run needs the target range", spec.name)
            return None
        return 0.5 * float(value_range)
    if score.baseline is None:
        logger.warning("fair %s of a failed run needs the no-skill baseline", spec.name)
        return None
    return float(score.baseline)


def percent_of_range(value: float, target_range: float) -> float:
    """Express an error as a percentage of the target range (``100 * value / range``).

    Args:
        value: The error, e.g. an RMSE.
        target_range: ``max - min`` of the target.

    Returns:
        The percentage.

    Raises:
        ValueError: If the range is not positive.
    """
    if not target_range > 0:
        raise ValueError(f"target range must be positive, got {target_range}")
    return 100.0 * float(value) / float(target_range)


def fair_percent_of_range(score: Score, target_range: float | None = None) -> float:
    """Fair error as % of the target range (a failed run counts as 50%).

    Args:
        score: A score of an error metric such as RMSE.
        target_range: The target range; defaults to ``score.target_range``.

    Returns:
        The fair error in percent of the target range.

    Raises:
        ValueError: If the target range is unknown or not positive.
    """
    value_range = score.target_range if target_range is None else target_range
    if value_range is None:
        raise ValueError("the target range is unknown")
    if not score.success:
        return 50.0
    return percent_of_range(float(score.value), value_range)


# Cap ladders: (threshold, cap) pairs checked top down; below the last one -> floor value.
_CLASSIFICATION_RAW_CAPS = ((0.85, 9), (0.75, 8), (0.65, 6), (0.55, 4))
# The same ladder expressed as skill against chance: for ROC-AUC, skill = 2 * AUC - 1.
_SKILL_CAPS_CLASSIFICATION = ((0.7, 9), (0.5, 8), (0.3, 6), (0.1, 4))
_SKILL_CAPS_REGRESSION = ((0.7, 9), (0.5, 8), (0.25, 6))
_RMSE_PERCENT_CAPS = ((10.0, 9), (25.0, 8), (50.0, 6))
MIN_REGRESSION_SKILL = 0.03
"""Skill (:attr:`Score.normalized`) below which a regression submission is capped at 4
whatever its error as % of the range. A constant guess has skill 0; for RMSE, 0.03 is an
R² of about 0.06, so an honest model of a noisy target (R² 0.18: skill 0.09) keeps the
ladder."""


def outcome_cap(score: Score, task_type: str, target_range: float | None = None) -> int:
    """The highest coach score (0-10) the analyst may get for this outcome.

    The spec's rubric: classification scored by ROC-AUC or accuracy: >= 0.85 -> 9,
    0.75-0.85 -> 8, 0.65-0.75 -> 6, 0.55-0.65 -> 4, below -> 3. Regression scored by RMSE
    (or MCRMSE) as % of the target range: < 10% -> 9, 10-25% -> 8, 25-50% -> 6, above -> 4.
    Accuracy is also ranked by its skill over the majority class (``(accuracy -
    majority) / (1 - majority)``, :attr:`Score.normalized`) on the skill ladder below,
    and the lower cap holds: on balanced binary answers both ladders agree, while a
    constant majority guess on imbalanced answers (92% one class) has no skill and gets
    3, not the 9 its accuracy would.

    Other metrics use :attr:`Score.normalized` (skill against a constant guess) on the
    same ladders: for classification-like tasks skill >= 0.7 -> 9, >= 0.5 -> 8,
    >= 0.3 -> 6, >= 0.1 -> 4, else 3 (these are the ROC-AUC thresholds rewritten as
    skill ``2 * AUC - 1``); for regression skill >= 0.7 -> 9, >= 0.5 -> 8, >= 0.25 -> 6,
    else 4. RMSE without a known target range also falls back to skill. A failed
    submission is capped at :data:`FAILED_SUBMISSION_CAP`.

    RMSE as % of the range does not tell a model from a constant: the answers' mean
    scores their standard deviation, often 15-30% of the range (8 or 6 on the ladder).
    So a regression submission with less skill than :data:`MIN_REGRESSION_SKILL` over
    the mean (about a constant's) gets the ladder's bottom, 4.

    Args:
        score: The submission's score.
        task_type: ``"classification"``, ``"regression"`` or another task type (treated
            like classification, e.g. ``"extraction"``).
        target_range: The target range; defaults to ``score.target_range``.

    Returns:
        The cap, an integer in ``[0, 10]``.
    """
    if not score.success or score.value is None:
        return FAILED_SUBMISSION_CAP
    if task_type == "regression":
        value_range = score.target_range if target_range is None else target_range
        if score.normalized < MIN_REGRESSION_SKILL:
            return 4
        if score.metric in ("rmse", "mcrmse") and value_range and value_range > 0:
            percent = percent_of_range(score.value, value_range)
            for threshold, cap in _RMSE_PERCENT_CAPS:
                if percent < threshold:
                    return cap
            return 4
        return skill_cap(score.normalized, task_type)
    skill_ladder = skill_cap(score.normalized, task_type)
    if score.metric == "roc_auc":
        return _raw_cap(score.value)
    if score.metric == "accuracy":
        # The spec's raw ladder ranked a constant majority guess (92% of the answers on
        # an imbalanced task) at 9: accuracy is ranked by its skill over the majority
        # class too, and the lower of the two caps holds.
        return min(_raw_cap(score.value), skill_ladder)
    return skill_ladder


def _raw_cap(value: float) -> int:
    for threshold, cap in _CLASSIFICATION_RAW_CAPS:
        if value >= threshold:
            return cap
    return 3


def skill_cap(skill: float, task_type: str) -> int:
    """The coach-score cap of a skill on the answers (0 = a constant guess, 1 = perfect).

    Classification-like tasks: >= 0.7 -> 9, >= 0.5 -> 8, >= 0.3 -> 6, >= 0.1 -> 4, else 3
    (the spec's ROC-AUC bands written as skill ``2 * AUC - 1``); regression: >= 0.7 -> 9,
    >= 0.5 -> 8, >= 0.25 -> 6, else 4.

    Args:
        skill: The skill, e.g. :attr:`Score.normalized` or :func:`prediction_skill`.
        task_type: ``"regression"`` or another task type (treated like classification).

    Returns:
        The cap, an integer in ``[3, 9]``.
    """
    regression = task_type == "regression"
    ladder = _SKILL_CAPS_REGRESSION if regression else _SKILL_CAPS_CLASSIFICATION
    for threshold, cap in ladder:
        if skill >= threshold:
            return cap
    return 4 if regression else 3


#: Least rows with an answer that :func:`prediction_skill` needs to judge predictions.
MIN_SKILL_ROWS = 10


def prediction_skill(
    predicted: Sequence[str | None],
    truth: Sequence[str | None],
    task_type: str,
    *,
    labels: Mapping[str, str] | None = None,
    signs: Sequence[float] | None = None,
) -> float | None:
    """How much better than chance predictions match the answers of the same rows.

    Rows are text, one value per target column joined by ``|`` (as the artifact
    inspector writes them); rows missing on either side are left out. Per target
    column, then the mean over columns, clipped to ``[0, 1]``:

    - regression (and numeric scores on a classification task): Spearman's rank
      correlation ``rho`` of predictions and answers; a model of a monotone transform
      of the target (its logarithm) keeps its skill. ``signs[c] = -1`` marks a column
      encoded in reverse (``-y``): its ``rho`` is negated;
    - classification: Cohen's kappa ``(p_o - p_e) / (1 - p_e)``, with ``p_o`` the
      share of rows whose predicted label is the answer and ``p_e = sum_k q_k * t_k``
      the agreement of predictions and answers drawn apart with their own label shares
      ``q`` and ``t``; a constant, or labels unrelated to the answers (a memorised
      noise), gets 0. ``labels`` maps an encoding's labels (``0``) to the answers'
      (``"setosa"``) first.

    Args:
        predicted: Predicted rows.
        truth: The answers of the same rows.
        task_type: ``"regression"`` or another task type (treated like classification).
        labels: Translation of predicted labels to the answers' labels.
        signs: Per column, ``-1`` for a target encoded in reverse (regression).

    Returns:
        The skill, or ``None`` with fewer than :data:`MIN_SKILL_ROWS` rows on both sides
        or rows whose columns do not line up.
    """
    pairs = [
        (got, true) for got, true in zip(predicted, truth) if got is not None and true is not None
    ]
    if len(pairs) < MIN_SKILL_ROWS:
        return None
    if labels:
        pairs = [(labels.get(got, got), true) for got, true in pairs]
    got_columns = list(zip(*(got.split("|") for got, _ in pairs)))
    true_columns = list(zip(*(true.split("|") for _, true in pairs)))
    if len(got_columns) != len(true_columns) or any(
        len(row.split("|")) != len(got_columns) for row, _ in pairs
    ):
        return None
    skills = []
    for index, (got, true) in enumerate(zip(got_columns, true_columns, strict=True)):
        got_labels = [_canonical_label(v) for v in got]
        true_labels = [_canonical_label(v) for v in true]
        numbers = _as_numbers(got_labels)
        scores = numbers is not None and not all(float(v).is_integer() for v in numbers)
        if task_type == "regression" or scores:
            answers = _as_numbers(true_labels)
            if numbers is None or answers is None:
                skills.append(0.0)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a constant column: rho is undefined
                rho = stats.spearmanr(numbers, answers).statistic
            sign = signs[index] if signs is not None and index < len(signs) else 1.0
            skills.append(float(rho) * sign if math.isfinite(rho) else 0.0)
        else:
            skills.append(_kappa(got_labels, true_labels))
    return float(min(1.0, max(0.0, sum(skills) / len(skills))))


def _as_numbers(values: Sequence[str | None]) -> list[float] | None:
    try:
        return [float(v) for v in values]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _kappa(predicted: Sequence[str | None], truth: Sequence[str | None]) -> float:
    """Cohen's kappa of two label sequences of one length (0 when chance is certain)."""
    rows = len(truth)
    observed = sum(p == t for p, t in zip(predicted, truth, strict=True)) / rows
    got, true = Counter(predicted), Counter(truth)
    chance = sum(got[label] * true[label] for label in true) / rows**2
    return 0.0 if chance >= 1.0 else (observed - chance) / (1.0 - chance)
