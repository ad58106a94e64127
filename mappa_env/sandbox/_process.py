"""Counting and killing a kernel's process tree.

Counting runs after every call, so it has a fast path: on Linux the tree is walked
through ``/proc/<pid>/task/<tid>/children`` (a few small reads for a kernel without
children) instead of psutil's scan of every process on the machine.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import psutil

logger = logging.getLogger(__name__)

_PROC_CHILDREN_SUPPORTED: bool | None = None


def _proc_children_supported() -> bool:
    global _PROC_CHILDREN_SUPPORTED
    if _PROC_CHILDREN_SUPPORTED is None:
        own = f"/proc/{os.getpid()}/task/{os.getpid()}/children"
        _PROC_CHILDREN_SUPPORTED = sys.platform.startswith("linux") and os.path.exists(own)
    return _PROC_CHILDREN_SUPPORTED


def _children_from_proc(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process is gone
        return children
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                children.extend(int(child) for child in handle.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return children


def descendant_pids(pid: int, stop_after: int | None = None) -> list[int]:
    """Pids of every descendant of ``pid`` (children, grandchildren, ...).

    Args:
        pid: Root of the tree; not included in the result.
        stop_after: Stop walking once more than this many are found (enough to know a
            limit is exceeded, without paying for a huge tree).

    Returns:
        Descendant pids, zombies included (they still hold a process slot).
    """
    if not _proc_children_supported():
        try:
            found = [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
        return found if stop_after is None else found[: stop_after + 1]
    found: list[int] = []
    seen = {pid}
    frontier = [pid]
    while frontier:
        for child in _children_from_proc(frontier.pop()):
            if child in seen:
                continue
            seen.add(child)
            found.append(child)
            frontier.append(child)
            if stop_after is not None and len(found) > stop_after:
                return found
    return found


def _threads_of(pid: int) -> int:
    """Threads of process ``pid`` (0 when it is gone); one small read of its stat file."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return 0
    # Fields after the command name (which may hold spaces and parentheses): the 20th
    # field of the line, num_threads, is the 18th after it.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[17])
    except (IndexError, ValueError):
        return 0


def tree_threads(pid: int, stop_after: int) -> int:
    """Threads of ``pid`` and all its descendants together, counted up to ``stop_after``.

    A process counts as its threads (one at least, zombies none); the walk stops as
    soon as the count passes ``stop_after``, before reading the child lists of a
    process's threads, so its cost is bounded by the limit whatever code started: a
    process of 3,000 threads costs one read, not 3,000.

    Args:
        pid: Root of the tree (counted).
        stop_after: The limit; the result is exact up to it, larger than it past it.

    Returns:
        The number of threads (tasks) in the tree.
    """
    if not _proc_children_supported():
        try:
            root = psutil.Process(pid)
            return sum(p.num_threads() for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return 0
    total = 0
    seen = {pid}
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        total += _threads_of(current)
        if total > stop_after:
            return total
        for child in _children_from_proc(current):
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    return total


def interrupt_group(process: subprocess.Popen) -> None:
    """Send SIGINT to the kernel's process group (the kernel and the children it started)."""
    try:
        os.killpg(process.pid, signal.SIGINT)
    except OSError:
        try:
            process.send_signal(signal.SIGINT)
        except OSError as exc:
            logger.debug("could not interrupt pid %d: %s", process.pid, exc)


def kill_tree(process: subprocess.Popen, wait_s: float = 5.0) -> None:
    """Kill the kernel ``process`` and every process it started, then reap the kernel.

    The group is stopped first so that nothing forks while the tree is read (this is
    what defeats a fork bomb); then the group and every descendant that left it are
    killed. The kernel is reaped last: until then its pid, which is also the group id,
    cannot be taken by an unrelated process (callers check liveness without reaping).

    Args:
        process: The kernel's ``Popen`` handle; the kernel leads its own session/group.
        wait_s: How long to wait for the kernel to be reaped.
    """
    pid = process.pid
    if process.returncode is None:
        _signal_group(pid, signal.SIGSTOP)
    survivors: list[psutil.Process] = []
    for child_pid in descendant_pids(pid):
        try:
            survivors.append(psutil.Process(child_pid))
        except psutil.Error:
            continue
    _signal_group(pid, signal.SIGKILL)
    logger.debug("killed kernel pid %d with %d descendants", pid, len(survivors))
    for child in survivors:
        try:
            child.kill()
        except psutil.Error:
            continue
    try:
        process.kill()
    except OSError:
        pass
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        logger.warning("kernel pid %d did not exit %.1f s after SIGKILL", pid, wait_s)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except OSError as exc:
        logger.debug("killpg(%d, %s) failed: %s", pgid, signal.Signals(signum).name, exc)
