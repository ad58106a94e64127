"""DSBench-v0 against hostile agent code: the workspace, the reads, the artifact checks.

An RL-trained agent takes any path to the reward that skips the task, and its code may
leave anything in the workspace. Here: links, FIFOs, devices, sparse files and deep or
wide trees must neither crash nor stall the environment, nor be read; planted modules
must not forge the artifact inspection; and the rules coach must pay its high scores
only for artifacts that do the job.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

import mappa_env
from mappa_env._fs import (
    MAX_WALK_DEPTH,
    UnsafeFileError,
    file_kind,
    read_regular_file,
    remove_tree,
    walk_files,
)
from mappa_env.dsbench import BuiltinTaskSet
from mappa_env.dsbench.reference import engineer_action, modeler_action, reference_script
from mappa_env.envs import dsbench as dsbench_env
from mappa_env.envs.dsbench import DSBenchEnv, list_files
from tests.fakes import InProcessSandbox, csv_task

DEPTH = 1_500


def code(text: str) -> str:
    return f"Here is my code.\n```python\n{text}\n```"


def deep_chain(root: Path, depth: int = DEPTH, name: str = "d") -> None:
    """A chain of ``depth`` nested folders, made through folder descriptors (any length)."""
    folder = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=folder)
            inner = os.open(name, os.O_RDONLY, dir_fd=folder)
            os.close(folder)
            folder = inner
        os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=folder))
    finally:
        os.close(folder)


DEEP_CHAIN_CODE = (
    "import os\n"
    "fd = os.open('.', os.O_RDONLY)\n"
    f"for _ in range({DEPTH}):\n"
    "    os.mkdir('deep', dir_fd=fd)\n"
    "    inner = os.open('deep', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = inner\n"
    "os.close(fd)\n"
)


@pytest.fixture(scope="module")
def task_set():
    tasks = BuiltinTaskSet(names=["iris"], secret="hardening")
    yield tasks
    tasks.close()


@pytest.fixture
def env(task_set):
    environment = DSBenchEnv(tasks=task_set, sandbox=InProcessSandbox)
    environment.reset(options={"task_id": "iris"})
    yield environment
    remove_tree(environment.workdir)  # what pipeline's own clean-up may not remove yet
    environment.close()


def rewards(env: DSBenchEnv) -> dict[tuple[str, int], float]:
    return {(r.agent, r.turn): r.reward for r in env.transcript}


# ---------------------------------------------------------------- walking and removing


class CountingScandir:
    """Stands in for ``os.scandir`` and counts the folders it opens and the entries read."""

    def __init__(self) -> None:
        self.folders = 0
        self.entries = 0
        self._scandir = os.scandir

    def __call__(self, path):
        self.folders += 1
        return self._Iterator(self._scandir(path), self)

    class _Iterator:
        def __init__(self, inner, counter: CountingScandir) -> None:
            self._inner = inner
            self._counter = counter

        def __enter__(self):
            return self

        def __exit__(self, *exc_info) -> None:
            self._inner.close()

        def __iter__(self):
            return self

        def __next__(self):
            entry = next(self._inner)
            self._counter.entries += 1
            return entry


@pytest.fixture
def scandir(monkeypatch) -> CountingScandir:
    counter = CountingScandir()
    monkeypatch.setattr(os, "scandir", counter)
    return counter


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """The names given to ``os.open`` while the test runs (a FIFO blocks once opened)."""
    names: list[str] = []
    real_open = os.open

    def spying_open(path, *args, **kwargs):
        names.append(os.path.basename(os.fsdecode(path)))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spying_open)
    return names


def test_listing_survives_a_deep_chain_and_skips_links_and_special_files(tmp_path, scandir):
    outside = tmp_path / "outside.txt"
    outside.write_text("not in the workspace")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "train.csv").write_text("id\n1\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "a.txt").write_text("a")
    (workspace / ".hidden").write_text("h")
    (workspace / "link.csv").symlink_to(outside)
    (workspace / "dir_link").symlink_to(tmp_path)
    os.mkfifo(workspace / "fifo")
    deep_chain(workspace)
    try:
        names = [f.name for f in list_files(workspace)]
        # The walk's work: the workspace, sub, and the chain down to the depth limit, not
        # its 1,500 levels, and no folder through a link.
        assert scandir.folders == 2 + MAX_WALK_DEPTH
        assert names == ["sub/a.txt", "train.csv"]  # nothing beyond the depth limit, no links
        assert list_files(tmp_path / "gone") == []
        (tmp_path / "swapped").symlink_to(workspace)
        assert list_files(tmp_path / "swapped") == []
    finally:
        remove_tree(workspace)  # pytest's own clean-up of tmp_path is recursive


@pytest.fixture
def fast_dir(tmp_path):
    """A folder in memory where there is one (100,000 files on a disk take long to make)."""
    if not os.access("/dev/shm", os.W_OK):
        return tmp_path
    folder = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="mappa-test-"))
    yield folder
    remove_tree(folder)


def test_listing_a_flood_of_files_is_bounded(fast_dir, scandir):
    count = 100_000
    folder = os.open(fast_dir, os.O_RDONLY)
    for i in range(count):
        os.close(os.open(f"f{i:06d}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=folder))
    os.close(folder)
    files = walk_files(fast_dir, limit=200, max_entries=20_000)
    # One folder, and 20,000 of its 100,000 entries (plus the one read to find the budget
    # spent).
    assert (scandir.folders, scandir.entries) == (1, 20_001)
    assert len(files) == 200
    assert remove_tree(fast_dir) == []
    assert not fast_dir.exists()


def test_remove_tree_takes_deep_long_named_locked_trees_and_never_follows_links(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious.txt").write_text("must survive")
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    # 1,500 levels of 200-character names: a path of 300 KB, far over PATH_MAX.
    deep_chain(doomed, name="n" * 200)
    (doomed / "link_to_keep").symlink_to(keep)
    (doomed / "file_link").symlink_to(keep / "precious.txt")
    os.mkfifo(doomed / "fifo")
    locked = doomed / "locked" / "inner"
    locked.mkdir(parents=True)
    (locked / "x").write_text("x")
    os.chmod(locked, 0)
    os.chmod(doomed / "locked", 0o500)
    assert remove_tree(doomed) == []
    assert not doomed.exists()
    assert (keep / "precious.txt").read_text() == "must survive"
    assert remove_tree(doomed) == []  # already gone: nothing to do, no error
    single = tmp_path / "single.txt"
    single.write_text("x")
    assert remove_tree(single) == []
    assert not single.exists()


# ---------------------------------------------------------------- reading workspace files


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d, out: (d / "f").symlink_to(out), "symbolic link"),
        (lambda d, out: (d / "f").symlink_to("/proc/self/environ"), "symbolic link"),
        (lambda d, out: (d / "f").symlink_to("/proc/self/pagemap"), "symbolic link"),
        (lambda d, out: os.mkfifo(d / "f"), "FIFO"),
        (lambda d, out: (d / "f").mkdir(), "directory"),
        (lambda d, out: os.link(out, d / "f"), "hard link"),
        (lambda d, out: os.truncate((d / "f").open("wb").name, 2**40), "over the 1000"),
    ],
    ids=["outside", "environ", "pagemap", "fifo", "directory", "hard_link", "sparse_1TB"],
)
def test_only_small_regular_files_of_their_own_are_read(tmp_path, make, why, opened):
    outside = tmp_path / "outside.csv"
    outside.write_text("id,species\n1,setosa\n")
    folder = tmp_path / "workspace"
    folder.mkdir()
    make(folder, outside)
    with pytest.raises(UnsafeFileError, match=why):
        read_regular_file(folder, "f", max_bytes=1000)
    # Refused before it is opened: a FIFO without a writer cannot block, 1 TB is not read.
    assert "f" not in opened
    kind, _ = file_kind(folder, "f")
    assert kind is not None  # it is seen (and listed), just not read


def test_a_linked_workspace_is_not_read_through(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "submission.csv").write_text("id\n1\n")
    (tmp_path / "workspace").symlink_to(real)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        read_regular_file(tmp_path / "workspace", "submission.csv", 1000)
    assert read_regular_file(real, "submission.csv", 1000) == b"id\n1\n"
    with pytest.raises(FileNotFoundError):
        read_regular_file(real, "missing.csv", 1000)


def test_submissions_read_as_bytes_score_like_files(tmp_path):
    from mappa_env.dsbench import score_submission

    answers = pd.DataFrame({"id": ["007", "8"], "y": ["a", "b"]})
    (tmp_path / "s.csv").write_text("id,y\n007,a\n8,a\n")
    from_file = score_submission(tmp_path / "s.csv", answers, "accuracy", "id", ["y"])
    from_bytes = score_submission(
        (tmp_path / "s.csv").read_bytes(), answers, "accuracy", "id", ["y"]
    )
    assert from_bytes == from_file
    assert from_bytes.value == 0.5
    empty = score_submission(b"", answers, "accuracy", "id", ["y"])
    assert not empty.success
    assert "empty" in empty.reason


# ---------------------------------------------------------------- the environment


ANALYST_DAMAGE = {
    "outside_copy": "shutil.copy('sample_submission.csv', OUTSIDE); os.symlink(OUTSIDE, 'submission.csv')",  # noqa: E501
    "environ": "os.symlink('/proc/self/environ', 'submission.csv')",
    "pagemap": "os.symlink('/proc/self/pagemap', 'submission.csv')",
    "fifo": "os.mkfifo('submission.csv')",
    "directory": "os.mkdir('submission.csv')",
    "hard_link": "shutil.copy('sample_submission.csv', OUTSIDE); os.link(OUTSIDE, 'submission.csv')",  # noqa: E501
    "sparse": "open('submission.csv', 'wb').truncate(2 ** 40)",
}
ANALYST_REASON = {
    "outside_copy": "symbolic link",
    "environ": "symbolic link",
    "pagemap": "symbolic link",
    "fifo": "FIFO",
    "directory": "directory",
    "hard_link": "hard link",
    "sparse": "over the",
}


@pytest.mark.parametrize("damage", sorted(ANALYST_DAMAGE))
def test_a_submission_that_is_not_a_plain_file_is_unscorable_and_harmless(
    env, damage, tmp_path, monkeypatch, opened
):
    monkeypatch.setenv("MAPPA_CANARY", "canary-9f3b-in-the-env-process")
    outside = tmp_path / "elsewhere.csv"
    env.step("Nothing to prepare.")
    env.step("Nothing to train.")
    env.step(code(f"import os, shutil\nOUTSIDE = {str(outside)!r}\n{ANALYST_DAMAGE[damage]}"))
    # Refused before it is opened: a FIFO without a writer cannot block, 1 TB is not read.
    assert "submission.csv" not in opened
    submission = env.infos["analyst"]["submission"]
    assert submission["success"] is False
    assert ANALYST_REASON[damage] in submission["reason"]
    assert rewards(env)[("analyst", 0)] <= 0.2
    env.step("Done.")
    outcome = env.state()["outcome"]
    assert outcome["success"] is False
    assert ANALYST_REASON[damage] in outcome["reason"]
    everything = json.dumps({"infos": env.infos, "state": env.state()}, default=str)
    # Before, the reason quoted /proc/self/environ's "columns": KEY=VALUE pairs.
    leaked = [key for key, value in os.environ.items() if f"{key}={value}" in everything]
    assert not leaked
    assert "canary-9f3b" not in everything
    assert outside.exists() or damage not in ("outside_copy", "hard_link")


def test_the_answers_of_a_real_data_dir_cannot_be_linked_in(tmp_path):
    task = csv_task(
        tmp_path,
        "linked",
        {
            "train": "id,x,label\n1,1,a\n2,2,b\n3,3,a\n4,4,b\n",
            "test": "id,x\n5,1\n6,2\n",
            "answers": "id,label\n5,a\n6,b\n",
        },
    )
    env = mappa_env.make("DSBench-v0", tasks=[task], sandbox=InProcessSandbox)
    answers = str(tmp_path / "answers.csv")
    for making, why in (("os.symlink", "symbolic link"), ("os.link", "hard link")):
        env.reset(options={"task": task})
        env.step("x")
        env.step("y")
        env.step(code(f"import os\n{making}({answers!r}, 'submission.csv')"))
        env.step("done")
        outcome = env.state()["outcome"]
        assert outcome["success"] is False, outcome
        assert why in outcome["reason"], outcome
    env.reset(options={"task": task})  # the same content as a file of its own does score
    env.step("x")
    env.step("y")
    env.step(code("open('submission.csv', 'w').write('id,label\\n5,a\\n6,b\\n')"))
    env.step("done")
    assert env.state()["outcome"]["value"] == 1.0
    env.close()


HOSTILE_ENGINEER = (
    DEEP_CHAIN_CODE + "import os\n"
    "os.mkfifo('X_train.pkl')\n"
    "os.symlink('/proc/self/pagemap', 'y_train.pkl')\n"
    "open('X_test.pkl', 'wb').truncate(2 ** 40)\n"
    "os.makedirs('wide', exist_ok=True)\n"
    "for i in range(2000):\n"
    "    open(f'wide/{i}', 'w').close()\n"
)
HOSTILE_MODELER = "import os\nos.mkdir('model.pkl')\nos.symlink('/proc/self/environ', 'x.csv')"
HOSTILE_ANALYST = "import os\nos.mkfifo('submission.csv')"


def test_no_step_raises_whatever_agent_code_leaves_in_the_workspace(env):
    steps = [
        code(HOSTILE_ENGINEER),
        "Saved everything.",
        code(HOSTILE_MODELER),
        "Done.",
        code(HOSTILE_ANALYST),
        "Done.",
    ]
    for action in steps:
        env.step(action)  # a blocking FIFO would stall here until the pytest timeout
    assert env.state()["outcome"]["success"] is False
    artifacts = env.transcript[0].tool.extra["artifacts"]
    assert all(entry["loads"] is False for entry in artifacts.values())
    assert "not a regular file" in artifacts["X_train.pkl"]["error"]
    assert all(record.verdict.valid for record in env.transcript)
    assert rewards(env)[("data_engineer", 0)] <= 0.5
    assert all("slot_end_error" not in info for info in env.infos.values())
    env.reset(options={"task_id": "iris"})  # the next episode starts clean, the chain gone
    assert {f.name for f in list_files(env.workdir)} == {
        "train.csv",
        "test.csv",
        "sample_submission.csv",
    }


def test_resetting_and_closing_after_a_deep_chain_do_not_raise(task_set):
    env = DSBenchEnv(tasks=task_set, sandbox=InProcessSandbox)
    workdirs = []
    try:
        for _ in range(2):
            env.reset(options={"task_id": "iris"})
            workdirs.append(env.workdir)
            env.step(code(DEEP_CHAIN_CODE))
        env.close()
        assert not any(path.exists() for path in workdirs)
    finally:
        for path in workdirs:
            remove_tree(path)


# ---------------------------------------------------------------- the artifact inspector

FORGING_MODULE = """
import sys
rows = lambda name: sum(1 for _ in open(name)) - 1
n, m = rows('train.csv'), rows('test.csv')
good = '"exists": true, "loads": true, "has_predict": false'
sys.stdout.write('{"X_train.pkl": {%s, "shape": [%d, 4], "varies": true}, '
                 '"y_train.pkl": {%s, "shape": [%d], "distinct_values": 3}, '
                 '"X_test.pkl": {%s, "shape": [%d, 4], "varies": true}}\\n'
                 % (good, n, good, n, good, m))
