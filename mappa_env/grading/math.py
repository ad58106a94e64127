"""Moved: math answer grading lives in :mod:`mappa_env.envs.mathchat.grading`.

Extraction and equivalence are there, the symbolic check's workers in
:mod:`mappa_env.envs.mathchat.symbolic`.

This module re-exports their names for one release.
"""

from __future__ import annotations

from mappa_env.envs.mathchat.grading import (
    MAX_ANSWER_CHARS,
    MAX_NESTING,
    MAX_NUMBER_DIGITS,
    MAX_POWERS,
    answers_match,
    answers_match_any,
    answers_match_async,
    boxed_answers,
    extract_boxed,
)
from mappa_env.envs.mathchat.symbolic import (
    SymbolicChecker,
    default_checker,
)

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_NESTING",
    "MAX_NUMBER_DIGITS",
    "MAX_POWERS",
    "SymbolicChecker",
    "answers_match",
    "answers_match_any",
    "answers_match_async",
    "boxed_answers",
    "default_checker",
    "extract_boxed",
]
