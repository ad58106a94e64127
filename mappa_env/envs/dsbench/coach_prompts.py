"""What an LLM coach is told about DSBench-v0: the rubric of each role, and its sections.

:data:`COACH_RUBRICS` is what an LLM coach judges each role by (the rules coach uses
:func:`~mappa_env.envs.dsbench.rubric.dsbench_rubric`). :func:`prompt_sections` makes
DSBench's own sections of the coach's prompt from its facts (what
:meth:`~mappa_env.envs.dsbench.facts.DSBenchFacts.prompt_sections` shows): the task's
type and metric, the checks of the files the agent makes or needs with the skill
cap they set, and the measured outcome of a submission with its cap. Whatever agent
code chose (an error message, a column name) is quoted inside an agent-text fence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from mappa_env.coach.facts import PromptSections
from mappa_env.coach.templates import agent_text
from mappa_env.envs.dsbench.roles import ANALYST, DATA_ENGINEER, MODELER
from mappa_env.text import truncate_middle

#: How an LLM coach treats an agent whose inputs an earlier agent did not leave.
BLAME_RULE = """\
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
{BLAME_RULE}""",
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
{BLAME_RULE}""",
}


def prompt_sections(metadata: Mapping[str, Any], score_cap: float | None) -> PromptSections:
    """DSBench's sections of the coach's prompt for an action with these facts.

    Args:
        metadata: The facts' plain-data form
            (:meth:`~mappa_env.envs.dsbench.facts.DSBenchFacts.to_dict`).
        score_cap: The most the action may score (the facts' ``score_cap``).

    Returns:
        "Task facts" (type and metric) after the agent's role; "Checks of the files this
        agent makes or needs" and "Measured outcome" (with the score cap) after the
        evidence. A section without content is left out.
    """
    facts = _facts(metadata)
    evidence: list[tuple[str, str]] = []
    checks = _artifact_section(metadata)
    if checks:
        evidence.append(("Checks of the files this agent makes or needs", checks))
    outcome = metadata.get("outcome")
    if isinstance(outcome, Mapping):
        if score_cap is not None:
            outcome = {**outcome, "cap": score_cap}
        evidence.append(("Measured outcome", _outcome_section(outcome)))
    return PromptSections(facts=(("Task facts", facts),) if facts else (), evidence=tuple(evidence))


def _facts(metadata: Mapping[str, Any]) -> str:
    lines = []
    for key, label in (("task_type", "task type"), ("metric", "metric")):
        if metadata.get(key) is not None:
            lines.append(f"- {label}: {metadata[key]}")
    return "\n".join(lines)


_IDENTIFIER_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,100}")


def _is_plain_fact(value: Any) -> bool:
    """Numbers, booleans, None, lists of them (a shape) and dotted names (a type).

    None of them can hold a sentence, a ``key: value`` line or a score.
    """
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return _IDENTIFIER_PATH.fullmatch(value) is not None
    return isinstance(value, (list, tuple)) and all(
        v is None or isinstance(v, (bool, int, float)) for v in value
    )


def _split_facts(facts: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(key=value facts shown inline, key: value facts to quote in a fence)``.

    A fact is shown inline when its value is a number, a boolean, None, a list of those
    (a shape) or a dotted name (a type such as ``pandas.DataFrame``); any other value (an
    error message, any text) may carry words agent code chose (a pickle names the module
    its unpickling error quotes) and is quoted inside an agent-text fence.
    """
    inline, quoted = [], []
    for key, value in facts.items():
        if _is_plain_fact(value):
            inline.append(f"{key}={list(value) if isinstance(value, tuple) else value}")
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            quoted.append(f"{key}: {truncate_middle(text, 300)}")
    return inline, quoted


def _artifact_section(metadata: Mapping[str, Any]) -> str:
    lines = []
    artifacts = metadata.get("artifacts")
    if isinstance(artifacts, Mapping):
        for name, facts in artifacts.items():
            inline, quoted = _split_facts(facts if isinstance(facts, Mapping) else {"fact": facts})
            line = f"- {name}: {', '.join(inline) or '(no plain facts)'}"
            if quoted:
                line += "; in words its file or code chose:\n" + agent_text("\n".join(quoted))
            lines.append(line)
    cap = metadata.get("skill_cap")
    if isinstance(cap, (int, float)):
        # The environment scored test predictions on the answers, as for the outcome.
        # Its reason may quote an error raised by the agent's files: fenced like them.
        why = str(metadata.get("skill_cap_reason") or "measured on held-out answers")
        lines.append(
            f"- Score cap from how well these files predict held-out answers: at most "
            f"{int(cap)}. Do not exceed it, whatever the quality of the code. Why:\n"
            + agent_text(truncate_middle(why, 300))
        )
    missing = metadata.get("missing_upstream")
    if missing:
        names = ", ".join(str(name) for name in missing)
        lines.append(
            f"- Needed from earlier agents but missing or unusable: {names}. Failures caused "
            "by these belong to the earlier agents (blame rule)."
        )
    return "\n".join(lines)


def _outcome_section(outcome: Mapping[str, Any]) -> str:
    lines = []
    if outcome.get("success") is False:
        # The scorer's reason quotes the submission (its column names, its labels).
        reason = truncate_middle(str(outcome.get("reason") or "no reason given"), 600)
        lines.append(
            "- The submission could not be scored; the scorer's reason, which quotes the "
            f"submission:\n{agent_text(reason)}"
        )
    for key in ("metric", "value", "rmse_pct_range", "normalized"):
        if outcome.get(key) is not None:
            lines.append(f"- {key}: {_fmt(outcome[key])}")
    if outcome.get("cap") is not None:
        # The environment derives the cap from the outcome (DSBench's metric table).
        lines.append(
            f"- Score cap from this outcome: at most {outcome['cap']:g} (cap set by the "
            "environment from the outcome, which lowers any score above it). Do not exceed "
            "it, whatever the quality of the code."
        )
    return "\n".join(lines) or "(outcome recorded without details)"


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
