"""MathChat-v0: three agents solve a competition math problem (the package).

The environment is :class:`~mappa_env.envs.mathchat.env.MathChatEnv` (its card is the
docstring of :mod:`mappa_env.envs.mathchat.env`). The package holds everything MathChat-v0
is made of: :mod:`~mappa_env.envs.mathchat.env` (the environment class and its options),
:mod:`~mappa_env.envs.mathchat.tasks` (``MathTask``, task files and public benchmarks),
:mod:`~mappa_env.envs.mathchat.generator` and :mod:`~mappa_env.envs.mathchat.word_problems`
(the seeded problem generator), :mod:`~mappa_env.envs.mathchat.checks` (which tasks a
copied expression solves), :mod:`~mappa_env.envs.mathchat.grading` and
:mod:`~mappa_env.envs.mathchat.symbolic` (answer extraction and equivalence),
:mod:`~mappa_env.envs.mathchat.answers` (an agent's own final number),
:mod:`~mappa_env.envs.mathchat.rubric` (the rules coach's rubric) and
:mod:`~mappa_env.envs.mathchat.facts` (what every coach is told of an action).
``mappa_env.tasks`` and ``mappa_env.grading`` re-export the task and grading names.

Every name of the environment module imports from here too (``from
mappa_env.envs.mathchat import MathChatEnv``), looked up on first use: importing one part
(the grader, say, as the coach's evidence readers do) does not import the environment,
its sandboxes and PettingZoo.
"""

from __future__ import annotations

import importlib
from typing import Any

ENV_MODULE = "mappa_env.envs.mathchat.env"
"""The module that holds the environment; its names are this package's names."""


PARTS = (
    "answers",
    "checks",
    "env",
    "facts",
    "generator",
    "grading",
    "problem",
    "rubric",
    "symbolic",
    "tasks",
    "word_problems",
)
"""The package's modules: ``from mappa_env.envs.mathchat import tasks`` imports only that."""


def __getattr__(name: str) -> Any:
    if name in PARTS:
        return importlib.import_module(f"{__name__}.{name}")
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(ENV_MODULE), name)
