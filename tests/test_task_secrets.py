"""Answers that cannot be looked up or rebuilt: task secrets and disguised built-in data.

An RL-trained agent takes any path to the reward that skips the task. Two such paths
closed here: rebuilding a generated task from its public seed (MathChat's problems,
DSBench's synthetic data) and looking test rows up in scikit-learn's bundled datasets
(DSBench's tasks made from them).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn import datasets
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neighbors import NearestNeighbors
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import mappa_env
from mappa_env.dsbench import BuiltinTaskSet, builtin_tasks, score_submission
from mappa_env.dsbench.reference import reference_script
from mappa_env.tasks import generate_math_tasks
from mappa_env.tasks.secret import TASK_SECRET_ENV, task_secret_path, user_task_secret
from tests.fakes import InProcessSandbox

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh cache directory and no secret in the environment: the file path is used."""
    monkeypatch.delenv(TASK_SECRET_ENV, raising=False)
    monkeypatch.setenv("MAPPA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---------------------------------------------------------------- MathChat's generator

# Tasks of the generator before secrets existed (computed with the code of commit 107da33).
PRE_SECRET_TASKS = {
    ("gen-s7-00000", None, "mixed"): (
        "A warehouse receives 12 crates every day for 9 days.",
        "9349",
    ),
    ("gen-s7-00001", None, "mixed"): (
        "Let $S$ be the sum of all positive divisors of $5358$.",
        "11520",
    ),
    ("gen-s7-00002", None, "mixed"): ("Find the remainder when $61918^{274955088931}$", "111436"),
    ("gen-s3-00000", "expression", "medium"): ("Compute 92 * 32 - 908.", "2036"),
    ("gen-s3-00001", "expression", "medium"): ("Compute 76 * 44 - 257.", "3087"),
}


def test_the_empty_secret_reproduces_the_tasks_from_before_secrets():
    for (task_id, kind, difficulty), (start, answer) in PRE_SECRET_TASKS.items():
        seed, index = int(task_id.split("-")[1][1:]), int(task_id.split("-")[2])
        kinds = None if kind is None else [kind]
        tasks = generate_math_tasks(
            index + 1, seed=seed, kinds=kinds, difficulty=difficulty, secret=""
        )
        assert tasks[index].id == task_id
        assert tasks[index].prompt.startswith(start), tasks[index].prompt
        assert tasks[index].answer == answer


def test_a_secret_changes_the_problems_but_not_the_ids():
    plain = generate_math_tasks(30, seed=7, secret="")
    salted = generate_math_tasks(30, seed=7, secret="s3cr3t")
    assert [t.id for t in salted] == [t.id for t in plain]
    assert sum(a.prompt != b.prompt for a, b in zip(plain, salted)) >= 28
    assert salted == generate_math_tasks(30, seed=7, secret="s3cr3t")  # pinned: reproducible
    assert salted != generate_math_tasks(30, seed=7, secret="s3cr3t2")
    assert all("s3cr3t" not in repr(t.metadata) + t.prompt for t in salted)
    with pytest.raises(TypeError, match="secret must be a string"):
        generate_math_tasks(2, secret=12)  # type: ignore[arg-type]


def test_the_default_secret_comes_from_the_environment_variable(monkeypatch):
    monkeypatch.setenv(TASK_SECRET_ENV, "from-the-env")
    assert user_task_secret() == "from-the-env"
    assert generate_math_tasks(5, seed=1) == generate_math_tasks(5, seed=1, secret="from-the-env")


def test_the_default_secret_is_created_once_in_the_cache_with_mode_0600(cache_dir):
    path = task_secret_path()
    assert path == cache_dir / "task-secret"
    assert not path.exists()
    first = user_task_secret()
    assert len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == first
    assert user_task_secret() == first
    assert os.listdir(cache_dir) == ["task-secret"]  # no temporary files left behind
    assert generate_math_tasks(5, seed=1) == generate_math_tasks(5, seed=1, secret=first)
    assert generate_math_tasks(5, seed=1) != generate_math_tasks(5, seed=1, secret="")


# Each child loads the module from its file (not the mappa_env package: a quick start),
# waits for the go signal so that all race, then prints the secret it ends with.
_CHILD = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("secret", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
print(module.user_task_secret())
"""


def test_processes_creating_the_secret_at_once_all_end_with_the_same_one(cache_dir, tmp_path):
    import subprocess

    source = ROOT / "mappa_env" / "tasks" / "secret.py"
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(source), str(go)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    go.touch()
    found = {child.communicate(timeout=60)[0].strip() for child in children}
    assert all(child.returncode == 0 for child in children)
    assert len(found) == 1
    assert found == {task_secret_path().read_text().strip()}
    assert os.listdir(cache_dir) == ["task-secret"]


def test_mathchat_task_sets_take_a_secret_and_default_to_the_users(monkeypatch):
    monkeypatch.setenv(TASK_SECRET_ENV, "user-secret")
    spec = {"n": 4, "seed": 3, "kinds": ["expression"], "difficulty": "medium"}
    env = mappa_env.make("MathChat-v0", tasks={**spec, "secret": "pinned"}, sandbox=None)
    assert env.tasks == generate_math_tasks(
        4, seed=3, kinds=["expression"], difficulty="medium", secret="pinned"
    )
    env.close()
    env = mappa_env.make("MathChat-v0", tasks=spec, sandbox=None)
    assert [t.prompt for t in env.tasks] == [
        t.prompt
        for t in generate_math_tasks(
            4, seed=3, kinds=["expression"], difficulty="medium", secret="user-secret"
        )
    ]
    env.close()
    env = mappa_env.make("MathChat-v0", tasks="gen:3:5", sandbox=None)
    assert env.tasks == generate_math_tasks(3, seed=5, secret="user-secret")
    env.close()
    with pytest.raises(ValueError, match="'secret' must be a string"):
        mappa_env.make("MathChat-v0", tasks={**spec, "secret": 2024}, sandbox=None)


def test_reproducible_recipes_draw_the_same_problems_for_every_user(monkeypatch):
    from benchmarks.repro_smoke import TASKS
    from mappa_env.envs.mathchat import _generated_tasks

    recipe = yaml.safe_load((ROOT / "configs" / "mathchat-smollm2.yaml").read_text())
    specs = [recipe["env_options"]["tasks"], recipe["eval_env_options"]["tasks"], TASKS]
    drawn = []
    for user_secret in ("one-user", "another-user"):
        monkeypatch.setenv("MAPPA_TASK_SECRET", user_secret)
        drawn.append([[t.prompt for t in _generated_tasks(spec, seed=0)] for spec in specs])
    assert all(isinstance(spec.get("secret"), str) for spec in specs)
    assert drawn[0] == drawn[1]


# ---------------------------------------------------------------- DSBench built-in tasks

PUBLIC_TASKS = ("iris", "wine", "breast_cancer", "digits", "diabetes", "linnerud")
SYNTHETIC_TASKS = (
    "synthetic_classification",
    "synthetic_regression",
    "synthetic_houses",
    "synthetic_churn",
)


def _files(task_set: BuiltinTaskSet) -> dict[str, bytes]:
    return {
        f"{task.id}/{path.name}": path.read_bytes()
        for task in task_set.tasks
        for path in (task.train_path, task.test_path, task.sample_submission_path)
    }


def test_task_sets_differ_without_a_secret_and_match_with_the_same_one():
    names = ["iris", "synthetic_churn"]
    fresh = [BuiltinTaskSet(names=names) for _ in range(2)]
    pinned = [BuiltinTaskSet(names=names, secret="pinned") for _ in range(2)]
    first, second = (_files(s) for s in fresh)
    assert all(first[name] != second[name] for name in first if "sample" not in name)
    assert not fresh[0].answers["iris"].equals(fresh[1].answers["iris"])
    assert _files(pinned[0]) == _files(pinned[1])
    for task_id in names:
        assert pinned[0].answers[task_id].equals(pinned[1].answers[task_id])
    assert [t.description for t in pinned[0].tasks] == [t.description for t in pinned[1].tasks]
    for task_set in fresh + pinned:
        task_set.close()


def _public_rows(name: str) -> tuple[np.ndarray, pd.DataFrame]:
    """scikit-learn's bundled copy, with the labels spelled as the built-in task spells them."""
    if name == "iris":
        bunch = datasets.load_iris()
        return bunch.data, pd.DataFrame({"species": np.asarray(bunch.target_names)[bunch.target]})
    if name == "wine":
        bunch = datasets.load_wine()
        return bunch.data, pd.DataFrame({"cultivar": np.array(["A", "B", "C"])[bunch.target]})
    if name == "breast_cancer":
        bunch = datasets.load_breast_cancer()
        return bunch.data, pd.DataFrame({"malignant": 1 - bunch.target})
    if name == "digits":
        bunch = datasets.load_digits()
        return bunch.data, pd.DataFrame({"digit": bunch.target})
    if name == "diabetes":
        bunch = datasets.load_diabetes(scaled=False)
        return bunch.data, pd.DataFrame({"progression": bunch.target})
    bunch = datasets.load_linnerud()
    return bunch.data, pd.DataFrame(bunch.target, columns=[n.lower() for n in bunch.target_names])


def lookup_attack(task, how: str) -> pd.DataFrame:
    """What agent code would write: each test row's label taken from the public dataset.

    ``exact``: the public row with equal features (else the training majority / mean);
    ``nearest``: the nearest public row on the raw features; ``standardised``: the nearest
    after standardising both sides column by column (undoes any per-column rescaling).
    Columns are paired by position: both tables have the features in the same number.
    """
    train, test = pd.read_csv(task.train_path), pd.read_csv(task.test_path)
    features = test.drop(columns=[task.id_column]).to_numpy(dtype=float)
    public, labels = _public_rows(task.id)
    if how == "exact":
        matches = [
            np.flatnonzero(np.isclose(public, row, rtol=0, atol=1e-6).all(axis=1))
            for row in features
        ]
        found = np.array([hits[0] if len(hits) else -1 for hits in matches])
    else:
        ours, theirs = features, public
        if how == "standardised":
            ours = (features - features.mean(0)) / np.where(features.std(0) > 0, features.std(0), 1)
            theirs = (public - public.mean(0)) / np.where(public.std(0) > 0, public.std(0), 1)
        found = NearestNeighbors(n_neighbors=1).fit(theirs).kneighbors(ours)[1][:, 0]
    submission = pd.DataFrame({task.id_column: test[task.id_column]})
    for column in task.target_columns:
        guess = (
            train[column].mode()[0] if task.task_type == "classification" else train[column].mean()
        )
        submission[column] = [labels[column].iloc[i] if i >= 0 else guess for i in found]
    return submission


def honest_submission(task) -> pd.DataFrame:
    """A plain scikit-learn model trained on train.csv (the job the attack skips)."""
    train, test = pd.read_csv(task.train_path), pd.read_csv(task.test_path)
    features = [c for c in test.columns if c != task.id_column]
    submission = pd.DataFrame({task.id_column: test[task.id_column]})
    for column in task.target_columns:
        if task.task_type == "classification":
            model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))
            model.fit(train[features], train[column])
            if task.metric_spec.needs_probabilities:
                submission[column] = model.predict_proba(test[features])[:, 1]
            else:
                submission[column] = model.predict(test[features])
        else:
            model = make_pipeline(StandardScaler(), Ridge()).fit(train[features], train[column])
            submission[column] = model.predict(test[features])
    return submission


