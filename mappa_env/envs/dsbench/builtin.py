"""Built-in offline DSBench tasks, written at run time in DSBench's directory layout.

The tasks come from datasets bundled with scikit-learn (no download) and from seeded
synthetic generators. :func:`builtin_tasks` writes, under a root directory::

    data_resplit/<task>/train.csv              id, features, target(s)
    data_resplit/<task>/test.csv               id, features
    data_resplit/<task>/sample_submission.csv  id, a constant prediction per target
    answers/<task>/test_answer.csv             id, true target(s) of the test rows
    cleaned_prompts.json                       descriptions, metrics and columns

so that they can also be read back with
:func:`mappa_env.envs.dsbench.tasks.load_dsbench_tasks`.
Every task has an ``id`` column and a Kaggle-style description written for this project
(overview, data fields, evaluation, submission format with example rows, files). Files
are identical for the same seed and secret; writing all tasks takes well under a second.

**Answers that cannot be looked up or rebuilt.** The bundled datasets are public and the
generators are in this file, so an agent could look its test rows up in
``sklearn.datasets.load_*`` or rerun a generator with the task's seed, and read the
answers instead of modelling. Every random choice is therefore keyed by a *secret* as
well as the seed, and the tasks made from public datasets are disguised with it:

- a random subset of the rows (85-95%) is kept;
- the numeric features are standardised, mixed by a random rotation (every new column
  is a blend of the original ones, none of which weighs more than 0.8 in it), given a
  little noise (0.1 standard deviation) and a random scale and offset per column, then
  named ``f_00``, ``f_01``, ...: no column of
  the task lines up with a public column, so exact and nearest-neighbour matching
  against the public rows finds nothing useful, while a model trained on train.csv
  sees the same information as before (linear models are unaffected by a rotation);
- regression targets get noise of 0.1 of their standard deviation, so that even a
  recovered row would not give the exact answer.

The synthetic tasks draw their data from the secret-keyed streams too. Without the
secret nothing of a task can be rebuilt; the secret itself appears in no file, task
field or description.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn import datasets
from sklearn.model_selection import train_test_split

from mappa_env._fs import remove_tree
from mappa_env.envs.dsbench.metrics import get_metric
from mappa_env.envs.dsbench.scoring import read_answers
from mappa_env.envs.dsbench.tasks import ANSWERS_FILE, DSBenchTask
from mappa_env.tasks.secret import user_task_secret
from mappa_env.tempdirs import make_temp_dir

BUILTIN_PROMPTS_FILE = "cleaned_prompts.json"
"""Cleaned-prompts file written beside the built-in tasks (same format as DSBench's)."""

ID_COLUMN = "id"

#: Share of a public dataset's rows a task keeps: drawn uniformly from this range.
KEPT_ROWS = (0.85, 0.95)
#: Noise added to each disguised feature, in standard deviations of that feature.
FEATURE_NOISE = 0.1
#: Noise added to regression targets of public datasets, in their standard deviations.
TARGET_NOISE = 0.1
#: Largest weight of one original column in a disguised column (see _random_rotation).
MAX_MIXING_WEIGHT = 0.8


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
    make: Callable[[np.random.Generator], _Dataset]
    overview: str
    fields: str
    evaluation: str
    source: str
    test_size: float = 0.25
    stratify: bool = False
    public: bool = False  # made from a public dataset: disguised (see the module docs)


def _snake(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in name.strip().lower())
    return "_".join(part for part in cleaned.split("_") if part)


def _iris(rng: np.random.Generator) -> _Dataset:
    bunch = datasets.load_iris()
    features = pd.DataFrame(bunch.data, columns=[_snake(n) for n in bunch.feature_names])
    species = np.asarray(bunch.target_names)[bunch.target]
    return _Dataset(features, pd.DataFrame({"species": species}))


def _wine(rng: np.random.Generator) -> _Dataset:
    bunch = datasets.load_wine()
    features = pd.DataFrame(bunch.data, columns=[_snake(n) for n in bunch.feature_names])
    cultivar = np.array(["A", "B", "C"])[bunch.target]
    return _Dataset(features, pd.DataFrame({"cultivar": cultivar}))


def _breast_cancer(rng: np.random.Generator) -> _Dataset:
    bunch = datasets.load_breast_cancer()
    features = pd.DataFrame(bunch.data, columns=[_snake(n) for n in bunch.feature_names])
    # scikit-learn codes malignant as 0; the task asks about malignancy, so 1 = malignant.
    return _Dataset(features, pd.DataFrame({"malignant": 1 - bunch.target}))


def _digits(rng: np.random.Generator) -> _Dataset:
    bunch = datasets.load_digits()
    columns = [f"pixel_{row}_{col}" for row in range(8) for col in range(8)]
    features = pd.DataFrame(bunch.data.astype(int), columns=columns)
    return _Dataset(features, pd.DataFrame({"digit": bunch.target}))


def _diabetes(rng: np.random.Generator) -> _Dataset:
    bunch = datasets.load_diabetes(scaled=False)
    features = pd.DataFrame(bunch.data, columns=list(bunch.feature_names))
    return _Dataset(features, pd.DataFrame({"progression": bunch.target}))


def _linnerud(rng: np.random.Generator) -> _Dataset:
    bunch = datasets.load_linnerud()
    features = pd.DataFrame(bunch.data, columns=[n.lower() for n in bunch.feature_names])
    targets = pd.DataFrame(bunch.target, columns=[n.lower() for n in bunch.target_names])
    return _Dataset(features, targets)


def _legacy_state(rng: np.random.Generator) -> np.random.RandomState:
    """A RandomState for scikit-learn's generators, seeded from ``rng`` with 256 bits."""
    return np.random.RandomState(rng.integers(0, 2**32, size=8, dtype=np.uint32))


def _synthetic_classification(rng: np.random.Generator) -> _Dataset:
    x, y = datasets.make_classification(
        n_samples=1200,
        n_features=12,
        n_informative=6,
        n_redundant=2,
        weights=[0.7, 0.3],
        flip_y=0.03,
        class_sep=0.9,
        random_state=_legacy_state(rng),
    )
    features = pd.DataFrame(x.round(5), columns=[f"sensor_{i:02d}" for i in range(12)])
    return _Dataset(features, pd.DataFrame({"fault": y}))


def _synthetic_regression(rng: np.random.Generator) -> _Dataset:
    x, y = datasets.make_regression(
        n_samples=1000,
        n_features=10,
        n_informative=6,
        noise=15.0,
        random_state=_legacy_state(rng),
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


def _synthetic_houses(rng: np.random.Generator) -> _Dataset:
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


def _synthetic_churn(rng: np.random.Generator) -> _Dataset:
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
        "- f_00 to f_03: four numeric features, each an undisclosed blend of the flower's "
        "sepal length, sepal width, petal length and petal width (in centimetres), with a "
        "little noise\n- species: the target, one of setosa, versicolor, virginica",
        "Submissions are evaluated on classification accuracy: the share of test rows "
        "whose predicted `species` is correct. Higher is better.",
        "sklearn.datasets.load_iris (disguised)",
        stratify=True,
        public=True,
    ),
    _Spec(
        "wine",
        "Wine cultivar",
        "f1_macro",
        "classification",
        _wine,
        "Each row is the chemical analysis of a wine grown in one region by one of three "
        "cultivators. Predict which cultivator (A, B or C) produced each test wine.",
        "- f_00 to f_12: 13 numeric features, each an undisclosed blend of the results of "
        "the chemical analysis (alcohol, malic acid, ash, alcalinity of ash, magnesium, total "
        "phenols, flavanoids, nonflavanoid phenols, proanthocyanins, colour intensity, hue, "
        "OD280/OD315 of diluted wines, proline), with a little noise\n"
        "- cultivar: the target, one of A, B, C",
        "Submissions are evaluated on the macro-averaged F1 score: F1 is computed for each "
        "cultivar and the three values are averaged with equal weight. Higher is better.",
        "sklearn.datasets.load_wine (disguised)",
        stratify=True,
        public=True,
    ),
    _Spec(
        "breast_cancer",
        "Breast mass diagnosis",
        "roc_auc",
        "classification",
        _breast_cancer,
        "Each row describes the cell nuclei seen in a digitised image of a fine needle "
        "aspirate of a breast mass. Predict how likely each test mass is to be malignant.",
        "- f_00 to f_29: 30 numeric features, each an undisclosed blend of the mean, "
        "standard error and worst value of ten nucleus measurements (radius, texture, "
        "perimeter, area, smoothness, compactness, concavity, concave points, symmetry, "
        "fractal dimension), with a little noise\n"
        "- malignant: the target, 1 for a malignant mass and 0 for a benign one",
        "Submissions are evaluated on the area under the ROC curve between the predicted "
        "probability and the true `malignant` value. Higher is better. Submit the "
        "probability that `malignant` is 1, not a hard 0/1 label.",
        "sklearn.datasets.load_breast_cancer (disguised)",
        stratify=True,
        public=True,
    ),
    _Spec(
        "digits",
        "Handwritten digits",
        "accuracy",
        "classification",
        _digits,
        "Each row describes an 8x8 image of a handwritten digit by 64 numeric features. "
        "Predict the digit shown in each test image.",
        "- f_00 to f_63: 64 numeric features, each an undisclosed blend of the image's 64 "
        "pixel intensities (ink from 0 to 16), with a little noise\n"
        "- digit: the target, an integer from 0 to 9",
        "Submissions are evaluated on classification accuracy: the share of test images "
        "whose predicted `digit` is correct. Higher is better.",
        "sklearn.datasets.load_digits (disguised)",
        stratify=True,
        public=True,
    ),
    _Spec(
        "diabetes",
        "Diabetes progression",
        "rmse",
        "regression",
        _diabetes,
        "Each row is one diabetes patient at a baseline visit. Predict a quantitative "
        "measure of disease progression one year later.",
        "- f_00 to f_09: ten numeric features, each an undisclosed blend of age, sex, body "
        "mass index, mean blood pressure and six blood serum measurements, with a little "
        "noise\n- progression: the target, a positive number",
        "Submissions are evaluated on the root mean squared error between the predicted "
        "and the true `progression`. Lower is better.",
        "sklearn.datasets.load_diabetes (disguised)",
        public=True,
    ),
    _Spec(
        "linnerud",
        "Exercise and physiology",
        "mcrmse",
        "regression",
        _linnerud,
        "Twenty middle-aged men were measured at a fitness club. From three exercise "
        "results, predict three physiological measurements of each test participant.",
        "- f_00 to f_02: three numeric features, each an undisclosed blend of the exercise "
        "results chins, situps and jumps (counts), with a little noise\n"
        "- weight (pounds), waist (inches), pulse (beats per minute): the three targets",
        "Submissions are evaluated on the mean column-wise root mean squared error "
        "(MCRMSE): the RMSE of each of `weight`, `waist` and `pulse`, averaged. Lower is "
        "better.",
        "sklearn.datasets.load_linnerud (disguised)",
        test_size=0.3,
        public=True,
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
    disguise_note = (
        "\n\nThe rows are a random subset of the original data and the features a secret "
        "random mix of its measurements with noise, so no published copy of the data "
        "matches them: learn from train.csv."
        if spec.public
        else ""
    )
    return (
        f"# {spec.title}\n\n"
        f"## Overview\n{spec.overview}\n\n"
        f"## Data fields\n- {ID_COLUMN}: row identifier\n{spec.fields}{disguise_note}\n\n"
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


def _task_rng(secret: str, seed: int, name: str, purpose: str) -> np.random.Generator:
    """The random stream of one use (``purpose``) in one task, keyed by secret and seed."""
    key = f"mappa-dsbench-builtin:{secret}:{seed}:{name}:{purpose}"
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest(), "big"))


def _random_rotation(size: int, rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal matrix that blends every new column from several old ones.

    Drawn uniformly (QR of a Gaussian matrix, signs fixed) and redrawn while one entry
    exceeds :data:`MAX_MIXING_WEIGHT` in size: in few dimensions (iris has four) a
    uniform draw is often close to a signed permutation, which would leave a public
    column nearly intact under a new name.
    """
    # A unit row of `size` entries has one of at least 1/sqrt(size): below that, no draw.
    bound = max(MAX_MIXING_WEIGHT, 1.0 / np.sqrt(size) + 0.05)
    best, best_weight = np.eye(size), np.inf
    for _ in range(1000):
        q, r = np.linalg.qr(rng.normal(size=(size, size)))
        q = q * np.sign(np.diag(r))
        weight = float(np.abs(q).max())
        if weight < best_weight:
            best, best_weight = q, weight
        if weight <= bound:
            break
    return best


def _disguise(dataset: _Dataset, task_type: str, rng: np.random.Generator) -> _Dataset:
    """Rows subsampled, features rotated, noised, rescaled and renamed (module docs)."""
    n_rows, n_features = dataset.features.shape
    share = rng.uniform(*KEPT_ROWS)
    kept = np.sort(rng.choice(n_rows, size=round(share * n_rows), replace=False))
    values = dataset.features.to_numpy(dtype=float)[kept]
    spread = values.std(axis=0)
    spread[spread == 0] = 1.0  # a constant column (a digit image's corner) stays constant
    standard = (values - values.mean(axis=0)) / spread
    mixed = standard @ _random_rotation(n_features, rng)
    mixed += rng.normal(0.0, FEATURE_NOISE, mixed.shape)
    scale = np.exp(rng.uniform(np.log(0.5), np.log(2.0), n_features))
    offset = rng.uniform(-3.0, 3.0, n_features)
    columns = [f"f_{i:02d}" for i in range(n_features)]
    features = pd.DataFrame((mixed * scale + offset).round(4), columns=columns)
    targets = dataset.targets.iloc[kept].reset_index(drop=True)
    if task_type == "regression":
        for column in targets.columns:
            truth = targets[column].to_numpy(dtype=float)
            noisy = truth + rng.normal(0.0, TARGET_NOISE * truth.std(), len(truth))
            # Clipped at the smallest true value, so a positive target stays positive.
            targets[column] = np.maximum(noisy, truth.min()).round(1)
    return _Dataset(features, targets)


def _write_task(
    root: Path, spec: _Spec, seed: int, secret: str
) -> tuple[DSBenchTask, dict[str, object]]:
    dataset = spec.make(_task_rng(secret, seed, spec.name, "data"))
    if spec.public:
        dataset = _disguise(dataset, spec.task_type, _task_rng(secret, seed, spec.name, "disguise"))
    n_rows = len(dataset.features)
    rng = _task_rng(secret, seed, spec.name, "split")
    # Ids are a keyed shuffle, so row ids say nothing about the original dataset order.
    ids = rng.permutation(n_rows) + 1
    positions = np.arange(n_rows)
    stratify = dataset.targets.iloc[:, 0] if spec.stratify else None
    train_rows, test_rows = train_test_split(
        positions, test_size=spec.test_size, random_state=_legacy_state(rng), stratify=stratify
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
    root: str | Path,
    names: Iterable[str] | None = None,
    seed: int = 0,
    secret: str | None = None,
) -> list[DSBenchTask]:
    """Write built-in tasks in DSBench's layout under ``root`` and return them.

    The test answers are written only under ``root/answers/``; ``test.csv`` has no target
    column. A ``cleaned_prompts.json`` beside them (merged with an existing one) lets
    :func:`~mappa_env.envs.dsbench.tasks.load_dsbench_tasks` read the same tasks back.

    Args:
        root: Directory to write into (created if needed).
        names: Which tasks, from :data:`BUILTIN_TASK_NAMES`; default all, in that order.
        seed: Seed for the row subset, the disguise, the train/test split, the id shuffle
            and synthetic data; the same seed and secret write the same files.
        secret: Keys every random choice together with ``seed``, so that the tasks can
            be neither looked up nor rebuilt without it (see the module docs). ``None``
            takes the user's secret (:func:`~mappa_env.tasks.secret.user_task_secret`);
            a string pins the files (reproducible tests). It is written nowhere.

    Returns:
        The tasks, in the order of ``names``.

    Raises:
        ValueError: If a name is not a built-in task.
    """
    if secret is None:
        secret = user_task_secret()
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
        task, entry = _write_task(root, _SPECS_BY_NAME[name], seed, secret)
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

    By default every set draws a fresh random secret (:mod:`secrets`) that lives only
    inside this call: nobody, not even the caller, can make or look up the same data
    again, so agents of a run cannot either. Pass ``secret`` for reproducible data.

    Args:
        names: Which tasks, from :data:`BUILTIN_TASK_NAMES`; default all.
        seed: Seed of the data (see :func:`builtin_tasks`).
        secret: The secret that keys the data (see :func:`builtin_tasks`); ``None``
            draws a fresh one. It is not kept.

    Attributes:
        tasks: The tasks.
        answers: Task id -> hidden answers table.
    """

    def __init__(
        self, names: Iterable[str] | None = None, seed: int = 0, secret: str | None = None
    ) -> None:
        self.root = make_temp_dir("dsbench-tasks")
        # remove_tree: nothing under the folder (agent code may reach it when unconfined)
        # can make the clean-up raise.
        self._cleanup = weakref.finalize(self, remove_tree, self.root)
        self.tasks = builtin_tasks(
            self.root,
            names=names,
            seed=seed,
            secret=secrets.token_hex(32) if secret is None else secret,
        )
        self.answers = {t.id: read_answers(t.answers_path, t.id_column) for t in self.tasks}
        remove_tree(self.root / "answers")

    def close(self) -> None:
        """Remove the task files. Idempotent."""
        self._cleanup()
