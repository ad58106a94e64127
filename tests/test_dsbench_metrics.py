"""Tests for DSBench submission scoring: metric references, id joins, bad submissions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from sklearn import metrics as skm

from mappa_env.dsbench.metrics import (
    FAILED_SUBMISSION_CAP,
    METRICS,
    Score,
    canonical_ids,
    fair_percent_of_range,
    fair_value,
    get_metric,
    map_at_k,
    mcrmse,
    normalize_value,
    normalized_gini,
    outcome_cap,
    prediction_skill,
    score_submission,
    skill_cap,
    smape,
    word_jaccard,
)

N = 60


def _frames(truth: dict, pred: dict, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Answers and a submission with the same ids, the submission's rows shuffled."""
    ids = [f"row{i:03d}" for i in range(len(next(iter(truth.values()))))]
    answers = pd.DataFrame({"id": ids, **truth})
    submission = pd.DataFrame({"id": ids, **pred})
    order = np.random.default_rng(seed).permutation(len(ids))
    return answers, submission.iloc[order].reset_index(drop=True)


def _labels(rng: np.random.Generator, classes: list, n: int = N) -> np.ndarray:
    return rng.choice(np.array(classes, dtype=object), size=n)


def _reference_cases():
    """(metric, answers, submission, reference value) built from seeded random data."""
    rng = np.random.default_rng(42)
    cases = []

    y = _labels(rng, ["cat", "dog", "owl"])
    p = np.where(rng.random(N) < 0.6, y, _labels(rng, ["cat", "dog", "owl"]))
    cases.append(("accuracy", {"y": y}, {"y": p}, skm.accuracy_score(y, p)))
    for average in ("micro", "macro", "weighted"):
        reference = skm.f1_score(y, p, average=average)
        cases.append((f"f1_{average}", {"y": y}, {"y": p}, reference))

    yb = rng.integers(0, 2, N)
    pb = np.where(rng.random(N) < 0.7, yb, 1 - yb)
    cases.append(("f1", {"y": yb}, {"y": pb}, skm.f1_score(yb, pb)))
    cases.append(("jaccard_score", {"y": yb}, {"y": pb}, skm.jaccard_score(yb, pb)))

    scores = np.clip(yb * 0.3 + rng.random(N) * 0.7, 0, 1)
    cases.append(("roc_auc", {"y": yb}, {"y": scores}, skm.roc_auc_score(yb, scores)))
    cases.append(("log_loss", {"y": yb}, {"y": scores}, skm.log_loss(yb, scores)))

    ratings = rng.integers(1, 7, N)
    noisy = np.clip(ratings + rng.integers(-1, 2, N), 1, 6)
    reference = skm.cohen_kappa_score(ratings, noisy, weights="quadratic")
    cases.append(("quadratic_weighted_kappa", {"y": ratings}, {"y": noisy}, reference))

    yr = rng.gamma(2.0, 3.0, N)
    pr = np.abs(yr + rng.normal(0, 1.5, N))
    cases += [
        ("rmse", {"y": yr}, {"y": pr}, skm.root_mean_squared_error(yr, pr)),
        ("rmsle", {"y": yr}, {"y": pr}, skm.root_mean_squared_log_error(yr, pr)),
        ("mae", {"y": yr}, {"y": pr}, skm.mean_absolute_error(yr, pr)),
        ("medae", {"y": yr}, {"y": pr}, skm.median_absolute_error(yr, pr)),
        ("r2", {"y": yr}, {"y": pr}, skm.r2_score(yr, pr)),
        ("pearson", {"y": yr}, {"y": pr}, stats.pearsonr(yr, pr).statistic),
        ("spearman", {"y": yr}, {"y": pr}, stats.spearmanr(yr, pr).statistic),
        ("normalized_gini", {"y": yb}, {"y": scores}, 2 * skm.roc_auc_score(yb, scores) - 1),
    ]

    y2 = rng.normal(size=(N, 3))
    p2 = y2 + rng.normal(0, 0.5, size=(N, 3))
    reference = skm.root_mean_squared_error(y2, p2, multioutput="raw_values").mean()
    truth = {f"t{j}": y2[:, j] for j in range(3)}
    pred = {f"t{j}": p2[:, j] for j in range(3)}
    cases.append(("mcrmse", truth, pred, reference))

    # Mean column-wise AUC over several binary targets (multi-label).
    y3 = rng.integers(0, 2, size=(N, 2))
    s3 = np.clip(y3 * 0.4 + rng.random((N, 2)) * 0.6, 0, 1)
    reference = np.mean([skm.roc_auc_score(y3[:, j], s3[:, j]) for j in range(2)])
    cases.append(
        ("roc_auc", {"a": y3[:, 0], "b": y3[:, 1]}, {"a": s3[:, 0], "b": s3[:, 1]}, reference)
    )
    return cases