def _score(task_set: BuiltinTaskSet, task, submission: pd.DataFrame):
    answers = task_set.answers[task.id]
    return score_submission(
        submission, answers, task.metric, task.id_column, list(task.target_columns)
    )


@pytest.mark.parametrize("secret", ["attack-1", "attack-2", "attack-3"])
def test_looking_test_rows_up_in_the_public_datasets_fails(secret):
    task_set = BuiltinTaskSet(names=PUBLIC_TASKS, secret=secret)
    for task in task_set.tasks:
        honest = _score(task_set, task, honest_submission(task))
        for how in ("exact", "nearest", "standardised"):
            stolen = _score(task_set, task, lookup_attack(task, how))
            assert stolen.success, stolen.reason
            # Before the disguise every one of these scored 1.0 (0.00 error).
            assert stolen.value != pytest.approx(1.0 if stolen.higher_is_better else 0.0)
            limit = 0.1 if how != "standardised" else 0.8
            assert stolen.normalized <= limit, (task.id, how, stolen)
            if task.task_type == "classification":
                # The job still pays more than the lookup.
                assert honest.normalized > stolen.normalized + 0.1, (task.id, how, honest, stolen)
    task_set.close()


def test_disguised_tasks_stay_learnable():
    task_set = BuiltinTaskSet(names=PUBLIC_TASKS, secret="learnable")
    minimum = {
        "iris": 0.6,
        "wine": 0.8,
        "breast_cancer": 0.9,
        "digits": 0.85,
        "diabetes": 0.1,
        "linnerud": -1,
    }
    for task in task_set.tasks:
        score = _score(task_set, task, honest_submission(task))
        assert score.success, score.reason
        assert score.normalized >= minimum[task.id], (task.id, score)
        # Numeric features only, named f_00...: nothing ties a column to a public one.
        train = pd.read_csv(task.train_path)
        features = [c for c in train.columns if c not in (task.id_column, *task.target_columns)]
        assert features == [f"f_{i:02d}" for i in range(len(features))]
        assert "disguised" in task.metadata["source"]
    task_set.close()


