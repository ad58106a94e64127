"""Moved: the generator's word problems live in :mod:`mappa_env.envs.mathchat.word_problems`.

This module re-exports its names for one release.
"""

from __future__ import annotations

from mappa_env.envs.mathchat.word_problems import (
    UNIT_FACTORS,
    WORD_KINDS,
    solution_expression,
)

__all__ = [
    "UNIT_FACTORS",
    "WORD_KINDS",
    "solution_expression",
]
