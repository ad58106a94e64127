"""A disk quota for a workspace: what its files take on disk, and bringing it back under.

Agents' code writes into a workspace on the host's disk, confined or not (the
workspace is bound read-write into the confined view, since the environment reads it
from the host). Nothing about the workspace's own file system holds it, so a loop that
writes files can fill the host's disk in seconds. The sandbox therefore measures the
workspace while code runs and after each call (:func:`workspace_usage`), stops code that
takes it over its quota, and deletes what that code wrote until the workspace is back
under it (:func:`trim_workspace`): the files written during the call first, largest
first, then, only if that is not enough, other files, largest first.

Sizes are the space files take on disk (allocated blocks), so a sparse file of
terabytes counts for what it really holds; a file with several hard links counts once.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mappa_env.sandbox.base import ExecError

logger = logging.getLogger(__name__)

#: ``ExecError.name`` of a call stopped for taking its workspace over the quota.
QUOTA_ERROR = "WorkspaceQuotaExceeded"
#: Most directory entries a measurement looks at. A workspace with more is over its
#: quota whatever its size (a flood of empty files fills a disk's inodes instead), and
#: the bound keeps one measurement to a fraction of a second.
MAX_QUOTA_ENTRIES = 100_000
#: Block size of ``st_blocks`` (POSIX: 512 bytes whatever the file system's block).
_BLOCK = 512


@dataclass(frozen=True)
class WorkspaceUsage:
    """What a workspace takes on disk.

    Attributes:
        bytes: Allocated bytes of every entry (files, folders, links), hard links once.
        entries: Entries counted.
        complete: False when the count stopped at the entry bound.
    """

    bytes: int
    entries: int
    complete: bool = True

    def over(self, quota_bytes: int) -> bool:
        """Whether this usage breaks a quota of ``quota_bytes``."""
        return not self.complete or self.bytes > quota_bytes

    def describe(self) -> str:
        """The usage in words, for messages."""
        if not self.complete:
            return f"more than {self.entries:,} files and folders"
        return f"{self.bytes:,} bytes"


@dataclass(frozen=True)
class _Entry:
    path: str
    allocated: int
    mtime_ns: int
    links: int


def workspace_usage(root: str | Path, max_entries: int = MAX_QUOTA_ENTRIES) -> WorkspaceUsage:
    """Measure what ``root`` takes on disk, without following links.

    Args:
        root: The workspace.
        max_entries: Stop counting after this many entries (the usage is then
            incomplete, and over any quota).

    Returns:
        The usage; zero for a workspace that does not exist.
    """
    usage, _ = _scan(os.fspath(root), max_entries, keep_files=False)
    return usage


def trim_workspace(
    root: str | Path,
    quota_bytes: int,
    written_since_ns: int,
    max_entries: int = MAX_QUOTA_ENTRIES,
) -> tuple[list[str], WorkspaceUsage]:
    """Delete files until ``root`` is back under ``quota_bytes``.

    Files modified at or after ``written_since_ns`` (the call that broke the quota) go
    first, largest first; other files only when those were not enough. Call this after
    the code's processes are stopped: a file a live process holds open keeps its space.

    Args:
        root: The workspace.
        quota_bytes: The quota.
        written_since_ns: Start of the call, ``time.time_ns()``.
        max_entries: As for :func:`workspace_usage`.

    Returns:
        The deleted files (paths relative to ``root``) and the usage afterwards.
    """
    root = os.fspath(root)
    usage, files = _scan(root, max_entries, keep_files=True)
    used, entries = usage.bytes, usage.entries
    recent = [f for f in files if f.mtime_ns >= written_since_ns]
    older = [f for f in files if f.mtime_ns < written_since_ns]
    removed: list[str] = []
    for group in (recent, older):
        # Largest first; among equals the newest, the last the code wrote.
        for entry in sorted(group, key=lambda f: (f.allocated, f.mtime_ns), reverse=True):
            if used <= quota_bytes and entries < max_entries:
                break
            try:
                os.unlink(os.path.join(root, entry.path))
            except FileNotFoundError:
                continue
            except OSError as exc:
                logger.warning("could not delete %s over the quota: %s", entry.path, exc)
                continue
            removed.append(entry.path)
            entries -= 1
            if entry.links <= 1:
                used -= entry.allocated
    after = workspace_usage(root, max_entries)
    if after.over(quota_bytes):
        logger.warning("workspace %s is still over its quota (%s)", root, after.describe())
    return removed, after


def quota_error(
    quota_bytes: int, measured: WorkspaceUsage, removed: list[str], after: WorkspaceUsage
) -> ExecError:
    """The error of a call that took its workspace over the quota.

    Args:
        quota_bytes: The quota.
        measured: The usage that broke it.
        removed: Files deleted to bring the workspace back under it.
        after: The usage after deleting them.

    Returns:
        An :class:`ExecError` named :data:`QUOTA_ERROR`.
    """
    more = len(removed) - 10
    shown = ", ".join(removed[:10]) + (f" and {more} more" if more > 0 else "")
    deleted = (
        f"; to bring the workspace back under it, {len(removed)} file(s) were deleted ({shown})"
        if removed
        else ""
    )
    still = "" if not after.over(quota_bytes) else f"; it still holds {after.describe()}"
    return ExecError(
        QUOTA_ERROR,
        f"the workspace went over its disk quota of {quota_bytes:,} bytes (it held "
        f"{measured.describe()}): the code was stopped and the Python process restarted "
        f"(earlier variables are gone){deleted}{still}. Write less, or delete files you "
        "no longer need",
    )


def _scan(root: str, max_entries: int, *, keep_files: bool) -> tuple[WorkspaceUsage, list[_Entry]]:
    """Walk ``root`` iteratively (no recursion limit, no links followed)."""
    files: list[_Entry] = []
    seen_links: set[tuple[int, int]] = set()
    total = entries = 0
    prefix = len(root) + 1
    stack = [root]
    while stack:
        try:
            iterator = os.scandir(stack.pop())
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                logger.debug("cannot list %s: %s", root, exc)
            continue
        with iterator:
            for entry in iterator:
                entries += 1
                if entries > max_entries:
                    return WorkspaceUsage(total, max_entries, complete=False), files
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                allocated = info.st_blocks * _BLOCK
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    key = (info.st_dev, info.st_ino)
                    if key in seen_links:
                        allocated = 0
                    seen_links.add(key)
                total += allocated
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                elif keep_files:
                    files.append(
                        _Entry(entry.path[prefix:], allocated, info.st_mtime_ns, info.st_nlink)
                    )
    return WorkspaceUsage(total, entries), files
