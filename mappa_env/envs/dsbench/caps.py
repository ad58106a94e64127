"""DSBench's score caps: the highest coach score an outcome or a skill allows.

Every cap DSBench puts on a coach's verdict is here: the analyst's by its submission's
score (:func:`outcome_cap`, :data:`FAILED_SUBMISSION_CAP` for none), the data engineer's
and the modeler's by the skill of test predictions on the answers (:func:`skill_cap`,
:func:`upstream_skill_cap`, :data:`UNFIT_DATA_CAP`). The environment sends them with
each request and enforces them on every coach's verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mappa_env.envs.dsbench.metrics import Score
from mappa_env.envs.dsbench.outcomes import percent_of_range
from mappa_env.envs.dsbench.roles import DATA_ENGINEER, MODELER

FAILED_SUBMISSION_CAP = 2
"""Analyst score cap when the submission is not scorable: below every cap of a scorable
submission (at least 3), so producing any valid submission always raises the ceiling."""

UNSENT_OUTCOME_CAP = 3
"""The rules coach's cap on a scored submission whose request carries no ``outcome_cap``
(a request built by hand): the bottom of the classification ladder."""

#: The data engineer's cap when no standard model can be fit on its files (text left in
#: the features, say): the middle of the ladder, as for artifacts that fail a check.
UNFIT_DATA_CAP = 5

# Cap ladders: (threshold, cap) pairs checked top down; below the last one -> floor value.
_CLASSIFICATION_RAW_CAPS = ((0.85, 9), (0.75, 8), (0.65, 6), (0.55, 4))
# The same ladder expressed as skill against chance: for ROC-AUC, skill = 2 * AUC - 1.
_SKILL_CAPS_CLASSIFICATION = ((0.7, 9), (0.5, 8), (0.3, 6), (0.1, 4))
_SKILL_CAPS_REGRESSION = ((0.7, 9), (0.5, 8), (0.25, 6))
_RMSE_PERCENT_CAPS = ((10.0, 9), (25.0, 8), (50.0, 6))
MIN_REGRESSION_SKILL = 0.03
"""Skill (:attr:`Score.normalized`) below which a regression submission is capped at 4
whatever its error as % of the range. A constant guess has skill 0; for RMSE, 0.03 is an
R² of about 0.06, so an honest model of a noisy target (R² 0.18: skill 0.09) keeps the
ladder."""


def outcome_cap(score: Score, task_type: str, target_range: float | None = None) -> int:
    """The highest coach score (0-10) the analyst may get for this outcome.

    The spec's rubric: classification scored by ROC-AUC or accuracy: >= 0.85 -> 9,
    0.75-0.85 -> 8, 0.65-0.75 -> 6, 0.55-0.65 -> 4, below -> 3. Regression scored by RMSE
    (or MCRMSE) as % of the target range: < 10% -> 9, 10-25% -> 8, 25-50% -> 6, above -> 4.
    Accuracy is also ranked by its skill over the majority class (``(accuracy -
    majority) / (1 - majority)``, :attr:`Score.normalized`) on the skill ladder below,
    and the lower cap holds: on balanced binary answers both ladders agree, while a
    constant majority guess on imbalanced answers (92% one class) has no skill and gets
    3, not the 9 its accuracy would.

    Other metrics use :attr:`Score.normalized` (skill against a constant guess) on the
    same ladders: for classification-like tasks skill >= 0.7 -> 9, >= 0.5 -> 8,
    >= 0.3 -> 6, >= 0.1 -> 4, else 3 (these are the ROC-AUC thresholds rewritten as
    skill ``2 * AUC - 1``); for regression skill >= 0.7 -> 9, >= 0.5 -> 8, >= 0.25 -> 6,
    else 4. RMSE without a known target range also falls back to skill. A failed
    submission is capped at :data:`FAILED_SUBMISSION_CAP`.

    RMSE as % of the range does not tell a model from a constant: the answers' mean
    scores their standard deviation, often 15-30% of the range (8 or 6 on the ladder).
    So a regression submission with less skill than :data:`MIN_REGRESSION_SKILL` over
    the mean (about a constant's) gets the ladder's bottom, 4.

    Args:
        score: The submission's score.
        task_type: ``"classification"``, ``"regression"`` or another task type (treated
            like classification, e.g. ``"extraction"``).
        target_range: The target range; defaults to ``score.target_range``.

    Returns:
        The cap, an integer in ``[0, 10]``.
    """
    if not score.success or score.value is None:
        return FAILED_SUBMISSION_CAP
    if task_type == "regression":
        value_range = score.target_range if target_range is None else target_range
        if score.normalized < MIN_REGRESSION_SKILL:
            return 4
        if score.metric in ("rmse", "mcrmse") and value_range and value_range > 0:
            percent = percent_of_range(score.value, value_range)
            for threshold, cap in _RMSE_PERCENT_CAPS:
                if percent < threshold:
                    return cap
            return 4
        return skill_cap(score.normalized, task_type)
    skill_ladder = skill_cap(score.normalized, task_type)
    if score.metric == "roc_auc":
        return _raw_cap(score.value)
    if score.metric == "accuracy":
        # The spec's raw ladder ranked a constant majority guess (92% of the answers on
        # an imbalanced task) at 9: accuracy is ranked by its skill over the majority
        # class too, and the lower of the two caps holds.
        return min(_raw_cap(score.value), skill_ladder)
    return skill_ladder


def _raw_cap(value: float) -> int:
    for threshold, cap in _CLASSIFICATION_RAW_CAPS:
        if value >= threshold:
            return cap
    return 3


def skill_cap(skill: float, task_type: str) -> int:
    """The coach-score cap of a skill on the answers (0 = a constant guess, 1 = perfect).

    Classification-like tasks: >= 0.7 -> 9, >= 0.5 -> 8, >= 0.3 -> 6, >= 0.1 -> 4, else 3
    (the spec's ROC-AUC bands written as skill ``2 * AUC - 1``); regression: >= 0.7 -> 9,
    >= 0.5 -> 8, >= 0.25 -> 6, else 4.

    Args:
        skill: The skill, e.g. :attr:`Score.normalized` or :func:`prediction_skill`.
        task_type: ``"regression"`` or another task type (treated like classification).

    Returns:
        The cap, an integer in ``[3, 9]``.
    """
    regression = task_type == "regression"
    ladder = _SKILL_CAPS_REGRESSION if regression else _SKILL_CAPS_CLASSIFICATION
    for threshold, cap in ladder:
        if skill >= threshold:
            return cap
    return 4 if regression else 3


def upstream_skill_cap(
    agent: str, artifacts: Mapping[str, Any], task_type: str
) -> tuple[int, str] | None:
    """The cap the skill of test predictions puts on an upstream agent's score.

    The modeler's: its model's predictions on the first test rows, scored on the
    answers; the data engineer's: those of a reference model fit on its files. A
    model that memorised noise, or data that leaks the target into X_train, fits
    its training rows and predicts the test rows no better than chance. Ladder:
    :func:`skill_cap`, as for the analyst's outcome.

    Args:
        agent: The agent judged.
        artifacts: The artifact facts of its action (``test_skill`` of model.pkl,
            ``reference_skill`` or ``reference_error`` of X_test.pkl).
        task_type: The task's type.

    Returns:
        ``(cap, why)``, or ``None`` when nothing was scored.
    """
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
    cap = skill_cap(float(skill), task_type)
    return cap, f"{source} predictions on the test rows have skill {skill:.2f} on the answers"
