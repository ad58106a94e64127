"""Tests for DSBench task sources: the real-layout loader and the built-in tasks."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer, make_column_selector
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from mappa_env.dsbench import metrics as dsbench_metrics
from mappa_env.dsbench.builtin import BUILTIN_PROMPTS_FILE, BUILTIN_TASK_NAMES, builtin_tasks
from mappa_env.dsbench.tasks import (
    BENCH_DIR_ENV,
    CLEANED_PROMPTS_FILE,
    DSBenchTask,
    find_bench_dir,
    load_dsbench_tasks,
    read_task_list,
)

BENCH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bench"


# ---------------------------------------------------------------------------------------
# A small fake DSBench tree
# ---------------------------------------------------------------------------------------


def _write(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)


def _fake_tree(root: Path) -> tuple[Path, Path, Path]:
    """Two tasks: 'alpha' (labels, accuracy) and 'beta' (two targets, RMSLE, no sample)."""
    data = root / "data"
    alpha_ids = ["a1", "a2", "a3", "a4"]
    _write(
        data / "data_resplit/alpha/train.csv",
        pd.DataFrame({"Id": ["t1", "t2"], "x": [1, 2], "label": ["cat", "dog"]}),
    )
    _write(data / "data_resplit/alpha/test.csv", pd.DataFrame({"Id": alpha_ids, "x": [1, 2, 3, 4]}))
    _write(
        data / "data_resplit/alpha/sample_submission.csv",
        pd.DataFrame({"Id": alpha_ids, "label": ["cat"] * 4}),
    )
    _write(
        data / "answers/alpha/test_answer.csv",
        pd.DataFrame({"Id": alpha_ids, "label": ["cat", "dog", "dog", "cat"]}),
    )
    beta_ids = [10, 11, 12]
    _write(
        data / "data_resplit/beta/train.csv",
        pd.DataFrame({"ForecastId": [1, 2], "x": [0.5, 0.7], "Cases": [3, 4], "Deaths": [0, 1]}),
    )
    _write(
        data / "data_resplit/beta/test.csv", pd.DataFrame({"ForecastId": beta_ids, "x": [1, 2, 3]})
    )
    beta_answers = {"ForecastId": beta_ids, "Cases": [5.0, 6.0, 7.0], "Deaths": [0.0, 1.0, 2.0]}
    _write(data / "answers/beta/test_answer.csv", pd.DataFrame(beta_answers))
    prompts = {
        "alpha": {
            "cleaned_prompt": "Task: predict the label.",
            "metric": "accuracy",
            "task_type": "classification",
            "target_column": "label",
            "id_column": "Id",
        },
        "beta": {
            "cleaned_prompt": "Task: forecast cases and deaths.",
            "metric": "rmsle",
            "task_type": "regression",
            "target_column": ["Cases", "Deaths"],
            "id_column": "ForecastId",
        },
    }
    prompts_path = root / "prompts.json"
    prompts_path.write_text(json.dumps(prompts))
    task_list = root / "list.json"
    rows = [
        {
            "prompt": "Raw Kaggle text for beta",
            "answer": None,
            "metadata": {"task_id": "beta", "url": "https://example.org/beta"},
        },
        {"prompt": "Raw text for gamma", "answer": None, "metadata": {"task_id": "gamma"}},
        {"prompt": "Raw Kaggle text for alpha", "answer": None, "metadata": {"task_id": "alpha"}},
    ]
    task_list.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return data, prompts_path, task_list


def test_loader_reads_a_fake_dsbench_tree(tmp_path: Path, caplog):
    data, prompts, task_list = _fake_tree(tmp_path)
    with caplog.at_level(logging.WARNING):
        tasks = load_dsbench_tasks(data, task_list=task_list, cleaned_prompts=prompts)
    # Listed order; 'gamma' has no cleaned prompt (metric unknown) and is skipped loudly.
    assert [task.id for task in tasks] == ["beta", "alpha"]
    assert "gamma" in caplog.text
    beta, alpha = tasks
    assert alpha.metric == "accuracy"
    assert alpha.task_type == "classification"
    assert alpha.id_column == "Id"
    assert alpha.target_columns == ("label",)
    assert alpha.description == "Task: predict the label."
    assert alpha.metadata["raw_prompt"] == "Raw Kaggle text for alpha"
    assert alpha.sample_submission_path == data / "data_resplit/alpha/sample_submission.csv"
    assert alpha.answers_path == data / "answers/alpha/test_answer.csv"
    assert set(alpha.agent_files()) == {"train.csv", "test.csv", "sample_submission.csv"}
    assert alpha.answers_path not in alpha.agent_files().values()
    assert beta.target_columns == ("Cases", "Deaths")
    assert beta.sample_submission_path is None
    assert set(beta.agent_files()) == {"train.csv", "test.csv"}
    assert beta.metadata["url"] == "https://example.org/beta"

    # The task scores submissions against its hidden answers, joined by id.
    perfect = pd.read_csv(alpha.answers_path).iloc[::-1]
    assert alpha.score(perfect).value == 1.0
    assert alpha.score(alpha.sample_submission_path).value == 0.5
    beta_submission = pd.DataFrame(
        {"ForecastId": [12, 10, 11], "Cases": [7, 5, 6], "Deaths": [2, 0, 1]}
    )
    beta_score = beta.score(beta_submission)
    assert beta_score.success, beta_score.reason
    assert beta_score.value == 0.0
    assert set(beta_score.per_column) == {"Cases", "Deaths"}


def test_loader_accepts_the_data_dir_or_its_parent_and_explicit_ids(tmp_path: Path):
    data, prompts, _ = _fake_tree(tmp_path)
    from_parent = load_dsbench_tasks(tmp_path, task_ids=["alpha"], cleaned_prompts=prompts)
    from_data = load_dsbench_tasks(data, task_ids=["alpha"], cleaned_prompts=prompts)
    assert from_parent == from_data
    all_tasks = load_dsbench_tasks(data, cleaned_prompts=json.loads(prompts.read_text()))
    assert [task.id for task in all_tasks] == ["alpha", "beta"]


def test_loader_errors_name_what_is_missing(tmp_path: Path):
    data, prompts, _ = _fake_tree(tmp_path)
    with pytest.raises(FileNotFoundError, match="data_resplit"):
        load_dsbench_tasks(tmp_path / "nowhere", cleaned_prompts=prompts)
    (data / "answers/beta/test_answer.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"answers/beta/test_answer\.csv"):
        load_dsbench_tasks(data, cleaned_prompts=prompts)
    with pytest.raises(KeyError, match="gamma"):
        load_dsbench_tasks(data, task_ids=["gamma"], cleaned_prompts=prompts)
    with pytest.raises(FileNotFoundError, match="cleaned prompts file not found"):
        load_dsbench_tasks(data, task_ids=["alpha"], cleaned_prompts=tmp_path / "none.json")


def test_loader_rejects_unknown_metrics_and_columns(tmp_path: Path):
    data, prompts_path, _ = _fake_tree(tmp_path)
    prompts = json.loads(prompts_path.read_text())
    bad_metric = {**prompts, "alpha": {**prompts["alpha"], "metric": "vibes"}}
    with pytest.raises(ValueError, match="unknown metric"):
        load_dsbench_tasks(data, task_ids=["alpha"], cleaned_prompts=bad_metric)
    partly_wrong = {**prompts, "beta": {**prompts["beta"], "target_column": ["Cases", "Nope"]}}
    with pytest.raises(ValueError, match="Nope"):
        load_dsbench_tasks(data, task_ids=["beta"], cleaned_prompts=partly_wrong)
    bad_id = {**prompts, "alpha": {**prompts["alpha"], "id_column": "row"}}
    with pytest.raises(ValueError, match="id column 'row'"):
        load_dsbench_tasks(data, task_ids=["alpha"], cleaned_prompts=bad_id)


def test_placeholder_target_falls_back_to_the_answer_columns(tmp_path: Path):
    data, prompts_path, _ = _fake_tree(tmp_path)
    prompts = json.loads(prompts_path.read_text())
    placeholder = {"beta": {**prompts["beta"], "target_column": "2_labels"}}
    (task,) = load_dsbench_tasks(data, cleaned_prompts=placeholder)
    assert task.target_columns == ("Cases", "Deaths")


def test_default_cleaned_prompts_come_from_the_bench_dir_env(tmp_path: Path, monkeypatch):
    data, prompts, _ = _fake_tree(tmp_path)
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / CLEANED_PROMPTS_FILE).write_text(prompts.read_text())
    monkeypatch.setenv(BENCH_DIR_ENV, str(bench))
    assert find_bench_dir() == bench
    tasks = load_dsbench_tasks(data, task_ids=["alpha"])
    assert tasks[0].metric == "accuracy"


def test_a_misspelt_bench_dir_names_the_dsbench_files_it_should_hold(tmp_path, monkeypatch):
    data, _, _ = _fake_tree(tmp_path)
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path / "no-such-folder"))
    with pytest.raises(FileNotFoundError, match=BENCH_DIR_ENV) as error:
        load_dsbench_tasks(data, task_ids=["alpha"])
    message = str(error.value)
    assert f"holds {CLEANED_PROMPTS_FILE} and the task lists dsbench_modeling_" in message
    assert "aime" not in message.lower()  # the math benchmarks' files are not DSBench's


def test_a_folder_with_its_own_prompts_file_uses_it_before_the_bench_dir(
    tmp_path: Path, monkeypatch
):
    import mappa_env

    data, prompts, _ = _fake_tree(tmp_path)
    (tmp_path / CLEANED_PROMPTS_FILE).write_text(prompts.read_text())
    # The benchmark folder's prompts know other tasks only (a KeyError for "alpha").
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / CLEANED_PROMPTS_FILE).write_text(json.dumps({"zeta": {"metric": "accuracy"}}))
    monkeypatch.setenv(BENCH_DIR_ENV, str(bench))
    (task,) = load_dsbench_tasks(data, task_ids=["alpha"])
    assert task.metric == "accuracy"
    env = mappa_env.make("DSBench-v0", data_dir=tmp_path, task_ids=["beta"], sandbox=None)
    assert env.task.metric == "rmsle"
    env.close()
    given = {"alpha": {**json.loads(prompts.read_text())["alpha"], "metric": "roc_auc"}}
    env = mappa_env.make(
        "DSBench-v0", data_dir=data, task_ids=["alpha"], cleaned_prompts=given, sandbox=None
    )
    assert env.task.metric == "roc_auc"  # cleaned_prompts= wins over any file
    env.close()


def test_data_inside_the_bench_dir_still_gets_the_raw_prompts(tmp_path: Path, monkeypatch):
    from mappa_env.dsbench.tasks import TASK_LIST_FILES

    data, prompts, task_list = _fake_tree(tmp_path)  # data/ sits inside the bench folder
    (tmp_path / CLEANED_PROMPTS_FILE).write_text(prompts.read_text())
    (tmp_path / TASK_LIST_FILES["train"]).write_text(task_list.read_text())
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path))
    for folder in (tmp_path, data):
        (task,) = load_dsbench_tasks(folder, task_ids=["alpha"])
        assert task.metadata["raw_prompt"] == "Raw Kaggle text for alpha"
        assert task.metadata["split"] == "train"


# ---------------------------------------------------------------------------------------
# The real shared task files
# ---------------------------------------------------------------------------------------

needs_bench = pytest.mark.skipif(
    not (BENCH_DIR / CLEANED_PROMPTS_FILE).is_file(), reason="shared benchmark files absent"
)


@needs_bench
def test_every_shared_cleaned_prompt_has_a_known_metric():
    prompts = json.loads((BENCH_DIR / CLEANED_PROMPTS_FILE).read_text())
    unknown = {}
    for task_id, entry in prompts.items():
        try:
            dsbench_metrics.get_metric(entry["metric"])
        except KeyError:
            unknown[task_id] = entry["metric"]
    assert not unknown, f"tasks with metrics missing from the registry: {unknown}"
    assert len(prompts) == 72


@needs_bench
def test_shared_prompts_load_over_a_fake_tree_with_their_columns(tmp_path: Path, caplog):
    """Every shared task loads when its files exist; tiny CSVs stand in for DSBench's."""
    prompts = json.loads((BENCH_DIR / CLEANED_PROMPTS_FILE).read_text())
    for task_id, entry in prompts.items():
        targets = entry["target_column"]
        targets = [targets] if isinstance(targets, str) else targets
        if task_id == "google-quest-challenge":  # its prompt names a placeholder
            targets = ["question_asker_intent_understanding", "answer_well_written"]
        if task_id == "titanic":  # the Titanic answers, not spaceship-titanic's
            targets = ["Survived"]
        frame = pd.DataFrame({entry["id_column"]: [1, 2], **{t: [0, 1] for t in targets}})
        _write(tmp_path / "answers" / task_id / "test_answer.csv", frame)
        _write(tmp_path / "data_resplit" / task_id / "train.csv", frame)
        _write(tmp_path / "data_resplit" / task_id / "test.csv", frame[[entry["id_column"]]])
    with caplog.at_level(logging.WARNING):
        tasks = load_dsbench_tasks(
            tmp_path, task_list="all", cleaned_prompts=BENCH_DIR / CLEANED_PROMPTS_FILE
        )
    by_id = {task.id: task for task in tasks}
    listed = [
        entry["metadata"]["task_id"]
        for name in ("dsbench_modeling_train.json", "dsbench_modeling_eval.json")
        for entry in read_task_list(BENCH_DIR / name)
    ]
    without_prompt = sorted(set(listed) - set(prompts))
    assert set(by_id) == set(listed) - set(without_prompt)
    for missing in without_prompt:
        assert missing in caplog.text
    assert by_id["google-quest-challenge"].target_columns == (
        "question_asker_intent_understanding",
        "answer_well_written",
    )
    titanic = by_id["titanic"]
    assert titanic.target_columns == ("Survived",)
    assert "known_issue" in titanic.metadata
    assert "Titanic" in titanic.description  # the raw prompt, not spaceship-titanic's text
    assert by_id["playground-series-s4e6"].metadata["split"] == "eval"
    assert all(task.description for task in tasks)


