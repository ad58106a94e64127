"""DSBench-v0: three data-science agents share one workspace and build a submission.

``data_engineer`` prepares features (``X_train.pkl``, ``y_train.pkl``, ``X_test.pkl``),
``modeler`` trains and saves ``model.pkl`` with cross-validation metrics printed, and
``analyst`` writes ``submission.csv``. Each agent runs Python in its own interpreter in
the episode's workspace directory, so work passes between agents only through files and
final messages. The submission is joined to the hidden answers by id and scored with
the task's own metric.

Card:

- **Agents**: ``data_engineer`` -> ``modeler`` -> ``analyst``, up to 4 turns each (a
  turn without code ends the slot); ``turns=`` changes the limits.
- **Observation**: ``{"text": str, "messages": (chat messages, ...)}``: the task, the
  workspace's files, earlier agents' final messages, its own earlier turns.
- **Action**: any string; its fenced ```` ```python ```` blocks run in the agent's own
  Jupyter kernel in the shared workspace.
- **Rewards**: ``process`` (default): the coach's score of each action / 10;
  ``outcome``: the submission's success to every action; ``mixed``: a weighted sum.
- **Outcome** (``infos[agent]["outcome"]``): ``success``, ``metric``, ``value``,
  ``fair_value`` (the metric mapped to [0, 1]), ``reward``, ``task_type``.
- **Tasks**: built-in offline tasks (scikit-learn and synthetic data, keyed by a
  secret), a :class:`~mappa_env.dsbench.builtin.BuiltinTaskSet`, or a real DSBench
  folder (``data_dir=``, ``task_ids=``, ``cleaned_prompts=``).
- **Coaches**: ``"rules"`` (offline,
  :func:`~mappa_env.coach.rules_dsbench.dsbench_rubric`, with artifact checks) or an
  LLM coach judging by :data:`COACH_RUBRICS`, shown the workspace's files.
- **Options**: ``tasks``, ``data_dir``, ``task_ids``, ``cleaned_prompts`` and every
  option of :class:`~mappa_env.envs.pipeline.PipelineEnv`.
- **Versions**: v0, the paper's DSBench modeling pipeline.

Whatever agent code leaves in the workspace, the environment reads only regular files
of the workspace itself (never through a link, never a FIFO or device, size-capped),
walks it within bounds, and checks pickles only in a separate isolated interpreter (see
:mod:`mappa_env._fs` and the artifact inspector below); a step never raises for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from mappa_env._fs import UnsafeFileError, file_kind, read_regular_file, walk_files
from mappa_env.audit.battery import AuditActions
from mappa_env.coach.base import FileInfo
from mappa_env.coach.rules_dsbench import dsbench_rubric
from mappa_env.dsbench.audit import audit_actions as dsbench_audit_actions
from mappa_env.dsbench.builtin import BuiltinTaskSet
from mappa_env.dsbench.inspections import SHARED_INSPECTIONS, inspection_key
from mappa_env.dsbench.tasks import DSBenchTask
from mappa_env.envs.pipeline import (
    ActionRecord,
    AgentSpec,
    PipelineEnv,
    ToolOutcome,
)
from mappa_env.options import seed_option
from mappa_env.tasks.secret import user_task_secret
from mappa_env.text import extract_code_blocks, strip_think, truncate_middle

logger = logging.getLogger(__name__)

DATA_ENGINEER = "data_engineer"
MODELER = "modeler"
ANALYST = "analyst"

#: Files each agent must leave in the workspace.
ARTIFACTS: dict[str, tuple[str, ...]] = {
    DATA_ENGINEER: ("X_train.pkl", "y_train.pkl", "X_test.pkl"),
    MODELER: ("model.pkl",),
    ANALYST: ("submission.csv",),
}
#: Artifacts an agent needs from upstream.
NEEDS: dict[str, tuple[str, ...]] = {
    DATA_ENGINEER: (),
    MODELER: ("X_train.pkl", "y_train.pkl"),
    ANALYST: ("model.pkl", "X_test.pkl"),
}
INPUT_FILES = ("train.csv", "test.csv", "sample_submission.csv")
SUBMISSION_FILE = "submission.csv"
#: Submissions larger than this are not read (a runaway write must not exhaust memory).
MAX_SUBMISSION_BYTES = 200 * 1024 * 1024
_LISTING_LIMIT = 200
#: Wall-clock limit of one artifact inspection.
INSPECT_TIMEOUT_S = 60.0
#: The data engineer's cap when no standard model can be fit on its files (text left in
#: the features, say): the middle of the ladder, as for artifacts that fail a check.
UNFIT_DATA_CAP = 5

SYSTEM_DESCRIPTION = (
    "Three agents solve a Kaggle-style data-modelling task together, one after another, in "
    "one shared working directory that holds train.csv, test.csv and sample_submission.csv: "
    "(1) the data engineer prepares the data and saves X_train.pkl, y_train.pkl and X_test.pkl "
    "(plus any fitted transformers) with a short summary; (2) the modeler trains a model on "
    "them, prints cross-validation metrics and saves model.pkl; (3) the analyst predicts on "
    "X_test.pkl with model.pkl and writes submission.csv in the task's submission format. "
    "Each agent runs Python in its own interpreter: work passes between agents only through "
    "files and their final messages. The submission is scored with the task's metric."
)

_ROLES = {
    DATA_ENGINEER: (
        "You are the data engineer, agent 1 of 3 in a data-science team working in one shared "
        "directory. After you, the modeler trains a model and the analyst writes the submission."
        "\nYour job: load train.csv and test.csv, clean and encode the features (handle missing "
        "values and categorical columns, keep the row order of train.csv and test.csv), and "
        "save with pickle:"
        " X_train.pkl (features), y_train.pkl (target) and X_test.pkl (test features, same "
        "columns as X_train). Save any fitted transformers too."
    ),
    MODELER: (
        "You are the modeler, agent 2 of 3 in a data-science team working in one shared "
        "directory. Before you, the data engineer saved X_train.pkl, y_train.pkl and X_test.pkl;"
        " after you, the analyst uses your model to write the submission.\nYour job: load "
        "X_train.pkl and y_train.pkl, train a good model for the task's metric, print its "
        "cross-validation score, and save the fitted model with pickle as model.pkl."
    ),
    ANALYST: (
        "You are the analyst, agent 3 of 3 in a data-science team working in one shared "
        "directory. Before you, the data engineer saved X_test.pkl and the modeler saved "
        "model.pkl.\nYour job: load them, predict for every row of test.csv, and write "
        "submission.csv exactly in the format of sample_submission.csv (same id column and "
        "target column names, one row per test id)."
    ),
}
_ROLE_FOOTER = (
    "\nRun Python by writing one ```python block per reply; it runs in the shared directory and "
    "you will see its output. Your variables persist between your own turns, but the other "
    "agents cannot see them: only files. You have up to {turns} turns. A reply without a code "
    "block ends your part: make it a short summary for the next agent of what you saved. "
    "Keep each reply within {budget} tokens."
)

# The artifact inspector. It runs in a fresh, short-lived interpreter in the workspace, in
# isolated mode (python -I: neither the workspace nor PYTHON* variables shape sys.path, so
# a planted json.py or pickle.py is never imported): agent-written pickles are never
# unpickled in the environment's process (unpickling runs arbitrary code), and not in
# the agent's own interpreter either, where earlier agent code could forge the report.
# Its parameters come as JSON on stdin; its report is the last line of stdout. It opens
# only regular files (no links, FIFOs or devices), as the environment does. It reports
# facts; the rubric (mappa_env.coach.rules_dsbench) judges them.
_INSPECT_CODE = r"""
import json, os, pickle, resource, stat, sys

