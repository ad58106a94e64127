"""The kernel process: launch under limits, connect, wait until ready, stop.

Used by :mod:`mappa_env.sandbox.jupyter`; nothing here decides what a call's result is.
:class:`~mappa_env.sandbox.errors.SandboxError` is imported here from its home,
:mod:`mappa_env.sandbox.errors`, for callers that import it from this module.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any

from mappa_env._async import run_sync
from mappa_env.sandbox import _process
from mappa_env.sandbox.errors import CGROUP_JOIN_FAILED, SandboxError
from mappa_env.sandbox.limits import SandboxLimits, inherited_import_paths
from mappa_env.tempdirs import make_temp_dir
from mappa_env.text import truncate_middle

if TYPE_CHECKING:
    from mappa_env.sandbox.cgroups import SandboxCgroup
    from mappa_env.sandbox.confinement import Confinement

logger = logging.getLogger(__name__)

#: Kernel options: no history database (dozens of kernels would contend for one SQLite
#: file in the user's home) and no colour codes in tracebacks.
_KERNEL_ARGS = ("--HistoryManager.enabled=False", "--InteractiveShell.colors=nocolor")
#: A request socket whose connection dropped would otherwise block a send forever.
_SEND_TIMEOUT_MS = 5_000


@functools.cache
def launcher_source() -> str:
    """Source of the kernel launcher, passed to the interpreter with ``-c``."""
    return (Path(__file__).with_name("_launcher.py")).read_text(encoding="utf-8")


#: The soft open-file limit the first kernel of a process asks for (never above the hard
#: limit, never lowered): room for about 5,000 live kernels' sockets and pipes.
OPEN_FILES_WANTED = 65536


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``wanted`` or its hard limit.

    Args:
        wanted: The soft limit asked for; a higher one is left as it is.

    Returns:
        The soft limit after the call (unchanged where it was already as high, or where
        the system refused).
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            logger.debug("could not raise the open-file limit to %d: %s", target, exc)
            return soft
        logger.info("open-file limit of this process raised from %d to %d", soft, target)
        return target
    return soft


@functools.cache
def _zmq_context(max_message_bytes: int) -> Any:
    """A ZeroMQ context whose sockets refuse messages above ``max_message_bytes``.

    Shared by all sandboxes with the same limit (a context per kernel would cost an I/O
    thread each). Setting the option on the context applies it before each socket
    connects, which is when ZeroMQ reads it.

    A live kernel holds 8 sockets of its context (its channels, control and monitor
    sockets, measured), and a context allows 1,023 by default: a process stopped at 127
    kernels at once, every later start failing with "Too many open files" (a sweep of
    two runs evaluating 64 episodes at once on a GPU machine did). The cap is raised to
    what ZeroMQ allows, so the process's own open-file limit is the one that counts;
    that limit's soft value is raised as far as its hard one allows (up to
    :data:`OPEN_FILES_WANTED`), as Jupyter's server does: a live kernel holds about
    a dozen of its parent's open files, and a soft limit of 1,024 (common) would stop a
    process at about 70 kernels.
    """
    import zmq

    raise_open_files_limit(OPEN_FILES_WANTED)
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, context.get(zmq.SOCKET_LIMIT))
    context.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    context.setsockopt(zmq.LINGER, 0)
    context.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
    return context


@functools.cache
def _manager_class() -> type:
    """KernelManager that launches our limited command instead of an installed kernel spec.

    An installed ``python3`` kernel spec may point at another interpreter; the sandbox
    must run this interpreter (``sys.executable``) through its launcher. A confined
    kernel runs as another user, who must be able to read its connection file.
    """
    from jupyter_client import KernelManager

    class _SandboxKernelManager(KernelManager):
        def __init__(
            self, *, sandbox_spec: Any, owner: tuple[int, int] | None = None, **kwargs: Any
        ) -> None:
            super().__init__(**kwargs)
            self._sandbox_spec = sandbox_spec
            self._owner = owner

        @property
        def kernel_spec(self) -> Any:
            return self._sandbox_spec

        def write_connection_file(self, **kwargs: Any) -> None:
            super().write_connection_file(**kwargs)
            if self._owner is not None:
                os.chown(self.connection_file, *self._owner)

    return _SandboxKernelManager


@dataclass
class Kernel:
    """One running kernel process with its manager and client.

    For a confined kernel, ``process`` is bubblewrap's, which runs the interpreter in its
    namespaces: ``pid`` and the exit status are bubblewrap's, which reports a child
    killed by signal N as exit status 128 + N (translated back by :meth:`exit_status`).
    """

    manager: Any
    process: subprocess.Popen
    runtime_dir: Path
    client: Any = None
    monitors: list[Any] = field(default_factory=list)
    confined: bool = False
    cgroup: SandboxCgroup | None = None
    #: The ``pids`` cgroup, where it is not ``cgroup`` itself (a v1 hierarchy of its own).
    pids_cgroup: SandboxCgroup | None = None
    #: Threads of the kernel's tree when it first answered (what it runs by itself).
    ready_threads: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def threads(self, stop_after: int) -> int:
        """Threads of every process of the kernel's tree, counted up to ``stop_after``."""
        return _process.tree_threads(self.pid, stop_after=stop_after)

    @property
    def hidden_descendants(self) -> int:
        """Host descendants that are not the agent's processes.

        Under the bubblewrap process of a confined kernel: its init and the interpreter.
        """
        return 2 if self.confined else 0

    def agent_processes(self, stop_after: int | None = None) -> list[int]:
        """Pids of the processes the agent's code started (counted up to ``stop_after``)."""
        hidden = self.hidden_descendants
        found = _process.descendant_pids(
            self.pid, stop_after=None if stop_after is None else stop_after + hidden
        )
        return found[hidden:]

    def connect(self) -> None:
        """(Re)create the client's shell and iopub sockets, watched for disconnection.

        ZeroMQ ends a connection for good when a message exceeds ``MAXMSGSIZE`` (it
        counts as a protocol error, which is never retried), so recovering from an
        oversized message means new sockets.
        """
        import zmq
        from jupyter_client.session import Session

        self.disconnect()
        # A fresh session gives the shell socket a new identity: a reply still addressed
        # to the old one (possibly the oversized message) is then dropped by the kernel
        # instead of being delivered to, and ending, the new connection.
        session = Session(
            key=self.manager.session.key,
            signature_scheme=self.manager.session.signature_scheme,
        )
        self.client = self.manager.client(context=self.manager.context, session=session)
        self.client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        self.monitors = [
            channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            for channel in (self.client.shell_channel, self.client.iopub_channel)
        ]

    def disconnect(self) -> None:
        """Close the client's sockets and their monitors."""
        if self.client is not None:
            # Monitoring must stop before the monitor sockets close: ZeroMQ's I/O thread
            # blocks sending an event to a monitor socket that has no reader any more.
            for channel in (self.client.shell_channel, self.client.iopub_channel):
                if channel.socket is not None and self.monitors:
                    channel.socket.disable_monitor()
        for monitor in self.monitors:
            monitor.close(linger=0)
        self.monitors = []
        if self.client is not None:
            self.client.stop_channels()
            self.client = None

    def connection_lost(self) -> bool:
        """True when the shell or iopub connection dropped since the last check."""
        lost = False
        for monitor in self.monitors:
            while monitor.poll(0):
                monitor.recv_multipart()
                lost = True
        return lost

    def exit_status(self) -> int | None:
        """``Popen.returncode`` semantics (negative: killed by that signal), or None.

        Unlike ``Popen.poll`` this does not reap a dead kernel: until it is reaped its
        pid, which is also its process-group id, cannot be taken by an unrelated
        process, so killing the group stays safe.
        """
        status = self._raw_exit_status()
        if self.confined and status is not None and status > 128:
            return -(status - 128)  # bubblewrap's report of a child killed by a signal
        return status

    def _raw_exit_status(self) -> int | None:
        if self.process.returncode is not None:
            return self.process.returncode
        if not hasattr(os, "waitid"):
            return self.process.poll()
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.process.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def alive(self) -> bool:
        return self.exit_status() is None

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the kernel to end, without reaping it."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def fault_report(self, max_chars: int = 4000) -> str:
        """Fatal-error traceback the kernel wrote when it crashed (may be empty)."""
        return truncate_middle(read_log(self.runtime_dir / FAULT_LOG).strip(), max_chars)


