"""How long one code run of a task may take, as the task carries or its kind implies.

An environment's ``code_timeout_s`` option wins; without it, an environment uses the
limit of the episode's task (see ``PipelineEnv.task_code_timeout_s``), and without
that, its class default (30 s for MathChat-v0, 120 s for DSBench-v0). A loop that never
ends then costs the episode seconds suited to the task, not the class's worst case.

A task carries a limit as ``metadata["code_timeout_s"]`` (a field of a task file's row,
or of a DSBench task's metadata). Generated math problems of the kinds in
:data:`KIND_CODE_TIMEOUT_S` imply one: their solution is a line of arithmetic on a few
numbers, which runs in milliseconds; the limit leaves room for importing a library such
as sympy on a busy machine. The other kinds (an enumeration over tens of thousands of
cases on the hard level) keep the class default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mappa_env.envs.mathchat.word_problems import WORD_KINDS
from mappa_env.options import number_option

#: Seconds one code run of a generated problem of these kinds may take.
KIND_CODE_TIMEOUT_S: Mapping[str, float] = {
    "expression": 10.0,
    "arithmetic": 10.0,
    **dict.fromkeys(WORD_KINDS, 10.0),
}


def task_code_timeout_s(task: Any, *, high: float | None = None) -> float | None:
    """The code timeout ``task`` carries or implies, in seconds, or ``None``.

    Args:
        task: A task object with a ``metadata`` mapping (a
            :class:`~mappa_env.tasks.MathTask`, a DSBench task), or anything else.
        high: The largest limit accepted.

    Returns:
        ``metadata["code_timeout_s"]`` when the task has one; else, for a generated
        problem (``metadata["source"] == "generator"``), the limit of its kind in
        :data:`KIND_CODE_TIMEOUT_S`; else ``None``.

    Raises:
        TypeError: If the task's ``code_timeout_s`` is not a number.
        ValueError: If it is not finite, not above 0, or above ``high``.
    """
    metadata = getattr(task, "metadata", None)
    if not isinstance(metadata, Mapping):
        return None
    given = metadata.get("code_timeout_s")
    if given is not None:
        task_id = getattr(task, "id", "?")
        return number_option(
            f"code_timeout_s of task {task_id!r}",
            given,
            low=0.0,
            low_open=True,
            high=high,
            hint="fix the task's metadata, or pass code_timeout_s to the environment",
        )
    if metadata.get("source") == "generator":
        return KIND_CODE_TIMEOUT_S.get(str(metadata.get("kind")))
    return None