params = json.loads(sys.stdin.read())
for limit, (soft, hard) in params["rlimits"].items():
    resource.setrlimit(getattr(resource, limit), (soft, hard))
sys.path.extend(params["import_paths"])  # -I ignores PYTHONPATH; these are the env's own


def describe(exc):
    return f"{type(exc).__name__}: {exc}"[:200]


def open_regular(name):
    before = os.lstat(name)
    if not stat.S_ISREG(before.st_mode):
        raise OSError(f"{name} is not a regular file (a link, folder, FIFO or device)")
    handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    after = os.fstat(handle)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(handle)
        raise OSError(f"{name} was replaced while it was being opened")
    os.set_blocking(handle, True)
    return os.fdopen(handle, "rb")


# Unpickling runs whatever a pickle names, and a pickle that ran code here could print
# a forged report. So only data and estimator types load, each named by the module that
# defines it (no attribute chains, no re-exported helpers such as operator.attrgetter):
# numpy arrays and scalars, pandas frames and their parts, scikit-learn estimators and
# their compiled pieces, scipy sparse matrices, pyarrow arrays, plain containers, and
# the few functions their pickles are made with.
SAFE_BUILTINS = {
    "list", "dict", "set", "frozenset", "tuple", "bytearray", "bytes", "slice", "range",
    "complex", "int", "float", "str", "bool", "object",
}
SAFE_FUNCTIONS = {
    ("copyreg", "_reconstructor"), ("_codecs", "encode"),
    ("collections", "OrderedDict"), ("collections", "defaultdict"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("pandas._libs.internals", "_unpickle_block"),
    ("pandas.core.internals.blocks", "new_block"),
    ("pandas.core.indexes.base", "_new_Index"),
    ("pandas._libs.tslibs.timestamps", "_unpickle_timestamp"),
    ("pandas._libs.tslibs.timedeltas", "_timedelta_unpickle"),
    ("pandas._libs.tslibs.nattype", "__nat_unpickle"),
    ("pyarrow.lib", "_restore_array"), ("pyarrow.lib", "py_buffer"),
    ("pyarrow.lib", "type_for_alias"),
}
# Modules whose classes may load (a class must also be defined there).
SAFE_CLASS_MODULES = (
    "numpy", "numpy.dtypes", "numpy.random.", "numpy.ma.core",
    "pandas", "pandas.arrays", "pandas.core.frame", "pandas.core.series",
    "pandas.core.flags", "pandas.core.internals.", "pandas.core.arrays.",
    "pandas.core.indexes.", "pandas.core.dtypes.", "pandas._libs.",
    "scipy.sparse.", "pyarrow.lib", "joblib.numpy_pickle",
    # scikit-learn's compiled and internal pieces of fitted estimators:
    "sklearn._loss.", "sklearn.tree._tree", "sklearn.neighbors._kd_tree",
    "sklearn.neighbors._ball_tree", "sklearn.metrics._dist_metrics",
    "sklearn.ensemble._hist_gradient_boosting.", "sklearn.utils._bunch",
)
CLASS_PACKAGES = ("numpy", "pandas", "sklearn", "scipy", "pyarrow", "joblib")
# Classes of those modules that read or write files or call what they are given.
UNSAFE_CLASSES = {
    "memmap", "vectorize", "HDFStore", "ExcelFile", "ExcelWriter", "Grouper", "NamedFunc",
}
PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}  # protocol 0-2 pickles


def in_modules(module, prefixes):
    return any(module == p or (p.endswith(".") and module.startswith(p)) for p in prefixes)


def is_rebuilder(module, name):
    # Cython's pickle helpers of extension types (sklearn's trees and distance metrics,
    # numpy's SeedSequence): they rebuild objects of their own type from plain state.
    return module.split(".")[0] in ("numpy", "pandas", "sklearn", "scipy") and (
        name.startswith("__pyx_unpickle_") or name == "newObj"
    )


def is_estimator(found):
    try:
        from sklearn.base import BaseEstimator
    except ImportError:
        return False
    return found.__module__.startswith("sklearn.") and issubclass(found, BaseEstimator)


def refuse(module, name):
    raise pickle.UnpicklingError(
        f"{module}.{name} is not allowed in artifacts: they may hold numpy, pandas, "
        "scikit-learn and scipy objects only"
    )


def safe_class(module, name):
    import importlib

    module = PY2_MODULES.get(module, module)
    if "." in name:  # an attribute chain reaches anything (operator, subprocess, ...)
        refuse(module, name)
    if module == "builtins":
        if name in SAFE_BUILTINS:
            import builtins

            return getattr(builtins, name)
        refuse(module, name)
    known = (module, name) in SAFE_FUNCTIONS or is_rebuilder(module, name)
    if not (known or module.split(".")[0] in CLASS_PACKAGES):
        refuse(module, name)
    found = getattr(importlib.import_module(module), name, None)
    if found is None:
        refuse(module, name)
    if known:
        return found
    import numpy

    if isinstance(found, numpy.ufunc) and module == "numpy":
        return found  # np.log1p in a FunctionTransformer, pickled by name
    if not isinstance(found, type) or found.__module__ != module or name in UNSAFE_CLASSES:
        refuse(module, name)
    if in_modules(module, SAFE_CLASS_MODULES) or is_estimator(found):
        return found
    refuse(module, name)


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return safe_class(module, name)


def load(name):
    with open_regular(name) as handle:
        try:
            return SafeUnpickler(handle).load()
        except Exception as first:
            try:
                import joblib.numpy_pickle as joblib_pickle
            except ImportError:
                raise first from None

            class SafeNumpyUnpickler(joblib_pickle.NumpyUnpickler):
                def find_class(self, module, name):
                    return safe_class(module, name)

            # joblib routes the nested pickles of object arrays through this find_class.
            joblib_pickle.NumpyUnpickler = SafeNumpyUnpickler
            try:
                handle.seek(0)
                return joblib_pickle.load(handle)
            except Exception:
                raise first from None


def shape_of(obj):
    shape = getattr(obj, "shape", None)
    if shape is None and isinstance(obj, (list, tuple)):
        import numpy

        try:
            shape = numpy.shape(obj)
        except Exception:
            shape = (len(obj),)
    elif shape is None and hasattr(obj, "__len__"):
        shape = (len(obj),)
    return None if shape is None else [int(size) for size in shape]


def head(obj, rows):
    part = obj.iloc[:rows] if hasattr(obj, "iloc") else obj[:rows]
    return part.toarray() if hasattr(part, "toarray") else part  # sparse matrices


