"""Moved: an agent's own final number is read by :mod:`mappa_env.envs.mathchat.answers`.

This module re-exports its names for one release.
"""

from __future__ import annotations

from mappa_env.envs.mathchat.answers import (
    code_executor_answer,
    last_number,
    numbers_in,
    printed_answer,
    stated_answer,
)

__all__ = [
    "code_executor_answer",
    "last_number",
    "numbers_in",
    "printed_answer",
    "stated_answer",
]