#: Files the kernel writes in its runtime directory, and the directory of its sockets.
FAULT_LOG, STARTUP_LOG, SOCKETS = "fault.log", "startup-error.log", "sockets"
#: What bubblewrap writes before a confined kernel runs (its refusal to start one).
BWRAP_LOG = "bwrap.log"
_LOG_READ_BYTES = 64 * 1024


def read_log(path: Path, max_bytes: int = _LOG_READ_BYTES) -> str:
    """The end of a log the kernel wrote, read as a regular file only, never a link.

    The kernel's code can write these files (a confined kernel cannot replace them: see
    :func:`start_kernel`); reading stays bounded and refuses anything but a regular
    file, so a log can neither point at another file nor stall the reader.
    """
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            return ""
        os.lseek(handle, max(0, info.st_size - max_bytes), os.SEEK_SET)
        return os.read(handle, max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(handle)


def _confined_runtime_dir(runtime_dir: Path, owner: tuple[int, int] | None) -> None:
    """Lay out a confined kernel's runtime directory so that it cannot be tampered with.

    Inside, the directory is mounted read-only; only the socket directory and the two
    log files (made here, empty) are writable, each bound in place, so the kernel's code
    can neither replace a log with a link to a file it should not read (which the
    environment would then read for it) nor change its connection file.
    """
    os.chmod(runtime_dir, 0o755)
    for name in (FAULT_LOG, STARTUP_LOG):
        (runtime_dir / name).touch(mode=0o600)
    if owner is not None:
        for name in (SOCKETS, FAULT_LOG, STARTUP_LOG):
            os.chown(runtime_dir / name, *owner)


def start_kernel(
    cwd: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    confinement: Confinement | None = None,
) -> Kernel:
    """Launch a kernel in ``cwd`` under ``limits`` and wait until it answers.

    The launcher runs in Python's isolated mode (``-I``): neither the working directory
    (agents' workspace) nor ``PYTHONPATH`` is on its path, so a module planted in the
    workspace cannot shadow the modules the kernel starts with.

    Args:
        cwd: The kernel's working directory.
        limits: Resource limits.
        env: The kernel's environment.
        confinement: How to confine the kernel (see
            :mod:`mappa_env.sandbox.isolation`); ``None`` runs it directly.

    Raises:
        SandboxError: If the kernel does not start or answer within the start timeout.
    """
    import zmq
    from jupyter_client.kernelspec import KernelSpec

    confined = confinement is not None and confinement.isolated
    started = time.monotonic()
    try:
        runtime_dir = make_temp_dir("kernel")
        (runtime_dir / SOCKETS).mkdir(mode=0o700)
        if confined:
            assert confinement is not None
            _confined_runtime_dir(runtime_dir, confinement.workspace_user(cwd))
    except OSError as exc:
        raise SandboxError(f"could not create the kernel's runtime directory: {exc}") from exc
    spec = {
        "rlimits": limits.rlimits(),
        "subreaper": True,
        "fault_log": str(runtime_dir / FAULT_LOG),
        "startup_error_log": str(runtime_dir / STARTUP_LOG),
        # The launcher runs with -I, which ignores PYTHONPATH: both this process's and
        # one given in the kernel's own environment are put on its path explicitly.
        "sys_path": list(dict.fromkeys([*inherited_import_paths(), *inherited_import_paths(env)])),
        # bubblewrap's refusal goes to a file (read by _start_failure); the kernel's own
        # stderr to /dev/null, as for an unconfined kernel.
        "quiet_stderr": confined,
    }
    argv = [
        sys.executable,
        "-I",
        "-c",
        launcher_source(),
        json.dumps(spec),
        "-f",
        "{connection_file}",
        *_KERNEL_ARGS,
    ]
    cgroup = pids_cgroup = None
    if confined:
        assert confinement is not None
        # Inside its PID namespace the kernel's parent is bubblewrap's init (pid 1), which
        # ipykernel would take for "my parent has died" and exit; bubblewrap ends the
        # kernel with this process instead (--die-with-parent).
        argv.append("--IPKernelApp.parent_handle=0")
        cgroup, pids_cgroup = _make_cgroups(confinement, limits)
        argv = confinement.command(
            argv,
            workdir=cwd,
            writable=[runtime_dir / n for n in (SOCKETS, FAULT_LOG, STARTUP_LOG)],
            read_only=[*(Path(p) for p in spec["sys_path"]), runtime_dir],
            tmp_bytes=limits.tmp_bytes,
            cgroup_procs=[c.procs_file for c in (cgroup, pids_cgroup) if c is not None],
        )
        env = confinement.environment(env)
    kernel_spec = KernelSpec(
        argv=argv, display_name="mappa sandbox", language="python", interrupt_mode="signal"
    )
    context = _zmq_context(limits.max_message_bytes)
    # IPC sockets in a private directory: no TCP port races between kernels started at
    # the same moment by other processes, and nothing listening on the network.
    use_ipc = os.name == "posix"
    manager = _manager_class()(
        sandbox_spec=kernel_spec,
        owner=confinement.workspace_user(cwd) if confined and confinement is not None else None,
        transport="ipc" if use_ipc else "tcp",
        ip=str(runtime_dir / SOCKETS / "kernel") if use_ipc else "127.0.0.1",
        connection_file=str(runtime_dir / "connection.json"),
        context=context,
    )
    try:
        # What bubblewrap says before the kernel runs (a refusal) is kept for the error.
        stderr: Any = open(runtime_dir / BWRAP_LOG, "wb") if confined else subprocess.DEVNULL  # noqa: SIM115
        try:
            # The coroutine behind jupyter-client's sync ``start_kernel``, on a loop of
            # our own: see close_kernel_files for why the sync wrapper fails in worker
            # threads.
            run_sync(
                manager._async_start_kernel(
                    cwd=str(cwd), env=env, stdout=subprocess.DEVNULL, stderr=stderr
                )
            )
        finally:
            if stderr is not subprocess.DEVNULL:
                stderr.close()
    except (OSError, RuntimeError, zmq.ZMQError) as exc:
        launched = getattr(manager.provisioner, "process", None)
        if launched is not None:
            # A start can fail after the process was launched (connecting the manager's
            # control socket comes after the launch): stop it as any kernel is stopped,
            # or it outlives its sandbox.
            stop_kernel(
                Kernel(manager, launched, runtime_dir, confined=confined, cgroup=cgroup,
                       pids_cgroup=pids_cgroup)
            )  # fmt: skip
        else:
            _remove_runtime(runtime_dir, cgroup, pids_cgroup)
        raise SandboxError(
            f"could not launch the kernel process: {describe_start_error(exc)}"
        ) from exc
    kernel = Kernel(
        manager,
        manager.provisioner.process,
        runtime_dir,
        confined=confined,
        cgroup=cgroup,
        pids_cgroup=pids_cgroup,
    )
    try:
        kernel.connect()
        wait_until_ready(kernel, started + limits.start_timeout_s)
        kernel.ready_threads = kernel.threads(stop_after=limits.max_threads or 10_000)
    except zmq.ZMQError as exc:
        stop_kernel(kernel)
        raise SandboxError(f"could not connect to the kernel: {describe_start_error(exc)}") from exc
    except SandboxError:
        stop_kernel(kernel)
        raise
    logger.debug(
        "kernel started: pid %d in %s (%.3f s)", kernel.pid, cwd, time.monotonic() - started
    )
    return kernel


def describe_start_error(exc: BaseException) -> str:
    """``exc`` as text; for running out of open files, with this process's count and limit.

    Each live kernel holds about a dozen of its parent's open files (sockets, pipes), so
    many kernels at once in one process (episodes in flight, evaluation sets, the runs
    of a sweep) reach the limit; the message says so and what to change.
    """
    import errno
    import resource

    if getattr(exc, "errno", None) != errno.EMFILE:
        return str(exc)
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        held = len(os.listdir("/proc/self/fd"))
    except OSError:
        held = -1
    count = f"{held} open" if held >= 0 else "open"
    return (
        f"{exc} ({count} files of this process's limit of {soft}: fewer kernels at once "
        f"(episodes in flight, evaluation sets, runs of a sweep) or a higher limit, "
        f"`ulimit -n`)"
    )


def _make_cgroups(
    confinement: Confinement, limits: SandboxLimits
) -> tuple[SandboxCgroup | None, SandboxCgroup | None]:
    """The kernel's memory cgroup and, where it is another one, its ``pids`` cgroup.

    On a unified (v2) hierarchy that delegates both controllers one cgroup takes both
    limits; on v1 each controller has its own hierarchy, so a second cgroup holds the
    ``pids`` limit. The ``pids`` limit is ``max_threads``: the cgroup holds the tasks the
    sandbox counts on the host (bubblewrap, its init, the kernel and everything below),
    so code meets the kernel's refusal before the host-side count would kill it.
    """
    memory = limits.total_memory_bytes
    tasks = limits.max_threads
    memory_parent, pids_parent = confinement.cgroups, confinement.pids_cgroups
    if memory is None:
        memory_parent = None
    if tasks is None:
        pids_parent = None
    same = (
        memory_parent is not None
        and pids_parent is not None
        and memory_parent.version == pids_parent.version == 2
        and memory_parent.path == pids_parent.path
    )
    if same:
        assert memory_parent is not None
        return memory_parent.create(memory_bytes=memory, max_tasks=tasks), None
    cgroup = None if memory_parent is None else memory_parent.create(memory_bytes=memory)
    pids_cgroup = None if pids_parent is None else pids_parent.create(max_tasks=tasks)
    return cgroup, pids_cgroup


def wait_until_ready(kernel: Kernel, deadline: float) -> None:
    """Block until the kernel answers ``kernel_info`` on shell *and* iopub.

    Seeing the request's ``idle`` status on iopub proves the subscription is live, so no
    output of the first call can be lost. (jupyter-client's ``wait_for_ready`` spends a
    fixed 0.2-0.4 s flushing iopub; this returns as soon as both answers are in.)
    """
    import zmq

    client = kernel.client
    shell, iopub = client.shell_channel, client.iopub_channel
    poller = zmq.Poller()
    poller.register(shell.socket, zmq.POLLIN)
    poller.register(iopub.socket, zmq.POLLIN)
    while True:
        msg_id = client.kernel_info()
        replied = idle = False
        retry_at = time.monotonic() + 1.0
        while not idle:
            now = time.monotonic()
            if not kernel.alive():
                raise SandboxError(_start_failure(kernel))
            if now >= deadline:
                raise SandboxError(
                    f"kernel pid {kernel.pid} did not answer within the start timeout"
                )
            if now >= retry_at:
                break  # resend: a reply or status published before we subscribed is lost
            for socket, _ in poller.poll(50):
                channel = shell if socket is shell.socket else iopub
                message = channel.get_msg(timeout=0)
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                if channel is shell:
                    replied = True
                    retry_at = min(retry_at, time.monotonic() + 0.2)
                elif message["msg_type"] == "status":
                    idle = message["content"]["execution_state"] == "idle"
        if replied and idle:
            return
        if idle:  # the reply is on its way; take it so it does not linger
            try:
                shell.get_msg(timeout=0.5)
            except Empty:
                pass
            return


def _start_failure(kernel: Kernel) -> str:
    status = kernel.exit_status()
    detail = ""
    try:
        detail = read_log(kernel.runtime_dir / STARTUP_LOG).strip()
    except OSError:
        pass
    if kernel.confined and status == CGROUP_JOIN_FAILED:
        return (
            "the kernel process could not join its memory or pids cgroup; pass "
            "SandboxLimits(total_memory_bytes=None) or SandboxLimits(max_threads=None) "
            "to run without one"
        )
    refusal = _bwrap_refusal(kernel) if kernel.confined else ""
    if refusal and not detail:
        return f"bubblewrap refused to start the kernel ({describe_exit(status)}): {refusal}"
    message = f"the kernel process exited during start ({describe_exit(status)})"
    return f"{message}:\n{truncate_middle(detail, 4000)}" if detail else message


def _bwrap_refusal(kernel: Kernel, lines: int = 5) -> str:
    """The first lines bubblewrap wrote before the kernel ran ("" when it wrote none)."""
    try:
        with open(kernel.runtime_dir / BWRAP_LOG, "rb") as log:
            text = log.read(4000).decode("utf-8", "replace")
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text.strip().splitlines()[:lines])


