"""Running coroutines from synchronous code: the one sync-over-async bridge of mappa.

Every blocking API of the project that is implemented by a coroutine (an environment's
``reset``/``step``, a coach's ``score``, an API policy's ``generate``, the rollout
runner's ``run``) goes through this module, because the obvious ``asyncio.run`` is not
enough:

- it fails in a thread that already runs an event loop (a Jupyter notebook cell, an
  async web app);
- it makes a new loop per call, while objects such as litellm's HTTP clients, a
  semaphore shared by every caller, or an environment's state between ``reset`` and
  ``step`` must stay on one loop for as long as their owner lives.

:class:`BackgroundLoop` is a private event loop on a daemon thread, for objects that
need one persistent loop: any thread, with or without a running loop of its own, can
run coroutines there, and :meth:`BackgroundLoop.close` cancels what is still pending.
:func:`run_sync` runs one self-contained coroutine from synchronous code, wherever it
is called from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long closing waits for cancelled work to wind down and for the thread to end.
CLOSE_TIMEOUT_S = 5.0


class BackgroundLoop:
    """An event loop running on a daemon thread, started on first use.

    Safe to use from any number of threads at once, including threads that run an event
    loop of their own. The loop is started lazily and again after :meth:`close` or in a
    forked child (where the parent's thread does not exist). It is also stopped when the
    object is garbage-collected or the interpreter exits, so a forgotten owner does not
    leave a thread behind.

    Coroutines run on the loop's thread, not the caller's: context variables set by the
    caller are not visible to them.

    Args:
        name: Name of the thread (shown in stack dumps and debuggers).
    """

    def __init__(self, name: str = "mappa-loop") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None
        _LIVE.add(self)

    # ----------------------------------------------------------------- public API

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes.

        Args:
            coro: The coroutine.
            timeout: Seconds to wait; then the coroutine is cancelled (its cleanup runs)
                and :class:`TimeoutError` is raised. ``None`` waits as long as it takes.

        Returns:
            The coroutine's result.

        Raises:
            TimeoutError: If ``timeout`` passed first.
            concurrent.futures.CancelledError: If :meth:`close` cancelled the work.
            RuntimeError: If called from the loop's own thread (it would deadlock: await
                the coroutine there instead).
            BaseException: Whatever the coroutine raised, with its own type.
        """
        if self.in_loop_thread():
            coro.close()  # never awaited: close it so Python does not warn about it
            raise RuntimeError(
                f"BackgroundLoop.run() called from its own thread {self.name!r}; "
                "await the coroutine instead"
            )
        bounded = _bounded(coro, timeout)
        try:
            future = self.submit(bounded)
        except RuntimeError:
            coro.close()  # the wrapper was closed unstarted; so is what it wraps
            raise
        try:
            return future.result()
        except BaseException:
            # Interrupted while waiting (Ctrl-C): do not leave the work running unseen.
            future.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` running on this loop, from any other event loop (or this one).

        Cancelling the awaiting task cancels the coroutine.

        Args:
            coro: The coroutine.

        Returns:
            The coroutine's result.
        """
        if self.in_loop_thread():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop without waiting for it.

        Args:
            coro: The coroutine.

        Returns:
            A future of its result; cancelling the future cancels the coroutine.
        """
        # Under the lock so that a concurrent close() cannot stop the loop between
        # choosing it and scheduling on it (the work would then never run nor fail).
        with self._lock:
            try:
                loop = self._ensure_loop()
            except RuntimeError:
                coro.close()  # it will never run: close it so Python does not warn
                raise
            return asyncio.run_coroutine_threadsafe(coro, loop)

    def in_loop_thread(self) -> bool:
        """Whether the calling thread is this loop's thread."""
        thread = self._thread
        return thread is not None and threading.current_thread() is thread

    @property
    def running(self) -> bool:
        """Whether the loop's thread is alive (it is started by the first call)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def close(self) -> None:
        """Cancel pending work, stop the loop and end its thread. Idempotent.

        Waits up to :data:`CLOSE_TIMEOUT_S` for the thread (not when called from the
        loop's own thread). A later call starts a fresh loop.
        """
        with self._lock:
            finalizer, self._finalizer = self._finalizer, None
            self._loop = self._thread = None
        if finalizer is not None:
            finalizer()  # runs _stop once; a dead finalizer does nothing

    def __enter__(self) -> BackgroundLoop:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BackgroundLoop(name={self.name!r}, running={self.running})"

    # ----------------------------------------------------------------- internals

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        # Called with self._lock held.
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            if sys.is_finalizing():
                # A thread started now never runs (start() would wait for ever): this is
                # a close() from __del__ at interpreter exit, which must not hang it.
                raise RuntimeError("the interpreter is shutting down: no event loop can start")
            if self._finalizer is not None:
                self._finalizer()  # the old thread has ended: just retire its finalizer
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True)
            thread.start()
            # The callback holds the loop and thread, never self, so self can be collected.
            self._finalizer = weakref.finalize(self, _stop, loop, thread)
            self._loop, self._thread = loop, thread
        return self._loop

    def _forget_after_fork(self) -> None:
        # In a forked child only the forking thread exists: the parent's loop thread is
        # gone and the lock may have been copied while held. Start from scratch; the
        # parent's loop cannot be closed here (it looks as if it were still running).
        self._lock = threading.Lock()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = None
        self._loop = self._thread = None


# Every bridge, so that a forked child can reset them (see _forget_after_fork).
_LIVE: weakref.WeakSet[BackgroundLoop] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for bridge in list(_LIVE):
        bridge._forget_after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Body of a loop thread: run until stopped, then wind down and close the loop."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        loop.run_until_complete(_wind_down(loop))
    finally:
        loop.close()


async def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task left (e.g. litellm's logging worker), then free the executor."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        if pending:
            logger.warning("%d task(s) ignored cancellation while closing", len(pending))
    await loop.shutdown_asyncgens()
    # Joins the threads of asyncio.to_thread; bounded in case one is stuck in a call.
    try:
        await asyncio.wait_for(loop.shutdown_default_executor(), CLOSE_TIMEOUT_S)
    except asyncio.TimeoutError:
        logger.warning("a worker thread was still busy when its event loop closed")


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Ask a loop thread to wind down and wait for it (unless called from it)."""
    if not thread.is_alive():
        return
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # the loop closed in the meantime
        return
    # From the loop's own thread (garbage collection there) joining would deadlock; the
    # loop stops as soon as the current callback returns.
    if threading.current_thread() is not thread:
        thread.join(CLOSE_TIMEOUT_S)
        if thread.is_alive():
            logger.warning(
                "event-loop thread %r did not end within %s s", thread.name, CLOSE_TIMEOUT_S
            )


async def _bounded(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Await ``coro``; past ``timeout`` cancel it, wait for its cleanup, raise TimeoutError.

    Unlike ``asyncio.wait_for``, a ``TimeoutError`` raised by the coroutine itself is
    passed on unchanged rather than confused with the deadline (they are one class since
    Python 3.11).
    """
    if timeout is None:
        return await coro
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        # On the deadline, or when this wrapper itself is cancelled: cancel the work.
        if not task.done():
            task.cancel()
    if not done:
        await asyncio.wait({task})
        raise TimeoutError(f"the coroutine did not finish within {timeout} s")
    return task.result()


def run_sync(coro: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run a self-contained coroutine to completion from synchronous code.

    Without an event loop in the calling thread this is ``asyncio.run`` (Ctrl-C cancels
    the coroutine cleanly). Inside a running loop (a notebook cell), where
    ``asyncio.run`` is impossible, the coroutine runs on a fresh :class:`BackgroundLoop`
    closed afterwards. Either way the coroutine gets a new loop: use a
    :class:`BackgroundLoop` instead for work that keeps loop-bound state between calls.

    Args:
        coro: The coroutine.
        timeout: Seconds after which the coroutine is cancelled and
            :class:`TimeoutError` raised; ``None`` for no limit.

    Returns:
        The coroutine's result.

    Raises:
        TimeoutError: If ``timeout`` passed first.
        BaseException: Whatever the coroutine raised, with its own type.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_bounded(coro, timeout))
    with BackgroundLoop(name="mappa-run-sync") as bridge:
        return bridge.run(coro, timeout=timeout)
