"""Moved: the seeded math problem generator lives in :mod:`mappa_env.envs.mathchat.generator`.

This module re-exports its names for one release.
"""

from __future__ import annotations

from mappa_env.envs.mathchat.generator import (
    DEFAULT_KINDS,
    DIFFICULTY_LEVELS,
    KINDS,
    MAX_GENERATED_TASKS,
    generate_math_tasks,
    generate_unseen_tasks,
    problem_identity,
)

__all__ = [
    "DEFAULT_KINDS",
    "DIFFICULTY_LEVELS",
    "KINDS",
    "MAX_GENERATED_TASKS",
    "generate_math_tasks",
    "generate_unseen_tasks",
    "problem_identity",
]
