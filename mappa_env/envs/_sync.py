"""Running the environments' async core from synchronous code."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class SyncRunner:
    """Runs coroutines to completion for a synchronous API.

    Each environment owns one runner (no process-wide loop). Outside any event loop the
    runner reuses a private loop, which costs tens of microseconds per call. Inside a
    running loop (a Jupyter notebook, an async web app) a nested ``run_until_complete``
    is impossible, so the coroutine runs on a private loop in a worker thread instead.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._worker_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion and return its result (or raise its exception)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(coro)
        return self._run_in_worker(coro)

    def _run_in_worker(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="mappa-env-sync")
        return self._worker.submit(self._run_on_worker_loop, coro).result()

    def _run_on_worker_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._worker_loop is None or self._worker_loop.is_closed():
            self._worker_loop = asyncio.new_event_loop()
        return self._worker_loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the private loops and the worker thread. Idempotent."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        if self._worker is not None:
            worker_loop = self._worker_loop
            if worker_loop is not None:
                self._worker.submit(worker_loop.close).result()
            self._worker.shutdown(wait=True)
            self._worker = None
