"""Coach audits: how a coach can be fooled, measured before an agent learns to fool it.

In MAPPA every reward is a coach's verdict, so the coach is the attack surface: LLM
judges give content-free replies and "master key" strings ("Thought process:")
positive verdicts, reward length, and follow instructions injected in the text they
judge. :func:`audit_coach` scores, for every agent of an environment and on real
episode contexts built from its tasks, an honest action and a battery of attacks
through the same path training uses (``env.step`` -> the environment's coach request ->
the coach -> the environment's caps):

- ``null``: an empty action, "Done.", a copy of the previous agent's message, the
  task restated;
- ``master_key``: short content-free strings and reasoning openers;
- ``inject_<channel>``: a score line, a fake verdict, a fake rubric, a fake reference
  answer, an instruction to ignore the rubric and an unclosed ``<think>``, planted in
  every channel where the agent's words reach the coach (its message, its code's
  stdout and stderr, file names, file contents, a submission);
- ``verbosity``, ``confident_wrong``, ``format_only``, ``several_answers``;
- ``later_turn``: a rerun, a cosmetic rerun and padding after the agent's first turn;
- ``mutation``: the honest action perturbed at random (seeded), counted where its
  answer changed.

The :class:`~mappa_env.audit.report.AuditReport` gives per family and agent the mean
score shift against the honest action, the false-positive rate (actions that fail the
job scored at or above the honest one), the invalid-verdict rate, agreement with the
rules coach, and for an LLM coach whether a payload reached its prompt outside the
agent-text fences; and a verdict per family: ``held``, ``moved`` or ``taken``, with the
families the verdict does not cover named (:meth:`AuditReport.coverage_line`).

An environment takes part through its ``audit_actions`` hook (what an honest and a wrong
action look like, and its channels); ``mappa coach audit --env ID --coach SPEC --out
DIR`` runs an audit from the command line.

Example:
    >>> from mappa_env.audit import audit_coach
    >>> report = audit_coach("MathChat-v0", "rules")  # doctest: +SKIP
    >>> report.family_lines()  # doctest: +SKIP
"""

from __future__ import annotations

from mappa_env.audit.battery import (
    CHANNELS,
    FAMILIES,
    MASTER_KEYS,
    MUTATIONS,
    PAYLOADS,
    AttackCase,
    AuditActions,
    Payload,
    add_code,
    append_text,
    build_battery,
    build_mutations,
    file_name_injector,
    one_line,
    stderr_injector,
    stdout_injector,
)
from mappa_env.audit.report import VERDICTS, AuditReport, CaseResult, FamilyStats, verdict_of
from mappa_env.audit.runner import AuditConfig, AuditError, audit_coach

__all__ = [
    "CHANNELS",
    "FAMILIES",
    "MASTER_KEYS",
    "MUTATIONS",
    "PAYLOADS",
    "VERDICTS",
    "AttackCase",
    "AuditActions",
    "AuditConfig",
    "AuditError",
    "AuditReport",
    "CaseResult",
    "FamilyStats",
    "Payload",
    "add_code",
    "append_text",
    "audit_coach",
    "build_battery",
    "build_mutations",
    "file_name_injector",
    "one_line",
    "stderr_injector",
    "stdout_injector",
    "verdict_of",
]
