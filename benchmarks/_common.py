"""Shared output helpers for benchmark scripts: print a table, write JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


def parse_sizes(parser: Any, text: str, flag: str = "--samples") -> list[int]:
    """Comma-separated positive integers (an argparse error naming ``flag`` otherwise)."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        parser.error(f"{flag} takes comma-separated positive integers, got {text!r}")
    return sizes


def git_commit() -> str | None:
    """The checkout's commit, with ``+dirty`` for uncommitted changes to tracked files."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty.strip() else "")


def parse_variants(parser: Any, text: str, known: Sequence[str]) -> list[str]:
    """Comma-separated variant names, checked against ``known`` (argparse error if not)."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(known)}")
    return names


def machine_info() -> dict[str, Any]:
    """Facts about the machine a measurement was taken on."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def cuda_synchronize() -> None:
    """Wait for the GPU's queued work (nothing without CUDA): timings then include it."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_operators(
    call: Callable[[], Any], out: Path, cpu_rows: int = 25, device_rows: int = 25
) -> dict[str, Any]:
    """Run ``call`` under ``torch.profiler`` (CPU, and CUDA where there is one).

    Writes the top operators by CPU time (and by device time on CUDA) to ``out``.

    Returns:
        ``wall_s_profiled``, ``gpu_busy_s`` (the operators' own device time) and
        ``gpu_busy_fraction`` (of the wall seconds; 0 without CUDA).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    cuda_synchronize()
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        call()
        cuda_synchronize()
    wall = time.perf_counter() - started
    averages = prof.key_averages()
    tables = [averages.table(sort_by="cpu_time_total", row_limit=cpu_rows)]
    device_us = 0.0
    if torch.cuda.is_available():
        tables.append(averages.table(sort_by="self_cuda_time_total", row_limit=device_rows))
        device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in averages)
    out.write_text("\n\n".join(tables) + "\n")
    return {
        "wall_s_profiled": round(wall, 3),
        "gpu_busy_s": round(device_us / 1e6, 3),
        "gpu_busy_fraction": round(device_us / 1e6 / wall, 3) if wall else None,
    }


def print_table(rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
    """Print ``rows`` (dicts with the same keys) as an aligned text table."""
    if title:
        print(title)
    if not rows:
        print("(no rows)")
        return
    columns = list(rows[0].keys())
    cells = [[_fmt(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    print("  ".join(col.ljust(w) for col, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def write_results(name: str, payload: Mapping[str, Any], out_dir: Path | None = None) -> Path:
    """Write ``payload`` plus machine facts to ``<out_dir>/<name>.json`` and return the path."""
    out_dir = out_dir or RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    data = {"benchmark": name, "machine": machine_info(), **payload}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