sys.exit(0)
"""
PLANTING_ENGINEER = (
    f"for module in ('json.py', 'pickle.py'):\n    open(module, 'w').write({FORGING_MODULE!r})\n"
    "for name in ('X_train.pkl', 'y_train.pkl', 'X_test.pkl'):\n"
    "    open(name, 'wb').write(b'not a pickle')\n"
)


def test_planted_modules_cannot_forge_the_artifact_report(env, monkeypatch):
    env.step(code(PLANTING_ENGINEER))
    artifacts = env.infos["data_engineer"]["artifacts"]
    assert [artifacts[n]["loads"] for n in ("X_train.pkl", "y_train.pkl", "X_test.pkl")] == [
        False
    ] * 3
    assert rewards(env)[("data_engineer", 0)] <= 0.5
    # Without isolated mode the planted json.py is imported and the forgery is believed;
    # only the target check still fails it (the forged report lists no rows of y_train).
    monkeypatch.setattr(
        DSBenchEnv,
        "_inspector_argv",
        lambda self: [sys.executable, "-c", dsbench_env._INSPECT_CODE],
    )
    env.reset(options={"task_id": "iris"})
    env.step(code(PLANTING_ENGINEER))
    assert env.infos["data_engineer"]["artifacts"]["X_train.pkl"]["loads"] is True
    assert env.infos["data_engineer"]["artifacts"]["y_train.pkl"]["holds_target"] is False
    assert rewards(env)[("data_engineer", 0)] == 0.5


def test_the_inspector_command_is_isolated_python():
    env = DSBenchEnv(sandbox=None, task_ids=["iris"], isolation="none")
    command = env._inspector_command()
    assert command[:3] == [sys.executable, "-I", "-c"]
    env.close()


# ---------------------------------------------------------------- the rubric's checks

TRAIN_ROWS = "n = len(pd.read_csv('train.csv')); m = len(pd.read_csv('test.csv'))\n"
CHEATING_ENGINEERS = {
    "zeros": "pickle.dump([0] * n, open('X_train.pkl', 'wb'))\n"
    "pickle.dump([0] * n, open('y_train.pkl', 'wb'))\n"
    "pickle.dump([0] * m, open('X_test.pkl', 'wb'))",
    "constant_columns": "pickle.dump([[0]] * n, open('X_train.pkl', 'wb'))\n"
    "pickle.dump(list(range(n)), open('y_train.pkl', 'wb'))\n"
    "pickle.dump([[0]] * m, open('X_test.pkl', 'wb'))",
    "rows_dropped": "t = pd.read_csv('train.csv').iloc[5:]; s = pd.read_csv('test.csv')\n"
    "pickle.dump(t.drop(columns=['id', 'species']), open('X_train.pkl', 'wb'))\n"
    "pickle.dump(t['species'], open('y_train.pkl', 'wb'))\n"
    "pickle.dump(s.drop(columns=['id']), open('X_test.pkl', 'wb'))",
    "test_rows_dropped": "t = pd.read_csv('train.csv'); s = pd.read_csv('test.csv').iloc[3:]\n"
    "pickle.dump(t.drop(columns=['id', 'species']), open('X_train.pkl', 'wb'))\n"
    "pickle.dump(t['species'], open('y_train.pkl', 'wb'))\n"
    "pickle.dump(s.drop(columns=['id']), open('X_test.pkl', 'wb'))",
}


@pytest.mark.parametrize("cheat", sorted(CHEATING_ENGINEERS))
def test_cheap_data_engineering_scores_no_more_than_the_middle(env, cheat):
    env.step(code("import pickle, pandas as pd\n" + TRAIN_ROWS + CHEATING_ENGINEERS[cheat]))
    env.step("Saved X_train.pkl, y_train.pkl and X_test.pkl.")
    assert rewards(env)[("data_engineer", 0)] <= 0.5, env.transcript[0].verdict.analysis
    assert rewards(env)[("data_engineer", 1)] <= 0.3  # the hand-over is not believed either


CV = "from sklearn.model_selection import cross_val_score\n"
LOAD = "import pickle\nX = pickle.load(open('X_train.pkl', 'rb')); y = pickle.load(open('y_train.pkl', 'rb'))\n"  # noqa: E501
SAVE = "pickle.dump(model, open('model.pkl', 'wb'))\n"
CHEATING_MODELERS = {
    "printed_cv_no_model": ("print('cv 0.99')", 0.4),
    # 5 for a model that has not learned, capped at 3 by its test predictions' skill.
    "constant_model": (
        LOAD + CV + "from sklearn.dummy import DummyClassifier\n"
        "model = DummyClassifier(strategy='most_frequent').fit(X, y)\n"
        "print('cv', cross_val_score(model, X, y, cv=3).mean())\n" + SAVE,
        0.3,
    ),
    "random_model": (
        LOAD + CV + "from sklearn.dummy import DummyClassifier\n"
        "model = DummyClassifier(strategy='uniform', random_state=0).fit(X, y)\n"
        "print('cv', cross_val_score(model, X, y, cv=3).mean())\n" + SAVE,
        0.3,
    ),
    "wrong_length": (
        LOAD + CV + "import operator\nfrom sklearn.pipeline import Pipeline\n"
        "from sklearn.preprocessing import FunctionTransformer\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "fitted = LogisticRegression(max_iter=1000).fit(X, y)\n"
        "head = FunctionTransformer(operator.itemgetter(slice(0, 5))).fit(X)\n"
        "model = Pipeline([('head', head), ('model', fitted)])\n"
        "print('cv', cross_val_score(fitted, X, y, cv=3).mean())\n" + SAVE,
        0.4,
    ),
    "good_model_printed_cv_only": (
        LOAD + "from sklearn.ensemble import RandomForestClassifier\n"
        "model = RandomForestClassifier(n_estimators=20, random_state=0).fit(X, y)\n"
        "print('cv 0.99')\n" + SAVE,
        0.7,
    ),
}


@pytest.mark.parametrize("cheat", sorted(CHEATING_MODELERS))
def test_a_model_must_be_usable_and_trained_and_cross_validated(env, task_set, cheat):
    action, expected = CHEATING_MODELERS[cheat]
    task = task_set.tasks[0]
    env.step(engineer_action(task))
    env.step("Saved the three pickles.")
    env.step(code(action))
    assert rewards(env)[("data_engineer", 0)] == 0.9
    assert rewards(env)[("modeler", 0)] == expected, env.transcript[-1].verdict.analysis


def test_the_reference_pipeline_still_earns_the_top_scores(env, task_set):
    task = task_set.tasks[0]
    script = reference_script(task)
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else script[agent].pop(0))
    scores = rewards(env)
    assert scores[("data_engineer", 0)] == 0.9
    assert scores[("modeler", 0)] == 0.9
    assert scores[("data_engineer", 1)] == 0.8
    assert scores[("modeler", 1)] == 0.8
    model = env.transcript[2].tool.extra["artifacts"]["model.pkl"]
    assert model["predictions"] == model["predictions_expected"] == len(pd.read_csv(task.test_path))
    assert model["train_skill"] > 0.5
    assert "CV score" in modeler_action(task)


def test_deleting_what_was_handed_over_is_no_excuse(env, task_set):
    # The modeler deletes the data engineer's X_train.pkl and the analyst the model: were
    # the gaps judged after their own code ran, both would be "not their fault" (5).
    script = reference_script(task_set.tasks[0])
    script["modeler"] = [code("import os\nos.remove('X_train.pkl')"), "Nothing to train on."]
    script["analyst"] = [code("import os\nos.remove('X_test.pkl')"), "Nothing to predict."]
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else script[agent].pop(0))
    scores = rewards(env)
    assert scores[("modeler", 0)] == 0.4  # its code ran and made no model
    verdicts = {(r.agent, r.turn): r.verdict for r in env.transcript}
    assert "not the modeler's fault" not in verdicts[("modeler", 0)].analysis
    # The model really was missing when the analyst's slot began: that stays excused.
    assert "['model.pkl'] are missing" in verdicts[("analyst", 0)].analysis


def test_holds_target_accepts_encodings_and_refuses_made_up_targets():
    from mappa_env.envs.dsbench import holds_target

    labels = ["yes", "no", "no", "maybe", "yes", "no"] * 20
    encoded = [{"yes": "1", "no": "0", "maybe": "2"}[v] for v in labels]
    one_hot = [{"yes": "1|0|0", "no": "0|1|0", "maybe": "0|0|1"}[v] for v in labels]
    assert holds_target(labels, labels, "classification")
    assert holds_target(encoded, labels, "classification")  # a label encoding
    assert holds_target(one_hot, labels, "classification")  # a one-hot encoding
    assert not holds_target(["0", "1"] * 60, labels, "classification")  # alternating
    assert not holds_target([str(i) for i in range(120)], labels, "classification")
    assert not holds_target(["1"] * 120, labels, "classification")  # merges the labels
    values = [((i * 37) % 101) / 7 for i in range(120)]
    truth = [str(v) for v in values]
    assert holds_target([str(math.log1p(v)) for v in values], truth, "regression")
    assert not holds_target([str(i) for i in range(120)], truth, "regression")  # row numbers
    assert not holds_target(["a"] * 120, truth, "regression")
    assert not holds_target([], truth, "regression")
    assert holds_target([str(-v) for v in values], truth, "regression")  # decreasing
    with_gaps = ["nan" if i % 10 == 0 else v for i, v in enumerate(truth)]
    assert holds_target(with_gaps, with_gaps, "regression")  # missing values left out
    assert not holds_target(["1.0"] * 120, truth, "regression")  # a constant
    # A few true values among missing ones: it rank-correlates where it has numbers.
    mostly_missing = ["nan"] * 110 + truth[110:]
    assert not holds_target(mostly_missing, truth, "regression")
    assert not holds_target(with_gaps, truth, "regression")  # 10% missing: too many
    few_gaps = ["nan" if i % 40 == 0 else v for i, v in enumerate(truth)]
    assert holds_target(few_gaps, truth, "regression")  # 3 of 120 missing


def engineer_saving(task, y_train: str) -> str:
    """The reference data engineer's action, saving ``y_train`` as its target."""
    action = engineer_action(task).replace("y_train = train[target]", f"y_train = {y_train}")
    assert action != engineer_action(task)
    return action


