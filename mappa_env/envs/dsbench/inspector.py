
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


def canonical(value, missing="nan"):
    """A class label as text: the one rule by which DSBench compares labels anywhere.

    Numbers in one form: 1, 1.0, "1.0", " 1 ", "007" and numpy.int64(1) are "1"; other
    floats are their repr ("0.30000000000000004"); integers keep every digit, and so
    does a number written as text that a float would round (2**53 and beyond).
    true/false in any case are "True"/"False"; other text is stripped. None, NaN,
    pandas.NA, "" and "nan" are missing: ``missing`` ("nan" in the rows this script
    writes, which reads back as missing; the scorer asks for None). The environment
    compiles this function alone from this script's text, so it uses no global of it.
    """
    import math

    import numpy
    import pandas

    def number_text(number):
        # A float that holds an integer exactly loses its ".0"; any other keeps its repr.
        if number.is_integer() and abs(number) < 2**53:
            return str(int(number))
        return repr(number)

    if value is None or value is pandas.NA:
        return missing
    if isinstance(value, (bool, numpy.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, numpy.integer)):
        return str(int(value))
    if isinstance(value, (float, numpy.floating)):
        if math.isnan(value):
            return missing
        return number_text(float(value)) if math.isfinite(value) else str(value)
    text = str(value).strip()
    lowered = text.lower()
    if not text or lowered == "nan":
        return missing
    if lowered in ("true", "false"):
        return lowered.capitalize()
    try:
        number = float(text)
    except ValueError:
        return text
    # Huge integers would lose digits as floats; they keep their spelling.
    if math.isfinite(number) and abs(number) < 2**53:
        return number_text(number)
    return text


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