def distinct_rows(obj):
    import pandas

    return int(len(pandas.DataFrame(obj).drop_duplicates()))


def varies(obj):
    import pandas

    frame = pandas.DataFrame(head(obj, params["sample_rows"]))
    return bool((frame.nunique(dropna=False) > 1).any())


def canonical(value):
    # 1, 1.0 and numpy.int64(1) are one label; anything else is compared as text.
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return str(int(value)) if number and float(value).is_integer() else str(value)


def target_rows(obj):
    # The first rows of a target as canonical text, one string per row (columns joined).
    import numpy
    import pandas

    frame = pandas.DataFrame(numpy.asarray(head(obj, params["target_rows"])))
    return frame.map(canonical).agg("|".join, axis=1).tolist()


def train_skill(model, features, target):
    # How much better than a constant guess the model fits its own training rows:
    # for labels, accuracy above the majority share, as a fraction of what is left; for
    # numbers (regression, or scores on a classification task), the rank correlation of
    # predictions and target (a model trained on a transformed target, e.g. its
    # logarithm, still ranks rows in the target's order).
    import numpy
    import pandas

    rows = params["sample_rows"]
    predicted = pandas.DataFrame(numpy.asarray(model.predict(head(features, rows))))
    truth = pandas.DataFrame(numpy.asarray(head(target, rows)))
    if predicted.shape != truth.shape:
        raise ValueError(f"predictions {predicted.shape} vs y_train {truth.shape}")
    numeric = all(pandas.api.types.is_numeric_dtype(t) for t in predicted.dtypes)
    scores = numeric and not (predicted.to_numpy(dtype=float) % 1 == 0).all()
    if params["task_type"] == "regression" or scores:
        from scipy.stats import spearmanr

        truth = truth.apply(pandas.to_numeric, errors="coerce")
        values = [spearmanr(predicted[c], truth[c], nan_policy="omit").statistic for c in truth]
        return float(numpy.nanmean(values)) if not numpy.isnan(values).all() else -1.0
    labels = truth.map(canonical).agg("|".join, axis=1)
    guesses = predicted.map(canonical).agg("|".join, axis=1)
    majority = float(labels.value_counts(normalize=True).iloc[0])
    accuracy = float((labels.to_numpy() == guesses.to_numpy()).mean())
    return (accuracy - majority) / (1.0 - majority) if majority < 1.0 else 0.0


def prediction_rows(predictions):
    # The first test rows' predictions as canonical text, one string per row: the
    # environment scores them on the answers, which never enter this process.
    import numpy
    import pandas

    frame = pandas.DataFrame(numpy.asarray(predictions)[: params["skill_rows"]])
    return frame.map(canonical).agg("|".join, axis=1).tolist()


def reference_predictions(features, target, test):
    # A standard model fit on the data engineer's features, predicting its X_test: data
    # that only fits its own rows (a leaked target) predicts the test rows badly.
    # A random forest: fast on one core, several targets at once, missing values allowed.
    import numpy
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    rows = params["sample_rows"]
    labels = numpy.asarray(head(target, rows))
    if labels.ndim > 1 and labels.shape[1] == 1:
        labels = labels.ravel()
    classify = params["task_type"] != "regression"
    model = (RandomForestClassifier if classify else RandomForestRegressor)(
        n_estimators=50, random_state=0, n_jobs=1
    )
    model.fit(head(features, rows), labels)
    return prediction_rows(model.predict(head(test, params["skill_rows"])))


report, objects = {}, {}
for name in params["names"]:
    entry = {"exists": os.path.lexists(name)}
    if entry["exists"]:
        entry["size"] = os.lstat(name).st_size
        try:
            obj = load(name)
        except Exception as exc:
            entry.update(loads=False, error=describe(exc))
        else:
            objects[name] = obj
            entry.update(loads=True, type=type(obj).__module__ + "." + type(obj).__qualname__)
            facts = {"shape": shape_of, "has_predict": lambda o: callable(getattr(o, "predict", 0))}
            if name in ("X_train.pkl", "X_test.pkl"):
                facts["varies"] = varies
            if name == "y_train.pkl":
                facts["distinct_values"] = distinct_rows
                facts["first_rows"] = target_rows
            for key, fact in facts.items():
                try:
                    entry[key] = fact(obj)
                except Exception:  # an object that does not answer: the fact is unknown
                    entry[key] = None
    report[name] = entry

model = report.get("model.pkl", {})
if model.get("loads") and model.get("has_predict"):
    if "X_test.pkl" in objects:
        try:
            import numpy

            predictions = numpy.asarray(objects["model.pkl"].predict(objects["X_test.pkl"]))
            model["predictions"] = int(predictions.shape[0]) if predictions.ndim else 0
            model["distinct_predictions"] = distinct_rows(predictions)
            model["test_predictions"] = prediction_rows(predictions)
        except Exception as exc:
            model["predict_error"] = describe(exc)
    else:
        model["predict_error"] = "no loadable X_test.pkl to predict on"
        model["predict_skipped"] = True
    if "X_train.pkl" in objects and "y_train.pkl" in objects:
        try:
            model["train_skill"] = round(
                train_skill(objects["model.pkl"], objects["X_train.pkl"], objects["y_train.pkl"]), 4
            )
        except Exception as exc:
            model["train_skill_error"] = describe(exc)
data = ("X_train.pkl", "y_train.pkl", "X_test.pkl")
if params["reference_model"] and all(name in objects for name in data):
    try:
        report["X_test.pkl"]["reference_predictions"] = reference_predictions(
            *(objects[name] for name in data)
        )
    except Exception as exc:
        report["X_test.pkl"]["reference_error"] = describe(exc)
