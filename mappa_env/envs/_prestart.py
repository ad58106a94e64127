"""Sandboxes started ahead of the code that needs them, each in a workspace of its own.

An environment makes the next episode's workspace and starts a sandbox in it while the
current episode runs, so the episode's first code run does not wait for a kernel start.
The workspace is made first and the kernel starts in it, so a confined kernel is bound
to that workspace alone, exactly as a kernel started on demand would be.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from mappa_env._fs import remove_tree
from mappa_env.sandbox.base import Sandbox, SandboxFactory
from mappa_env.sandbox.isolation import Confinement, UidLease
from mappa_env.tempdirs import make_temp_dir

logger = logging.getLogger(__name__)

#: How long closing waits for a start still in flight before it closes the sandbox anyway.
_CLOSE_WAIT_S = 120.0


def new_workspace(kind: str, confinement: Confinement) -> tuple[Path, UidLease | None]:
    """A fresh, empty episode workspace that confined interpreters may write.

    Confined interpreters run as another user, one of their own per workspace where the
    machine allows: the workspace is theirs to use.

    Args:
        kind: Names the directory (see :func:`~mappa_env.tempdirs.make_temp_dir`).
        confinement: How the interpreters working there are confined.

    Returns:
        The directory and the uid leased for it (``None`` where none is leased).
    """
    workdir = make_temp_dir(kind)
    lease = confinement.lease_user()
    try:
        confinement.prepare_writable(workdir, user=None if lease is None else lease.user)
    except BaseException:
        _drop_workspace(workdir, lease)
        raise
    return workdir, lease


def _drop_workspace(workdir: Path, lease: UidLease | None) -> None:
    left = remove_tree(workdir)
    if left:
        logger.warning("could not remove %d entries of %s", len(left), workdir)
    if lease is not None:
        lease.release()


class PrestartedSandbox:
    """A new workspace and a sandbox for it whose kernel starts in a background thread.

    The workspace and its uid belong to this object until :meth:`adopt_workspace` hands
    them to an episode; the sandbox belongs to it until :meth:`take` hands it out.
    :meth:`close` releases whatever it still holds.

    Args:
        kind: Names the workspace directory.
        confinement: How interpreters working in the workspace are confined.
        factory: Makes the sandbox (``factory(workdir)``); a sandbox with a ``start()``
            method is started in the background, any other is only made ahead.

    Raises:
        Exception: Whatever making the workspace or the sandbox raised; nothing is left.
    """

    def __init__(self, kind: str, confinement: Confinement, factory: SandboxFactory) -> None:
        self.workdir, lease = new_workspace(kind, confinement)
        self._lease = lease
        self._owns_workspace = True
        try:
            sandbox = factory(self.workdir)
        except BaseException:
            _drop_workspace(self.workdir, lease)
            raise
        self._sandbox: Sandbox | None = sandbox
        self._started: Future[None] = Future()
        threading.Thread(
            target=self._start, args=(sandbox,), name="mappa-sandbox-prestart", daemon=True
        ).start()

    def _start(self, sandbox: Sandbox) -> None:
        start = getattr(sandbox, "start", None)
        try:
            if callable(start):
                start()
        except Exception as exc:  # the sandbox's first run starts it again and reports why
            logger.warning("starting a sandbox ahead failed: %s", exc, exc_info=True)
        finally:
            self._started.set_result(None)

    @property
    def started(self) -> bool:
        """Whether the background start has ended (started, or failed and left to the first run)."""
        return self._started.done()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Block until the background start has ended; False on timeout."""
        try:
            self._started.result(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def adopt_workspace(self) -> tuple[Path, UidLease | None]:
        """Hand the workspace and its uid to the caller, who removes and releases them."""
        self._owns_workspace = False
        return self.workdir, self._lease

    async def take(self) -> Sandbox:
        """Hand out the sandbox once its start has ended; the caller closes it from then on.

        Waiting matters: a call queued on the sandbox while its kernel still starts would
        contend with the start for the sandbox's one worker thread.

        Raises:
            RuntimeError: If the sandbox was handed out or closed already.
        """
        await asyncio.wrap_future(self._started)
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            raise RuntimeError("the prestarted sandbox was handed out or closed already")
        return sandbox

    def close(self) -> None:
        """Close the sandbox unless handed out; remove the workspace unless adopted. Idempotent."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            # A JupyterSandbox's close waits for a start in flight and stops that kernel;
            # the wait covers sandboxes of other kinds, closed again once started.
            sandbox.close()
            if not self.wait_started(_CLOSE_WAIT_S):
                logger.warning("a sandbox started ahead was still starting when closed")
            sandbox.close()
        if self._owns_workspace:
            self._owns_workspace = False
            _drop_workspace(self.workdir, self._lease)
