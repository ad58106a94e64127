"""Rule-based grading of task outcomes (math answers)."""

from mappa_env.grading.math import (
    SymbolicChecker,
    answers_match,
    answers_match_any,
    answers_match_async,
    boxed_answers,
    default_checker,
    extract_boxed,
)

__all__ = [
    "SymbolicChecker",
    "answers_match",
    "answers_match_any",
    "answers_match_async",
    "boxed_answers",
    "default_checker",
    "extract_boxed",
]
