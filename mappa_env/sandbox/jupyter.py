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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import signal
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from mappa_env._fs import remove_tree
from mappa_env.sandbox import _process
from mappa_env.sandbox._kernel import (
    Kernel,
    SandboxError,
    close_kernel_files,
    describe_exit,
    start_kernel,
    stop_kernel,
    wait_until_ready,
)
from mappa_env.sandbox.base import ExecError, ExecResult
from mappa_env.sandbox.isolation import (
    Confinement,
    IsolationMode,
    UidLease,
    resolve_confinement,
)
from mappa_env.sandbox.limits import SandboxLimits, kernel_environment
from mappa_env.sandbox.quota import (
    QUOTA_ERROR,
    WorkspaceUsage,
    quota_error,
    trim_workspace,
    workspace_usage,
)
from mappa_env.tempdirs import make_temp_dir
from mappa_env.text import truncate_middle

logger = logging.getLogger(__name__)

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: Surrogate code points: the only ones a ``str`` may hold that UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Wait this long after ``idle`` for the shell reply before giving up on it.
_REPLY_WAIT_S = 1.0
#: After the shell reply, wait this long for iopub's ``idle`` before deciding it was lost.
_IOPUB_AFTER_REPLY_S = 0.5
_MAX_TRACEBACK_CHARS = 20_000
#: How long close() waits for a call running in another thread to give up the kernel.
_CLOSE_WAIT_S = 10.0


def strip_ansi(text: str) -> str:
    """Remove terminal colour/cursor escape sequences from ``text``."""
    return _ANSI_ESCAPE.sub("", text)


def utf8_safe(text: str) -> str:
    """Return ``text`` with lone surrogates replaced by U+FFFD, so it encodes as UTF-8.

    A result that cannot be encoded would break whoever stores or sends it on (a JSON
    file, a model API request). Surrogate pairs are joined into the character they
    stand for; only unpaired halves are replaced.
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _unencodable_code_error(code: str) -> ExecError | None:
    """Describe why ``code`` cannot be sent to the kernel, or None when it can.

    Messages to the kernel are UTF-8; a lone surrogate (say, half of an emoji left by a
    JSON escape cut in the middle) cannot be encoded, so such code is refused unrun.

    Args:
        code: The code a caller wants to run.

    Returns:
        A ``UnicodeEncodeError`` naming the first offending character and where it is.
    """
    first = _SURROGATE.search(code)
    if first is None:
        return None
    count = len(_SURROGATE.findall(code))
    offset = first.start()
    line = code.count("\n", 0, offset) + 1
    column = offset - (code.rfind("\n", 0, offset) + 1) + 1
    # The message names the character by its code point: the character itself would
    # make this result as unencodable as the code.
    return ExecError(
        "UnicodeEncodeError",
        f"the code was not run: it contains {count} character(s) that cannot be encoded "
        f"as UTF-8 (lone surrogates, such as half of an emoji); the first is "
        f"U+{ord(first.group()):04X} at line {line}, column {column}. Remove or replace "
        "them and run the code again",
    )


# --------------------------------------------------------------------------------------
# Output collection
# --------------------------------------------------------------------------------------


class _BoundedText:
    """Collects streamed text keeping the head and a rolling tail of at most ``limit`` each.

    Memory stays bounded however much is appended, so ``while True: print(...)`` cannot
    exhaust this process; :meth:`text` then cuts to ``limit`` from the middle.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._head = ""
        self._tail: list[str] = []
        self._tail_chars = 0
        self.total_chars = 0

    def append(self, text: str) -> None:
        if not text:
            return
        self.total_chars += len(text)
        if len(self._head) < self._limit:
            room = self._limit - len(self._head)
            self._head += text[:room]
            text = text[room:]
            if not text:
                return
        self._tail.append(text)
        self._tail_chars += len(text)
        if self._tail_chars > 2 * self._limit:
            kept = "".join(self._tail)[-self._limit :]
            self._tail = [kept]
            self._tail_chars = len(kept)

    def text(self) -> tuple[str, bool]:
        """Return the collected text, cut to the limit, and whether it was cut."""
        full = self._head + "".join(self._tail)
        if self.total_chars <= self._limit:
            return full, False
        marker = f"\n...[output cut from the middle: {self.total_chars} characters in all]...\n"
        return truncate_middle(full, self._limit, marker=marker), True


# --------------------------------------------------------------------------------------
# Workspace tracking
# --------------------------------------------------------------------------------------

_FileStamp = tuple[int, int, int]