@pytest.mark.parametrize(
    ("metric", "truth", "pred", "reference"),
    _reference_cases(),
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_metric_matches_reference_and_ignores_row_order(metric, truth, pred, reference):
    answers, submission = _frames(truth, pred)
    score = score_submission(submission, answers, metric, "id", list(truth))
    assert score.success, score.reason
    assert score.value == pytest.approx(reference, rel=1e-9, abs=1e-12)
    assert set(score.per_column) == set(truth)
    assert score.n_rows == N
    assert 0.0 <= score.normalized <= 1.0

    # Any order of the submission's rows gives the identical score.
    reshuffled = submission.iloc[::-1].reset_index(drop=True)
    again = score_submission(reshuffled, answers, metric, "id", list(truth))
    assert again.value == score.value
    assert again.per_column == score.per_column


def test_multiclass_probability_columns_use_one_vs_rest_auc_and_log_loss():
    rng = np.random.default_rng(3)
    classes = ["Graduate", "Dropout", "Enrolled"]
    y = _labels(rng, classes)
    raw = rng.random((N, 3)) + np.stack([(y == c) * 0.8 for c in sorted(classes)], axis=1)
    probabilities = raw / raw.sum(axis=1, keepdims=True)
    # Submission columns are named after the classes, in an order unlike the sorted one.
    pred = {c: probabilities[:, sorted(classes).index(c)] for c in classes}
    answers, submission = _frames({"Target": y}, pred)
    codes = np.searchsorted(np.array(sorted(classes)), y.astype(str))
    auc = score_submission(submission, answers, "roc_auc", "id", "Target")
    assert auc.success, auc.reason
    expected_auc = skm.roc_auc_score(codes, probabilities, multi_class="ovr")
    assert auc.value == pytest.approx(expected_auc)
    loss = score_submission(submission, answers, "log_loss", "id", "Target")
    assert loss.value == pytest.approx(skm.log_loss(codes, probabilities))
    # Without per-class columns a multi-class probability metric cannot be scored.
    labels_only = pd.DataFrame({"id": answers["id"], "Target": y})
    failed = score_submission(labels_only, answers, "roc_auc", "id", "Target")
    assert not failed.success
    assert "probability column per class" in failed.reason


def test_one_hot_log_loss_is_multiclass_and_reports_each_column():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 3, N)
    names = ["winner_model_a", "winner_model_b", "winner_tie"]
    truth = {name: (codes == j).astype(int) for j, name in enumerate(names)}
    raw = (rng.random((N, 3)) + np.eye(3)[codes]) / 2
    pred = {name: raw[:, j] for j, name in enumerate(names)}  # rows need not sum to 1
    answers, submission = _frames(truth, pred)
    score = score_submission(submission, answers, "log_loss", "id", names)
    assert score.success, score.reason
    normalised = raw / raw.sum(axis=1, keepdims=True)
    assert score.value == pytest.approx(skm.log_loss(codes, normalised))
    for j, name in enumerate(names):
        assert score.per_column[name] == pytest.approx(
            skm.log_loss(truth[name], raw[:, j], labels=[0, 1])
        )


def test_smape_hand_computed():
    # |110-100|/105 = 2/21, |0-0| -> 0, |50-100|/75 = 2/3; mean * 100.
    expected = 100 * (2 / 21 + 0 + 2 / 3) / 3
    assert smape([100, 0, 100], [110, 0, 50]) == pytest.approx(expected)
    answers, submission = _frames({"y": [100.0, 0.0, 100.0]}, {"y": [110.0, 0.0, 50.0]})
    assert score_submission(submission, answers, "smape", "id", "y").value == pytest.approx(
        expected
    )


