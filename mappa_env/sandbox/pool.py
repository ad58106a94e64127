"""A warm pool of started kernels, so that an episode does not wait for a kernel start."""

from __future__ import annotations

import logging
import shutil
import threading
import weakref
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from mappa_env.sandbox.isolation import Confinement, refuse_unconfined
from mappa_env.sandbox.jupyter import JupyterSandbox, SandboxError
from mappa_env.sandbox.limits import SandboxLimits
from mappa_env.tempdirs import make_temp_dir

logger = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0


class _PoolState:
    """The pool's shared state: the refill thread and the finalizer hold this, not the pool."""

    def __init__(self, size: int, limits: SandboxLimits, env: Mapping[str, str] | None) -> None:
        self.size = size
        self.limits = limits
        self.env = dict(env) if env else None
        # Pooled kernels wait here, in an empty directory, until they are handed out.
        self.neutral_dir = make_temp_dir("pool").resolve()
        self.ready: deque[JupyterSandbox] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.hits = 0
        self.misses = 0
        self.thread: threading.Thread | None = None

    def refill_forever(self) -> None:
        """Start kernels until ``size`` are ready; sleep while the pool is full."""
        backoff = 1.0
        while True:
            with self.cond:
                while not self.closed and len(self.ready) >= self.size:
                    self.cond.wait()
                if self.closed:
                    return
            sandbox = JupyterSandbox(self.neutral_dir, self.limits, env=self.env, isolation="none")
            try:
                sandbox.start()
            except SandboxError as exc:
                sandbox.close()
                logger.warning("pool: kernel start failed (%s); retrying in %.0f s", exc, backoff)
                with self.cond:
                    self.cond.wait_for(lambda: self.closed, timeout=backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            backoff = 1.0
            with self.cond:
                if not self.closed:
                    self.ready.append(sandbox)
                    self.cond.notify_all()
                    continue
            sandbox.close()
            return

    def take(self) -> JupyterSandbox | None:
        """Pop the oldest ready sandbox whose kernel is alive, or None."""
        dead: list[JupyterSandbox] = []
        found = None
        with self.cond:
            while self.ready:
                candidate = self.ready.popleft()
                if candidate.kernel_pid is not None:
                    found = candidate
                    break
                dead.append(candidate)
            self.cond.notify_all()  # wake the refill thread
        for sandbox in dead:
            sandbox.close()
        return found

    def close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            idle = list(self.ready)
            self.ready.clear()
            self.cond.notify_all()
        for sandbox in idle:
            sandbox.close()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            # At most one start is in flight; the thread closes that kernel itself.
            thread.join(timeout=self.limits.start_timeout_s)
        shutil.rmtree(self.neutral_dir, ignore_errors=True)
        logger.debug("pool closed (%d hits, %d misses)", self.hits, self.misses)


class KernelPool:
    """Keeps ``size`` kernels started in the background and hands them out as sandboxes.

    The pool is a :class:`~mappa_env.sandbox.base.SandboxFactory`: ``pool(workdir)``
    returns a :class:`JupyterSandbox` whose kernel is already running. Pooled kernels
    wait in an empty directory of their own; on hand-out the kernel changes its working
    directory to ``workdir`` (before any agent code runs), and the sandbox tracks
    files and restarts there. A background thread refills the pool; when it is empty
    the hand-out falls back to a cold sandbox (started on its first call).

    Handed-out sandboxes belong to the caller, who closes them; :meth:`close` stops the
    refill thread and the kernels still waiting in the pool.

    Pooled kernels are not isolated (``isolation="none"``): they start before the
    workspace they will run in exists, and a confined kernel sees only the directories
    bound when it started. For agents that must not reach past their workspace, use
    ``JupyterSandbox.factory(isolation="namespaces")``: environments start each such
    sandbox ahead, in the next episode's own workspace (their ``prestart_sandbox``).

    Args:
        size: Kernels kept ready (0 disables pre-starting; every hand-out is cold).
        limits: Limits of every sandbox handed out.
        env: Extra kernel environment variables of every sandbox handed out.
        isolation: Only ``"none"``, stated so that callers see it.

    Raises:
        ValueError: If ``size`` is negative, or ``isolation`` is not ``"none"``.
        IsolationUnavailableError: When ``MAPPA_REQUIRE_ISOLATION`` is set (its
            kernels are never confined).
    """

    def __init__(
        self,
        size: int = 2,
        limits: SandboxLimits | None = None,
        *,
        env: Mapping[str, str] | None = None,
        isolation: str = "none",
    ) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if isolation != "none":
            raise ValueError(
                "a KernelPool's kernels start before their workspace exists, so they cannot "
                f"be confined to it (isolation={isolation!r}); use "
                "JupyterSandbox.factory(isolation='namespaces') for confined cold starts"
            )
        refuse_unconfined("a KernelPool")
        self._state = _PoolState(size, limits or SandboxLimits(), env)
        self._finalizer = weakref.finalize(self, self._state.close)
        if size:
            thread = threading.Thread(
                target=self._state.refill_forever, name="mappa-kernel-pool", daemon=True
            )
            self._state.thread = thread
            thread.start()

    @property
    def confinement(self) -> Confinement:
        """What the pool declares about its kernels: not confined (see the class docs)."""
        return Confinement(
            mode="none", reason="KernelPool kernels start before their workspace exists"
        )

    @property
    def size(self) -> int:
        """Number of kernels the pool keeps ready."""
        return self._state.size

    @property
    def limits(self) -> SandboxLimits:
        """Limits of the sandboxes handed out."""
        return self._state.limits

    @property
    def ready_count(self) -> int:
        """Kernels started and waiting right now."""
        with self._state.cond:
            return len(self._state.ready)

    @property
    def hits(self) -> int:
        """Hand-outs served by a pre-started kernel."""
        return self._state.hits

    @property
    def misses(self) -> int:
        """Hand-outs that fell back to a cold sandbox."""
        return self._state.misses

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the pool holds ``size`` started kernels.

        Args:
            timeout: Seconds to wait at most; ``None`` waits indefinitely.

        Returns:
            True if the pool is full, False on timeout or when closed.
        """
        state = self._state
        with state.cond:
            return (
                state.cond.wait_for(
                    lambda: state.closed or len(state.ready) >= state.size, timeout=timeout
                )
                and not state.closed
            )

    def acquire(self, workdir: str | Path | None = None) -> JupyterSandbox:
        """Hand out a sandbox running in ``workdir``.

        Args:
            workdir: Working directory for the code; ``None`` makes a temporary one that
                the sandbox owns. A missing directory is created.

        Returns:
            A sandbox with a started kernel when one was ready, else a cold one.

        Raises:
            SandboxError: If the pool is closed.
        """
        state = self._state
        if state.closed:
            raise SandboxError("the kernel pool is closed")
        if workdir is None:
            target, owned = make_temp_dir("sandbox").resolve(), True
        else:
            target, owned = Path(workdir).expanduser().resolve(), False
            target.mkdir(parents=True, exist_ok=True)
        while (sandbox := state.take()) is not None:
            if sandbox._move_to(target, owned=owned):
                with state.cond:
                    state.hits += 1
                return sandbox
            sandbox.close()
        with state.cond:
            state.misses += 1
        sandbox = JupyterSandbox(target, state.limits, env=state.env, isolation="none")
        if owned:
            sandbox._res.owned_dir = target
        return sandbox

    def __call__(self, workdir: Path) -> JupyterSandbox:
        """Hand out a sandbox for ``workdir`` (the :class:`SandboxFactory` protocol)."""
        return self.acquire(workdir)

    def close(self) -> None:
        """Stop refilling and close the kernels still waiting. Idempotent."""
        self._finalizer()

    def __enter__(self) -> KernelPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KernelPool(size={self.size}, ready={self.ready_count})"
