"""Micro-batches by a token budget: a forward/backward pass of about the same size each time.

Rows of very different lengths make row-count micro-batches either tiny (short rows: the
pass is bound by per-call overhead, not the GPU) or huge (long rows: memory). Grouping
rows, sorted by length, until their padded size reaches a budget keeps every pass near
the same number of tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_budget_batches(
    lengths: Sequence[int], budget: int, max_rows: int | None = None
) -> list[list[int]]:
    """Split rows, in the order given, into runs whose padded size fits ``budget``.

    A run's padded size is ``len(run) * max(lengths[i] for i in run)``: what a
    right-padded batch of those rows holds. Runs are filled greedily in order, so with
    rows sorted by length each run pads little. A row longer than ``budget`` forms a run
    of its own (it cannot be split).

    Args:
        lengths: Length in tokens of each row (prompt + response).
        budget: Most padded tokens per run; must be >= 1.
        max_rows: Most rows per run as well, if given.

    Returns:
        Runs of row positions (``0 .. len(lengths) - 1``), covering each row once, in order.

    Raises:
        ValueError: For a budget or ``max_rows`` below 1.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    runs: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for position, length in enumerate(lengths):
        widest = max(longest, int(length))
        full = max_rows is not None and len(current) >= max_rows
        if current and (full or (len(current) + 1) * widest > budget):
            runs.append(current)
            current, widest = [], int(length)
        current.append(position)
        longest = widest
    if current:
        runs.append(current)
    return runs
