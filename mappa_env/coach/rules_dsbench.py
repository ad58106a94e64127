"""DSBench-v0 rubric of the rules coach (scores out of 10).

The environment passes, in ``request.metadata``: ``artifacts`` (for each file of the
agent's contract and of what it needs from upstream: ``exists``, ``loads``, ``shape``,
``has_predict``, ``error``), ``missing_upstream`` (needed upstream files absent when the
agent acted), and for the analyst ``outcome`` (the submission's score) and
``outcome_cap`` (the spec's cap on the analyst's score for that outcome).

data_engineer (must leave X_train.pkl, y_train.pkl, X_test.pkl):
     9  all three load and their row counts agree (X_train with y_train)
     5  some artifacts exist, or they do not load / do not agree
     4  the code ran but no artifact exists yet (exploring)
     2  the code raised or timed out
    without code (the hand-over message): 8 if all three load, 3 if some exist, else 1

modeler (must leave model.pkl and print cross-validation metrics):
     5  its inputs are missing upstream and it produced nothing: the blame goes upstream
     9  model.pkl loads, has ``predict``, and cross-validation output was printed
     7  model.pkl loads and has ``predict``, no cross-validation output seen
     4  the code ran but model.pkl is missing or unusable
     2  the code raised or timed out (with its inputs present)
    without code: 8 if model.pkl is usable, else 1

analyst (must leave submission.csv):
    cap  submission scored: the outcome cap of the spec (3-9; classification by ROC-AUC /
         accuracy bands, regression by RMSE as % of the target range)
     5   no submission because model.pkl / X_test.pkl are missing upstream
     2   a submission that cannot be scored (wrong ids, columns, NaNs), or code that raised
     4   code ran, no submission yet
     1   no code and no submission
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mappa_env.coach.base import CoachRequest

_CV_HINT = re.compile(r"\b(cv|cross[-_ ]?val\w*|fold|kfold|validation)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d\.\d+|\d+\.\d*")


def _usable(entry: Mapping[str, Any] | None) -> bool:
    return bool(entry) and bool(entry.get("exists")) and bool(entry.get("loads", False))


def _tool_failed(request: CoachRequest) -> tuple[bool, str]:
    tool = request.tool_result
    if tool is None or tool.get("ok", True):
        return False, ""
    if tool.get("timed_out"):
        return True, "timed out"
    error = tool.get("error") or {}
    return True, f"raised {error.get('name', 'an error')}: {str(error.get('value', ''))[:120]}"


def _data_engineer(request: CoachRequest, artifacts: Mapping[str, Any]) -> tuple[float, str]:
    names = ("X_train.pkl", "y_train.pkl", "X_test.pkl")
    present = [n for n in names if artifacts.get(n, {}).get("exists")]
    usable = [n for n in names if _usable(artifacts.get(n))]
    failed, why = _tool_failed(request)
    rows = [((artifacts.get(n) or {}).get("shape") or [None])[0] for n in names[:2]]
    consistent = len(usable) == 3 and rows[0] is not None and rows[0] == rows[1]
    if request.tool_result is None:
        if len(usable) == 3:
            return 8.0, "Hand-over with all three artifacts saved and loadable."
        if present:
            return 3.0, f"Hand-over with only {present} saved."
        return 1.0, "Hand-over without any of X_train.pkl, y_train.pkl, X_test.pkl."
    if failed:
        return 2.0, f"The code {why}."
    if consistent:
        return 9.0, "X_train.pkl, y_train.pkl and X_test.pkl load and their rows agree."
    if present:
        return 5.0, f"Artifacts incomplete or unusable: present {present}, loadable {usable}."
    return 4.0, "The code ran, but no artifact is saved yet."


def _modeler(request: CoachRequest, artifacts: Mapping[str, Any]) -> tuple[float, str]:
    model = artifacts.get("model.pkl")
    usable = _usable(model) and bool(model.get("has_predict"))
    missing = list(request.metadata.get("missing_upstream", ()))
    failed, why = _tool_failed(request)
    if missing and not usable:
        return 5.0, f"Upstream artifacts {missing} are missing: not the modeler's fault."
    if request.tool_result is None:
        if usable:
            return 8.0, "Hand-over with a usable model.pkl."
        return 1.0, "Hand-over without a usable model.pkl."
    if failed:
        return 2.0, f"The code {why}."
    stdout = str(request.tool_result.get("stdout", ""))
    printed_cv = bool(_CV_HINT.search(stdout)) and bool(_NUMBER.search(stdout))
    if usable and printed_cv:
        return 9.0, "model.pkl loads, has predict(), and cross-validation results were printed."
    if usable:
        return 7.0, "model.pkl loads and has predict(), but no cross-validation output was seen."
    return 4.0, "The code ran, but model.pkl is missing or has no predict()."


def _analyst(request: CoachRequest, artifacts: Mapping[str, Any]) -> tuple[float, str]:
    outcome = request.metadata.get("outcome") or {}
    missing = list(request.metadata.get("missing_upstream", ()))
    failed, why = _tool_failed(request)
    if outcome.get("success"):
        cap = float(request.metadata.get("outcome_cap", 3))
        value = outcome.get("value")
        return cap, f"Submission scored {outcome.get('metric')}={value}: capped at {cap:g}."
    reason = outcome.get("reason") or "no submission"
    submitted = (artifacts.get("submission.csv") or {}).get("exists", False)
    if not submitted and missing:
        return 5.0, f"Upstream artifacts {missing} are missing: not the analyst's fault."
    if submitted:
        return 2.0, f"submission.csv cannot be scored: {reason}."
    if request.tool_result is None:
        return 1.0, "No code and no submission."
    if failed:
        return 2.0, f"The code {why}."
    return 4.0, "The code ran, but submission.csv is not written yet."


def dsbench_rubric(request: CoachRequest) -> tuple[float, str]:
    """Score one DSBench-v0 action; see the module docstring for the table."""
    if not request.action.strip():
        return 0.0, "Empty action."
    artifacts = request.metadata.get("artifacts")
    if artifacts is None:
        raise ValueError("DSBench rubric needs metadata['artifacts'] from the environment")
    if request.agent == "data_engineer":
        return _data_engineer(request, artifacts)
    if request.agent == "modeler":
        return _modeler(request, artifacts)
    if request.agent == "analyst":
        return _analyst(request, artifacts)
    raise ValueError(f"no DSBench rubric for agent {request.agent!r}")
