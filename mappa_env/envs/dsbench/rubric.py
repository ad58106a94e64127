"""DSBench-v0 rubric of the rules coach (scores out of 10).

The environment passes, in ``request.metadata``: ``artifacts`` (for each file of the
agent's contract and of what it needs from upstream, the facts its artifact inspector
found: ``exists``, ``loads``, ``shape``, ``has_predict``, ``error``; for X_train.pkl and
X_test.pkl ``varies`` (some column takes more than one value) and ``rows_expected`` (rows
of the train.csv / test.csv the environment wrote); for y_train.pkl ``distinct_values``
and ``rows_expected``; for model.pkl the result of ``predict(X_test)``: ``predictions``
(rows returned), ``predictions_expected``, ``distinct_predictions``, or ``predict_error``
(``predict_skipped`` when there was no loadable X_test.pkl), and ``train_skill``, how
much better than a constant guess the model fits its own training rows, and ``test_skill``,
how well its predictions on the test rows match the answers; for X_test.pkl inspected after
the data engineer's code, ``reference_skill``, the same for a reference model fit on its
files), plus ``missing_upstream`` (needed upstream files absent when the agent's slot began),
``earlier_codes`` (the agent's earlier cells), for the data engineer and the modeler
``skill_cap`` and ``skill_cap_reason`` (the cap those test predictions put on the score),
and for the analyst ``outcome`` (the submission's score) and, once a submission exists,
``outcome_cap`` (the spec's cap on the analyst's score for that outcome). The environment
enforces both caps on every coach's verdict.

The high scores go only to artifacts that pass these checks, and the ladder keeps its
order: no cheap behaviour (pickles of ``[0] * n``, a model that returns a constant, a
printed "cv 0.99") scores above 5, the middle, and none outscores doing the job.

data_engineer (must leave X_train.pkl, y_train.pkl, X_test.pkl):
     9  all three load and pass the checks: X_train and X_test are 2-D tables with the
        same columns and a column that varies; X_train and y_train have one row per row
        of train.csv, X_test one per row of test.csv; y_train holds more than one value
        and is train.csv's target row by row (up to a relabelling or a monotone
        transform)
     5  some artifacts exist, but not all load or pass the checks (the reason is named)
     4  the code ran but no artifact exists yet (exploring)
     2  the code raised or timed out
    without code (the hand-over message): 8 if all three pass, 3 if some exist, else 1

modeler (must leave model.pkl and show cross-validation):
     9  the model is usable and has learned, and the action cross-validated: code (its
        code blocks, not prose, comments or strings) that calls a real cross-validation
        or hold-out API reached through an import (scikit-learn's ``cross_val_*``,
        splitters such as ``KFold``, ``train_test_split``, searches such as
        ``GridSearchCV``, estimators such as ``RidgeCV``; XGBoost's, LightGBM's or
        CatBoost's ``cv``) and a number printed with a word such as "cv" or
        "validation". A printed "cv 0.99" alone, a ``cv=`` keyword of any call
        (``dict(cv=5)``) or a function of its own named ``cv`` never counts.
     7  the model is usable and has learned, no cross-validation seen
     5  model.pkl loads and predicts one value per test row, but it has not learned:
        its predictions on X_test are all the same, or it fits its training rows no
        better than a constant guess (``train_skill`` below 0.1, or unknown); or its
        predictions could not be checked because X_test.pkl is missing upstream; or its
        inputs are missing upstream and it produced nothing: the blame goes upstream
     4  the code ran but model.pkl is missing, does not load, has no ``predict``, or
        ``predict(X_test)`` fails or returns the wrong number of rows
     2  the code raised or timed out (with its inputs present)
    without code: 8 if the model is usable and has learned, 3 if model.pkl exists, else 1

    "Usable": model.pkl loads, has ``predict``, and ``predict(X_test.pkl)`` returns one
    prediction per row of test.csv (what the analyst needs). "Learned": those
    predictions are not all one value, and the model fits its own training rows better
    than a constant guess.

Caps over every row above:
    skill  the data engineer's and the modeler's scores are at most the cap of the skill
           of test predictions on the answers (the model's own, or a reference random
           forest's fit on the data engineer's files; 5 when none can be fit on them):
           a model that memorised noise, or files that leak the target into X_train,
           fit their training rows and predict the test rows at chance (cap 3)
    rerun  a cell an agent ran before, run again unchanged, scores at most one below the
           hand-over it should have been
    later  a code turn after an earlier code turn of the agent's slot is paid what it
           adds: its score less the best score of those earlier turns (each judged on
           what the environment reported then), never below 0. Padding (``print(i)``),
           a rerun or a cosmetic variant earns 0; splitting one cell into several
           earns, over the slot, what the best cell would alone. A hand-over (no code)
           is scored as above.

    Each score names its parts (:class:`~mappa_env.coach.rubric.RubricScore`): the row
    as ``"base"``, then what each cap took off as ``"skill_cap"``, ``"rerun_cap"`` and
    ``"later_turn"`` (absent where it did not lower the score).

analyst (must leave submission.csv):
    cap  submission scored: the outcome cap of the spec (3-9; classification by ROC-AUC /
         accuracy bands, regression by RMSE as % of the target range once it has some
         skill over the answers' mean, else 4)
     5   no submission because model.pkl / X_test.pkl are missing upstream
     2   a submission that cannot be scored (wrong ids, columns, NaNs, a link or FIFO
         instead of a file), or code that raised
     4   code ran, no submission yet
     1   no code and no submission
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mappa_env.coach.base import CoachRequest, pay_what_it_adds
from mappa_env.coach.rubric import AgentRubric, AgentScorer, RubricScore
from mappa_env.coach.rules import repeats_code
from mappa_env.envs.dsbench.caps import UNSENT_OUTCOME_CAP
from mappa_env.text import extract_code_blocks, ipython_as_python

_CV_HINT = re.compile(r"\b(cv|cross[-_ ]?val\w*|fold|kfold|validation)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d\.\d+|\d+\.\d*")
# Calls that evaluate on held-out data: scikit-learn's splitters and searches and the
# cv() functions of gradient-boosting libraries (any call given a cv= argument counts too).
# Names of scikit-learn's validation functions and classes: splitters, searches,
# ``cross_val_*`` and the estimators that cross-validate themselves (``RidgeCV``).
_CV_CALL = re.compile(
    r"cross_val\w*|\w*KFold|\w*ShuffleSplit|LeaveOneOut|LeavePOut|LeaveOneGroupOut"
    r"|LeavePGroupsOut|PredefinedSplit|TimeSeriesSplit|train_test_split|\w+CV"
)
#: Packages whose validation APIs count (their ``cv`` functions for the boosting ones).
_CV_PACKAGES = ("sklearn", "xgboost", "lightgbm", "catboost")
#: Least ``train_skill`` of a model that has learned something (0 = a constant guess).
MIN_TRAIN_SKILL = 0.1

_FEATURES = ("X_train.pkl", "X_test.pkl")


def _usable(entry: Mapping[str, Any] | None) -> bool:
    return bool(entry) and bool(entry.get("exists")) and bool(entry.get("loads", False))


def _rows(entry: Mapping[str, Any]) -> int | None:
    shape = entry.get("shape") or [None]
    return shape[0] if isinstance(shape[0], int) else None


def _tool_failed(request: CoachRequest) -> tuple[bool, str]:
    tool = request.tool_result
    if tool is None or tool.get("ok", True):
        return False, ""
    if tool.get("timed_out"):
        return True, "timed out"
    error = tool.get("error") or {}
    return True, f"raised {error.get('name', 'an error')}: {str(error.get('value', ''))[:120]}"


def engineer_problems(artifacts: Mapping[str, Any]) -> list[str]:
    """What keeps the data engineer's three pickles from passing the checks (empty: none).

    Args:
        artifacts: The environment's artifact facts (see the module docs).

    Returns:
        One short reason per failed check.
    """
    entries = {n: artifacts.get(n) or {} for n in ("X_train.pkl", "y_train.pkl", "X_test.pkl")}
    problems = [
        f"{name} {'does not load' if entry.get('exists') else 'is missing'}"
        for name, entry in entries.items()
        if not _usable(entry)
    ]
    if problems:
        return problems
    for name, entry in entries.items():
        rows, expected = _rows(entry), entry.get("rows_expected")
        if rows is None:
            problems.append(f"{name} has no row count")
        elif expected is not None and rows != expected:
            source = "test.csv" if name == "X_test.pkl" else "train.csv"
            problems.append(f"{name} has {rows} rows, {source} has {expected}")
    for name in _FEATURES:
        shape = entries[name].get("shape") or []
        if len(shape) != 2:
            problems.append(f"{name} is not a 2-D table (shape {shape})")
        elif entries[name].get("varies") is not True:
            problems.append(f"no column of {name} varies")
    train_shape = entries["X_train.pkl"].get("shape") or []
    test_shape = entries["X_test.pkl"].get("shape") or []
    if len(train_shape) == len(test_shape) == 2 and train_shape[1] != test_shape[1]:
        problems.append(f"X_train.pkl has {train_shape[1]} columns, X_test.pkl {test_shape[1]}")
    rows = [_rows(entries[n]) for n in ("X_train.pkl", "y_train.pkl")]
    if None not in rows and rows[0] != rows[1]:
        problems.append(f"X_train.pkl has {rows[0]} rows, y_train.pkl {rows[1]}")
    distinct = entries["y_train.pkl"].get("distinct_values")
    if not isinstance(distinct, int) or distinct < 2:
        problems.append(f"y_train.pkl holds {distinct} distinct value(s), not a target")
    elif entries["y_train.pkl"].get("holds_target") is False:
        problems.append(
            "y_train.pkl is not train.csv's target row by row (not even relabelled or "
            "monotonically transformed)"
        )
    return problems


def model_problems(model: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """Why model.pkl is not usable, and why it has not learned (empty lists: it is/has).

    Args:
        model: The environment's facts about model.pkl (see the module docs).

    Returns:
        ``(usability problems, learning problems)``; a skipped prediction (no loadable
        X_test.pkl) is a learning problem named as such, not a usability one.
    """
    if not _usable(model) or not model.get("has_predict"):
        return ["model.pkl is missing, does not load or has no predict()"], []
    if model.get("predict_skipped"):
        return [], ["its predictions could not be checked: X_test.pkl is not usable"]
    if model.get("predict_error"):
        return [f"predict(X_test) failed: {model['predict_error']}"], []
    predictions, expected = model.get("predictions"), model.get("predictions_expected")
    if not isinstance(predictions, int) or (expected is not None and predictions != expected):
        return [f"predict(X_test) returned {predictions} rows for {expected} test rows"], []
    learning = []
    distinct = model.get("distinct_predictions")
    if not isinstance(distinct, int) or distinct < 2:
        learning.append("its predictions on X_test are all the same value")
    skill = model.get("train_skill")
    if not isinstance(skill, (int, float)) or skill < MIN_TRAIN_SKILL:
        learning.append(
            f"it fits its training rows no better than a constant guess (skill {skill})"
        )
    return [], learning


def _data_engineer(request: CoachRequest, artifacts: Mapping[str, Any]) -> tuple[float, str]:
    names = ("X_train.pkl", "y_train.pkl", "X_test.pkl")
    present = [n for n in names if (artifacts.get(n) or {}).get("exists")]
    problems = engineer_problems(artifacts)
    failed, why = _tool_failed(request)
    if request.tool_result is None:
        if not problems:
            return 8.0, "Hand-over with all three artifacts saved and passing the checks."
        if present:
            return 3.0, f"Hand-over with artifacts that fail the checks: {'; '.join(problems)}."
        return 1.0, "Hand-over without any of X_train.pkl, y_train.pkl, X_test.pkl."
    if failed:
        return 2.0, f"The code {why}."
    if not problems:
        return 9.0, (
            "X_train.pkl, y_train.pkl and X_test.pkl load, match train.csv and test.csv row "
            "for row, and hold real features and targets."
        )
    if present:
        return 5.0, f"Artifacts incomplete or failing the checks: {'; '.join(problems)}."
    return 4.0, "The code ran, but no artifact is saved yet."


def _calls_cross_validation(action: str, earlier: Sequence[str] = ()) -> bool:
    """Whether the action's code calls a real cross-validation or hold-out API.

    A call of a splitter, search or ``cross_val_*`` function of scikit-learn, or of the
    ``cv`` function of XGBoost, LightGBM or CatBoost, reached through an import (in this
    action or the agent's earlier cells, whose imports live on in its interpreter):
    ``cross_val_score(...)`` after ``from sklearn.model_selection import
    cross_val_score``, ``ms.KFold(5)`` after ``import sklearn.model_selection as ms``,
    ``xgb.cv(...)`` after ``import xgboost as xgb``. Not a name: importing
    ``cross_val_score``, assigning ``cv = 5``, a ``cv=`` keyword on any call
    (``dict(cv=5)``), a function of one's own named ``cv`` or ``cross_val_score``, or
    "no train_test_split needed" in prose, a comment or a string.

    Args:
        action: The modeler's action (its fenced blocks are the code).
        earlier: The code of its earlier turns.
    """
    trees = [_parse(code) for code in (*earlier, "\n".join(extract_code_blocks(action)))]
    if trees[-1] is None:
        return False
    imported: dict[str, str] = {}
    starred: list[str] = []
    local: set[str] = set()
    for tree in filter(None, trees):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        imported[alias.asname] = alias.name
                    else:
                        top = alias.name.partition(".")[0]
                        imported[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name == "*":
                        starred.append(node.module)
                    else:
                        imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            else:
                local.update(_bound_names(node))
    for node in ast.walk(trees[-1]):
        if not isinstance(node, ast.Call):
            continue
        parts = _dotted(node.func)
        if not parts or parts[0] in local:
            continue
        head = imported.get(parts[0])
        if head is not None:
            if _is_cv_callee(".".join([head, *parts[1:]])):
                return True
        elif len(parts) == 1 and any(_is_cv_callee(f"{m}.{parts[0]}") for m in starred):
            return True
    return False


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(ipython_as_python(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _bound_names(node: ast.AST) -> list[str]:
    """Names a statement or expression binds other than by import (defs, assignments)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, ast.arg):
        return [node.arg]
    return []


