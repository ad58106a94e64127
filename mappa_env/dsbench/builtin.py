"""Built-in offline DSBench tasks, written at run time in DSBench's directory layout.

The tasks come from datasets bundled with scikit-learn (no download) and from seeded
synthetic generators. :func:`builtin_tasks` writes, under a root directory::

    data_resplit/<task>/train.csv              id, features, target(s)
    data_resplit/<task>/test.csv               id, features
    data_resplit/<task>/sample_submission.csv  id, a constant prediction per target
    answers/<task>/test_answer.csv             id, true target(s) of the test rows
    cleaned_prompts.json                       descriptions, metrics and columns

so that they can also be read back with :func:`mappa_env.dsbench.tasks.load_dsbench_tasks`.
Every task has an ``id`` column and a Kaggle-style description written for this project
(overview, data fields, evaluation, submission format with example rows, files). Files
are identical for the same seed; writing all tasks takes well under a second.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn import datasets
from sklearn.model_selection import train_test_split

from mappa_env.dsbench.metrics import get_metric
from mappa_env.dsbench.tasks import ANSWERS_FILE, DSBenchTask

BUILTIN_PROMPTS_FILE = "cleaned_prompts.json"
"""Cleaned-prompts file written beside the built-in tasks (same format as DSBench's)."""

ID_COLUMN = "id"


@dataclass(frozen=True)
class _Dataset:
    """Internal: one generated dataset before it is split."""

    features: pd.DataFrame
    targets: pd.DataFrame


@dataclass(frozen=True)
class _Spec:
    """Internal: how to make and describe one built-in task."""

    name: str
    title: str
    metric: str
    task_type: str
    make: Callable[[int], _Dataset]
    overview: str
    fields: str
    evaluation: str
    source: str
    test_size: float = 0.25
    stratify: bool = False


def _snake(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in name.strip().lower())
    return "_".join(part for part in cleaned.split("_") if part)


def _iris(seed: int) -> _Dataset:
    bunch = datasets.load_iris()
    features = pd.DataFrame(bunch.data, columns=[_snake(n) for n in bunch.feature_names])
    species = np.asarray(bunch.target_names)[bunch.target]
    return _Dataset(features, pd.DataFrame({"species": species}))


def _wine(seed: int) -> _Dataset:
    bunch = datasets.load_wine()
    features = pd.DataFrame(bunch.data, columns=[_snake(n) for n in bunch.feature_names])
    cultivar = np.array(["A", "B", "C"])[bunch.target]
    return _Dataset(features, pd.DataFrame({"cultivar": cultivar}))


def _breast_cancer(seed: int) -> _Dataset:
    bunch = datasets.load_breast_cancer()
    features = pd.DataFrame(bunch.data, columns=[_snake(n) for n in bunch.feature_names])
    # scikit-learn codes malignant as 0; the task asks about malignancy, so 1 = malignant.
    return _Dataset(features, pd.DataFrame({"malignant": 1 - bunch.target}))


def _digits(seed: int) -> _Dataset:
    bunch = datasets.load_digits()
    columns = [f"pixel_{row}_{col}" for row in range(8) for col in range(8)]
    features = pd.DataFrame(bunch.data.astype(int), columns=columns)
    return _Dataset(features, pd.DataFrame({"digit": bunch.target}))


def _diabetes(seed: int) -> _Dataset:
    bunch = datasets.load_diabetes(scaled=False)
    features = pd.DataFrame(bunch.data, columns=list(bunch.feature_names))
    return _Dataset(features, pd.DataFrame({"progression": bunch.target}))


def _linnerud(seed: int) -> _Dataset:
    bunch = datasets.load_linnerud()
    features = pd.DataFrame(bunch.data, columns=[n.lower() for n in bunch.feature_names])
    targets = pd.DataFrame(bunch.target, columns=[n.lower() for n in bunch.target_names])
    return _Dataset(features, targets)


def _synthetic_classification(seed: int) -> _Dataset:
    x, y = datasets.make_classification(
        n_samples=1200,
        n_features=12,
        n_informative=6,
        n_redundant=2,
        weights=[0.7, 0.3],
        flip_y=0.03,
        class_sep=0.9,
        random_state=seed,
    )
    features = pd.DataFrame(x.round(5), columns=[f"sensor_{i:02d}" for i in range(12)])
    return _Dataset(features, pd.DataFrame({"fault": y}))


def _synthetic_regression(seed: int) -> _Dataset:
    x, y = datasets.make_regression(
        n_samples=1000, n_features=10, n_informative=6, noise=15.0, random_state=seed
    )
    features = pd.DataFrame(x.round(5), columns=[f"x_{i:02d}" for i in range(10)])
    return _Dataset(features, pd.DataFrame({"yield": (y + 200.0).round(3)}))


def _with_missing(
    frame: pd.DataFrame, rng: np.random.Generator, shares: dict[str, float]
) -> pd.DataFrame:
    frame = frame.copy()
    for column, share in shares.items():
        frame.loc[rng.random(len(frame)) < share, column] = pd.NA
    return frame


def _synthetic_houses(seed: int) -> _Dataset:
    rng = np.random.default_rng(seed)
    n = 1500
    neighborhoods = np.array(["Northside", "Riverside", "Oldtown", "Hillcrest", "Lakeshore"])
    neighborhood = rng.choice(neighborhoods, n, p=[0.25, 0.2, 0.2, 0.2, 0.15])
    building = rng.choice(["house", "apartment", "townhouse"], n, p=[0.45, 0.35, 0.2])
    condition = rng.choice(["poor", "fair", "good", "excellent"], n, p=[0.1, 0.3, 0.45, 0.15])
    area = rng.gamma(6.0, 16.0, n) + np.where(building == "house", 40.0, 0.0)
    rooms = np.maximum(1, np.round(area / 25.0 + rng.normal(0, 0.7, n))).astype(int)
    year_built = rng.integers(1900, 2024, n)
    distance = rng.gamma(2.0, 3.0, n)
    garden_share = np.where(building == "house", 0.8, 0.2)
    garden = np.where(rng.random(n) < garden_share, "yes", "no")
    location_effect = dict(zip(neighborhoods, [0.10, 0.25, -0.10, 0.30, 0.40], strict=True))
    condition_effect = {"poor": -0.30, "fair": -0.10, "good": 0.0, "excellent": 0.20}
    log_price = (
        8.3
        + 0.9 * np.log(area)
        + np.vectorize(location_effect.get)(neighborhood)
        + np.vectorize(condition_effect.get)(condition)
        - 0.03 * distance
        + 0.002 * (year_built - 1960)
        + 0.08 * (garden == "yes")
        + rng.normal(0, 0.15, n)
    )
    # Hand-typed records: some neighbourhood names arrive in lower case.
    messy = rng.random(n) < 0.03
    neighborhood = np.where(messy, np.char.lower(neighborhood.astype(str)), neighborhood)
    features = pd.DataFrame(
        {
            "neighborhood": neighborhood,
            "building_type": building,
            "condition": condition,
            "area_sqm": area.round(1),
            "rooms": pd.array(rooms, dtype="Int64"),
            "year_built": pd.array(year_built, dtype="Int64"),
            "distance_to_center_km": distance.round(2),
            "has_garden": garden,
        }
    )
    features = _with_missing(
        features, rng, {"area_sqm": 0.06, "year_built": 0.04, "has_garden": 0.08, "condition": 0.03}
    )
    price = np.round(np.exp(log_price), -2)
    return _Dataset(features, pd.DataFrame({"price": price}))


def _synthetic_churn(seed: int) -> _Dataset:
    rng = np.random.default_rng(seed)
    n = 2000
    plan = rng.choice(["basic", "standard", "premium"], n, p=[0.45, 0.35, 0.2])
    contract = rng.choice(["monthly", "yearly", "two_year"], n, p=[0.55, 0.3, 0.15])
    payment = rng.choice(["card", "bank_transfer", "invoice", "voucher"], n)
    region = rng.choice(["north", "south", "east", "west"], n)
    tenure = rng.integers(1, 72, n)
    base_charge = np.select([plan == "basic", plan == "standard"], [25.0, 45.0], 70.0)
    monthly = (base_charge + rng.normal(0, 6, n)).round(2)
    calls = rng.poisson(1.5, n)
    contract_effect = np.select([contract == "monthly", contract == "yearly"], [0.9, -0.3], -1.2)
    logit = (
        -1.3
        + 0.45 * calls
        - 0.035 * tenure
        + contract_effect
        + 0.5 * (payment == "invoice")
        + 0.012 * (monthly - 45.0)
        + rng.normal(0, 0.3, n)
    )
    churned = np.where(rng.random(n) < 1.0 / (1.0 + np.exp(-logit)), "yes", "no")
    features = pd.DataFrame(
        {
            "plan": plan,
            "contract": contract,
            "payment_method": payment,
            "region": region,
            "tenure_months": pd.array(tenure, dtype="Int64"),
            "monthly_charges": monthly,
            "support_calls": calls,
        }
    )
    features = _with_missing(
        features, rng, {"monthly_charges": 0.05, "payment_method": 0.05, "tenure_months": 0.03}
    )
    return _Dataset(features, pd.DataFrame({"churned": churned}))


_SPECS: tuple[_Spec, ...] = (
    _Spec(
        "iris",
        "Iris species",
        "accuracy",
        "classification",
        _iris,
        "Each row describes one iris flower by four measurements of its sepals and petals. "
        "Predict the species of every flower in the test set.",
        "- sepal_length_cm, sepal_width_cm, petal_length_cm, petal_width_cm: measurements "
        "in centimetres\n- species: the target, one of setosa, versicolor, virginica",
        "Submissions are evaluated on classification accuracy: the share of test rows "
        "whose predicted `species` is correct. Higher is better.",
        "sklearn.datasets.load_iris",
        stratify=True,
    ),
    _Spec(
        "wine",
        "Wine cultivar",
        "f1_macro",
        "classification",
        _wine,
        "Each row is the chemical analysis of a wine grown in one region by one of three "
        "cultivators. Predict which cultivator (A, B or C) produced each test wine.",
        "- alcohol, malic_acid, ash, alcalinity_of_ash, magnesium, total_phenols, "
        "flavanoids, nonflavanoid_phenols, proanthocyanins, color_intensity, hue, "
        "od280_od315_of_diluted_wines, proline: results of the chemical analysis\n"
        "- cultivar: the target, one of A, B, C",
        "Submissions are evaluated on the macro-averaged F1 score: F1 is computed for each "
        "cultivar and the three values are averaged with equal weight. Higher is better.",
        "sklearn.datasets.load_wine",
        stratify=True,
    ),
    _Spec(
        "breast_cancer",
        "Breast mass diagnosis",
        "roc_auc",
        "classification",
        _breast_cancer,
        "Each row describes the cell nuclei seen in a digitised image of a fine needle "
        "aspirate of a breast mass. Predict how likely each test mass is to be malignant.",
        "- 30 numeric columns such as mean_radius, mean_texture, worst_concavity: the mean, "
        "standard error and worst value of ten nucleus measurements\n"
        "- malignant: the target, 1 for a malignant mass and 0 for a benign one",
        "Submissions are evaluated on the area under the ROC curve between the predicted "
        "probability and the true `malignant` value. Higher is better. Submit the "
        "probability that `malignant` is 1, not a hard 0/1 label.",
        "sklearn.datasets.load_breast_cancer",
        stratify=True,
    ),
    _Spec(
        "digits",
        "Handwritten digits",
        "accuracy",
        "classification",
        _digits,
        "Each row is an 8x8 image of a handwritten digit, flattened into 64 pixel values. "
        "Predict the digit shown in each test image.",
        "- pixel_R_C (R, C from 0 to 7): ink intensity from 0 to 16 at row R, column C\n"
        "- digit: the target, an integer from 0 to 9",
        "Submissions are evaluated on classification accuracy: the share of test images "
        "whose predicted `digit` is correct. Higher is better.",
        "sklearn.datasets.load_digits",
        stratify=True,
    ),
    _Spec(
        "diabetes",
        "Diabetes progression",
        "rmse",
        "regression",
        _diabetes,
        "Each row is one diabetes patient at a baseline visit. Predict a quantitative "
        "measure of disease progression one year later.",
        "- age (years), sex (coded 1 or 2), bmi (body mass index), bp (mean blood pressure)\n"
        "- s1 to s6: six blood serum measurements\n"
        "- progression: the target, a positive number",
        "Submissions are evaluated on the root mean squared error between the predicted "
        "and the true `progression`. Lower is better.",
        "sklearn.datasets.load_diabetes",
    ),
    _Spec(
        "linnerud",
        "Exercise and physiology",
        "mcrmse",
        "regression",
        _linnerud,
        "Twenty middle-aged men were measured at a fitness club. From three exercise "
        "results, predict three physiological measurements of each test participant.",
        "- chins, situps, jumps: exercise results (counts)\n"
        "- weight (pounds), waist (inches), pulse (beats per minute): the three targets",
        "Submissions are evaluated on the mean column-wise root mean squared error "
        "(MCRMSE): the RMSE of each of `weight`, `waist` and `pulse`, averaged. Lower is "
        "better.",
        "sklearn.datasets.load_linnerud",
        test_size=0.3,
    ),
    _Spec(
        "synthetic_classification",
        "Sensor fault detection",
        "log_loss",
        "classification",
        _synthetic_classification,
        "A machine reports twelve anonymised sensor readings per production cycle. About a "
        "third of the cycles end in a fault. Predict the probability of a fault for each "
        "test cycle.",
        "- sensor_00 to sensor_11: anonymised numeric sensor readings\n"
        "- fault: the target, 1 if the cycle ended in a fault and 0 otherwise",
        "Submissions are evaluated on the logarithmic loss between the predicted "
        "probability and the true `fault` value. Lower is better. Submit the probability "
        "that `fault` is 1 (a number between 0 and 1); confident mistakes are "
        "punished heavily.",
        "sklearn.datasets.make_classification (seeded)",
        stratify=True,
    ),
    _Spec(
        "synthetic_regression",
        "Crop yield",
        "mae",
        "regression",
        _synthetic_regression,
        "Each row is a field plot described by ten anonymised, standardised soil and "
        "weather measurements. Predict the crop yield of each test plot.",
        "- x_00 to x_09: anonymised numeric measurements\n- yield: the target, a number",
        "Submissions are evaluated on the mean absolute error between the predicted and "
        "the true `yield`. Lower is better.",
        "sklearn.datasets.make_regression (seeded)",
    ),
    _Spec(
        "synthetic_houses",
        "House prices",
        "rmsle",
        "regression",
        _synthetic_houses,
        "Each row is a sold home in one city, described by its neighbourhood, building type, "
        "condition and size. The records were typed in by hand: some values are missing "
        "and some category names are spelled inconsistently. Predict the sale price of each "
        "test home.",
        "- neighborhood, building_type, condition, has_garden: categories (text)\n"
        "- area_sqm, rooms, year_built, distance_to_center_km: numbers\n"
        "- price: the target, the sale price",
        "Submissions are evaluated on the root mean squared logarithmic error (RMSLE) "
        "between the predicted and the true `price`. Lower is better. Predictions must be "
        "non-negative.",
        "seeded synthetic generator (categorical text columns, missing values)",
    ),
    _Spec(
        "synthetic_churn",
        "Customer churn",
        "f1",
        "classification",
        _synthetic_churn,
        "Each row is a customer of a subscription service. Some values are missing. "
        "Predict which test customers cancel their subscription (churn).",
        "- plan, contract, payment_method, region: categories (text)\n"
        "- tenure_months, monthly_charges, support_calls: numbers\n"
        "- churned: the target, yes or no",
        "Submissions are evaluated on the F1 score of the class `yes` (the harmonic mean of "
        "precision and recall for churners). Higher is better. Predict the label yes or no.",
        "seeded synthetic generator (categorical text columns, missing values)",
        stratify=True,
    ),
)

BUILTIN_TASK_NAMES: tuple[str, ...] = tuple(spec.name for spec in _SPECS)
"""Names of the built-in tasks, in a fixed order."""

_SPECS_BY_NAME = {spec.name: spec for spec in _SPECS}


def _sample_value(metric: str, train_target: pd.Series) -> object:
    """A constant placeholder prediction in the right format, computed from training data."""
    spec = get_metric(metric)
    if spec.input_type == "labels":
        return train_target.mode().sort_values().iloc[0]
    if spec.name == "roc_auc":
        return 0.5
    # Regression targets: the training mean; binary log loss: the training positive rate.
    return round(float(train_target.mean()), 3)


def _describe(
    spec: _Spec,
    feature_count: int,
    targets: Sequence[str],
    n_train: int,
    n_test: int,
    sample: pd.DataFrame,
) -> str:
    target_list = ", ".join(f"`{t}`" for t in targets)
    example = sample.head(3).to_csv(index=False).strip()
    return (
        f"# {spec.title}\n\n"
        f"## Overview\n{spec.overview}\n\n"
        f"## Data fields\n- {ID_COLUMN}: row identifier\n{spec.fields}\n\n"
        f"## Evaluation\n{spec.evaluation}\n\n"
        f"## Submission format\n"
        f"For every `{ID_COLUMN}` in test.csv, predict {target_list}. The file must have a "
        f"header row and the columns `{ID_COLUMN}`, "
        f"{target_list}, like this (the values are placeholders):\n\n"
        f"```\n{example}\n```\n\n"
        f"## Files\n"
        f"- train.csv: the training set, {n_train} rows: `{ID_COLUMN}`, {feature_count} "
        f"feature columns and the target column(s) {target_list}\n"
        f"- test.csv: the test set, {n_test} rows: `{ID_COLUMN}` and the feature columns, "
        f"without the target\n"
        f"- sample_submission.csv: a sample submission in the correct format\n"
    )


def _write_task(root: Path, spec: _Spec, seed: int) -> tuple[DSBenchTask, dict[str, object]]:
    dataset = spec.make(seed)
    n_rows = len(dataset.features)
    rng = np.random.default_rng(seed)
    # Ids are a seeded shuffle, so row ids say nothing about the original dataset order.
    ids = rng.permutation(n_rows) + 1
    positions = np.arange(n_rows)
    stratify = dataset.targets.iloc[:, 0] if spec.stratify else None
    train_rows, test_rows = train_test_split(
        positions, test_size=spec.test_size, random_state=seed, stratify=stratify
    )
    frame = pd.concat([pd.DataFrame({ID_COLUMN: ids}), dataset.features, dataset.targets], axis=1)
    target_columns = list(dataset.targets.columns)
    train = frame.iloc[train_rows].sort_values(ID_COLUMN)
    test = frame.iloc[test_rows].sort_values(ID_COLUMN)
    sample = pd.DataFrame({ID_COLUMN: test[ID_COLUMN].to_numpy()})
    for column in target_columns:
        sample[column] = _sample_value(spec.metric, train[column])
    description = _describe(
        spec, dataset.features.shape[1], target_columns, len(train), len(test), sample
    )

    task_dir = root / "data_resplit" / spec.name
    answers_dir = root / "answers" / spec.name
    task_dir.mkdir(parents=True, exist_ok=True)
    answers_dir.mkdir(parents=True, exist_ok=True)
    train.to_csv(task_dir / "train.csv", index=False)
    test.drop(columns=target_columns).to_csv(task_dir / "test.csv", index=False)
    sample.to_csv(task_dir / "sample_submission.csv", index=False)
    answers = test[[ID_COLUMN, *target_columns]]
    answers.to_csv(answers_dir / ANSWERS_FILE, index=False)

    target_range = None
    if spec.task_type == "regression":
        target_range = float(np.mean([np.ptp(answers[c].to_numpy()) for c in target_columns]))
    task = DSBenchTask(
        id=spec.name,
        description=description,
        metric=get_metric(spec.metric).name,
        task_type=spec.task_type,
        id_column=ID_COLUMN,
        target_columns=tuple(target_columns),
        train_path=task_dir / "train.csv",
        test_path=task_dir / "test.csv",
        sample_submission_path=task_dir / "sample_submission.csv",
        answers_path=answers_dir / ANSWERS_FILE,
        target_range=target_range,
        metadata={
            "source": spec.source,
            "builtin": True,
            "seed": seed,
            "n_train": len(train),
            "n_test": len(test),
        },
    )
    prompt_entry: dict[str, object] = {
        "cleaned_prompt": description,
        "metric": task.metric,
        "task_type": spec.task_type,
        "target_column": target_columns[0] if len(target_columns) == 1 else target_columns,
        "id_column": ID_COLUMN,
    }
    return task, prompt_entry


def builtin_tasks(
    root: str | Path, names: Iterable[str] | None = None, seed: int = 0
) -> list[DSBenchTask]:
    """Write built-in tasks in DSBench's layout under ``root`` and return them.

    The test answers are written only under ``root/answers/``; ``test.csv`` has no target
    column. A ``cleaned_prompts.json`` beside them (merged with an existing one) lets
    :func:`~mappa_env.dsbench.tasks.load_dsbench_tasks` read the same tasks back.

    Args:
        root: Directory to write into (created if needed).
        names: Which tasks, from :data:`BUILTIN_TASK_NAMES`; default all, in that order.
        seed: Seed for the train/test split, the id shuffle and synthetic data; the same
            seed writes the same files.

    Returns:
        The tasks, in the order of ``names``.

    Raises:
        ValueError: If a name is not a built-in task.
    """
    root = Path(root)
    chosen = list(BUILTIN_TASK_NAMES if names is None else names)
    unknown = [name for name in chosen if name not in _SPECS_BY_NAME]
    if unknown:
        raise ValueError(f"unknown built-in task(s) {unknown}; known: {list(BUILTIN_TASK_NAMES)}")
    root.mkdir(parents=True, exist_ok=True)
    prompts_path = root / BUILTIN_PROMPTS_FILE
    prompts: dict[str, object] = {}
    if prompts_path.is_file():
        prompts = json.loads(prompts_path.read_text(encoding="utf-8"))
    tasks = []
    for name in chosen:
        task, entry = _write_task(root, _SPECS_BY_NAME[name], seed)
        prompts[name] = entry
        tasks.append(task)
    prompts_path.write_text(json.dumps(prompts, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return tasks


class BuiltinTaskSet:
    """Built-in tasks written once to a private directory, with the answers only in memory.

    Several environments can share one set (e.g. every environment of a rollout runner),
    so the data is made once. The hidden answers are read into memory and their files
    deleted, so no file an agent's code could find holds them. The directory is removed
    by :meth:`close` or when the set is garbage-collected.

    Args:
        names: Which tasks, from :data:`BUILTIN_TASK_NAMES`; default all.
        seed: Seed of the data (see :func:`builtin_tasks`).

    Attributes:
        tasks: The tasks.
        answers: Task id -> hidden answers table.
    """

    def __init__(self, names: Iterable[str] | None = None, seed: int = 0) -> None:
        from mappa_env.dsbench.metrics import read_answers

        self.root = Path(tempfile.mkdtemp(prefix="mappa-dsbench-tasks-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        self.tasks = builtin_tasks(self.root, names=names, seed=seed)
        self.answers = {t.id: read_answers(t.answers_path, t.id_column) for t in self.tasks}
        shutil.rmtree(self.root / "answers", ignore_errors=True)

    def close(self) -> None:
        """Remove the task files. Idempotent."""
        self._cleanup()
