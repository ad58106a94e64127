"""What DSBench-v0 reads of its workspace: file listings for prompts, rows of a CSV.

Listings never follow links and are bounded (see :func:`mappa_env._fs.walk_files`), so
no tree agent code builds can stall or crash them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mappa_env._fs import walk_files
from mappa_env.coach.base import FileInfo

logger = logging.getLogger(__name__)

#: Most files a listing names, so a flood of files cannot blow up prompts.
LISTING_LIMIT = 200


def list_files(root: Path, limit: int = LISTING_LIMIT) -> list[FileInfo]:
    """Regular files under ``root`` (relative names, sizes), hidden files and folders skipped.

    At most ``limit`` files are listed, so a flood of files cannot blow up prompts; the
    walk is bounded in depth and in entries examined and never follows links (see
    :func:`mappa_env._fs.walk_files`), so no tree agent code builds can stall or crash it.
    """
    return [FileInfo(found.name, found.size) for found in walk_files(root, limit=limit)]


def csv_rows(path: Path) -> int | None:
    """Data rows of a CSV file as pandas reads it (what agents' code sees), or None."""
    try:
        return len(pd.read_csv(path, usecols=[0]))
    except (OSError, ValueError) as exc:  # pandas' parser errors are ValueErrors
        logger.warning("cannot count the rows of %s: %s", path, exc)
        return None


def format_listing(files: Sequence[FileInfo | Mapping[str, Any]]) -> str:
    """A file listing for prompts: one ``name (size)`` per line."""
    if not files:
        return "(the directory is empty)"
    rows = [f if isinstance(f, FileInfo) else FileInfo(f["name"], f["size"]) for f in files]
    return "\n".join(f"- {f.name} ({human_size(f.size)})" for f in rows)


def human_size(size: int) -> str:
    """``size`` bytes for people: ``512 B``, ``1.5 KB``, ``2.0 MB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"