def test_mcrmse_hand_computed():
    truth = [[1.0, 2.0], [3.0, 4.0]]
    pred = [[2.0, 2.0], [3.0, 2.0]]
    # column 1: sqrt((1 + 0) / 2); column 2: sqrt((0 + 4) / 2).
    expected = (math.sqrt(0.5) + math.sqrt(2.0)) / 2
    assert mcrmse(truth, pred) == pytest.approx(expected)


def test_map_at_k_hand_computed():
    actual = ["A", "B", "C", "D"]
    predicted = ["A B C", "C B A", "A B C", "A B C"]
    # ranks 1, 2, 3 and not found -> (1 + 1/2 + 1/3 + 0) / 4
    assert map_at_k(actual, predicted, 3) == pytest.approx((1 + 0.5 + 1 / 3) / 4)
    # A label repeated in the prediction counts once; only the first k entries count.
    assert map_at_k(["B"], ["A A B"], 3) == pytest.approx(1 / 3)
    assert map_at_k(["C"], ["A B C"], 2) == 0.0
    answers, submission = _frames({"prognosis": actual}, {"prognosis": predicted})
    score = score_submission(submission, answers, "map@3", "id", "prognosis")
    assert score.success, score.reason
    assert score.value == pytest.approx((1 + 0.5 + 1 / 3) / 4)


def test_normalized_gini_hand_computed_and_tie_invariant():
    # Scores rank the two positives 1st and 3rd of 4: Lorenz points (.25,.5) (.5,.5)
    # (.75,1) (1,1); area = .0625 + .125 + .1875 + .25 = .625 -> Gini .125; the perfect
    # order has area .75 -> .25; normalized = .5 (= 2 * AUC - 1 with AUC .75).
    y = [1, 0, 1, 0]
    assert normalized_gini(y, [0.9, 0.8, 0.7, 0.1]) == pytest.approx(0.5)
    rng = np.random.default_rng(1)
    yb = rng.integers(0, 2, 200)
    tied = rng.integers(0, 5, 200).astype(float)  # many ties
    assert normalized_gini(yb, tied) == pytest.approx(2 * skm.roc_auc_score(yb, tied) - 1)
    order = rng.permutation(200)
    assert normalized_gini(yb[order], tied[order]) == pytest.approx(normalized_gini(yb, tied))


def test_word_jaccard_hand_computed():
    truth = ["very good day", "I don't care", ""]
    pred = ["Very good", "care", ""]
    expected = (2 / 3 + 1 / 3 + 1.0) / 3
    assert word_jaccard(truth, pred) == pytest.approx(expected)
    answers, submission = _frames({"selected_text": truth}, {"selected_text": pred})
    score = score_submission(submission, answers, "jaccard", "id", "selected_text")
    assert score.value == pytest.approx(expected)


def test_multi_target_scores_every_column():
    rng = np.random.default_rng(7)
    truth = {"ConfirmedCases": rng.gamma(2, 50, N), "Fatalities": rng.gamma(2, 2, N)}
    good = {name: values * 1.05 for name, values in truth.items()}
    answers, submission = _frames(truth, good)
    base = score_submission(submission, answers, "rmsle", "id", list(truth))
    assert base.success, base.reason
    assert set(base.per_column) == set(truth)
    assert base.value == pytest.approx(np.mean(list(base.per_column.values())))
    wrong_second = submission.copy()
    wrong_second["Fatalities"] = wrong_second["Fatalities"] * 10
    worse = score_submission(wrong_second, answers, "rmsle", "id", list(truth))
    assert worse.per_column["ConfirmedCases"] == base.per_column["ConfirmedCases"]
    assert worse.per_column["Fatalities"] > base.per_column["Fatalities"]
    assert worse.value > base.value


