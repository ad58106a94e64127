"""Whether an agent's code repeats its earlier code: a rule for any rules rubric.

A rerun of code that already ran adds nothing. :func:`repeats_code` reads the earlier
code from the request's metadata under the keys the environments give it
(``earlier_code``, ``earlier_codes``); a rubric pays a rerun nothing by it.
It lives apart from :mod:`mappa_env.coach.rules` so that a rubric can use it without
importing the coach (``mappa_env.coach.rules`` still gives it).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from mappa_env.text import extract_code_blocks, ipython_as_python


def _normalized_code(code: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in code.splitlines() if line.strip())


def _code_shape(code: str) -> str | None:
    try:
        return ast.dump(ast.parse(ipython_as_python(code)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def repeats_code(action: str, metadata: Mapping[str, object]) -> bool:
    """Whether ``action``'s code is the code of one of the agent's earlier turns again.

    Two cells are the same when their lines are, each stripped, blank lines dropped, or
    when they parse to the same Python (comments and spacing aside).

    Args:
        action: The agent's action (its fenced blocks are the code).
        metadata: The request's metadata; ``"earlier_code"`` is the code of the
            agent's latest earlier turn that ran code, and ``"earlier_codes"`` the code
            of all its earlier turns (an environment gives either).

    Returns:
        True for a rerun of an earlier turn's code; False when there is none.
    """
    earlier = [str(metadata.get("earlier_code") or "")]
    earlier += [str(cell) for cell in metadata.get("earlier_codes") or () if cell]  # type: ignore[attr-defined]
    earlier = [cell for cell in earlier if cell.strip()]
    code = "\n".join(extract_code_blocks(action))
    if not earlier or not code.strip():
        return False
    lines = _normalized_code(code)
    if any(lines == _normalized_code(cell) for cell in earlier):
        return True
    shape = _code_shape(code)
    return shape is not None and any(shape == _code_shape(cell) for cell in earlier)