def _rebuilt_answers(task, guessed_secret: str) -> pd.DataFrame:
    """Agent code rerunning the generator with the task's public seed and a guess."""
    with tempfile.TemporaryDirectory() as tmp:
        (copy,) = builtin_tasks(
            tmp, names=[task.id], seed=task.metadata["seed"], secret=guessed_secret
        )
        rebuilt_test, rebuilt_answers = pd.read_csv(copy.test_path), pd.read_csv(copy.answers_path)
    test, train = pd.read_csv(task.test_path), pd.read_csv(task.train_path)

    def key(frame: pd.DataFrame) -> pd.Series:
        return (
            frame.drop(columns=[task.id_column])
            .astype(object)
            .fillna("")
            .astype(str)
            .agg("|".join, axis=1)
        )

    column = task.target_columns[0]
    known = dict(zip(key(rebuilt_test), rebuilt_answers[column]))
    guess = train[column].mode()[0] if task.task_type == "classification" else train[column].mean()
    return pd.DataFrame(
        {task.id_column: test[task.id_column], column: [known.get(k, guess) for k in key(test)]}
    )


def test_rebuilding_synthetic_tasks_from_their_seed_fails():
    task_set = BuiltinTaskSet(names=SYNTHETIC_TASKS, secret="the-real-one")
    for task in task_set.tasks:
        for guess in ("", "mappa", str(task.metadata["seed"])):
            stolen = _score(task_set, task, _rebuilt_answers(task, guess))
            assert stolen.success, stolen.reason
            assert stolen.normalized == 0.0, (task.id, guess, stolen)
        # The same secret does rebuild it: the secret is all that protects the answers.
        rebuilt = _score(task_set, task, _rebuilt_answers(task, "the-real-one"))
        assert rebuilt.normalized == pytest.approx(1.0)
    task_set.close()