# ---------------------------------------------------------------------------------------
# Built-in tasks
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin_root(tmp_path_factory) -> tuple[Path, list[DSBenchTask]]:
    root = tmp_path_factory.mktemp("builtin")
    return root, builtin_tasks(root, seed=0)


def test_builtin_layout(builtin_root):
    root, tasks = builtin_root
    assert [task.id for task in tasks] == list(BUILTIN_TASK_NAMES)
    assert {task.metric for task in tasks} >= {"accuracy", "roc_auc", "rmse", "mcrmse", "rmsle"}
    for task in tasks:
        assert task.train_path == root / "data_resplit" / task.id / "train.csv"
        assert task.answers_path == root / "answers" / task.id / "test_answer.csv"
        train = pd.read_csv(task.train_path)
        test = pd.read_csv(task.test_path)
        answers = pd.read_csv(task.answers_path)
        sample = pd.read_csv(task.sample_submission_path)
        assert task.id_column in train.columns
        assert set(task.target_columns) <= set(train.columns)
        assert list(answers.columns) == [task.id_column, *task.target_columns]
        assert list(sample.columns) == [task.id_column, *task.target_columns]
        assert sorted(answers[task.id_column]) == sorted(test[task.id_column])
        assert sorted(sample[task.id_column]) == sorted(test[task.id_column])
        assert not set(train[task.id_column]) & set(test[task.id_column])
        assert train[task.id_column].is_unique
        for section in ("## Overview", "## Evaluation", "## Submission format", "## Files"):
            assert section in task.description
        assert "test_answer" not in task.description
        assert str(task.answers_path) not in task.description
        # The sample submission is in the right format: it scores.
        sample_score = task.score(task.sample_submission_path)
        assert sample_score.success, (task.id, sample_score.reason)
    linnerud = next(task for task in tasks if task.id == "linnerud")
    assert linnerud.metric == "mcrmse"
    assert len(linnerud.target_columns) == 3
    houses = pd.read_csv(root / "data_resplit" / "synthetic_houses" / "train.csv")
    assert houses.isna().any().any()
    assert any(pd.api.types.is_string_dtype(dtype) for dtype in houses.dtypes)