print()  # the report starts a line of its own, whatever a pickle printed while loading
print(json.dumps(report))
"""
#: Rows of X_train / y_train the inspector looks at for variation and training fit.
INSPECT_SAMPLE_ROWS = 20_000
#: Leading rows of y_train compared with train.csv's target (see :func:`holds_target`).
TARGET_CHECK_ROWS = 500
#: Leading test rows whose predictions are scored on the answers (the modeler's model,
#: and a reference model fit on the data engineer's files).
SKILL_ROWS = 5_000


def _canonical_label(value: Any) -> str:
    """A target value as text: 1, 1.0 and "1" are one label (the inspector's rule)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return str(int(value)) if number and float(value).is_integer() else str(value)


def holds_target(given: Sequence[str], truth: Sequence[str], task_type: str) -> bool:
    """Whether ``given`` rows are train.csv's target ``truth`` rows, up to an encoding.

    Row by row over the rows both have (the engineer is asked to keep train.csv's row
    order): for classification a consistent relabelling (each true label becomes one
    label, distinct labels stay distinct: label or one-hot encodings pass) on at least
    95% of the rows; for regression a rank correlation of at least 0.95 in size per
    column over the rows where both are numbers (a monotone transform such as ``log1p``
    or ``-y`` passes; missing values are left out). A made-up target with the right row
    count (row numbers, alternating labels) does not.
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
            both = numpy.isfinite(left[:, column]) & numpy.isfinite(right[:, column])
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


#: Most bytes of the inspector's stdout (and of its stderr) kept: the tail, with the report.
INSPECT_OUTPUT_BYTES = 1024 * 1024


def list_files(root: Path, limit: int = _LISTING_LIMIT) -> list[FileInfo]:
    """Regular files under ``root`` (relative names, sizes), hidden files and folders skipped.

    At most ``limit`` files are listed, so a flood of files cannot blow up prompts; the
    walk is bounded in depth and in entries examined and never follows links (see
    :func:`mappa_env._fs.walk_files`), so no tree agent code builds can stall or crash it.
    """
    return [FileInfo(found.name, found.size) for found in walk_files(root, limit=limit)]


async def _exchange(process: asyncio.subprocess.Process, request: bytes) -> tuple[bytes, bytes]:
    """Send ``request`` on stdin; return the tails of stdout and stderr at exit.

    Like ``communicate()``, but only the last :data:`INSPECT_OUTPUT_BYTES` of each stream
    are kept: a pickle that prints without end while it loads cannot fill this
    process's memory (the report is the last line).
    """
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        process.stdin.write(request)
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it exited before reading its parameters: its output says why
    stdout, stderr = await asyncio.gather(_tail(process.stdout), _tail(process.stderr))
    await process.wait()
    return stdout, stderr


async def _tail(stream: asyncio.StreamReader) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > INSPECT_OUTPUT_BYTES:
            del kept[:-INSPECT_OUTPUT_BYTES]
    return bytes(kept)


def _csv_rows(path: Path) -> int | None:
    """Data rows of a CSV file as pandas reads it (what agents' code sees), or None."""
    try:
        return len(pd.read_csv(path, usecols=[0]))
    except (OSError, ValueError) as exc:  # pandas' parser errors are ValueErrors
        logger.warning("cannot count the rows of %s: %s", path, exc)
        return None


def format_listing(files: Sequence[FileInfo | Mapping[str, Any]]) -> str:
    """A file listing for prompts: one ``name (size)`` per line."""
    if not files:
        return "(the directory is empty)"
    rows = [f if isinstance(f, FileInfo) else FileInfo(f["name"], f["size"]) for f in files]
    return "\n".join(f"- {f.name} ({_human_size(f.size)})" for f in rows)


def _human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


_BLAME_RULE = """\
Blame rule: if this agent's work failed because an earlier agent did not leave an \
artifact it needed (a missing or broken file), do not penalise it for that failure; judge \
whether it detected the problem, reported it clearly, and recovered sensibly where it could."""

#: What an LLM coach judges each role by (the rules coach uses ``dsbench_rubric``).
COACH_RUBRICS = {
    DATA_ENGINEER: """\
The data engineer prepares data for modelling in the shared workspace. It must leave \
X_train.pkl, y_train.pkl and X_test.pkl (plus any fitted transformers) and a short \
preprocessing summary.
- The files must exist at the end of its turn (see the workspace file list), with \
matching rows and columns between train and test features.
- The target must be separated from the features, with no target leakage and no id \
column used as a feature.
- Missing values and categorical columns must be handled; test data must be \
transformed with the transformers fitted on the training data.
- Code errors in the tool output that it left unresolved count against it; files \
promised but absent from the workspace are a serious fault (downstream agents need them).""",
    MODELER: f"""\
The modeler trains a model on the data engineer's files and must leave model.pkl and \
print cross-validation metrics.
- The model and validation should suit the task type and the task's metric (e.g. a \
classifier with probabilities for ROC-AUC, a regressor for RMSE).
- model.pkl must exist at the end of its turn; cross-validation scores must appear in \
the tool output (not only be claimed).
- Sensible choices (a strong baseline such as gradient boosting, reasonable \
hyperparameters, no training on test data) matter more than elaborate ones.
{_BLAME_RULE}""",
    ANALYST: f"""\
The analyst predicts on the test set with the saved model and must write \
submission.csv in the format of sample_submission.csv: the id column and the target \
column(s), one row per test row.
- submission.csv must exist and be scorable; predictions must come from the model (not \
constants or copied samples) and be of the right kind (labels or probabilities as the \
metric needs).
- When an outcome section is shown, it reports how the submission actually scored; the \
score cap given there is binding.
- With no scorable submission, the analyst's own failure scores low.
{_BLAME_RULE}""",
}


class DSBenchEnv(PipelineEnv):
    """DSBench-v0: data_engineer -> modeler -> analyst in one shared workspace.

    Args:
        tasks: A list of :class:`~mappa_env.dsbench.tasks.DSBenchTask`, a
            :class:`~mappa_env.dsbench.builtin.BuiltinTaskSet` shared with other
            environments, or ``None`` for this environment's own built-in offline tasks
            (made at run time from scikit-learn datasets and seeded synthetic data).
        data_dir: A real DSBench data directory (``data_resplit/`` and ``answers/``);
            with ``task_ids`` selects tasks from it instead of the built-in ones.
        task_ids: Task ids to use from ``data_dir`` (or names of built-in tasks).
        cleaned_prompts: With ``data_dir``: the cleaned-prompts file (or its parsed
            mapping) that gives each task's metric and columns; default: the file in
            ``data_dir``, else the benchmark directory's (see
            :func:`~mappa_env.dsbench.tasks.load_dsbench_tasks`).
        **options: Options of :class:`~mappa_env.envs.pipeline.PipelineEnv` (``coach``
            defaults to ``"rules"``, ``sandbox`` to ``"jupyter"``: one kernel per agent,
            all in the workspace; ``isolation`` confines the artifact inspector too;
            ``seed`` also seeds the built-in task data, keyed by the user's task secret
            as well (see :mod:`mappa_env.tasks.secret`) so that agents cannot rebuild it
            from the seed; pass a :class:`~mappa_env.dsbench.builtin.BuiltinTaskSet` for
            data keyed otherwise).
    """

    env_id = "DSBench-v0"
    roles = (
        AgentSpec(DATA_ENGINEER, "data engineer", 4),
        AgentSpec(MODELER, "modeler", 4),
        AgentSpec(ANALYST, "analyst", 4),
    )
    task_class = DSBenchTask
    coach_rubrics = COACH_RUBRICS
    rules_rubric = staticmethod(dsbench_rubric)
    shows_workspace = True
    default_code_timeout_s = 120.0
    hands_over_through_files = True

    def __init__(
        self,
        tasks: Sequence[Any] | None = None,
        *,
        data_dir: str | Path | None = None,
        task_ids: Sequence[str] | None = None,
        cleaned_prompts: str | Path | Mapping[str, Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("coach", "rules")
        options.setdefault("sandbox", "jupyter")
        self._owned_builtin: BuiltinTaskSet | None = None
        self._shared_builtin: BuiltinTaskSet | None = None
        self._answer_tables: dict[str, pd.DataFrame] = {}
        self._row_counts: dict[str, tuple[int | None, int | None]] = {}
        self._input_rows: tuple[int | None, int | None] = (None, None)
        self._target_rows: dict[str, list[str] | None] = {}
        self._test_truth: dict[str, list[str | None] | None] = {}
        self._label_translation: dict[str, str] | None = None
        self._target_signs: list[float] | None = None
        # Checked here too: the task data is made from it before the base class runs.
        seed = seed_option(options.get("seed"))
        self.tasks = self._resolve_tasks(
            tasks, data_dir, task_ids, cleaned_prompts, 0 if seed is None else seed
        )
        self._answers: pd.DataFrame | None = None
        self._artifacts: dict[str, dict[str, Any]] = {}
        self._slot_start_files: dict[str, list[FileInfo]] = {}
        #: Per agent, the files it needs that were missing when its slot began.
        self._missing_at_slot_start: dict[str, list[str]] = {}
        self._submission_score: Any = None
        self.task = self.tasks[0]
        super().__init__(**options)

    def _resolve_tasks(
        self,
        tasks: Sequence[Any] | None,
        data_dir: str | Path | None,
        task_ids: Sequence[str] | None,
        cleaned_prompts: str | Path | Mapping[str, Mapping[str, Any]] | None,
        seed: int,
    ) -> list[Any]:
        from mappa_env.dsbench.tasks import DSBenchTask, load_dsbench_tasks

        if task_ids is not None:
            if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Sequence):
                raise TypeError(
                    f"task_ids={task_ids!r}: task_ids must be a list of task ids, e.g. "
                    f"[{task_ids!r}] (a string would be read letter by letter)"
                )
            task_ids = list(task_ids)
        if isinstance(tasks, (str, bytes)) or not isinstance(
            tasks, (BuiltinTaskSet, Sequence, type(None))
        ):
            raise TypeError(
                f"tasks={tasks!r}: tasks must be a list of DSBenchTask, a BuiltinTaskSet or "
                f"None (the built-in tasks); got {type(tasks).__name__}. A DSBench folder "
                "is given as data_dir"
            )
        if isinstance(tasks, BuiltinTaskSet):
            # Shared with other environments: its answers are already in memory.
            known = {t.id for t in tasks.tasks}
            unknown = sorted(set(task_ids or ()) - known)
            if unknown:
                raise ValueError(f"task_ids {unknown} are not in the task set: {sorted(known)}")
            wanted = None if task_ids is None else set(task_ids)
            resolved = [t for t in tasks.tasks if wanted is None or t.id in wanted]
            self._answer_tables = tasks.answers
            self._shared_builtin = tasks  # keeps its files alive as long as this env
        elif tasks is not None:
            resolved = list(tasks)
            bad = [t for t in resolved if not isinstance(t, DSBenchTask)]
            if bad:
                raise TypeError(
                    f"tasks must be DSBenchTask objects, got {type(bad[0]).__name__}; "
                    "load them with mappa_env.dsbench.load_dsbench_tasks()"
                )
        elif data_dir is not None:
            resolved = load_dsbench_tasks(
                data_dir, task_ids=task_ids, cleaned_prompts=cleaned_prompts
            )
        else:
            # The user's secret, not a fresh one: the same seed then gives the same
            # episodes (PettingZoo's seed_test), and agents still cannot rebuild them.
            builtin = BuiltinTaskSet(names=task_ids, seed=seed, secret=user_task_secret())
            self._owned_builtin = builtin
            resolved = builtin.tasks
            self._answer_tables = builtin.answers
        if not resolved:
            raise ValueError("no DSBench tasks selected: check tasks, data_dir and task_ids")
        return resolved

    # ------------------------------------------------------------------ pipeline hooks

    @property
    def system_description(self) -> str:
        """What the DSBench system is."""
        return SYSTEM_DESCRIPTION

    def role_description(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        return _ROLES[agent] + _ROLE_FOOTER.format(
            turns=self.spec_of(agent).max_turns, budget=self.max_new_tokens
        )

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """Task, file listing, upstream final messages; then the agent's own turns."""
        if agent not in _ROLES:
            raise KeyError(f"unknown agent {agent!r}")
        files = self._slot_start_files.get(agent) or list_files(self.workdir)
        upstream = []
        for other in self.possible_agents[: self.possible_agents.index(agent)]:
            last = self.last_record(other)
            if last is not None:
                text = truncate_middle(strip_think(last.action).strip(), 4000)
                upstream.append(f"[{other}]\n{text or '(empty message)'}")
        first = [
            f"Task:\n{self.task.description}",
            f"Files in the working directory:\n{format_listing(files)}",
        ]
        if upstream:
            first.append("Final messages of the agents before you:\n" + "\n\n".join(upstream))
        must = ", ".join(ARTIFACTS[agent])
        first.append(f"You must leave in the working directory: {must}.")
        messages = [
            {"role": "system", "content": self.role_description(agent)},
            {"role": "user", "content": "\n\n".join(first)},
        ]
        own = self.records_of(agent)
        limit = self.spec_of(agent).max_turns
        for i, record in enumerate(own):
            messages.append({"role": "assistant", "content": record.action})
            left = limit - (i + 1)
            now = record.tool.extra.get("files", ())
            follow = (
                "This is your last turn: finish your work, or reply without code to hand over."
                if left == 1
                else f"You have {left} turns left. Write more code, or reply without code "
                "to hand over with a short summary."
            )
            messages.append(
                {
                    "role": "user",
                    "content": f"Output of your code:\n{record.tool.output or '(no code ran)'}"
                    f"\n\nFiles now:\n{format_listing(now)}\n\n{follow}",
                }
            )
        return messages

    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        """Run the action's Python in the agent's own interpreter; inspect artifacts."""
        blocks = await asyncio.to_thread(extract_code_blocks, action)
        extra: dict[str, Any] = {"code_blocks": len(blocks)}
        code = "\n".join(blocks) if blocks else None
        result = None
        output = None
        if code is not None:
            # Each agent has its own interpreter: work passes between agents only as files.
            result, output = await self.run_code(
                code, agent, self.code_timeout_s, self.tool_output_chars
            )
            if result is not None:
                self._artifacts.update(await self._inspect(agent))
        # Plain dicts: infos must stay JSON-serialisable.
        extra["files"] = [asdict(f) for f in list_files(self.workdir)]
        extra["upstream_files"] = [
            asdict(f) for f in self._slot_start_files.get(agent, []) if f.name not in INPUT_FILES
        ]
        extra["artifacts"] = {
            name: self._artifacts.get(name, self._file_only_check(name))
            for name in ARTIFACTS[agent] + NEEDS[agent]
        }
        if agent == ANALYST:
            # Reading and scoring a large CSV blocks: keep the event loop free.
            self._submission_score = await asyncio.to_thread(self._score_submission)
            extra["submission"] = self._submission_score.to_dict()
        outcome = ToolOutcome(code=code, result=result, output=output, ends_slot=not blocks)
        outcome.extra = extra
        return outcome

    def _inspected_names(self, agent: str) -> list[str]:
        """The pickles inspected after ``agent``'s code ran.

        X_test.pkl comes with a model: predicting on it shows that the model is usable.
        """
        names = [n for n in ARTIFACTS[agent] + NEEDS[agent] if n.endswith(".pkl")]
        if "model.pkl" in names and "X_test.pkl" not in names:
            names.append("X_test.pkl")
        return names

    def _inspector_argv(self) -> list[str]:
        """The inspector's interpreter, its flags and its code, before any confinement."""
        return [sys.executable, "-I", "-c", _INSPECT_CODE]

    def _inspector_command(self) -> list[str]:
        """The inspector's command line (its parameters come on stdin).

        ``-I`` (isolated mode) keeps the workspace and ``PYTHON*`` variables off
        ``sys.path``: a ``json.py`` or ``pickle.py`` planted by agent code is not imported.
        With namespace isolation it runs confined like the agents' kernels (it loads what
        agent code wrote), with the workspace read-only; the code is the last element.
        """
        from mappa_env.sandbox.limits import SandboxLimits, inherited_import_paths

        return self.helper_confinement.command(
            self._inspector_argv(),
            workdir=self.workdir,
            workdir_writable=False,
            read_only=[Path(p) for p in inherited_import_paths()],
            tmp_bytes=SandboxLimits().tmp_bytes,
        )

    async def _inspect(self, agent: str) -> dict[str, dict[str, Any]]:
        """Inspect pickled artifacts in a fresh limited interpreter; never raises.

        Reports, per file, whether it loads, its type, shape and ``predict``; whether
        X_train / X_test vary and how many distinct values y_train holds; for a model,
        whether ``predict(X_test)`` runs, how many rows and distinct values it returns,
        and how well it fits its own training rows. The rows the environment wrote to
        train.csv and test.csv are added as ``rows_expected`` / ``predictions_expected``.
        Pickles inspected before, byte for byte, get that report again
        (:mod:`mappa_env.dsbench.inspections`).
        """
        names = self._inspected_names(agent)
        if not names:
            return {}
        from mappa_env.sandbox.limits import SandboxLimits, inherited_import_paths

        limits = SandboxLimits()
        parameters = {
            "rlimits": limits.rlimits(),
            "names": names,
            "import_paths": inherited_import_paths(),
            "task_type": self.task.task_type,
            "sample_rows": INSPECT_SAMPLE_ROWS,
            "target_rows": TARGET_CHECK_ROWS,
            "skill_rows": SKILL_ROWS,
            "reference_model": agent == DATA_ENGINEER,
        }
        # What a report depends on besides the files: the inspector's code and flags and
        # the confinement's mode (the whole command line names this workspace's path).
        identity = f"{self.helper_confinement.mode} {self._inspector_argv()}"
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)  # agent code may have deleted it
        except OSError as exc:  # e.g. replaced by a file: the inspector says what it finds
            logger.warning("the workspace could not be made again: %s", exc)
        key = await asyncio.to_thread(inspection_key, self.workdir, names, parameters, identity)
        report = SHARED_INSPECTIONS.get(key)
        if report is None:
            report = await self._run_inspector(parameters)
            if isinstance(report, dict):
                # Kept only if the files are still the bytes that were hashed.
                after = await asyncio.to_thread(
                    inspection_key, self.workdir, names, parameters, identity
                )
                if after == key:
                    SHARED_INSPECTIONS.put(key, report)
        if isinstance(report, str):
            return self._uninspected(names, report)
        checked = {n: report[n] for n in names if isinstance(report.get(n), dict)}
        self._add_expected_rows(checked)
        self._check_target(checked)
        # Scored here, on answers the sandbox never sees; reading them blocks.
        await asyncio.to_thread(self._score_test_predictions, checked)
        return checked

    async def _run_inspector(self, parameters: dict[str, Any]) -> dict[str, Any] | str:
        """Run the inspector once: its report, or why there is none."""
        from mappa_env.sandbox.limits import SandboxLimits, kernel_environment

        limits = SandboxLimits()
        try:
            process = await asyncio.create_subprocess_exec(
                *self._inspector_command(),
                cwd=self.workdir,
                env=self.helper_confinement.environment(kernel_environment(limits)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:  # e.g. the workspace replaced by a file, no process slots
            logger.warning("the artifact inspector could not start: %s", exc)
            return f"inspection could not start: {exc}"
        request = json.dumps(parameters).encode()
        try:
            stdout, stderr = await asyncio.wait_for(_exchange(process, request), INSPECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            return f"inspection timed out after {INSPECT_TIMEOUT_S:g} s"
        if process.returncode != 0:
            # Only a report of a run that finished counts (a crash, a kill, an exit from
            # inside a loaded object); the cause is the last line of its stderr.
            tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return f"the inspector exited with status {process.returncode}: {tail[0]}"[:300]
        try:
            report = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no report"]
            return tail[0][:300]
        if not isinstance(report, dict):
            return "the inspection report is not a mapping"
        return report

    def _score_test_predictions(self, entries: dict[str, dict[str, Any]]) -> None:
        """Replace predictions on the first test rows by their skill on the answers.

        ``model.pkl`` gets ``test_skill`` (its own predictions), ``X_test.pkl`` gets
        ``reference_skill`` (a reference model's, fit on the data engineer's files),
        each with the rows scored; ``None`` with ``*_skill_error`` when they could not
        be scored. The raw predictions do not stay: infos and prompts would carry
        thousands of values.
        """
        from mappa_env.dsbench.metrics import prediction_skill

        for name, source, key in (
            ("model.pkl", "test_predictions", "test_skill"),
            ("X_test.pkl", "reference_predictions", "reference_skill"),
        ):
            entry = entries.get(name)
            if not entry or source not in entry:
                continue
            rows = entry.pop(source)
            truth = self._test_truth_rows(self.task)
            if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
                entry[key], entry[f"{key}_error"] = None, "the predictions could not be read"
                continue
            if truth is None:
                entry[key], entry[f"{key}_error"] = None, "the answers could not be read"
                continue
            skill = prediction_skill(
                rows,
                truth,
                self.task.task_type,
                labels=self._label_translation,
                signs=self._target_signs,
            )
            entry[key] = None if skill is None else round(skill, 4)
            if skill is None:
                entry[f"{key}_error"] = "too few predicted rows have an answer to score"

    def _test_truth_rows(self, task: Any) -> list[str | None] | None:
        """The answers of test.csv's first rows, as prediction rows are written."""
        if task.id not in self._test_truth:
            from mappa_env.dsbench.metrics import canonical_ids

            try:
                ids = pd.read_csv(
                    task.test_path, usecols=[task.id_column], nrows=SKILL_ROWS, dtype=str
                )[task.id_column]
                answers = self._answers
                assert answers is not None
                keyed = answers.set_index(canonical_ids(answers[task.id_column]))
                targets = keyed[list(task.target_columns)].map(_canonical_label)
                joined = targets.agg("|".join, axis=1)
                joined = joined[~joined.index.duplicated()]
                rows = [joined.get(i) for i in canonical_ids(ids)]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("the answers of %s's test rows could not be read: %s", task.id, exc)
                rows = None
            self._test_truth[task.id] = rows
        return self._test_truth[task.id]

    def _check_target(self, entries: dict[str, dict[str, Any]]) -> None:
        """Add ``holds_target`` to y_train.pkl's entry: is it train.csv's target?

        Compared with the task's own train.csv (not the workspace copy agent code can
        change); left out when either side cannot be read.
        """
        entry = entries.get("y_train.pkl")
        if not entry or not entry.get("loads"):
            return
        # Only the verdict stays: 500 rows of the target would flood infos and prompts.
        given = entry.pop("first_rows", None)
        truth = self._train_target_rows(self.task)
        if not truth:
            return
        # A y_train whose rows cannot even be listed (a ragged list, a dict) is no target.
        readable = isinstance(given, list) and all(isinstance(v, str) for v in given)
        entry["holds_target"] = readable and holds_target(given, truth, self.task.task_type)
        # Predictions come in y_train's encoding: how to read them as the target's.
        self._label_translation, self._target_signs = (
            target_translation(given, truth, self.task.task_type)
            if entry["holds_target"]
            else (None, None)
        )

    def _train_target_rows(self, task: Any) -> list[str] | None:
        """The first rows of the task's train.csv target, as the inspector writes them."""
        if task.id not in self._target_rows:
            try:
                frame = pd.read_csv(
                    task.train_path, usecols=list(task.target_columns), nrows=TARGET_CHECK_ROWS
                )
            except (OSError, ValueError) as exc:
                logger.warning("train.csv's target of %s could not be read: %s", task.id, exc)
                self._target_rows[task.id] = None
            else:
                frame = frame[list(task.target_columns)]
                rows = frame.map(_canonical_label).agg("|".join, axis=1).tolist()
                self._target_rows[task.id] = rows
        return self._target_rows[task.id]

    def _uninspected(self, names: Sequence[str], why: str) -> dict[str, dict[str, Any]]:
        """Entries for pickles whose inspection failed: what is on disk, not loadable."""
        return {n: {**self._file_only_check(n), "loads": False, "error": why} for n in names}

    def _add_expected_rows(self, entries: dict[str, dict[str, Any]]) -> None:
        """Add the rows of the train.csv / test.csv this environment wrote to the entries."""
        train_rows, test_rows = self._input_rows
        for name, rows in (("X_train.pkl", train_rows), ("y_train.pkl", train_rows)):
            if name in entries:
                entries[name]["rows_expected"] = rows
        if "X_test.pkl" in entries:
            entries["X_test.pkl"]["rows_expected"] = test_rows
        if "model.pkl" in entries and "predictions" in entries["model.pkl"]:
            entries["model.pkl"]["predictions_expected"] = test_rows

    def _file_only_check(self, name: str) -> dict[str, Any]:
        """What is at ``name`` in the workspace, by its directory entry (links not followed)."""
        kind, size = file_kind(self.workdir, name)
        entry: dict[str, Any] = {"exists": kind is not None, "size": size}
        if kind not in (None, "regular file"):
            entry["error"] = f"{name} is a {kind}, not a regular file"
        return entry

    def _score_submission(self) -> Any:
        """Score submission.csv; never raises for anything agent code left there.

        The file is read only if it is a regular file of the workspace within the size
        limit, without following links (see :func:`mappa_env._fs.read_regular_file`).
        """
        from mappa_env.dsbench.metrics import score_submission

        task = self.task
        targets = list(task.target_columns)
        try:
            content = read_regular_file(self.workdir, SUBMISSION_FILE, MAX_SUBMISSION_BYTES)
        except FileNotFoundError:
            problem = f"submission file not found: {SUBMISSION_FILE}"
        except UnsafeFileError as exc:
            problem = str(exc)
        else:
            return score_submission(content, self._answers, task.metric, task.id_column, targets)
        # Not read; scoring an empty frame still fills the baseline and range.
        score = score_submission(
            pd.DataFrame(), self._answers, task.metric, task.id_column, targets
        )
        return dataclasses.replace(score, reason=problem)

    async def episode_outcome(self) -> dict[str, Any]:
        """Score ``submission.csv`` against the hidden answers with the task's metric."""
        from mappa_env.dsbench.metrics import fair_value

        score = self._submission_score
        if score is None:  # the analyst never acted (truncated episode)
            score = self._score_submission()
        target_range = getattr(self.task, "target_range", None)
        return {
            "success": bool(score.success),
            "metric": score.metric,
            "value": score.value,
            "normalized": score.normalized if score.success else 0.0,
            "fair_value": fair_value(score, score.metric, target_range=target_range),
            "reason": score.reason,
            "task_id": self.task.id,
            "task_type": self.task.task_type,
            "reward": float(score.normalized) if score.success else 0.0,
        }

    async def on_episode_start(self) -> None:
        """Copy the task's inputs into a fresh workspace; load the hidden answers."""
        self._artifacts = {}
        self._submission_score = None
        self._label_translation = self._target_signs = None
        # Copying (possibly large) CSVs blocks: keep the event loop free.
        self._answers = await asyncio.to_thread(self._prepare_workspace, self.task)
        self._input_rows = await asyncio.to_thread(self._rows_written, self.task)
        self._slot_start_files = {DATA_ENGINEER: list_files(self.workdir)}
        self._missing_at_slot_start = {DATA_ENGINEER: self._missing_needs(DATA_ENGINEER)}
        # What the coach was told about each code turn, for judging later turns.
        self._turn_facts: dict[tuple[str, int], dict[str, Any]] = {}

    def _prepare_workspace(self, task: Any) -> pd.DataFrame:
        from mappa_env.dsbench.metrics import read_answers

        copies = [(task.train_path, "train.csv"), (task.test_path, "test.csv")]
        if task.sample_submission_path is not None:
            copies.append((task.sample_submission_path, "sample_submission.csv"))
        for source, name in copies:
            shutil.copyfile(source, self.workdir / name)
        cached = self._answer_tables.get(task.id)
        return cached if cached is not None else read_answers(task.answers_path, task.id_column)

    def _rows_written(self, task: Any) -> tuple[int | None, int | None]:
        """Data rows of the task's train.csv and test.csv, counted once per task.

        Counted from the task's own files, not the workspace copies agent code may
        change; ``None`` for a file pandas cannot read.
        """
        if task.id not in self._row_counts:
            counts = []
            for key, path in (("n_train", task.train_path), ("n_test", task.test_path)):
                known = task.metadata.get(key) if task.metadata.get("builtin") else None
                counts.append(int(known) if known is not None else _csv_rows(Path(path)))
            self._row_counts[task.id] = (counts[0], counts[1])
        return self._row_counts[task.id]

    def audit_actions(self, agent: str) -> AuditActions:
        """Honest and attack actions for a coach audit (see :mod:`mappa_env.dsbench.audit`)."""
        return dsbench_audit_actions(self.task, agent)

    def task_facts(self) -> tuple[str, str, str | None]:
        """``(task id, description, None)``: DSBench has no short ground-truth string."""
        return self.task.id, self.task.description, None

    @classmethod
    def cli_options(cls, flags: Mapping[str, Any]) -> dict[str, Any]:
        """A real DSBench folder (``--data-dir``), else the built-in tasks.

        ``--task-ids`` picks tasks of either; ``--task-secret`` keys the built-in data.
        """
        if flags.get("tasks") is not None or flags.get("num_tasks") is not None:
            raise ValueError(
                "DSBench-v0 takes --data-dir and --task-ids (or the built-in tasks), "
                "not --tasks/--num-tasks"
            )
        task_ids = flags.get("task_ids")
        if flags.get("data_dir"):
            return {"data_dir": flags["data_dir"], "task_ids": task_ids}
        # Built once and shared by every environment of the run (the caller closes it).
        return {"tasks": BuiltinTaskSet(names=task_ids, secret=flags.get("task_secret"))}

    @classmethod
    def summarize_outcomes(cls, outcomes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The mean metric of scored submissions and the mean fair value of all.

        ``metric_mean_when_successful`` is the raw metric over scored submissions;
        ``fair_value_mean`` the metric mapped to [0, 1], over every episode.
        """

        def mean(values: list[Any]) -> float | None:
            clean = [float(v) for v in values if v is not None and float(v) == float(v)]
            return sum(clean) / len(clean) if clean else None  # (v == v drops NaN)

        return {
            "metric_mean_when_successful": mean(
                [o.get("value") for o in outcomes if o.get("success")]
            ),
            "fair_value_mean": mean([o.get("fair_value") for o in outcomes]),
        }

    def coach_metadata(self, record: ActionRecord) -> dict[str, Any]:
        """Task type, metric, artifact checks, the agent's earlier code and turns, score caps.

        ``earlier_turns``: what the coach was told about each earlier code turn of the
        agent's slot (``action``, ``tool_result``, ``metadata``), so a later turn can be
        paid what it adds over them.

        ``skill_cap`` (with ``skill_cap_reason``): for the data engineer and the
        modeler, the cap from the skill of test predictions (:meth:`_skill_cap`);
        ``outcome`` and ``outcome_cap``: for the analyst, the submission's score.
        """
        extra = record.tool.extra
        # Missing upstream means absent when the agent's slot began, not after its own
        # code ran: an agent that deletes what it was handed is not excused by the gap.
        # Without a snapshot (its listing failed) nothing counts as missing upstream.
        missing = list(self._missing_at_slot_start.get(record.agent, ()))
        metadata: dict[str, Any] = {
            "task_type": self.task.task_type,
            "metric": self.task.metric,
            "artifacts": extra.get("artifacts", {}),
            "missing_upstream": missing,
            # The agent's earlier cells (the record judged is not in the transcript yet):
            # their imports live on in its interpreter, and a cell run again adds nothing.
            "earlier_codes": [r.tool.code for r in self.records_of(record.agent) if r.tool.code],
        }
        capped = self._skill_cap(record.agent, metadata["artifacts"])
        if capped is not None:
            metadata["skill_cap"], metadata["skill_cap_reason"] = capped
        # The earlier code turns of the agent's slot, as the coach judged them: a later
        # turn is paid what it adds over them (mappa_env.coach.rules_dsbench).
        facts = getattr(self, "_turn_facts", {})
        metadata["earlier_turns"] = [
            facts[(r.agent, r.turn)]
            for r in self.records_of(record.agent)
            if r.tool.result is not None and (r.agent, r.turn) in facts
        ]
        if "submission" in extra and self._submission_score is not None:
            from mappa_env.dsbench.metrics import outcome_cap

            metadata["outcome"] = extra["submission"]
            # The cap binds the verdict (the environment enforces it), so only a
            # submission on disk, scored or not, sets one: without one the rubric's
            # blame rule and its rows for work in progress apply.
            if (metadata["artifacts"].get(SUBMISSION_FILE) or {}).get("exists"):
                metadata["outcome_cap"] = outcome_cap(
                    self._submission_score,
                    self.task.task_type,
                    target_range=getattr(self.task, "target_range", None),
                )
        if record.tool.result is not None:
            facts[(record.agent, record.turn)] = {
                "action": record.action,
                "tool_result": record.tool.result.to_dict(),
                "metadata": {k: v for k, v in metadata.items() if k != "earlier_turns"},
            }
            self._turn_facts = facts
        return metadata

    def _skill_cap(self, agent: str, artifacts: Mapping[str, Any]) -> tuple[int, str] | None:
        """The cap the skill of test predictions puts on an upstream agent's score.

        The modeler's: its model's predictions on the first test rows, scored on the
        answers; the data engineer's: those of a reference model fit on its files. A
        model that memorised noise, or data that leaks the target into X_train, fits
        its training rows and predicts the test rows no better than chance. Ladder:
        :func:`~mappa_env.dsbench.metrics.skill_cap`, as for the analyst's outcome.

        Returns:
            ``(cap, why)``, or ``None`` when nothing was scored.
        """
        from mappa_env.dsbench.metrics import skill_cap

        if agent == MODELER:
            entry, key, source = artifacts.get("model.pkl") or {}, "test_skill", "model.pkl's"
        elif agent == DATA_ENGINEER:
            entry, key = artifacts.get("X_test.pkl") or {}, "reference_skill"
            source = "a reference model's (fit on X_train.pkl and y_train.pkl)"
            if entry.get("reference_error"):
                why = f"a reference model could not be fit on its files: {entry['reference_error']}"
                return UNFIT_DATA_CAP, why
        else:
            return None
        skill = entry.get(key)
        if not isinstance(skill, (int, float)):
            return None
        cap = skill_cap(float(skill), self.task.task_type)
        return cap, f"{source} predictions on the test rows have skill {skill:.2f} on the answers"

    async def on_slot_end(self, agent: str, next_agent: str | None) -> None:
        """Free the agent's interpreter and snapshot the files the next agent starts from.

        Never raises: a failure (whatever agent code left behind) is logged and reported
        in ``infos[agent]["slot_end_error"]``, and the next agent starts from a fresh
        listing.
        """
        try:
            await self.release_sandbox(agent)
            if next_agent is not None:
                self._slot_start_files[next_agent] = await asyncio.to_thread(
                    list_files, self.workdir
                )
                self._missing_at_slot_start[next_agent] = self._missing_needs(next_agent)
        except Exception as exc:  # the step must go on; the cause is kept for researchers
            logger.exception("the end of %s's slot failed", agent)
            self.infos.setdefault(agent, {})["slot_end_error"] = f"{type(exc).__name__}: {exc}"
            if next_agent is not None:
                self._slot_start_files.pop(next_agent, None)
                self._missing_at_slot_start.pop(next_agent, None)

    def _missing_needs(self, agent: str) -> list[str]:
        """The files ``agent`` needs that are not regular files of the workspace now.

        Looked up by name, not read from the listing: that one is capped (200 entries),
        and files an earlier agent floods the workspace with must not push a needed one
        out of sight, so that it counts as missing and excuses the agent.
        """
        return [n for n in NEEDS[agent] if file_kind(self.workdir, n)[0] != "regular file"]

    def on_close(self) -> None:
        """Remove the built-in task files made for this environment."""
        if self._owned_builtin is not None:
            self._owned_builtin.close()
            self._owned_builtin = None
