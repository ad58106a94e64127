"""How DSBench-v0 compares labels: the inspector's label rule, and y_train against the target.

The artifact inspector writes targets and predictions as text rows, one value per target
column joined by ``|``, each value by its rule (:func:`label_text`: ``1``, ``1.0``,
``"1.0"`` and ``numpy.int64(1)`` are the label ``"1"``, a missing value is ``"nan"``), the
one rule by which the scorer compares labels too
(:func:`~mappa_env.envs.dsbench.scoring.canonical_label`). The environment writes
train.csv's target and the hidden answers by the same rule (:func:`label_rows`), then
checks whether y_train is train.csv's target up to an encoding (:func:`holds_target`) and
how to read predictions in y_train's encoding (:func:`target_translation`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from mappa_env.envs.dsbench.inspections import inspector_function
from mappa_env.envs.dsbench.scoring import canonical_ids

logger = logging.getLogger(__name__)

#: A target value as text: 1, 1.0, "1.0" and numpy.int64(1) are one label; a missing one is
#: "nan". The inspector's own function (``canonical``), which the scorer runs too, so the
#: rows both sides write and the labels scored compare alike.
label_text = inspector_function("canonical")


def label_rows(frame: pd.DataFrame) -> pd.Series:
    """Each row of ``frame`` as text: its values by :func:`label_text`, joined by ``|``."""
    return frame.map(label_text).agg("|".join, axis=1)


def holds_target(given: Sequence[str], truth: Sequence[str], task_type: str) -> bool:
    """Whether ``given`` rows are train.csv's target ``truth`` rows, up to an encoding.

    Row by row over the rows both have (the engineer is asked to keep train.csv's row
    order): for classification a consistent relabelling (each true label becomes one
    label, distinct labels stay distinct: label or one-hot encodings pass) on at least
    95% of the rows; for regression a rank correlation of at least 0.95 in size per
    column over the rows where both are numbers (a monotone transform such as ``log1p``
    or ``-y`` passes; values missing in train.csv are left out, and y_train must have a
    number on at least 95% of the rows where train.csv has one). A made-up target with the
    right row count (row numbers, alternating labels, a few true values among missing
    ones) does not.
    """
    rows = min(len(given), len(truth))
    if rows == 0:
        return False
    given, truth = list(given[:rows]), list(truth[:rows])
    if task_type == "regression":
        import numpy
        from scipy.stats import spearmanr

        try:
            left = numpy.array([[float(v) for v in row.split("|")] for row in given])
            right = numpy.array([[float(v) for v in row.split("|")] for row in truth])
        except ValueError:
            return False
        if left.shape != right.shape:
            return False
        for column in range(right.shape[1]):
            known = numpy.isfinite(right[:, column])
            both = numpy.isfinite(left[:, column]) & known
            if both.sum() < 0.95 * known.sum():
                return False  # missing where the target has a number: not the target
            x, y = left[both, column], right[both, column]
            if len(y) < 3 or numpy.ptp(y) == 0:
                continue  # too few numbers, or a constant true column: nothing to rank
            if numpy.ptp(x) == 0:
                return False
            rho = spearmanr(x, y).statistic
            if not numpy.isfinite(rho) or abs(rho) < 0.95:
                return False
        return True
    pairs: dict[str, Counter[str]] = {}
    for true, got in zip(truth, given, strict=True):
        pairs.setdefault(true, Counter())[got] += 1
    chosen = [counts.most_common(1)[0] for counts in pairs.values()]
    consistent = sum(count for _, count in chosen) / rows
    return consistent >= 0.95 and len({label for label, _ in chosen}) == len(chosen)


def target_translation(
    given: Sequence[str], truth: Sequence[str], task_type: str
) -> tuple[dict[str, str] | None, list[float] | None]:
    """How to read values in y_train's encoding as train.csv's target values.

    Classification: each label of ``given`` maps to the true label it stands for most
    often on the same rows (an encoding ``0, 1, 2`` of ``setosa, versicolor, virginica``);
    regression: per column, ``-1`` where the encoding reverses the order (``-y``), else
    ``1``. Rows as in :func:`holds_target`.

    Returns:
        ``(labels, None)`` for classification, ``(None, signs)`` for regression.
    """
    rows = min(len(given), len(truth))
    if task_type != "regression":
        pairs: dict[str, Counter[str]] = {}
        for true, got in zip(truth[:rows], given[:rows], strict=True):
            pairs.setdefault(got, Counter())[true] += 1
        return {got: counts.most_common(1)[0][0] for got, counts in pairs.items()}, None
    import numpy
    from scipy.stats import spearmanr

    try:
        left = numpy.array([[float(v) for v in row.split("|")] for row in given[:rows]])
        right = numpy.array([[float(v) for v in row.split("|")] for row in truth[:rows]])
    except ValueError:
        return None, None
    if left.ndim != 2 or left.shape != right.shape:
        return None, None
    signs = []
    for column in range(right.shape[1]):
        both = numpy.isfinite(left[:, column]) & numpy.isfinite(right[:, column])
        rho = spearmanr(left[both, column], right[both, column]).statistic if both.sum() > 2 else 1
        signs.append(-1.0 if numpy.isfinite(rho) and rho < 0 else 1.0)
    return None, signs


def train_target_rows(task: Any, rows: int) -> list[str] | None:
    """The first ``rows`` rows of the task's train.csv target, as the inspector writes them.

    Read from the task's own train.csv, not the workspace copy agent code can change;
    ``None`` (with a warning) when it cannot be read.
    """
    try:
        frame = pd.read_csv(task.train_path, usecols=list(task.target_columns), nrows=rows)
    except (OSError, ValueError) as exc:
        logger.warning("train.csv's target of %s could not be read: %s", task.id, exc)
        return None
    frame = frame[list(task.target_columns)]
    return label_rows(frame).tolist()


def answers_of_test_rows(
    task: Any, answers: pd.DataFrame | None, rows: int
) -> list[str | None] | None:
    """The answers of test.csv's first ``rows`` rows, as prediction rows are written.

    Joined by id (as the scorer joins); ``None`` for a row without an answer, and
    ``None`` (with a warning) when test.csv or the answers cannot be read.
    """
    try:
        ids = pd.read_csv(task.test_path, usecols=[task.id_column], nrows=rows, dtype=str)[
            task.id_column
        ]
        assert answers is not None
        keyed = answers.set_index(canonical_ids(answers[task.id_column]))
        joined = label_rows(keyed[list(task.target_columns)])
        joined = joined[~joined.index.duplicated()]
        return [joined.get(i) for i in canonical_ids(ids)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("the answers of %s's test rows could not be read: %s", task.id, exc)
        return None