def _dotted(node: ast.AST) -> list[str]:
    """``a.b.c`` of a call's function as ``["a", "b", "c"]`` (empty for anything else)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    return [node.id, *reversed(parts)]


def _is_cv_callee(qualified: str) -> bool:
    """Whether a fully qualified function or class name is a real validation API."""
    top = qualified.partition(".")[0]
    name = qualified.rpartition(".")[2]
    if top not in _CV_PACKAGES:
        return False
    if name == "cv":
        return top != "sklearn"  # xgboost.cv, lightgbm.cv, catboost.cv
    return _CV_CALL.fullmatch(name) is not None


def cross_validated(request: CoachRequest) -> bool:
    """Whether the modeler printed a validation score of a real cross-validation call."""
    stdout = str((request.tool_result or {}).get("stdout", ""))
    printed = bool(_CV_HINT.search(stdout)) and bool(_NUMBER.search(stdout))
    earlier = [str(code) for code in request.metadata.get("earlier_codes") or ()]
    return printed and _calls_cross_validation(request.action, earlier)


def _modeler(request: CoachRequest, artifacts: Mapping[str, Any]) -> tuple[float, str]:
    unusable, not_learned = model_problems(artifacts.get("model.pkl"))
    missing = list(request.metadata.get("missing_upstream", ()))
    failed, why = _tool_failed(request)
    if missing and unusable:
        return 5.0, f"Upstream artifacts {missing} are missing: not the modeler's fault."
    if request.tool_result is None:
        if not unusable and not not_learned:
            return 8.0, "Hand-over with a usable, trained model.pkl."
        if (artifacts.get("model.pkl") or {}).get("exists"):
            return 3.0, f"Hand-over with a model that fails: {'; '.join(unusable + not_learned)}."
        return 1.0, "Hand-over without a usable model.pkl."
    if failed:
        return 2.0, f"The code {why}."
    if unusable:
        return 4.0, f"The code ran, but the model is not usable: {'; '.join(unusable)}."
    if not_learned:
        return 5.0, f"model.pkl predicts, but {'; '.join(not_learned)}."
    if cross_validated(request):
        return 9.0, (
            "model.pkl predicts one varied value per test row, fits its training data, and "
            "cross-validation was run and printed."
        )
    return 7.0, (
        "model.pkl is usable and trained, but no cross-validation (code and printed "
        "score) was seen."
    )


def _analyst(request: CoachRequest, artifacts: Mapping[str, Any]) -> tuple[float, str]:
    outcome = request.metadata.get("outcome") or {}
    missing = list(request.metadata.get("missing_upstream", ()))
    failed, why = _tool_failed(request)
    if outcome.get("success"):
        cap = float(request.metadata.get("outcome_cap", UNSENT_OUTCOME_CAP))
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


_Row = Callable[[CoachRequest, Mapping[str, Any]], tuple[float, str]]


def _scorer(row: _Row | None) -> AgentScorer:
    """An agent's scorer: its ``row`` of the table, the caps, then the later-turn pay.

    Its parts: ``"base"`` (the row), ``"skill_cap"``, ``"rerun_cap"`` and
    ``"later_turn"`` where they lower the score. ``row=None`` scores an agent the
    table has no row for: the checks every action meets first, then an error.
    """

    def first_turn(request: CoachRequest) -> RubricScore:
        """An action's score before the later-turn rule: its row, caps and the rerun cap."""
        if not request.action.strip():
            return RubricScore.row(0.0, "Empty action.")
        artifacts = request.metadata.get("artifacts")
        if artifacts is None:
            raise ValueError("DSBench rubric needs metadata['artifacts'] from the environment")
        if row is None:
            raise ValueError(f"no DSBench rubric for agent {request.agent!r}")
        scored = RubricScore.row(*row(request, artifacts))
        cap = request.metadata.get("skill_cap")
        if isinstance(cap, (int, float)) and scored.score > cap:
            why = (
                request.metadata.get("skill_cap_reason") or "its test predictions have little skill"
            )
            scored = scored.adjusted(
                "skill_cap", float(cap), f"{scored.analysis} Capped at {cap:g}: {why}."
            )
        if request.tool_result is not None and repeats_code(request.action, request.metadata):
            # A cell run again adds nothing: it earns less than handing over would.
            handover, _ = row(dataclasses.replace(request, tool_result=None), artifacts)
            if isinstance(cap, (int, float)):
                handover = min(handover, float(cap))
            most = max(handover - 1.0, 0.0)
            if scored.score > most:
                scored = scored.adjusted(
                    "rerun_cap",
                    most,
                    f"{scored.analysis} It reran code it had already run: capped at "
                    f"{most:g}, one below handing over.",
                )
        return scored

    def scorer(request: CoachRequest) -> RubricScore:
        first = first_turn(request)
        earlier = [
            turn
            for turn in request.metadata.get("earlier_turns") or ()
            if isinstance(turn, Mapping)
        ]
        if request.tool_result is None or not earlier or not request.action.strip():
            return first
        scores = [
            first_turn(
                dataclasses.replace(
                    request,
                    action=str(turn.get("action") or ""),
                    tool_result=turn.get("tool_result"),
                    metadata=dict(turn.get("metadata") or {}),
                )
            ).score
            for turn in earlier
        ]
        paid = pay_what_it_adds(
            first.score, first.analysis, scores, "its earlier cells (the best scored {best})"
        )
        return first.adjusted("later_turn", *paid)

    return scorer


dsbench_rubric = AgentRubric(
    {
        "data_engineer": _scorer(_data_engineer),
        "modeler": _scorer(_modeler),
        "analyst": _scorer(_analyst),
    },
    fallback=_scorer(None),
)
"""Score one DSBench-v0 action; see the module docstring for the table.

``dsbench_rubric(request) -> (score, analysis)``; by agent,
``dsbench_rubric[agent](request) -> RubricScore`` with the parts ``"base"``,
``"skill_cap"``, ``"rerun_cap"`` and ``"later_turn"``.
"""
