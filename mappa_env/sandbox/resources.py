"""What a sandbox holds, and what watches it between calls.

:class:`SandboxResources` is everything a :class:`~mappa_env.sandbox.jupyter.JupyterSandbox`
must release (its kernel, worker thread, workspace, uid lease);
:func:`watch_idle_kernel` keeps a kernel's background processes within their limits
between calls, and :func:`limit_error` says when a kernel went over one.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from mappa_env._fs import remove_tree
from mappa_env.sandbox import _process
from mappa_env.sandbox._kernel import Kernel, close_kernel_files
from mappa_env.sandbox.base import ExecError
from mappa_env.sandbox.limits import SandboxLimits
from mappa_env.sandbox.quota import QUOTA_ERROR, quota_error, trim_workspace, workspace_usage

if TYPE_CHECKING:
    from mappa_env.sandbox.uids import UidLease

logger = logging.getLogger(__name__)

#: How long close() waits for a call running in another thread to give up the kernel.
_CLOSE_WAIT_S = 10.0


class SandboxResources:
    """Everything a sandbox must release; shared with its finalizer and watcher thread.

    Kept apart from :class:`JupyterSandbox` so that neither ``weakref.finalize`` nor the
    background watcher holds a reference to the sandbox (which would keep it alive).
    """

    def __init__(self, owned_dir: Path | None, lease: UidLease | None = None) -> None:
        self.lock = threading.Lock()  # serialises calls (and restarts) on the kernel
        self.lease = lease  # the sandbox's own uid, if it leased one
        self.state_lock = threading.Lock()  # guards kernel / closed against close()
        self.kernel: Kernel | None = None
        self.closed = False
        self.owned_dir = owned_dir
        self.executor: ThreadPoolExecutor | None = None
        self.watcher: threading.Thread | None = None
        self.stop_watch = threading.Event()
        self.pending_notice = ""
        # The sandbox's one worker thread, told apart from every other sandbox's.
        self.thread_prefix = f"mappa-sandbox-{id(self):x}"

    def release(self) -> None:
        """Kill the kernel, stop the worker thread, delete an owned workspace, free the uid."""
        with self.state_lock:
            if self.closed:
                return
            self.closed = True
            kernel, self.kernel = self.kernel, None
            executor, self.executor = self.executor, None
        self.stop_watch.set()
        if kernel is not None:
            # Killing is safe from any thread; closing the sockets is not while a call in
            # another thread polls them, so wait for it to notice (it checks every tick).
            _process.kill_tree(kernel.process)
            acquired = self.lock.acquire(timeout=_CLOSE_WAIT_S)
            if not acquired:
                logger.warning("closing kernel %d while a call still uses it", kernel.pid)
            try:
                close_kernel_files(kernel)
            finally:
                if acquired:
                    self.lock.release()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if self.owned_dir is not None:
            remove_tree(self.owned_dir)  # agent code may have left a tree rmtree cannot
        if self.lease is not None:
            # Its processes are gone (killed with the kernel's tree and namespace).
            self.lease.release()


def over_limit(kernel: Kernel, limits: SandboxLimits) -> tuple[str, int] | None:
    """``("threads" or "processes", limit)`` when a kernel is over that limit, else None.

    Threads are counted first: that count is bounded by its limit (see
    :func:`~mappa_env.sandbox._process.tree_threads`), while listing the processes reads
    a file per thread.
    """
    threads = limits.max_threads
    if threads is not None and kernel.threads(stop_after=threads) > threads:
        return "threads", threads
    limit = limits.max_processes
    if limit is not None and len(kernel.agent_processes(stop_after=limit)) > limit:
        return "processes", limit
    return None


def limit_error(kernel: Kernel, limits: SandboxLimits) -> ExecError | None:
    """The error of a call after which the kernel is over a limit, or None."""
    over = over_limit(kernel, limits)
    if over is None:
        return None
    what, limit = over
    counted = " (every thread of every process of the sandbox counts)" if what == "threads" else ""
    return ExecError(
        "ProcessLimitExceeded",
        f"the code had more than {limit} {what} running{counted}; all of its processes "
        "and the Python process were killed, and the Python process was restarted",
    )


def left_running(kernel: Kernel) -> bool:
    """Whether earlier code left processes, or threads of its own, running in the kernel."""
    return bool(kernel.agent_processes(stop_after=0)) or (
        kernel.threads(stop_after=kernel.ready_threads) > kernel.ready_threads
    )


def watch_idle_kernel(
    res: SandboxResources, kernel: Kernel, limits: SandboxLimits, workdir: Path
) -> None:
    """Between calls, kill the kernel if what it left running exceeds its limits.

    Runs only while earlier code left processes or threads running; a running call does
    its own checks, so a round is skipped whenever the call lock is taken. What was left
    running may also write: past the workspace quota it is killed, and what it wrote is
    deleted until the workspace is back under.
    """
    watching_since_ns = time.time_ns()
    while not res.stop_watch.wait(limits.idle_watch_interval_s):
        if not res.lock.acquire(blocking=False):
            continue
        try:
            if res.kernel is not kernel or not kernel.alive():
                res.watcher = None
                return
            over = over_limit(kernel, limits)
            if over is not None:
                what, limit = over
                logger.debug("kernel pid %d: background %s over %d", kernel.pid, what, limit)
                _process.kill_tree(kernel.process)
                # The next call adds whether the Python process could be restarted.
                res.pending_notice = (
                    f"[sandbox] {what} left running by earlier code exceeded the limit of "
                    f"{limit}; they and the Python process were killed"
                )
                res.watcher = None
                return
            quota = limits.workspace_bytes
            usage = None if quota is None else workspace_usage(workdir)
            if quota is not None and usage is not None and usage.over(quota):
                _process.kill_tree(kernel.process)
                removed, after = trim_workspace(workdir, quota, watching_since_ns)
                stated = quota_error(quota, usage, removed, after)
                res.pending_notice = (
                    f"[sandbox] {QUOTA_ERROR}: processes left running by earlier code "
                    f"wrote past the quota; {stated.value}"
                )
                res.watcher = None
                return
            if not left_running(kernel):
                res.watcher = None
                return
        finally:
            res.lock.release()
    res.watcher = None
