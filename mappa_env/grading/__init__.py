"""Rule-based grading of task outcomes (math answers).

The math grading lives in :mod:`mappa_env.envs.mathchat.grading` and is re-exported here.
"""

from mappa_env.envs.mathchat.grading import (
    answers_match,
    answers_match_any,
    answers_match_async,
    boxed_answers,
    extract_boxed,
)
from mappa_env.envs.mathchat.symbolic import SymbolicChecker, default_checker

__all__ = [
    "SymbolicChecker",
    "answers_match",
    "answers_match_any",
    "answers_match_async",
    "boxed_answers",
    "default_checker",
    "extract_boxed",
]
