"""What a DSBench score is worth: the paper's fair values, and the skill of predictions.

:func:`fair_value` is what a run contributes to the paper's "fair" aggregates (a failed
run counts as a no-skill guess); :func:`prediction_skill` measures predictions written
as text rows (as the artifact inspector writes them) against the answers of the same
rows, for the caps of :mod:`mappa_env.envs.dsbench.caps`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence

from scipy import stats

from mappa_env.envs.dsbench.metrics import Metric, Score, get_metric
from mappa_env.envs.dsbench.scoring import canonical_label

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------
# The paper's "fair" aggregates
# ----------------------------------------------------------------------------------------

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
        got_labels = [canonical_label(v) for v in got]
        true_labels = [canonical_label(v) for v in true]
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