def test_builtin_answers_are_not_in_the_test_files(builtin_root):
    _, tasks = builtin_root
    for task in tasks:
        test = pd.read_csv(task.test_path)
        assert not set(task.target_columns) & set(test.columns), task.id
        for path in task.agent_files().values():
            assert "answers" not in path.parts


def test_builtin_tasks_are_deterministic_per_seed(tmp_path: Path):
    names = ["iris", "synthetic_houses", "linnerud"]
    first = builtin_tasks(tmp_path / "a", names=names, seed=3)
    second = builtin_tasks(tmp_path / "b", names=names, seed=3)
    other = builtin_tasks(tmp_path / "c", names=names, seed=4)
    for one, two, three in zip(first, second, other, strict=True):
        for attribute in ("train_path", "test_path", "sample_submission_path", "answers_path"):
            assert getattr(one, attribute).read_bytes() == getattr(two, attribute).read_bytes()
        assert one.test_path.read_bytes() != three.test_path.read_bytes()
        assert one.description == two.description
    with pytest.raises(ValueError, match="unknown built-in task"):
        builtin_tasks(tmp_path / "d", names=["mnist"])


def test_builtin_tasks_load_back_through_the_dsbench_loader(builtin_root):
    root, tasks = builtin_root
    loaded = load_dsbench_tasks(root, cleaned_prompts=root / BUILTIN_PROMPTS_FILE)
    by_id = {task.id: task for task in loaded}
    for task in tasks:
        again = by_id[task.id]
        for attribute in (
            "description",
            "metric",
            "task_type",
            "id_column",
            "target_columns",
            "train_path",
            "test_path",
            "sample_submission_path",
            "answers_path",
        ):
            assert getattr(again, attribute) == getattr(task, attribute), (task.id, attribute)