def test_ids_join_across_spellings_but_keep_leading_zeros():
    assert canonical_ids(pd.Series([1, 2])).tolist() == ["1", "2"]
    assert canonical_ids(pd.Series([1.0, 2.0])).tolist() == ["1", "2"]
    assert canonical_ids(pd.Series([" 1 ", "2.0", "007", "0013_01", "1.5"])).tolist() == [
        "1",
        "2",
        "007",
        "0013_01",
        "1.5",
    ]
    answers = pd.DataFrame({"id": ["1", "2", "3"], "y": [1.0, 2.0, 3.0]})
    as_floats = pd.DataFrame({"id": [3.0, 1.0, 2.0], "y": [3.0, 1.0, 2.0]})
    assert score_submission(as_floats, answers, "rmse", "id", "y").value == 0.0
    zero_padded = pd.DataFrame({"id": ["01", "02", "03"], "y": [1.0, 2.0, 3.0]})
    failed = score_submission(zero_padded, answers, "rmse", "id", "y")
    assert not failed.success
    assert "lacks 3 of the 3 ids" in failed.reason


def test_labels_compare_in_canonical_form_and_columns_match_loosely():
    answers = pd.DataFrame({"PassengerId": ["a", "b", "c"], "Transported": [True, False, True]})
    submission = pd.DataFrame(
        {" passengerid ": ["c", "a", "b"], "TRANSPORTED": ["true", "True", "FALSE"]}
    )
    score = score_submission(submission, answers, "accuracy", "PassengerId", "Transported")
    assert score.success, score.reason
    assert score.value == 1.0
    numeric = pd.DataFrame({"PassengerId": ["a", "b", "c"], "Transported": [1.0, 0.0, 1.0]})
    mismatch = score_submission(numeric, answers, "accuracy", "PassengerId", "Transported")
    assert mismatch.value == 0.0
    assert any("not among the answers' classes" in note for note in mismatch.warnings)


def test_csv_paths_give_the_same_score_as_frames(tmp_path: Path):
    rng = np.random.default_rng(11)
    answers, submission = _frames({"y": rng.normal(size=N)}, {"y": rng.normal(size=N)})
    answers.to_csv(tmp_path / "answers.csv", index=False)
    submission.to_csv(tmp_path / "submission.csv", index=False)
    from_frames = score_submission(submission, answers, "rmse", "id", "y")
    from_files = score_submission(
        tmp_path / "submission.csv", tmp_path / "answers.csv", "rmse", "id", "y"
    )
    assert from_files.success, from_files.reason
    assert from_files.value == pytest.approx(from_frames.value)


def test_target_columns_default_to_all_non_id_answer_columns():
    answers = pd.DataFrame({"qa_id": [1, 2, 3], "q1": [0.1, 0.5, 0.9], "q2": [0.2, 0.4, 0.8]})
    score = score_submission(answers.copy(), answers, "spearman", "qa_id", None)
    assert score.success, score.reason
    assert set(score.per_column) == {"q1", "q2"}
    assert score.value == pytest.approx(1.0)


def test_constant_prediction_correlation_counts_as_zero():
    answers = pd.DataFrame({"id": [1, 2, 3], "score": [0.1, 0.5, 0.9]})
    constant = pd.DataFrame({"id": [1, 2, 3], "score": [0.5, 0.5, 0.5]})
    score = score_submission(constant, answers, "pearson", "id", "score")
    assert score.success
    assert score.value == 0.0


@pytest.mark.parametrize("metric", ["f1", "jaccard_score", "accuracy", "f1_macro"])
def test_no_constant_label_counts_as_skill(metric):
    # 1 in 4 rows positive: a constant "1" has F1 2p/(1+p) = 0.4 and Jaccard p = 0.25,
    # more than the majority "0" (0 for both), and is still no model at all.
    labels = [1, 0, 0, 0] * 25
    answers = pd.DataFrame({"id": range(100), "y": labels})
    for constant in (0, 1):
        submission = pd.DataFrame({"id": range(100), "y": [constant] * 100})
        score = score_submission(submission, answers, metric, "id", "y")
        assert score.success
        assert score.normalized == 0.0, (constant, score)
    # A real signal still counts: half of the positives found, no false alarm.
    found = [1, 0, 0, 0] * 12 + [0, 0, 0, 0] * 13
    score = score_submission(pd.DataFrame({"id": range(100), "y": found}), answers, metric,
                             "id", "y")  # fmt: skip
    assert score.normalized > 0.0