def test_a_made_up_target_fails_the_data_engineers_checks(env, task_set):
    env.step(engineer_saving(task_set.tasks[0], "pd.Series([i % 2 for i in range(len(train))])"))
    entry = env.infos["data_engineer"]["artifacts"]["y_train.pkl"]
    assert entry["holds_target"] is False
    assert "first_rows" not in entry  # the rows compared stay out of infos and prompts
    # 5 for artifacts failing a check, capped at 3: a model fit on them predicts nothing.
    assert rewards(env)[("data_engineer", 0)] == 0.3
    assert "not train.csv's target" in env.transcript[0].verdict.analysis


def test_a_target_whose_rows_cannot_be_listed_is_no_target(env, task_set):
    env.step(engineer_saving(task_set.tasks[0], "[[0]] * (len(train) - 1) + [[1, 1]]"))
    assert env.infos["data_engineer"]["artifacts"]["y_train.pkl"]["holds_target"] is False
    assert rewards(env)[("data_engineer", 0)] == 0.5


def test_an_encoded_target_passes_the_data_engineers_checks(env, task_set):
    env.step(engineer_saving(task_set.tasks[0], "pd.Series(pd.factorize(train[target])[0])"))
    assert env.infos["data_engineer"]["artifacts"]["y_train.pkl"]["holds_target"] is True
    assert rewards(env)[("data_engineer", 0)] == 0.9