def _snapshot(root: str, cap: int) -> dict[str, _FileStamp] | None:
    """Map each file under ``root`` to (mtime, size, inode); None when over ``cap`` entries.

    Symbolic links are not followed (a link to ``/`` would make the scan unbounded);
    ``__pycache__`` directories are skipped.
    """
    stamps: dict[str, _FileStamp] = {}
    entries = 0
    prefix = len(root) + 1
    stack = [root]
    while stack:
        try:
            iterator = os.scandir(stack.pop())
        except OSError:
            continue
        with iterator:
            for entry in iterator:
                entries += 1
                if entries > cap:
                    return None
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(entry.path)
                        continue
                    stat = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                stamps[entry.path[prefix:]] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    return stamps


def _changed_files(
    before: dict[str, _FileStamp] | None, after: dict[str, _FileStamp] | None
) -> tuple[str, ...]:
    if before is None or after is None:
        return ()
    return tuple(sorted(path for path, stamp in after.items() if before.get(path) != stamp))


# --------------------------------------------------------------------------------------
# One call
# --------------------------------------------------------------------------------------


@dataclass
class _CallOutcome:
    """What the kernel reported for one execute request, before restart handling."""

    stdout: _BoundedText
    stderr: _BoundedText
    error: ExecError | None = None
    timed_out: bool = False
    interrupted_traceback: str = ""
    kill_reason: str | None = None  # set when the kernel must be killed and restarted
    kill_error: ExecError | None = None
    asked_exit: bool = False
    died: bool = False
    output_lost: bool = False
    closed: bool = False
    oom_kills_before: int = 0  # the cgroup's count when the call began
    over_quota: WorkspaceUsage | None = None  # the usage that broke the workspace quota


# --------------------------------------------------------------------------------------
# Sandbox
# --------------------------------------------------------------------------------------


