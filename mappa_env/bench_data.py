"""Where the benchmark files are found: one folder that every environment's loaders read.

The folder holds each environment's task files side by side (named benchmarks, task
lists, prompts). It is the one the ``MAPPA_BENCH_DIR`` environment variable names, else
a ``shared/data/bench`` folder found by walking up from the working directory or from
this package. Each loader says which of its files it looks for there, so an error about
the folder names what the caller needs.
"""

from __future__ import annotations

import os
from pathlib import Path

BENCH_DIR_ENV = "MAPPA_BENCH_DIR"
"""Environment variable naming the directory that holds the benchmark files."""

DEFAULT_HOLDING = "the benchmark task files"
"""What :func:`find_bench_dir`'s errors say the folder holds when the caller names nothing."""


def bench_dir_candidates() -> list[Path]:
    """Directories searched for benchmark files, in order.

    The value of ``MAPPA_BENCH_DIR`` when set; then ``shared/data/bench`` inside every
    ancestor of the current directory and of this package's directory.

    Returns:
        Candidate directories (they need not exist).
    """
    candidates: list[Path] = []
    configured = os.environ.get(BENCH_DIR_ENV)
    if configured:
        candidates.append(Path(configured).expanduser())
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for ancestor in (start, *start.parents):
            candidate = ancestor / "shared" / "data" / "bench"
            if candidate not in candidates:
                candidates.append(candidate)
    return candidates


def find_bench_dir(required: bool = True, *, holding: str = DEFAULT_HOLDING) -> Path | None:
    """The directory holding the benchmark files (every environment's task files).

    Args:
        required: Raise when none is found (else return ``None``).
        holding: The files the caller looks for there, as the errors name them
            (e.g. ``"AIME_1983_2024.json, aime_2025.json, amc*.json"``).

    Returns:
        The first existing directory of :func:`bench_dir_candidates`.

    Raises:
        FileNotFoundError: If ``MAPPA_BENCH_DIR`` names no directory (whether or not
            ``required``: a misspelt setting must not pass unnoticed), or if
            ``required`` and none exists; the message lists what was tried.
    """
    configured = os.environ.get(BENCH_DIR_ENV)
    if configured and not Path(configured).expanduser().is_dir():
        raise FileNotFoundError(
            f"{BENCH_DIR_ENV}={configured!r} is not a directory. Point it at the folder "
            f"that holds {holding}."
        )
    candidates = bench_dir_candidates()
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    if not required:
        return None
    tried = "\n  ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        "No benchmark directory found. Tried:\n  "
        f"{tried}\nSet {BENCH_DIR_ENV} to the folder holding {holding}, or pass a task "
        "file's path instead of a benchmark name."
    )


__all__ = ["BENCH_DIR_ENV", "DEFAULT_HOLDING", "bench_dir_candidates", "find_bench_dir"]