def _baseline_model(task: DSBenchTask):
    """One generic scikit-learn pipeline per task type: impute, encode, linear model."""
    preprocess = ColumnTransformer(
        [
            (
                "numbers",
                make_pipeline(SimpleImputer(strategy="median"), StandardScaler()),
                make_column_selector(dtype_include="number"),
            ),
            (
                "categories",
                make_pipeline(
                    SimpleImputer(strategy="most_frequent"), OneHotEncoder(handle_unknown="ignore")
                ),
                make_column_selector(dtype_exclude="number"),
            ),
        ]
    )
    if task.task_type == "classification":
        # A positive class's F1 or Jaccard index rewards finding the minority class: an
        # unweighted model's threshold scores below the constant "all positive" there.
        balanced = task.metric in ("f1", "jaccard_score")
        return make_pipeline(
            preprocess,
            LogisticRegression(max_iter=2000, class_weight="balanced" if balanced else None),
        )
    return make_pipeline(preprocess, Ridge(alpha=1.0))


def _predict_submission(task: DSBenchTask) -> pd.DataFrame:
    train = pd.read_csv(task.train_path)
    test = pd.read_csv(task.test_path)
    features = [c for c in train.columns if c not in (task.id_column, *task.target_columns)]
    # Categorical text columns become plain objects so that the imputer accepts them.
    train[features] = train[features].apply(
        lambda col: col if pd.api.types.is_numeric_dtype(col) else col.astype(object)
    )
    test[features] = test[features].apply(
        lambda col: col if pd.api.types.is_numeric_dtype(col) else col.astype(object)
    )
    submission = pd.DataFrame({task.id_column: test[task.id_column]})
    for target in task.target_columns:
        y = train[target]
        if task.metric == "rmsle":
            model = _baseline_model(task).fit(train[features], np.log1p(y))
            submission[target] = np.expm1(model.predict(test[features])).clip(min=0)
            continue
        model = _baseline_model(task).fit(train[features], y)
        if task.metric_spec.needs_probabilities:
            submission[target] = model.predict_proba(test[features])[:, 1]
        else:
            submission[target] = model.predict(test[features])
    return submission.sample(frac=1.0, random_state=0)  # row order must not matter


# Lower bounds on the skill score (0 = constant guess, 1 = perfect) of a plain linear
# pipeline: loose enough for any seed, tight enough to catch a broken task.
_MIN_SKILL = {"linnerud": 0.0, "diabetes": 0.1}


@pytest.mark.slow
def test_a_simple_pipeline_scores_sensibly_on_every_builtin_task(builtin_root):
    _, tasks = builtin_root
    results = {}
    for task in tasks:
        score = task.score(_predict_submission(task))
        assert score.success, (task.id, score.reason)
        results[task.id] = score
        assert score.normalized >= _MIN_SKILL.get(task.id, 0.2), (task.id, score)
    assert results["iris"].value > 0.8
    assert results["digits"].value > 0.8
    assert results["breast_cancer"].value > 0.9