def stop_kernel(kernel: Kernel) -> None:
    """Kill the kernel and its process tree, close its sockets, delete its files."""
    _process.kill_tree(kernel.process)
    close_kernel_files(kernel)


def close_kernel_files(kernel: Kernel) -> None:
    """Close the sockets of a killed kernel and delete its runtime directory."""
    import zmq

    try:
        kernel.disconnect()
        # jupyter-client's sync wrappers (``cleanup_resources``, ``start_kernel``) run
        # their coroutine on the event loop a context variable remembers, making a new
        # loop (never closed) where there is none; a worker thread that inherited the
        # context of a thread running that loop (``asyncio.to_thread`` does) cannot run
        # it at all. The cleanup was then dropped unawaited, leaving the control socket,
        # zmq context and ports of every closed kernel behind. Run on a loop of our own,
        # closed afterwards, the coroutine always completes.
        run_sync(kernel.manager._async_cleanup_resources(), timeout=30.0)
    except (OSError, RuntimeError, TimeoutError, zmq.ZMQError) as exc:
        # Closing sockets of a dead kernel can fail at interpreter exit; the files are
        # removed below regardless.
        logger.debug("closing kernel %d resources: %s", kernel.pid, exc)
    _remove_runtime(kernel.runtime_dir, kernel.cgroup, kernel.pids_cgroup)
    logger.debug("kernel stopped: pid %d", kernel.pid)


def _remove_runtime(runtime_dir: Path, *cgroups: SandboxCgroup | None) -> None:
    """Delete a kernel's runtime directory and its cgroups."""
    shutil.rmtree(runtime_dir, ignore_errors=True)
    for cgroup in cgroups:
        if cgroup is not None:
            cgroup.remove()  # also kills anything of the sandbox still in it


def describe_exit(status: int | None) -> str:
    if status is None:
        return "still running"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}"
    return f"exit status {status}"