def _bad_submission_cases(tmp_path: Path):
    answers = pd.DataFrame({"id": [1, 2, 3, 4], "y": [1.0, 2.0, 3.0, 4.0]})
    good = answers.copy()
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "binary.csv").write_bytes(b"\x00\xff\xfe\x00garbage\x00\n\x89PNG")
    (tmp_path / "ragged.csv").write_text('id,y\n1,2\n"3,4\n')
    (tmp_path / "folder").mkdir()
    (tmp_path / "blank.csv").write_text("id,y\n1,1.0\n2,\n3,3\n4,4\n")
    (tmp_path / "text.csv").write_text("id,y\n1,1.0\n2,abc\n3,3\n4,4\n")
    return answers, [
        ("missing file", tmp_path / "nope.csv", "rmse", "not found"),
        ("directory", tmp_path / "folder", "rmse", "not a file"),
        ("empty file", tmp_path / "empty.csv", "rmse", "empty"),
        ("binary file", tmp_path / "binary.csv", "rmse", "not a readable CSV"),
        ("unbalanced quote", tmp_path / "ragged.csv", "rmse", "not a readable CSV"),
        ("blank cell in csv", tmp_path / "blank.csv", "rmse", "missing"),
        ("text cell in csv", tmp_path / "text.csv", "rmse", "non-numeric"),
        ("no id column", good.drop(columns="id"), "rmse", "lacks the id column"),
        ("no target column", good.drop(columns="y"), "rmse", "lacks the target column"),
        ("duplicate ids", pd.concat([good, good.iloc[:1]]), "rmse", "duplicate id"),
        ("missing ids", good.iloc[:2], "rmse", "lacks 2 of the 4 ids"),
        (
            "extra ids",
            pd.concat([good, pd.DataFrame({"id": [9], "y": [1.0]})]),
            "rmse",
            "not in the test set",
        ),
        ("missing id value", good.assign(id=[1, 2, None, 4]), "rmse", "missing ids"),
        ("nan values", good.assign(y=[1.0, np.nan, 3.0, 4.0]), "rmse", "missing"),
        ("text values", good.assign(y=["1", "two", "3", "4"]), "rmse", "non-numeric"),
        ("infinite values", good.assign(y=[1.0, np.inf, 3.0, 4.0]), "rmse", "infinite"),
        ("negative for rmsle", good.assign(y=[1.0, -2.0, 3.0, 4.0]), "rmsle", "negative"),
        (
            "probabilities out of range",
            good.assign(y=[0.1, 1.5, 0.2, 0.3]),
            "log_loss",
            "in [0, 1]",
        ),
        ("non-integer ratings", good.assign(y=[1.5, 2.0, 3.0, 4.0]), "qwk", "integer"),
        (
            "duplicate column names",
            pd.DataFrame([[1, 1.0, 2.0]], columns=["id", "y", " y"]),
            "rmse",
            "duplicate column",
        ),
        ("empty frame", pd.DataFrame(), "rmse", "lacks the id column"),
    ]


def test_bad_submissions_fail_with_a_reason(tmp_path: Path):
    answers, cases = _bad_submission_cases(tmp_path)
    for name, submission, metric, expected in cases:
        answers_for_metric = answers
        if metric == "log_loss":
            answers_for_metric = answers.assign(y=[0, 1, 0, 1])
        score = score_submission(submission, answers_for_metric, metric, "id", "y")
        assert not score.success, name
        assert score.value is None, name
        assert score.reason, name
        assert expected in score.reason, (name, score.reason)
        assert score.normalized == 0.0
        assert score.to_dict()["reason"] == score.reason


def test_bad_answers_fail_without_raising():
    submission = pd.DataFrame({"id": [1, 2], "y": [1.0, 2.0]})
    no_target = score_submission(submission, pd.DataFrame({"id": [1, 2]}), "rmse", "id", "y")
    assert not no_target.success
    assert "answers lack the target column" in no_target.reason
    duplicated = pd.DataFrame({"id": [1, 1], "y": [1.0, 2.0]})
    assert (
        "answers have duplicate ids"
        in score_submission(submission, duplicated, "rmse", "id", "y").reason
    )