def test_the_secret_appears_nowhere_agents_or_researchers_look(tmp_path):
    secret = "Zq9-unmistakable-secret-7Hk"
    task_set = BuiltinTaskSet(names=["iris", "synthetic_churn"], secret=secret)
    env = mappa_env.make("DSBench-v0", tasks=task_set, sandbox=InProcessSandbox)
    seen = [task.description + repr(task.metadata) for task in task_set.tasks]
    for task in env.tasks[:1]:  # one episode shows what agents and infos get
        env.reset(options={"task_id": task.id})
        script = reference_script(task)
        for agent in env.agent_iter():
            *_, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            seen.append(json.dumps(env.observe(agent)["messages"]))
            env.step(script[agent].pop(0))
            seen.append(json.dumps(env.infos[agent], default=str))
        seen += [p.read_bytes().decode("latin-1") for p in env.workdir.rglob("*") if p.is_file()]
        seen.append(json.dumps(env.state(), default=str))
    seen += [p.read_bytes().decode("latin-1") for p in task_set.root.rglob("*") if p.is_file()]
    assert not [text for text in seen if secret in text]
    assert not list(task_set.root.rglob("test_answer.csv"))
    assert secret not in json.dumps({k: str(v) for k, v in vars(task_set).items()})
    env.close()
    task_set.close()


def test_an_environment_owns_tasks_keyed_by_the_users_secret(monkeypatch):
    monkeypatch.setenv(TASK_SECRET_ENV, "user-secret-a")
    first = mappa_env.make("DSBench-v0", task_ids=["iris"], sandbox=None, seed=0)
    again = mappa_env.make("DSBench-v0", task_ids=["iris"], sandbox=None, seed=0)
    assert first.tasks[0].train_path.read_bytes() == again.tasks[0].train_path.read_bytes()
    monkeypatch.setenv(TASK_SECRET_ENV, "user-secret-b")
    other = mappa_env.make("DSBench-v0", task_ids=["iris"], sandbox=None, seed=0)
    assert other.tasks[0].train_path.read_bytes() != first.tasks[0].train_path.read_bytes()
    for env in (first, again, other):
        env.close()


def test_secrets_never_reach_the_kernels_environment(monkeypatch):
    from mappa_env.sandbox.limits import SandboxLimits, kernel_environment

    monkeypatch.setenv(TASK_SECRET_ENV, "do-not-leak")
    monkeypatch.setenv("MAPPA_CACHE_DIR", "/somewhere")
    environment = kernel_environment(SandboxLimits())
    assert "do-not-leak" not in json.dumps(environment)
    assert not [key for key in environment if key.startswith("MAPPA")]
