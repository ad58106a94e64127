"""The record a problem builder returns, shared by the generator's modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """A generated problem before it becomes a task."""

    prompt: str
    answer: int
    params: dict[str, Any]