def test_unknown_metric_is_a_caller_error():
    with pytest.raises(KeyError, match="unknown metric"):
        score_submission(pd.DataFrame(), pd.DataFrame(), "not_a_metric", "id", "y")


_cell = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.booleans(),
    st.sampled_from(["1", "2.0", " 3 ", "nan", "True", "a b", "0.5"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    metric=st.sampled_from([*sorted(METRICS), "map_at_3", "qwk"]),
    n_rows=st.integers(0, 6),
    columns=st.lists(st.sampled_from(["id", "y", "z", "Y", " id"]), max_size=4),
    data=st.data(),
)
def test_random_submissions_never_raise(metric, n_rows, columns, data):
    rows = {
        column: data.draw(st.lists(_cell, min_size=n_rows, max_size=n_rows))
        for column in dict.fromkeys(columns)
    }
    submission = pd.DataFrame(rows)
    answers = pd.DataFrame({"id": [0, 1, 2, 3], "y": [0, 1, 1, 0]})
    score = score_submission(submission, answers, metric, "id", "y")
    assert isinstance(score, Score)
    if score.success:
        assert score.value is not None
        assert math.isfinite(score.value)
        assert 0.0 <= score.normalized <= 1.0
    else:
        # Unanticipated exceptions are caught and reported as "scoring error"; random
        # frames must only ever hit the checks that explain what is wrong.
        assert score.reason
        assert not score.reason.startswith("scoring error"), score.reason


_ANSWER_TABLES = [
    pd.DataFrame({"id": [0, 1, 2, 3], "y": [0, 1, 1, 0]}),
    pd.DataFrame({"id": ["a", "b", "c"], "y": [1.5, 2.5, 0.0]}),
    pd.DataFrame({"id": [0, 1, 2, 3, 4], "y": ["x", "y", "z", "x", "y"]}),
    pd.DataFrame({"id": [0, 1], "y": [1, 1]}),
    pd.DataFrame({"id": [0, 1, 2], "y": ["a b", "c", ""]}),
    pd.DataFrame({"id": [0, 1, 2], "y": [True, False, True]}),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    metric=st.sampled_from([*sorted(METRICS), "map_at_3", "qwk"]),
    table=st.integers(0, len(_ANSWER_TABLES) - 1),
    extra_columns=st.lists(st.sampled_from(["x", "z", "0", "1"]), max_size=2, unique=True),
    data=st.data(),
)
def test_random_values_with_matching_ids_never_raise(metric, table, extra_columns, data):
    """Ids match, so every metric's own checks and computation see random values."""
    answers = _ANSWER_TABLES[table]
    n_rows = len(answers)
    values = st.lists(st.one_of(_cell, st.floats(0, 1)), min_size=n_rows, max_size=n_rows)
    rows = {"id": list(answers["id"])[::-1], "y": data.draw(values)}
    for column in extra_columns:
        rows[column] = data.draw(values)
    score = score_submission(pd.DataFrame(rows), answers, metric, "id", "y")
    if score.success:
        assert math.isfinite(score.value)
        assert 0.0 <= score.normalized <= 1.0
    else:
        assert score.reason
        assert not score.reason.startswith("scoring error"), score.reason


def test_aliases_and_map_at_k():
    assert get_metric("qwk") is METRICS["quadratic_weighted_kappa"]
    assert get_metric("QWK").name == "quadratic_weighted_kappa"
    assert get_metric("f1_binary") is METRICS["f1"]
    assert get_metric("map@3") is METRICS["map_at_3"]
    assert get_metric("map_at_5").name == "map_at_5"
    answers = pd.DataFrame({"id": [1], "y": ["E"]})
    submission = pd.DataFrame({"id": [1], "y": ["A B C D E"]})
    assert score_submission(submission, answers, "map@5", "id", "y").value == pytest.approx(0.2)
    assert score_submission(submission, answers, "map@3", "id", "y").value == 0.0
    for name, metric in METRICS.items():
        assert metric.name == name
        assert metric.kind in ("classification", "regression", "ranking", "text")
    with pytest.raises(KeyError):
        get_metric("map_at_0")


def test_baselines_are_the_scores_of_constant_guesses():
    rng = np.random.default_rng(9)
    y = (rng.random(N) < 0.3).astype(int)
    answers, submission = _frames({"y": y}, {"y": np.full(N, 0.5)})
    loss = score_submission(submission, answers, "log_loss", "id", "y")
    assert loss.baseline == pytest.approx(skm.log_loss(y, np.full(N, y.mean())))
    assert loss.normalized == pytest.approx(max(0.0, 1 - loss.value / loss.baseline))
    accuracy = score_submission(submission.assign(y=0), answers, "accuracy", "id", "y")
    assert accuracy.baseline == pytest.approx(max(y.mean(), 1 - y.mean()))
    yr = rng.gamma(2.0, 3.0, N)
    answers, submission = _frames({"y": yr}, {"y": yr})
    mae = score_submission(submission, answers, "mae", "id", "y")
    assert mae.baseline == pytest.approx(skm.mean_absolute_error(yr, np.full(N, np.median(yr))))
    rmsle = score_submission(submission, answers, "rmsle", "id", "y")
    guess = np.expm1(np.mean(np.log1p(yr)))
    assert rmsle.baseline == pytest.approx(skm.root_mean_squared_log_error(yr, np.full(N, guess)))
    assert mae.target_range == pytest.approx(np.ptp(yr))


def test_normalized_is_zero_at_the_constant_guess_and_one_when_perfect():
    rng = np.random.default_rng(2)
    y = rng.normal(10, 3, N)
    answers, perfect = _frames({"y": y}, {"y": y})
    constant = perfect.assign(y=y.mean())
    half = perfect.assign(y=perfect["y"] + 1.0)
    assert score_submission(perfect, answers, "rmse", "id", "y").normalized == 1.0
    assert score_submission(constant, answers, "rmse", "id", "y").normalized == pytest.approx(0.0)
    partial = score_submission(half, answers, "rmse", "id", "y")
    assert partial.normalized == pytest.approx(1 - 1.0 / np.std(y))
    labels = pd.DataFrame({"id": range(10), "y": ["a"] * 7 + ["b"] * 3})
    majority = labels.assign(y="a")
    assert score_submission(majority, labels, "accuracy", "id", "y").normalized == 0.0
    assert normalize_value(0.75, 0.5, "roc_auc") == pytest.approx(0.5)
    assert normalize_value(0.4, 0.5, "roc_auc") == 0.0


def _score(metric: str, value: float | None, **extra) -> Score:
    spec = get_metric(metric)
    return Score(
        success=value is not None,
        metric=spec.name,
        value=value,
        reason=None if value is not None else "failed",
        higher_is_better=spec.higher_is_better,
        **extra,
    )


def test_fair_values_follow_the_paper():
    assert fair_value(_score("accuracy", None)) == 0.5
    assert fair_value(_score("roc_auc", None)) == 0.5
    assert fair_value(_score("f1_macro", None)) == 0.0
    assert fair_value(_score("rmse", None, target_range=40.0)) == 20.0
    assert fair_value(_score("rmse", None), target_range=10.0) == 5.0
    assert fair_value(_score("log_loss", None, baseline=0.69)) == 0.69
    assert fair_value(_score("accuracy", 0.8)) == 0.8
    assert fair_percent_of_range(_score("rmse", 4.0, target_range=40.0)) == pytest.approx(10.0)
    assert fair_percent_of_range(_score("rmse", None, target_range=40.0)) == 50.0
    assert fair_value(_score("rmse", None)) is None  # no range known: nothing to count
    assert fair_value(_score("log_loss", None)) is None
    # The scorer knows the range and baseline from the answers even without a submission.
    answers = pd.DataFrame({"id": [1, 2, 3], "y": [0.0, 10.0, 4.0]})
    missing = score_submission(Path("no-such-submission.csv"), answers, "rmse", "id", "y")
    assert not missing.success
    assert fair_value(missing) == 5.0


@pytest.mark.parametrize(
    ("metric", "value", "task_type", "extra", "cap"),
    [
        # Balanced binary answers: skill over the majority is 2 * accuracy - 1.
        ("accuracy", 0.9, "classification", {"normalized": 0.8}, 9),
        ("roc_auc", 0.8, "classification", {}, 8),
        ("roc_auc", 0.7, "classification", {}, 6),
        ("accuracy", 0.6, "classification", {"normalized": 0.2}, 4),
        ("accuracy", 0.5, "classification", {}, 3),
        # A constant majority guess on answers that are 92% one class: no skill.
        ("accuracy", 0.92, "classification", {"normalized": 0.0}, 3),
        # Ten balanced classes: 0.8 is 9 on the skill ladder, 8 on the accuracy one.
        ("accuracy", 0.8, "classification", {"normalized": 0.78}, 8),
        ("rmse", 5.0, "regression", {"target_range": 100.0, "normalized": 0.8}, 9),
        ("rmse", 20.0, "regression", {"target_range": 100.0, "normalized": 0.3}, 8),
        ("rmse", 40.0, "regression", {"target_range": 100.0, "normalized": 0.2}, 6),
        ("rmse", 60.0, "regression", {"target_range": 100.0, "normalized": 0.2}, 4),
        # The answers' mean: RMSE = their std, 20% of the range, and no skill at all.
        ("rmse", 20.0, "regression", {"target_range": 100.0, "normalized": 0.0}, 4),
        ("mcrmse", 20.0, "regression", {"target_range": 100.0, "normalized": 0.02}, 4),
        # An honest model of a noisy target (R² 0.18) keeps the ladder.
        ("rmse", 12.8, "regression", {"target_range": 100.0, "normalized": 0.09}, 8),
        ("log_loss", 0.2, "classification", {"normalized": 0.75}, 9),
        ("log_loss", 0.6, "classification", {"normalized": 0.05}, 3),
        ("mae", 1.0, "regression", {"normalized": 0.55}, 8),
        ("mae", 1.0, "regression", {"normalized": 0.1}, 4),
    ],
)
def test_outcome_cap_follows_the_rubric(metric, value, task_type, extra, cap):
    assert outcome_cap(_score(metric, value, **extra), task_type) == cap


def test_outcome_cap_of_a_failure_is_lowest():
    assert outcome_cap(_score("accuracy", None), "classification") == FAILED_SUBMISSION_CAP
    assert FAILED_SUBMISSION_CAP < 3


def test_prediction_skill_is_kappa_for_labels_and_rank_correlation_for_numbers():
    # Cohen's kappa by hand: p_o = 3/4, p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2 -> 0.5.
    predicted, truth = ["a", "a", "b", "b"] * 3, ["a", "b", "b", "b"] * 3
    assert prediction_skill(predicted, truth, "classification") == pytest.approx(0.5)
    # A constant has no skill, labels in another encoding are translated first.
    assert prediction_skill(["b"] * 12, truth, "classification") == 0.0
    encoded = ["0" if v == "a" else "1" for v in predicted]
    assert prediction_skill(
        encoded, truth, "classification", labels={"0": "a", "1": "b"}
    ) == pytest.approx(0.5)
    # Numbers: a monotone transform keeps all its skill, a reversed encoding is turned.
    values = [str(v) for v in range(12)]
    cubes = [str(v**3) for v in range(12)]
    assert prediction_skill(cubes, values, "regression") == pytest.approx(1.0)
    negated = [str(-(v**3)) for v in range(12)]
    assert prediction_skill(negated, values, "regression") == 0.0
    assert prediction_skill(negated, values, "regression", signs=[-1.0]) == pytest.approx(1.0)
    # Several columns are scored apart and averaged; too few rows are not scored.
    rows = [f"{v}|{v}" for v in range(12)]
    assert prediction_skill(rows, rows, "regression") == pytest.approx(1.0)
    assert prediction_skill(["1"] * 5, ["1"] * 5, "classification") is None


def test_skill_caps_follow_the_analysts_ladders():
    assert [skill_cap(s, "classification") for s in (0.0, 0.1, 0.3, 0.5, 0.7)] == [3, 4, 6, 8, 9]
    assert [skill_cap(s, "regression") for s in (0.0, 0.25, 0.5, 0.7)] == [4, 6, 8, 9]