class _Resources:
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
        self._res = _Resources(owned, lease)
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
        refused = _unencodable_code_error(code)
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
        before = _snapshot(root, self._limits.max_tracked_files)
        outcome = self._execute(kernel, code, timeout)
        error = outcome.error
        if outcome.closed:
            error = ExecError("SandboxClosed", "the sandbox was closed while the code ran")
        elif outcome.kill_reason is None and not outcome.died:
            over = _limit_error(kernel, self._limits)
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
        elif not outcome.closed and _left_running(kernel):
            self._watch_background_processes(kernel)

        stdout, stdout_cut = outcome.stdout.text()
        stderr, stderr_cut = outcome.stderr.text()
        if notes:
            stderr = "\n".join(notes) + ("\n" + stderr if stderr else "\n")
        after = _snapshot(root, self._limits.max_tracked_files)
        return ExecResult(
            stdout=utf8_safe(stdout),
            stderr=utf8_safe(stderr),
            error=_utf8_safe_error(error),
            timed_out=outcome.timed_out,
            duration_s=time.monotonic() - started,
            truncated=stdout_cut or stderr_cut,
            restarted=restarted,
            files_written=tuple(utf8_safe(n) for n in _changed_files(before, after)),
        )

    def _check_quota(self, outcome: _CallOutcome) -> None:
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
            error=_utf8_safe_error(error),
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
        self, kernel: Kernel, outcome: _CallOutcome, error: ExecError | None
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
    ) -> _CallOutcome:
        """Send one execute request and collect its output until the kernel is idle.

        The ``idle`` status on iopub normally ends the call. Iopub may lose messages, so
        the shell reply also ends it when ``idle`` has not followed shortly; and when a
        connection drops (a message above ``max_message_bytes``), the client reconnects
        and the call ends once the kernel answers again.
        """
        limits = self._limits
        outcome = _CallOutcome(
            _BoundedText(limits.max_output_chars), _BoundedText(limits.max_output_chars)
        )
        if kernel.cgroup is not None:
            outcome.oom_kills_before = kernel.cgroup.oom_kills()
        msg_id = self._send(kernel, code, silent)
        if msg_id is None:
            outcome.kill_reason = "the code could not be sent to it"
            outcome.kill_error = ExecError(
                "SandboxError",
                "the code could not be sent to the Python process, which was restarted; "
                "earlier variables are gone and the code did not run",
            )
            return outcome
        shell, iopub = kernel.client.shell_channel, kernel.client.iopub_channel
        deadline = time.monotonic() + timeout
        give_up_at: float | None = None  # set once interrupted
        next_check = time.monotonic() + limits.watch_interval_s
        next_quota_check = time.monotonic() + limits.workspace_watch_interval_s
        reply: dict[str, Any] | None = None
        reply_seen_at = 0.0
        reconnect = False
        while True:
            now = time.monotonic()
            if give_up_at is None and now >= deadline:
                outcome.timed_out = True
                _process.interrupt_group(kernel.process)
                give_up_at = now + limits.interrupt_grace_s
            elif give_up_at is not None and now >= give_up_at:
                outcome.kill_reason = "it did not stop after an interrupt"
                break
            if now >= next_check:
                next_check = now + limits.watch_interval_s
                if self._res.closed:
                    outcome.closed = True
                    return outcome
                if not kernel.alive():
                    outcome.died = True
                    break
                over = _limit_error(kernel, self._limits)
                if over is not None:
                    outcome.kill_reason, outcome.kill_error = "process limit", over
                    break
                if limits.workspace_bytes is not None and now >= next_quota_check:
                    usage = workspace_usage(self._workdir)
                    # A big workspace takes long to measure: measure it less often, so
                    # the watch costs the call at most about a tenth of its time.
                    spent = time.monotonic() - now
                    next_quota_check = now + max(limits.workspace_watch_interval_s, 10 * spent)
                    if usage.over(limits.workspace_bytes):
                        outcome.over_quota = usage
                        outcome.kill_reason = "workspace quota"
                        outcome.kill_error = ExecError(QUOTA_ERROR, "")
                        break
                if kernel.connection_lost():
                    outcome.output_lost = reconnect = True
                    break
                if reply is None:
                    reply = _matching_reply(shell, msg_id)
                    reply_seen_at = now
                elif now - reply_seen_at > _IOPUB_AFTER_REPLY_S:
                    outcome.output_lost = True
                    break
            wait = min(next_check, give_up_at or deadline) - now
            try:
                message = iopub.get_msg(timeout=max(wait, 0.001))
            except Empty:
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if _handle_iopub(message, outcome):
                break

        if outcome.output_lost and not outcome.kill_reason:
            self._resync(kernel, outcome, deadline, reconnect=reconnect)
        if outcome.timed_out:
            stopped = outcome.kill_reason is None
            outcome.error = ExecError(
                "TimeoutError",
                f"the code ran longer than {timeout:g} s and was interrupted"
                + ("" if stopped else "; it did not stop, so the Python process was restarted"),
                outcome.interrupted_traceback,
            )
            if not stopped:
                outcome.kill_error = outcome.error
        if outcome.kill_reason is None and not outcome.died:
            if reply is None and not reconnect:
                reply = _wait_reply(kernel.client.shell_channel, msg_id, _REPLY_WAIT_S)
            if reply is not None:
                _apply_reply(reply, outcome)
            if outcome.asked_exit:
                # ``exit()`` in IPython stops the kernel shortly after the reply.
                outcome.died = kernel.wait_exit(timeout=5)
                outcome.kill_reason = None if outcome.died else "exit requested"
        if outcome.output_lost:
            outcome.stderr.append(
                ("\n" if outcome.stderr.total_chars else "")
                + "[sandbox] some output of this call was lost: a single output larger "
                f"than {limits.max_message_bytes} bytes is dropped\n"
            )
        return outcome

    @staticmethod
    def _send(kernel: Kernel, code: str, silent: bool) -> str | None:
        """Send an execute request, reconnecting once if the shell connection is gone."""
        import zmq

        for attempt in range(2):
            try:
                if attempt:
                    kernel.connect()
                _drain(kernel.client.shell_channel)
                kernel.connection_lost()  # forget events from before this call
                return kernel.client.execute(
                    code,
                    silent=silent,
                    store_history=False,
                    allow_stdin=False,
                    stop_on_error=False,
                )
            except zmq.ZMQError as exc:
                logger.debug("kernel pid %d: sending failed (%s)", kernel.pid, exc)
        return None

    def _resync(
        self, kernel: Kernel, outcome: _CallOutcome, deadline: float, *, reconnect: bool
    ) -> None:
        """After lost messages, wait until the kernel answers on fresh, live channels.

        The kernel answers ``kernel_info`` only once the code has finished, so this
        also waits for the end of the call (interrupting it at ``deadline``).
        """
        import zmq

        try:
            if reconnect:
                kernel.connect()
            wait_until_ready(kernel, max(deadline, time.monotonic() + 1.0))
            return
        except zmq.ZMQError as exc:
            outcome.kill_reason = f"its connection could not be rebuilt ({exc})"
            return
        except SandboxError:
            if not kernel.alive():
                outcome.died = True
                return
        outcome.timed_out = True
        _process.interrupt_group(kernel.process)
        try:
            wait_until_ready(kernel, time.monotonic() + self._limits.interrupt_grace_s)
        except SandboxError:
            if kernel.alive():
                outcome.kill_reason = "it did not stop after an interrupt"
            else:
                outcome.died = True

    def _watch_background_processes(self, kernel: Kernel) -> None:
        """Keep counting the kernel's processes and threads between calls while it has any."""
        limits = self._limits
        if (limits.max_processes is None and limits.max_threads is None) or (
            self._res.watcher is not None
        ):
            return
        watcher = threading.Thread(
            target=_watch_idle_kernel,
            args=(self._res, kernel, limits, self._workdir),
            name=f"mappa-sandbox-watch-{kernel.pid}",
            daemon=True,
        )
        self._res.watcher = watcher
        watcher.start()