def test_a_flood_of_files_does_not_hide_what_was_handed_over(env, task_set):
    # 200 files that sort before model.pkl push it out of the capped listing: the
    # analyst must still be judged as having had the model.
    script = reference_script(task_set.tasks[0])
    flood = "\nimport os\nos.makedirs('a', exist_ok=True)\nfor i in range(210):\n"
    flood += "    open(f'a/{i:03d}', 'w').close()"
    script["modeler"][0] = script["modeler"][0].replace(
        "```python\n", "```python" + flood + "\n", 1
    )
    script["analyst"] = ["I will not do anything.", "Nothing."]
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else script[agent].pop(0))
    verdicts = {(r.agent, r.turn): r.verdict for r in env.transcript}
    assert "missing" not in verdicts[("analyst", 0)].analysis
    assert rewards(env)[("analyst", 0)] < 0.5


def test_a_failing_slot_end_is_contained_and_reported(env, monkeypatch):
    calls = {"n": 0}
    real = dsbench_env.list_files

    def flaky(root, limit=200):
        calls["n"] += 1
        if calls["n"] == 2:  # the first lists the action's files, the second is the slot end's
            raise RuntimeError("listing broke")
        return real(root, limit)

    monkeypatch.setattr(dsbench_env, "list_files", flaky)
    env.step("Nothing to do.")  # the data engineer's slot ends: the listing fails once
    assert "listing broke" in env.infos["data_engineer"]["slot_end_error"]
    assert env.agent_selection == "modeler"
    assert "train.csv" in env.observe("modeler")["messages"][1]["content"]

    async def broken_release(owner):
        raise RuntimeError("the sandbox would not close")

    monkeypatch.setattr(env, "release_sandbox", broken_release)
    env.step("Nothing to do either.")
    assert "would not close" in env.infos["modeler"]["slot_end_error"]
    env.step("Nothing.")
    assert env.state()["outcome"]["success"] is False


