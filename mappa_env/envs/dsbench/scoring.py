"""Scoring DSBench submissions: a scorer that joins by id (metrics: :mod:`.metrics`).

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
  ``"7"``) and ``true``/``false`` in any case are ``"True"``/``"False"``. The artifact
  inspector writes y_train's and a model's labels by the same rule: it is the
  inspector's function (:func:`canonical_label`).
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
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mappa_env.envs.dsbench.inspections import inspector_function
from mappa_env.envs.dsbench.metrics import Metric, Score, get_metric, positive_label

logger = logging.getLogger(__name__)

# Integers above this lose precision as floats; such numbers stay as written.
_MAX_EXACT_FLOAT_INT = 2**53


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
            id_name = None if id_column is None else find_column(header, id_column)
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


def find_column(columns: Sequence[Any], name: str) -> str | None:
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


#: The label rule: the artifact inspector's own function (it runs where this package cannot
#: be imported), so the labels it writes and the ones scored here compare alike.
_LABEL_RULE = inspector_function("canonical")


def canonical_label(value: Any) -> str | None:
    """Canonical text of one class label (see the module docs), ``None`` when missing.

    The rule is the artifact inspector's ``canonical``
    (:func:`~mappa_env.envs.dsbench.inspections.inspector_function`), which writes a
    missing value as ``"nan"`` in its rows: that text reads back as missing here.

    Args:
        value: A label as read (number, bool, text, ``None``, NaN, ``pandas.NA``).

    Returns:
        The label's text, or ``None`` when the value is missing.
    """
    return _LABEL_RULE(value, None)


def _canonical_labels(series: pd.Series) -> np.ndarray:
    # Columns of labels hold few distinct values: canonicalise those, then map back.
    codes, uniques = pd.factorize(series, use_na_sentinel=True)
    lookup = np.array([canonical_label(value) for value in uniques] + [None], dtype=object)
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
        positive = positive_label(labels)
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
    # Few distinct labels fill many rows: the rule runs once per distinct token.
    known: dict[str, str] = {}

    def canonical(token: str) -> str:
        if token not in known:
            known[token] = _canonical_token(token)
        return known[token]

    return np.array(
        [" ".join(canonical(t) for t in str(v).split()) for v in _texts(series)],
        dtype=object,
    )


def _canonical_token(token: str) -> str:
    label = canonical_label(token)
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
        label = canonical_label(column)
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
    answers_id = find_column(list(answers.columns), id_column)
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
        found = find_column(list(answers.columns), name)
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
    submission_id = find_column(list(submission.columns), id_column)
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
            found = find_column(list(aligned.columns), column)
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
