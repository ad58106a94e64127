"""A sandbox backed by a Jupyter kernel (ipykernel) with hard resource limits.

One :class:`JupyterSandbox` owns one IPython kernel process running in a workspace
directory. State persists across calls, like a notebook. Whatever the code does (raise,
loop forever, exhaust memory, fork without end, kill its own process) comes back as an
:class:`~mappa_env.sandbox.base.ExecResult`; the sandbox restarts the kernel when it
has to and says so with ``restarted=True``.

Example:
    >>> with JupyterSandbox() as sandbox:  # doctest: +SKIP
    ...     sandbox.run("x = 6 * 7")
    ...     print(sandbox.run("x").stdout)
    42

Where the parts live: one call's request and output in :mod:`mappa_env.sandbox.calls`,
the text it becomes in :mod:`mappa_env.sandbox.output`, the files it wrote in
:mod:`mappa_env.sandbox.file_changes`, what the sandbox holds and watches between calls
in :mod:`mappa_env.sandbox.resources`, the kernel process in
:mod:`mappa_env.sandbox._kernel`. This module keeps the sandbox itself: its calls, the
kernel's restarts and recovery, and its workspace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mappa_env.sandbox._kernel import (
    Kernel,
    describe_exit,
    start_kernel,
    stop_kernel,
)
from mappa_env.sandbox.base import ExecError, ExecResult
from mappa_env.sandbox.calls import CallOutcome, execute
from mappa_env.sandbox.errors import SandboxError
from mappa_env.sandbox.file_changes import changed_files, snapshot
from mappa_env.sandbox.isolation import (
    Confinement,
    IsolationMode,
    resolve_confinement,
)
from mappa_env.sandbox.limits import SandboxLimits, kernel_environment
from mappa_env.sandbox.output import (
    BoundedText,
    strip_ansi,
    unencodable_code_error,
    utf8_safe,
    utf8_safe_error,
)
from mappa_env.sandbox.quota import (
    QUOTA_ERROR,
    WorkspaceUsage,
    quota_error,
    trim_workspace,
    workspace_usage,
)
from mappa_env.sandbox.resources import (
    SandboxResources,
    left_running,
    limit_error,
    watch_idle_kernel,
)
from mappa_env.tempdirs import make_temp_dir

__all__ = [
    "JupyterSandbox",
    "JupyterSandboxFactory",
    "SandboxError",
    "strip_ansi",
    "utf8_safe",
]

logger = logging.getLogger(__name__)

#: The old name of :class:`~mappa_env.sandbox.output.BoundedText`, kept for one release.
_BoundedText = BoundedText


@dataclass(frozen=True)
class JupyterSandboxFactory:
    """Makes :class:`JupyterSandbox` es with fixed settings; declares their confinement.

    Build it with :meth:`JupyterSandbox.factory`. Environments read ``confinement`` to
    report (and, under ``isolation="namespaces"``, to require) what the sandboxes are.

    Attributes:
        limits: Limits of every sandbox made (``None``: the defaults).
        env: Extra kernel environment variables.
        isolation: The isolation mode every sandbox is made with.
        confinement: What that mode resolved to on this machine.
    """

    limits: SandboxLimits | None
    env: Mapping[str, str] | None
    isolation: IsolationMode
    confinement: Confinement

    def __call__(self, workdir: Path) -> JupyterSandbox:
        """A new sandbox working in ``workdir`` (the :class:`SandboxFactory` protocol)."""
        return JupyterSandbox(workdir, self.limits, env=self.env, isolation=self.isolation)


class JupyterSandbox:
    """Runs Python in a Jupyter kernel confined by :class:`SandboxLimits`.

    The kernel starts on the first :meth:`run` (or :meth:`start`), with its working
    directory in :attr:`workdir`. Several sandboxes may share one workdir (agents hand
    each other files that way); a sandbox deletes only a directory it created itself.

    Calls are serialised: two threads calling :meth:`run` on one sandbox take turns.
    :meth:`close` (also called on garbage collection and at interpreter exit) kills the
    kernel together with every process it started.

    Besides the code's own exceptions, ``ExecResult.error.name`` may be one of:
    ``TimeoutError`` (the wall-clock limit interrupted the code), ``KernelDied`` (the
    process crashed, was killed or exited), ``CPUTimeLimitExceeded``,
    ``ProcessLimitExceeded``, ``WorkspaceQuotaExceeded`` (the workspace went over
    ``limits.workspace_bytes``: the code was stopped and what it wrote deleted until the
    workspace is back under), ``SandboxClosed`` (closed from another thread while the
    code ran), ``SandboxError`` (the kernel could not be reached, started or restarted;
    the next call tries again) and ``UnicodeEncodeError`` (the code contains characters
    that cannot be sent to the kernel, such as a lone surrogate; it did not run).

    Needs a POSIX system (Linux or macOS): the limits use ``resource``; on Linux the
    process tree is read from ``/proc``, elsewhere through psutil. Namespace isolation
    needs Linux and bubblewrap (see :mod:`mappa_env.sandbox.isolation`).

    Args:
        workdir: Working directory of the code. ``None`` creates a temporary directory
            that the sandbox owns and deletes on close. A missing directory is created.
        limits: Resource limits; :class:`SandboxLimits` defaults when ``None``.
        env: Extra environment variables for the kernel, added to the allow-listed
            ones taken from this process (see :func:`~mappa_env.sandbox.limits.kernel_environment`).
        isolation: ``"auto"`` (default: Linux namespaces where bubblewrap works, else
            none, with a warning once), ``"namespaces"`` (or raise) or ``"none"``.

    Raises:
        IsolationUnavailableError: For ``isolation="namespaces"`` where bubblewrap
            cannot confine processes, naming the cause and the fix.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        limits: SandboxLimits | None = None,
        *,
        env: Mapping[str, str] | None = None,
        isolation: IsolationMode = "auto",
    ) -> None:
        self._confinement = resolve_confinement(isolation)
        if workdir is None:
            self._workdir = make_temp_dir("sandbox").resolve()
            owned: Path | None = self._workdir
        else:
            self._workdir = Path(workdir).expanduser().resolve()
            self._confinement.check_workdir(self._workdir)
            self._workdir.mkdir(parents=True, exist_ok=True)
            owned = None
        # The confined user writes the workspace (as the agents' files are theirs); a
        # workspace over the interpreter's own directories is refused. Files in a
        # workspace made for the sandbox (by it, or by an environment) become the confined
        # user's at each start; a directory the caller gave keeps its files as they are.
        self._confinement.check_workdir(self._workdir)
        # A workspace an environment made for its sandboxes has its user already (every
        # agent of an episode shares it); any other gets a uid of its own where the
        # machine allows (see UidPool), held as long as this sandbox.
        made_for_sandboxes = self._confinement.owns(self._workdir)
        owner = self._confinement.workspace_user(self._workdir)
        # The owner's uid is held by whoever made the workspace; one nobody holds any
        # more (an earlier sandbox's directory) is leased again, never shared unheld.
        lease = self._confinement.lease_user(
            owner[0] if made_for_sandboxes and owner is not None else None
        )
        self._user = lease.user if lease is not None else owner
        self._hands_over_files = owned is not None or made_for_sandboxes
        self._confinement.prepare_writable(self._workdir, user=self._user)
        self._limits = limits or SandboxLimits()
        self._env = kernel_environment(self._limits, env)
        self._res = SandboxResources(owned, lease)
        self._finalizer = weakref.finalize(self, self._res.release)

    @classmethod
    def factory(
        cls,
        limits: SandboxLimits | None = None,
        *,
        env: Mapping[str, str] | None = None,
        isolation: IsolationMode = "auto",
    ) -> JupyterSandboxFactory:
        """A :class:`~mappa_env.sandbox.base.SandboxFactory` making cold-started sandboxes.

        Args:
            limits: Limits for every sandbox made.
            env: Extra kernel environment variables for every sandbox made.
            isolation: Isolation of every sandbox made (see :class:`JupyterSandbox`);
                checked now, so ``"namespaces"`` fails here when unavailable.

        Returns:
            ``factory(workdir) -> JupyterSandbox``, declaring its confinement as
            ``factory.confinement``.

        Raises:
            IsolationUnavailableError: For ``isolation="namespaces"`` where it cannot work.
        """
        return JupyterSandboxFactory(
            limits=limits, env=env, isolation=isolation, confinement=resolve_confinement(isolation)
        )

    # ----------------------------------------------------------------- properties

    @property
    def workdir(self) -> Path:
        """Directory the code runs in (its current working directory at start)."""
        return self._workdir

    @property
    def limits(self) -> SandboxLimits:
        """The limits this sandbox enforces."""
        return self._limits

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._res.closed

    @property
    def confinement(self) -> Confinement:
        """How the kernel is confined (``confinement.isolated``: in namespaces)."""
        return self._confinement

    @property
    def kernel_pid(self) -> int | None:
        """Process id of the running kernel, or None when none is running."""
        kernel = self._res.kernel
        return kernel.pid if kernel is not None and kernel.alive() else None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the kernel now instead of on the first :meth:`run`.

        Raises:
            SandboxError: If the kernel cannot start, or the sandbox is closed.
        """
        with self._res.lock:
            kernel = self._res.kernel
            if kernel is None or not kernel.alive():
                self._replace_kernel()

    def close(self) -> None:
        """Kill the kernel and its process tree; delete the workdir if the sandbox made it.

        Idempotent. A call running in another thread returns with a ``SandboxClosed``
        error.
        """
        self._finalizer()

    def __enter__(self) -> JupyterSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pid={self.kernel_pid}"
        return f"JupyterSandbox(workdir={str(self._workdir)!r}, {state})"

    # ------------------------------------------------------------------ execution

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in the kernel and wait for it, at most ``timeout`` seconds.

        Args:
            code: Python source (IPython syntax is accepted too).
            timeout: Wall-clock limit for this call; ``limits.timeout_s`` when None.

        Returns:
            What happened. Failures of the code (exceptions, timeouts, a crashed or
            killed kernel, exceeded limits, characters that cannot be sent) and a
            kernel that cannot be started are described here, never raised.

        Raises:
            TypeError: If ``code`` is not a string.
            ValueError: If ``timeout`` is not positive.
            SandboxError: If the sandbox is closed.
        """
        limit = self._check_call(code, timeout)
        with self._res.lock:
            if self._res.closed:
                raise SandboxError("the sandbox is closed")
            return self._run_locked(code, limit)

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        """Like :meth:`run`, without blocking the event loop.

        The call runs in this sandbox's own single worker thread, so many sandboxes
        run concurrently without exhausting the loop's default executor. Cancelling
        the awaiting task does not stop the code; it still ends by its timeout.

        Args:
            code: Python source.
            timeout: Wall-clock limit for this call; ``limits.timeout_s`` when None.

        Returns:
            The :class:`ExecResult`, as from :meth:`run`.

        Raises:
            TypeError: If ``code`` is not a string.
            ValueError: If ``timeout`` is not positive.
            SandboxError: If the sandbox is closed.
        """
        self._check_call(code, timeout)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), self.run, code, timeout)

    def _executor(self) -> ThreadPoolExecutor:
        with self._res.state_lock:
            if self._res.closed:
                raise SandboxError("the sandbox is closed")
            if self._res.executor is None:
                self._res.executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self._res.thread_prefix
                )
            return self._res.executor

    def _check_call(self, code: object, timeout: float | None) -> float:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        limit = self._limits.timeout_s if timeout is None else float(timeout)
        if not limit > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        return limit

    def _run_locked(self, code: str, timeout: float) -> ExecResult:
        started = time.monotonic()
        refused = unencodable_code_error(code)
        if refused is not None:
            # Nothing is sent (the kernel's message packer would raise), so the kernel and
            # its state are untouched.
            return ExecResult(error=refused, duration_s=time.monotonic() - started)
        notes: list[str] = []
        restarted = False
        kernel = self._res.kernel
        if kernel is None:
            try:
                kernel = self._replace_kernel()
            except SandboxError as exc:
                return self._start_failed(exc, notes, started)
        elif not kernel.alive():
            ended = self._res.pending_notice or (
                f"[sandbox] the Python process had ended ({describe_exit(kernel.exit_status())})"
            )
            self._res.pending_notice = ""
            try:
                kernel = self._replace_kernel()
            except SandboxError as exc:
                notes.append(f"{ended}; earlier variables are gone")
                return self._start_failed(exc, notes, started)
            notes.append(f"{ended}; it was restarted before this call")
            restarted = True
        else:
            notes.extend(self._restore_live_workdir(kernel))
            if self._res.kernel is not kernel:  # a confined kernel had to be restarted
                if self._res.kernel is None:
                    return self._start_failed(SandboxError("; ".join(notes)), [], started)
                kernel, restarted = self._res.kernel, True
        self._res.pending_notice = ""

        root = str(self._workdir)
        started_ns = time.time_ns()
        before = snapshot(root, self._limits.max_tracked_files)
        outcome = self._execute(kernel, code, timeout)
        error = outcome.error
        if outcome.closed:
            error = ExecError("SandboxClosed", "the sandbox was closed while the code ran")
        elif outcome.kill_reason is None and not outcome.died:
            over = limit_error(kernel, self._limits)
            if over is not None:
                outcome.kill_reason, outcome.kill_error = "process limit", over
            else:
                self._check_quota(outcome)
        elif outcome.died and outcome.over_quota is None:
            # A writer killed by RLIMIT_FSIZE or the like may still have filled the disk.
            self._check_quota(outcome)
        if not outcome.closed and (outcome.died or outcome.kill_reason or outcome.asked_exit):
            error = self._recover(kernel, outcome, error)
            restarted = True
        if outcome.over_quota is not None and not outcome.closed:
            error = self._trim_after_quota(outcome.over_quota, error, started_ns)
        elif not outcome.closed and left_running(kernel):
            self._watch_background_processes(kernel)

        stdout, stdout_cut = outcome.stdout.text()
        stderr, stderr_cut = outcome.stderr.text()
        if notes:
            stderr = "\n".join(notes) + ("\n" + stderr if stderr else "\n")
        after = snapshot(root, self._limits.max_tracked_files)
        return ExecResult(
            stdout=utf8_safe(stdout),
            stderr=utf8_safe(stderr),
            error=utf8_safe_error(error),
            timed_out=outcome.timed_out,
            duration_s=time.monotonic() - started,
            truncated=stdout_cut or stderr_cut,
            restarted=restarted,
            files_written=tuple(utf8_safe(n) for n in changed_files(before, after)),
        )

    def _check_quota(self, outcome: CallOutcome) -> None:
        """Mark ``outcome`` for a kill when the workspace is over its quota after the call."""
        quota = self._limits.workspace_bytes
        if quota is None:
            return
        usage = workspace_usage(self._workdir)
        if usage.over(quota):
            outcome.over_quota = usage
            outcome.kill_reason = outcome.kill_reason or "workspace quota"
            outcome.kill_error = outcome.kill_error or ExecError(QUOTA_ERROR, "")

    def _trim_after_quota(
        self, usage: WorkspaceUsage, error: ExecError | None, started_ns: int
    ) -> ExecError:
        """Bring the workspace back under its quota (the kernel is stopped); the error."""
        quota = self._limits.workspace_bytes
        assert quota is not None
        removed, after = trim_workspace(self._workdir, quota, started_ns)
        logger.info(
            "workspace %s over its quota of %d bytes (%s): %d files deleted",
            self._workdir,
            quota,
            usage.describe(),
            len(removed),
        )
        stated = quota_error(quota, usage, removed, after)
        if error is not None and error.name == QUOTA_ERROR and error.value:
            # What the restart added (it could not restart, for instance).
            return ExecError(QUOTA_ERROR, f"{stated.value}{error.value}")
        return stated

    def _start_failed(self, exc: SandboxError, notes: list[str], started: float) -> ExecResult:
        """The result of a call whose kernel could not be started; the code did not run.

        No kernel is left, so the next call tries a fresh start.
        """
        if self._res.closed:
            error = ExecError("SandboxClosed", "the sandbox was closed before the code ran")
        else:
            logger.warning("kernel start failed: %s", exc)
            error = ExecError(
                "SandboxError",
                "the Python process could not be started, so the code did not run "
                f"(the next call tries again): {exc}",
            )
        return ExecResult(
            stderr=utf8_safe("".join(f"{note}\n" for note in notes)),
            error=utf8_safe_error(error),
            duration_s=time.monotonic() - started,
        )

    def _ensure_workdir(self) -> bool:
        """Create the workdir again if code deleted it; return whether it had to.

        Raises:
            SandboxError: If the directory is missing and cannot be created.
        """
        if self._workdir.is_dir():
            return False
        try:
            self._workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxError(
                f"the working directory {self._workdir} is gone and could not be created "
                f"again: {exc}"
            ) from exc
        logger.info("working directory %s was deleted; created it again", self._workdir)
        return True

    def _restore_live_workdir(self, kernel: Kernel) -> list[str]:
        """Recreate a deleted workdir and move the running kernel into it.

        A kernel whose working directory was deleted keeps pointing at the dead
        directory, where no file can be created; moving it keeps its state.

        Returns:
            Notes for the call's stderr (empty when the workdir was there).
        """
        try:
            if not self._ensure_workdir():
                return []
        except SandboxError as exc:
            logger.warning("%s", exc)
            return [f"[sandbox] {exc}"]
        if kernel.confined:
            # Its view of the workspace was fixed when it started: start it again there.
            self._confinement.prepare_writable(self._workdir, user=self._user)
            try:
                self._replace_kernel()
            except SandboxError as exc:
                return [f"[sandbox] the working directory had been deleted; {exc}"]
            return [
                "[sandbox] the working directory had been deleted; it was created again, "
                "empty, and the Python process was restarted in it (earlier variables are "
                "gone)"
            ]
        if not self._chdir_kernel(kernel, self._workdir):
            logger.warning("kernel pid %d could not change to %s", kernel.pid, self._workdir)
            return [
                "[sandbox] the working directory had been deleted; it was created again "
                "(empty), but the Python process could not change into it"
            ]
        return [
            "[sandbox] the working directory had been deleted; it was created again, empty, "
            "and made the current directory again"
        ]

    def _chdir_kernel(self, kernel: Kernel, workdir: Path) -> bool:
        """Change the running kernel's working directory without leaving a trace.

        Returns:
            Whether the kernel changed directory and is still usable.
        """
        code = f"import os as _mappa_os\n_mappa_os.chdir({str(workdir)!r})\ndel _mappa_os"
        outcome = self._execute(kernel, code, self._limits.start_timeout_s, silent=True)
        return not (outcome.error or outcome.timed_out or outcome.died or outcome.kill_reason)

    def _recover(
        self, kernel: Kernel, outcome: CallOutcome, error: ExecError | None
    ) -> ExecError | None:
        """Replace a dead or unrecoverable kernel; return the error to report."""
        if outcome.died:
            status = kernel.exit_status()
            if status == -signal.SIGXCPU:
                error = ExecError(
                    "CPUTimeLimitExceeded",
                    f"the Python process used up its CPU time ({self._limits.cpu_seconds} s) "
                    "and was restarted",
                    kernel.fault_report(),
                )
            elif kernel.cgroup is not None and kernel.cgroup.oom_kills() > outcome.oom_kills_before:
                error = ExecError(
                    "MemoryError",
                    "the sandbox ran out of memory (its limit of "
                    f"{self._limits.total_memory_bytes} bytes counts every process, shared "
                    "memory and its /tmp together); the Python process was killed and "
                    "restarted",
                    kernel.fault_report(),
                )
            elif not outcome.asked_exit:
                error = ExecError(
                    "KernelDied",
                    f"the Python process died ({describe_exit(status)}) and was restarted",
                    kernel.fault_report(),
                )
        elif outcome.kill_error is not None:
            error = outcome.kill_error
        logger.debug(
            "restarting kernel pid %d: %s",
            kernel.pid,
            outcome.kill_reason or ("exit requested" if outcome.asked_exit else "it died"),
        )
        try:
            self._replace_kernel()
        except SandboxError as exc:
            # Leave no kernel: the next call tries a fresh start (and reports if that fails).
            logger.warning("kernel restart failed: %s", exc)
            note = f"the Python process could not be restarted: {exc}"
            if error is None:
                error = ExecError("SandboxError", note)
            else:
                error = ExecError(error.name, f"{error.value}; {note}", error.traceback)
        return error

    def _replace_kernel(self) -> Kernel:
        """Stop the current kernel (if any) and start a fresh one in the workdir.

        A workdir that code deleted is created again first: the kernel process cannot
        start in a missing directory.

        Raises:
            SandboxError: If the sandbox is closed or the kernel cannot start; no kernel
                is left then.
        """
        with self._res.state_lock:
            if self._res.closed:
                raise SandboxError("the sandbox is closed")
            old, self._res.kernel = self._res.kernel, None
            if old is not None:
                stop_kernel(old)
            self._ensure_workdir()
            self._confinement.prepare_writable(
                self._workdir, contents=self._hands_over_files, user=self._user
            )
            # Started under the state lock so that close() cannot miss a new kernel.
            kernel = self._start_in_own_thread()
            self._res.kernel = kernel
            return kernel

    def _start_in_own_thread(self) -> Kernel:
        """Start a kernel, a confined one from this sandbox's own long-lived thread.

        bubblewrap ends the sandbox when the *thread* that started it exits (Linux's
        parent-death signal follows threads), so a kernel started from a short-lived
        caller thread would die with it. The sandbox's worker thread lives until close().
        """
        start = functools.partial(
            start_kernel, self._workdir, self._limits, self._env, self._confinement
        )
        if not self._confinement.isolated:
            return start()
        executor = self._res.executor
        if executor is None:
            executor = self._res.executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=self._res.thread_prefix
            )
        if threading.current_thread().name.startswith(self._res.thread_prefix):
            return start()
        return executor.submit(start).result()

    def _move_to(self, workdir: Path, *, owned: bool) -> bool:
        """Point this sandbox's running kernel at ``workdir`` (for :class:`KernelPool`).

        Args:
            workdir: Resolved directory; created when missing.
            owned: Whether the sandbox should delete ``workdir`` on close.

        Returns:
            False when the kernel is not running, or the directory could not be created
            or changed to.
        """
        with self._res.lock:
            kernel = self._res.kernel
            if self._res.closed or kernel is None or not kernel.alive() or kernel.confined:
                return False  # a confined kernel sees only the workspace it started in
            try:
                workdir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                logger.warning("could not create working directory %s: %s", workdir, exc)
                return False
            if not self._chdir_kernel(kernel, workdir):
                return False
            self._workdir = workdir
            if owned:
                self._res.owned_dir = workdir
            return True

    def _execute(
        self, kernel: Kernel, code: str, timeout: float, *, silent: bool = False
    ) -> CallOutcome:
        """Run one piece of code on ``kernel`` (see :func:`~mappa_env.sandbox.calls.execute`)."""
        return execute(
            kernel,
            code,
            timeout,
            limits=self._limits,
            workdir=self._workdir,
            res=self._res,
            silent=silent,
        )

    def _watch_background_processes(self, kernel: Kernel) -> None:
        """Keep counting the kernel's processes and threads between calls while it has any."""
        limits = self._limits
        if (limits.max_processes is None and limits.max_threads is None) or (
            self._res.watcher is not None
        ):
            return
        watcher = threading.Thread(
            target=watch_idle_kernel,
            args=(self._res, kernel, limits, self._workdir),
            name=f"mappa-sandbox-watch-{kernel.pid}",
            daemon=True,
        )
        self._res.watcher = watcher
        watcher.start()