FORGING_ENGINEER = (
    "import pickle\n"
    "names = ('X_train.pkl', 'y_train.pkl', 'X_test.pkl')\n"
    "report = {n: {'exists': True, 'loads': True, 'shape': [96, 4], 'varies': True,\n"
    "              'distinct_values': 3} for n in names}\n"
    "class Forge:\n"
    "    def __reduce__(self):\n"
    "        forged = 'import json, os; print(json.dumps(%r)); os._exit(0)' % (report,)\n"
    "        return (exec, (forged,))\n"
    "for name in names:\n"
    "    pickle.dump(Forge(), open(name, 'wb'))\n"
)


def test_a_pickle_cannot_forge_the_inspection_report(env):
    # Unpickling runs what a pickle names: one that ran code in the inspector could print
    # a report of its own. Only numpy, pandas, scikit-learn and scipy types may load.
    env.step(code(FORGING_ENGINEER))
    artifacts = env.infos["data_engineer"]["artifacts"]
    assert all(entry["loads"] is False for entry in artifacts.values())
    assert "builtins.exec is not allowed" in artifacts["X_train.pkl"]["error"]
    assert rewards(env)[("data_engineer", 0)] <= 0.5


def test_a_submission_with_a_huge_header_is_refused_before_pandas_parses_it(monkeypatch):
    from mappa_env.dsbench.metrics import MAX_COLUMNS, score_submission

    # pandas parses a header of a million columns for minutes: count what reaches it.
    parsed: list[int] = []
    read_csv = pd.read_csv

    def counting_read_csv(source, *args, **kwargs):
        parsed.append(len(source.getvalue()) if isinstance(source, io.BytesIO) else -1)
        return read_csv(source, *args, **kwargs)

    monkeypatch.setattr(pd, "read_csv", counting_read_csv)  # pandas itself: every reader

    answers = pd.DataFrame({"id": ["1", "2"], "y": ["a", "b"]})
    wide = ",".join(["id", "y", *(f"c{i}" for i in range(20_000))]).encode() + b"\n1,a\n"
    # Just under the limit, with names that collide once stripped: parsed, and refused.
    names = [name for i in range((MAX_COLUMNS - 10) // 2) for name in (f"c{i}", f" c{i}")]
    colliding = ",".join(["id", "y", *names])
    colliding_content = colliding.encode() + b"\n1,a\n"
    endless = b"id" + b"x" * (2 * 1024 * 1024)
    for content, why in ((wide, "columns"), (endless, "header line")):
        score = score_submission(content, answers, "accuracy", "id", ["y"])
        assert score.success is False
        assert why in score.reason, score.reason
        assert parsed == [], "refused from its first line, unparsed"
    score = score_submission(colliding_content, answers, "accuracy", "id", ["y"])
    assert score.success is False
    assert "duplicate" in score.reason, score.reason
    assert parsed  # under the limit: parsed, then refused


def test_duplicate_column_names_are_found_in_linear_time(monkeypatch):
    from mappa_env.dsbench.metrics import score_submission

    # 20,000 columns: counting each name in the list took about five minutes of CPU (20 s
    # at 5,000), a linear check takes hundredths of a second. The CPU time of this thread
    # counts the work: other processes on the cores do not add to it.
    names = [f"c{i}" for i in range(20_000)]
    table = pd.DataFrame([["1", "a", *range(len(names)), 0]], columns=["id", "y", *names, "c7"])
    answers = pd.DataFrame({"id": ["1"], "y": ["a"]})
    start = time.thread_time()
    score = score_submission(table, answers, "accuracy", "id", ["y"])
    assert time.thread_time() - start < 20
    assert score.success is False
    assert "duplicate column names: ['c7']" in score.reason, score.reason


# Hand-built pickles that reach code through names the safe unpickler must refuse: an
# attribute chain, helpers re-exported by allowed packages (operator, functools,
# subprocess, the type of types), and a pandas class that evaluates what it is given.
GADGETS = {
    "attribute chain": b"csklearn.linear_model\nLinearRegression.__init__\n.",
    "re-exported itemgetter": b"csklearn.utils.discovery\nitemgetter\n.",
    "re-exported partial": b"cpandas.core.common\npartial\n.",
    "the type of types": b"cpandas._typing\ntype_t\n.",
    "a module in reach": b"cpandas._config.localization\nsubprocess\n.",
    "an evaluating class": b"cpandas.core.computation.expr\nExpr\n(V1\ntR.",
    "a ufunc reconstructor": b"cnumpy._core\n_ufunc_reconstruct\n(Vos\nVsystem\ntR.",
}


@pytest.mark.parametrize("name", sorted(GADGETS))
def test_gadget_pickles_do_not_load(env, name):
    payload = GADGETS[name]
    writes = "\n".join(
        f"open({artifact!r}, 'wb').write({payload!r})"
        for artifact in ("X_train.pkl", "y_train.pkl", "X_test.pkl")
    )
    env.step(code(writes))
    artifacts = env.infos["data_engineer"]["artifacts"]
    assert all(entry["loads"] is False for entry in artifacts.values()), artifacts
    assert rewards(env)[("data_engineer", 0)] <= 0.5


def test_cross_validation_counts_only_as_code_that_calls_it():
    from mappa_env.coach.base import CoachRequest
    from mappa_env.coach.rules_dsbench import _cross_validated

    def request(action: str, stdout: str = "cv accuracy 0.95\n") -> CoachRequest:
        return CoachRequest(
            env_id="DSBench-v0",
            task_id="t",
            task="",
            agent="modeler",
            system_description="",
            role_description="",
            agent_input=(),
            action=action,
            tool_result={"ok": True, "stdout": stdout},
        )

    def python(text: str) -> str:
        return f"```python\n{text}\n```"

    called = [
        "from sklearn.model_selection import cross_val_score\ns = cross_val_score(m, X, y)",
        "import sklearn.model_selection as ms\nms.cross_validate(m, X, y)",
        "from sklearn.model_selection import GridSearchCV\nGridSearchCV(m, grid, cv=5).fit(X, y)",
        "from sklearn.model_selection import *\nfor tr, va in KFold(5).split(X): pass",
        "import xgboost as xgb\nxgb.cv(params, data)",
        "import sklearn\nsklearn.model_selection.train_test_split(X, y)",
        "from sklearn.model_selection import cross_val_score as cvs\ncvs(m, X, y)",
        "from sklearn.model_selection import StratifiedKFold as SKF\nSKF(5).split(X, y)",
        "!pip install -q lightgbm\nfrom sklearn import model_selection\n"
        "model_selection.cross_val_score(m, X, y, cv=5)",
        "%%time\nfrom sklearn.linear_model import RidgeCV\nRidgeCV().fit(X, y)",
    ]
    for text in called:
        assert _cross_validated(request(python(text))), text
    named = [
        "from sklearn.model_selection import cross_val_score\nprint(1)",  # imported only
        "cv = 5\nprint('cv accuracy 0.99')",  # a name that calls nothing
        "# cross_val_score would be slow\ns = 'KFold'",
        "print('cross_val_score(m, X, y)')",
        # A cv= keyword on any call, and functions of one's own with the names.
        "settings = dict(cv=5)",
        "search(m, cv = 5)",
        "def cv(): pass\ncv()",
        "def cross_val_score(*a): return [0.99]\ncross_val_score(m, X, y)",
        "from sklearn.model_selection import KFold\nKFold = print\nKFold(5)",
        "cross_val_score(m, X, y, cv=5)",  # imported nowhere: no real one
        "import mylib\nmylib.cross_val_score(m, X, y)",
    ]
    for text in named:
        assert not _cross_validated(request(python(text))), text
    prose = "No train_test_split needed here.\n" + python("print('cv', 1.0)")
    assert not _cross_validated(request(prose))
    # A real call, but no printed score: not seen either.
    assert not _cross_validated(request(python(called[0]), stdout="done\n"))
    # An import of an earlier turn lives on in the agent's interpreter.
    later = dataclasses.replace(
        request(python("print('cv', cross_val_score(m, X, y).mean())")),
        metadata={"earlier_codes": ["from sklearn.model_selection import cross_val_score"]},
    )
    assert _cross_validated(later)
