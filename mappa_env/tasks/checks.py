"""Moved: checks of a task set's design live in :mod:`mappa_env.envs.mathchat.checks`.

This module re-exports its names for one release.
"""

from __future__ import annotations

from mappa_env.envs.mathchat.checks import (
    arithmetic_value,
    expression_candidates,
    is_own_solution,
)

__all__ = [
    "arithmetic_value",
    "expression_candidates",
    "is_own_solution",
]
