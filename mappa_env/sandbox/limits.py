"""Hard limits for sandboxed code, and the environment the code sees."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024**3

#: Parent-process variables the kernel inherits. Everything else (API keys, tokens,
#: cloud credentials) stays out: an allow-list, so a new secret cannot slip through.
ENV_ALLOW = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONHASHSEED",
        # Some Python builds and conda environments need these to load their libraries.
        "LD_LIBRARY_PATH",
        "SYSTEMROOT",
    }
)
#: Prefixes of inherited variables (locale settings).
ENV_ALLOW_PREFIXES = ("LC_",)

#: Variables that cap the threads and worker processes numeric libraries start.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "LOKY_MAX_CPU_COUNT",
)


@dataclass(frozen=True)
class SandboxLimits:
    """Hard limits for code run in a sandbox. ``None`` switches a limit off.

    Resource limits (``RLIMIT_*``) are set in the kernel process when it is launched and
    inherited by every process it starts; they count per process, not per sandbox.
    Running as root, code can raise them again: this is a fence against accidents and
    runaway code, not a security boundary against a determined attacker.

    Attributes:
        timeout_s: Wall-clock seconds one call may run (default 30). The code is then
            interrupted (``KeyboardInterrupt``); a call's own ``timeout`` overrides it.
        interrupt_grace_s: Seconds to wait for an interrupted call to stop before the
            kernel is killed and restarted (default 3; C code may ignore interrupts).
        start_timeout_s: Seconds a kernel may take to start (default 60; generous because
            many kernels may start at once on a loaded machine).
        memory_bytes: Data-segment limit (``RLIMIT_DATA``: heap and private anonymous
            memory) of the kernel, default 4 GiB. Allocations beyond it fail with
            ``MemoryError``. The address-space limit (``RLIMIT_AS``) is not used: below
            ~2 GB it breaks imports such as scipy, whose libraries reserve address space.
        cpu_seconds: CPU seconds the kernel process may use over its whole life, all
            its threads together (``RLIMIT_CPU``, default 600; each child process has
            its own budget). Past it the kernel is stopped by ``SIGXCPU`` and the
            sandbox restarts it, which resets the budget.
        open_files: Open file descriptors per process (``RLIMIT_NOFILE``, default 1024).
        file_size_bytes: Largest file a process may write (``RLIMIT_FSIZE``, default
            1 GiB); a larger write fails with ``OSError`` (errno EFBIG).
        max_processes: Most processes the kernel may have below it (children,
            grandchildren, ...; default 64). Checked while code runs and after each
            call; exceeding it kills the kernel with its whole tree (this is what stops
            a fork bomb: ``RLIMIT_NPROC`` is per user and not enforced for root).
        max_threads: Most threads of the whole sandbox, every thread of every process
            counted, the kernel's own (about 15, 30 with scikit-learn's worker
            processes) included (default 256). Threads cost the host a process slot
            each (``kernel.pid_max`` is often 32,768), and ``max_processes`` alone let
            1,000 threads through. With namespace isolation and a ``pids`` cgroup (v1 or
            v2, where this process may make one) the kernel refuses the thread or
            process past the limit (the code sees ``RuntimeError: can't start new
            thread`` or ``BlockingIOError``); everywhere the sandbox also counts them
            while code runs, after each call and while the kernel idles, and kills the
            kernel with its tree past the limit.
        user_processes: Optional ``RLIMIT_NPROC`` (default None). It counts every
            process *and thread* of the user, not of the sandbox, and root ignores it, so
            it is only useful for a dedicated unprivileged user: a confined sandbox run
            by root has a user of its own (see :mod:`mappa_env.sandbox.isolation`).
        max_output_chars: Characters kept of stdout and of stderr per call (default
            20,000); longer output is cut from the middle so its end (where tracebacks
            are) survives. Collection stops growing once past the limit.
        max_message_bytes: Largest single output message accepted from the kernel
            (default 64 MiB); larger ones are dropped before they reach this process's
            memory (the call then ends by timeout, its output lost).
        numeric_threads: Threads/worker processes numeric libraries may start (OpenMP,
            BLAS, numexpr, joblib's loky), default ``min(4, cpus)``; keeps many
            concurrent kernels from each starting one thread per core.
        watch_interval_s: Seconds between process-tree checks while code runs (0.05).
        idle_watch_interval_s: Seconds between process-tree checks while the kernel is
            idle but has left processes running in the background (0.5).
        max_tracked_files: Workspace entries scanned for ``files_written``; a bigger
            workspace is not tracked (default 5,000, keeps the scan under a millisecond
            or so per call).
        total_memory_bytes: Memory of the whole sandbox (every process, shared memory
            and its private ``/tmp`` and ``/dev/shm`` together), default 4 GiB; enforced
            by a cgroup with namespace isolation where this process may make cgroups
            (see :mod:`mappa_env.sandbox.isolation`), else not at all: then only each
            process's ``memory_bytes`` holds.
        tmp_bytes: Size of each of a confined sandbox's private ``/tmp`` and ``/dev/shm``
            (tmpfs, memory-backed), default 1 GiB.
        workspace_bytes: Disk quota of the workspace (default 1 GiB), confined or not:
            what its files take on disk (see :mod:`mappa_env.sandbox.quota`). The
            sandbox measures the workspace while code runs (every
            ``workspace_watch_interval_s``, or less often when a measurement takes
            long) and after each call; code that takes it over the quota is stopped
            (the Python process is restarted) and what it wrote is deleted until the
            workspace is back under, and the call's error is ``WorkspaceQuotaExceeded``.
            No single file may grow past it either (``RLIMIT_FSIZE`` is the smaller of
            it and ``file_size_bytes``).
        workspace_watch_interval_s: Seconds between workspace measurements while code
            runs (0.05; they come with the process-tree checks, every
            ``watch_interval_s``): what code writes between two measurements stays on
            disk that long, then is deleted.
    """

    timeout_s: float = 30.0
    interrupt_grace_s: float = 3.0
    start_timeout_s: float = 60.0
    memory_bytes: int | None = 4 * GIB
    cpu_seconds: int | None = 600
    open_files: int | None = 1024
    file_size_bytes: int | None = 1 * GIB
    max_processes: int | None = 64
    max_threads: int | None = 256
    user_processes: int | None = None
    max_output_chars: int = 20_000
    max_message_bytes: int = 64 * 1024**2
    numeric_threads: int | None = min(4, os.cpu_count() or 1)
    watch_interval_s: float = 0.05
    idle_watch_interval_s: float = 0.5
    max_tracked_files: int = 5_000
    total_memory_bytes: int | None = 4 * GIB
    tmp_bytes: int | None = 1 * GIB
    workspace_bytes: int | None = 1 * GIB
    workspace_watch_interval_s: float = 0.05

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "interrupt_grace_s",
            "start_timeout_s",
            "watch_interval_s",
            "workspace_watch_interval_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in (
            "memory_bytes",
            "cpu_seconds",
            "open_files",
            "file_size_bytes",
            "max_processes",
            "max_threads",
            "user_processes",
            "numeric_threads",
            "total_memory_bytes",
            "tmp_bytes",
            "workspace_bytes",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.max_output_chars < 64:
            raise ValueError(f"max_output_chars must be >= 64, got {self.max_output_chars}")

    def rlimits(self) -> dict[str, list[int]]:
        """The ``RLIMIT_*`` settings as ``{name: [soft, hard]}`` (``-1``: unlimited).

        Returns:
            The mapping the kernel launcher applies.
        """
        spec: dict[str, list[int]] = {}
        if self.memory_bytes is not None:
            spec["RLIMIT_DATA"] = [self.memory_bytes, self.memory_bytes]
        if self.cpu_seconds is not None:
            # The soft limit sends SIGXCPU (which ends Python); the hard one, a little
            # later, SIGKILL in case the signal is caught or ignored.
            spec["RLIMIT_CPU"] = [self.cpu_seconds, self.cpu_seconds + 5]
        if self.open_files is not None:
            spec["RLIMIT_NOFILE"] = [self.open_files, self.open_files]
        sizes = [b for b in (self.file_size_bytes, self.workspace_bytes) if b is not None]
        if sizes:
            # A single file past the quota is refused at the write (EFBIG), not found later.
            spec["RLIMIT_FSIZE"] = [min(sizes), min(sizes)]
        if self.user_processes is not None:
            spec["RLIMIT_NPROC"] = [self.user_processes, self.user_processes]
        return spec


def inherited_import_paths(parent: Mapping[str, str] | None = None) -> list[str]:
    """Directories on this process's ``PYTHONPATH``, as real paths, for the kernel.

    The kernel runs this interpreter, so it sees the same installed packages; packages
    reachable only through ``PYTHONPATH`` would be missing, because the variable is not
    on the environment allow-list. The launcher puts these directories on the kernel's
    ``sys.path`` itself. Relative entries are resolved against this process's working
    directory (what they mean here), never the workspace's; missing ones are dropped.
    Symbolic links are resolved: a confined kernel sees bound directories only at their
    real paths.

    Args:
        parent: Environment to read, default ``os.environ``.

    Returns:
        Existing directories in ``PYTHONPATH`` order, without duplicates.
    """
    source: Mapping[str, Any] = os.environ if parent is None else parent
    paths: list[str] = []
    for entry in str(source.get("PYTHONPATH", "")).split(os.pathsep):
        if not entry:
            continue  # an empty entry means the current directory: never the workspace
        path = os.path.realpath(entry)
        if os.path.isdir(path) and path not in paths:
            paths.append(path)
    return paths


def kernel_environment(
    limits: SandboxLimits,
    extra: Mapping[str, str] | None = None,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build the kernel's environment from an allow-list of the parent's variables.

    Args:
        limits: Supplies the numeric-library thread caps.
        extra: Variables to add or override (the caller's explicit choice).
        parent: Environment to filter, default ``os.environ``.

    Returns:
        The environment for the kernel process.
    """
    source: Mapping[str, Any] = os.environ if parent is None else parent
    env = {
        key: value
        for key, value in source.items()
        if key in ENV_ALLOW or key.startswith(ENV_ALLOW_PREFIXES)
    }
    env.setdefault("PATH", os.defpath)
    if limits.numeric_threads is not None:
        for key in THREAD_ENV_VARS:
            env[key] = str(limits.numeric_threads)
    # Tracebacks and warnings are read by models: keep them free of colour codes.
    env["NO_COLOR"] = "1"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # silences a debugger warning at start
    if extra:
        env.update({str(key): str(value) for key, value in extra.items()})
    return env
