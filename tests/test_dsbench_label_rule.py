"""DSBench's one label rule, run both ways: by the scorer, and by the artifact inspector.

The inspector writes y_train's and the predictions' labels as text rows in its own
interpreter; the scorer and the outcome reward read labels in the environment's. Both
run the inspector's ``canonical``, so a label compares the same on either side, and the
text the inspector writes for a missing value reads back as missing.
"""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from mappa_env.envs.dsbench.inspections import INSPECTOR_SOURCE, inspector_function
from mappa_env.envs.dsbench.labels import label_rows, label_text
from mappa_env.envs.dsbench.scoring import canonical_label
from mappa_env.sandbox.limits import inherited_import_paths

#: Labels the inspector and the scorer wrote differently, and what both write now
#: (``None``: missing, which the inspector's rows write as ``"nan"``).
DISAGREED = [
    ("1.0", "1"),  # a number written as text
    (" 1 ", "1"),
    ("007", "7"),
    ("abc ", "abc"),
    ("true", "True"),  # bools written as text, in any case
    ("FALSE", "False"),
    (None, None),  # missing values
    ("", None),
    ("NaN", None),
    (pd.NA, None),
    (1e20, "1e+20"),  # a float beyond 2**53 is no exact integer: its repr
    (np.float32(3.0), "3"),  # a float32 that holds an integer
    (np.float32(0.3), "0.30000001192092896"),  # the float32's value, as a float's repr
]
#: Labels both sides always wrote alike (the rule must keep them).
AGREED = [
    (1, "1"),
    (1.0, "1"),
    (np.int64(2), "2"),
    (np.float64(2.0), "2"),
    (True, "True"),
    (np.bool_(False), "False"),
    (1.5, "1.5"),
    (0.1 + 0.2, "0.30000000000000004"),
    ("0.30000000000000004", "0.30000000000000004"),
    (2**70, str(2**70)),  # integers keep every digit
    ("100000000000000000001", "100000000000000000001"),  # so does such a number as text
    (float("inf"), "inf"),
    ("setosa", "setosa"),
    (np.nan, None),  # missing: the rows' "nan" reads back as missing
]
TABLE = DISAGREED + AGREED


def _row_text(expected: str | None) -> str:
    return "nan" if expected is None else expected


@pytest.mark.parametrize(("value", "expected"), TABLE, ids=[repr(v) for v, _ in TABLE])
def test_the_scorer_and_the_inspector_write_a_label_alike(value, expected):
    assert canonical_label(value) == expected
    written = inspector_function("canonical")(value)  # compiled from the text that runs
    assert written == label_text(value) == _row_text(expected)
    assert canonical_label(written) == expected  # a row's text reads back as the label


def test_rows_of_a_frame_are_written_by_the_same_rule():
    values = [value for value, _ in TABLE]
    frame = pd.DataFrame({"y": pd.Series(values, dtype=object), "k": ["a"] * len(values)})
    assert label_rows(frame).tolist() == [f"{_row_text(e)}|a" for _, e in TABLE]


def test_the_inspector_script_writes_y_trains_rows_by_the_rule(tmp_path):
    # The whole script, as the environment runs it, on a pickled y_train.
    # The inspector's unpickler refuses pandas.NA as a pickled object of its own.
    values = [value for value, _ in TABLE if value is not pd.NA]
    expected = [_row_text(e) for value, e in TABLE if value is not pd.NA]
    with (tmp_path / "y_train.pkl").open("wb") as handle:
        pickle.dump(pd.Series(values, dtype=object), handle)
    parameters = {
        "rlimits": {},
        "names": ["y_train.pkl"],
        "import_paths": inherited_import_paths(),
        "task_type": "classification",
        "sample_rows": 100,
        "target_rows": 100,
        "skill_rows": 100,
        "reference_model": False,
    }
    result = subprocess.run(
        [sys.executable, "-I", "-c", INSPECTOR_SOURCE],
        input=json.dumps(parameters),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["y_train.pkl"]["loads"] is True, report
    assert report["y_train.pkl"]["first_rows"] == expected


def test_the_rule_is_part_of_the_text_the_report_cache_key_hashes():
    from mappa_env.envs.dsbench import DSBenchEnv, scoring

    # The scorer's rule is compiled from the inspector's text ...
    tree = ast.parse(INSPECTOR_SOURCE)
    (rule,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "canonical"]
    code = scoring._LABEL_RULE.__code__
    assert (code.co_filename, code.co_firstlineno) == ("inspector.py", rule.lineno)
    # ... which is the code the inspector runs, and the command line is part of each
    # report's key: a changed rule never reuses a report written by the old one.
    argv = DSBenchEnv._inspector_argv(None)  # uses nothing of the instance
    assert argv[-1] == INSPECTOR_SOURCE
    assert ast.get_source_segment(INSPECTOR_SOURCE, rule) in argv[-1]