def _utf8_safe_error(error: ExecError | None) -> ExecError | None:
    """``error`` with every text field made encodable (see :func:`utf8_safe`)."""
    if error is None:
        return None
    fields = (error.name, error.value, error.traceback)
    safe = tuple(utf8_safe(text) for text in fields)
    return error if safe == fields else ExecError(*safe)


def _over_limit(kernel: Kernel, limits: SandboxLimits) -> tuple[str, int] | None:
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


def _limit_error(kernel: Kernel, limits: SandboxLimits) -> ExecError | None:
    """The error of a call after which the kernel is over a limit, or None."""
    over = _over_limit(kernel, limits)
    if over is None:
        return None
    what, limit = over
    counted = " (every thread of every process of the sandbox counts)" if what == "threads" else ""
    return ExecError(
        "ProcessLimitExceeded",
        f"the code had more than {limit} {what} running{counted}; all of its processes "
        "and the Python process were killed, and the Python process was restarted",
    )


def _left_running(kernel: Kernel) -> bool:
    """Whether earlier code left processes, or threads of its own, running in the kernel."""
    return bool(kernel.agent_processes(stop_after=0)) or (
        kernel.threads(stop_after=kernel.ready_threads) > kernel.ready_threads
    )


def _handle_iopub(message: dict[str, Any], outcome: _CallOutcome) -> bool:
    """Fold one iopub message into ``outcome``; return True when the request is done."""
    kind = message["msg_type"]
    content = message["content"]
    if kind == "stream":
        target = outcome.stderr if content.get("name") == "stderr" else outcome.stdout
        target.append(content.get("text", ""))
    elif kind in ("execute_result", "display_data"):
        text = content.get("data", {}).get("text/plain")
        if text:
            outcome.stdout.append(text if text.endswith("\n") else text + "\n")
    elif kind == "error":
        traceback = strip_ansi("\n".join(content.get("traceback", [])))
        name = content.get("ename", "Error")
        value = strip_ansi(content.get("evalue", ""))
        if outcome.timed_out and name == "KeyboardInterrupt":
            outcome.interrupted_traceback = traceback
        else:
            outcome.error = ExecError(name, value, truncate_middle(traceback, _MAX_TRACEBACK_CHARS))
    elif kind == "status":
        return content.get("execution_state") == "idle"
    return False


def _matching_reply(shell: Any, msg_id: str) -> dict[str, Any] | None:
    """The shell reply to ``msg_id`` if it has arrived (others are discarded), else None."""
    while shell.msg_ready():
        reply = shell.get_msg(timeout=0)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
    return None


def _wait_reply(shell: Any, msg_id: str, timeout: float) -> dict[str, Any] | None:
    """Wait up to ``timeout`` seconds for the shell reply to ``msg_id``."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            reply = shell.get_msg(timeout=remaining)
        except Empty:
            return None
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
    return None


def _apply_reply(reply: dict[str, Any], outcome: _CallOutcome) -> None:
    """Take from the execute reply what iopub may have missed: the error, an exit request."""
    content = reply.get("content", {})
    if content.get("status") == "error" and outcome.error is None and not outcome.timed_out:
        traceback = strip_ansi("\n".join(content.get("traceback", [])))
        outcome.error = ExecError(
            content.get("ename", "Error"),
            strip_ansi(content.get("evalue", "")),
            truncate_middle(traceback, _MAX_TRACEBACK_CHARS),
        )
    outcome.asked_exit = any(
        p.get("source") == "ask_exit" and not p.get("keepkernel")
        for p in content.get("payload", [])
    )


def _drain(channel: Any) -> None:
    while channel.msg_ready():
        channel.get_msg(timeout=0)


def _watch_idle_kernel(
    res: _Resources, kernel: Kernel, limits: SandboxLimits, workdir: Path
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
            over = _over_limit(kernel, limits)
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
            if not _left_running(kernel):
                res.watcher = None
                return
        finally:
            res.lock.release()
    res.watcher = None
