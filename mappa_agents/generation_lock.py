"""Which of a process's local generate calls may run at the same time.

A seeded ``generate`` call reseeds torch's process-global random generator and restores
it afterwards (``fork_rng``): two calls doing that from different threads would reseed
and draw from the one generator interleaved, so such a call must run alone in the
process. A call decoding through recorded graphs draws from a generator of its own when
seeded, and only draws when not (torch's generators draw under a lock of their own), so
such calls of different models may run together: the three agents of a rollout, and
the runs of a sweep, then decode at the same time on one GPU, each replaying its own
recorded graphs, instead of taking turns. Calls on one model always take turns:
policies sharing a base model switch its adapter, and a decoder switches its attention,
for a whole call.

:data:`GENERATION_LOCK` is the process's lock: :meth:`GenerationLock.hold` takes it
exclusively (a call that reseeds, or that may not share) or shared per model.
:data:`RANDOM_DRAWS` keeps sampling out of CUDA graph captures.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any


class SharedExclusiveLock:
    """A lock held either by one caller alone or by any number of callers together.

    Exclusive holders are preferred: once one waits, no new shared holder enters, so an
    exclusive caller is not starved by a stream of shared ones.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone."""
        with self._condition:
            self._exclusive_waiting += 1
            try:
                self._condition.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._exclusive_waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._condition:
                self._exclusive = False
                self._condition.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock beside other shared holders."""
        with self._condition:
            self._condition.wait_for(lambda: not self._exclusive and not self._exclusive_waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._condition:
                self._shared -= 1
                self._condition.notify_all()

    @property
    def exclusive_waiting(self) -> int:
        """Callers waiting to hold the lock alone."""
        with self._condition:
            return self._exclusive_waiting


class GenerationLock:
    """The generate calls' lock: some calls alone, others of different models together."""

    def __init__(self) -> None:
        self.calls = SharedExclusiveLock()
        """Held alone by calls that must run alone, shared by the others."""
        self._model_locks: weakref.WeakKeyDictionary[Any, threading.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._model_locks_guard = threading.Lock()

    @contextlib.contextmanager
    def hold(self, model: Any, *, exclusive: bool) -> Iterator[None]:
        """Hold the lock for one generate call on ``model``.

        Args:
            model: The model the call runs (calls on one model never overlap); ``None``
                (a closed policy's) holds exclusively.
            exclusive: Whether the call must run alone in the process (one that
                reseeds the process's generator).
        """
        if exclusive or model is None:
            with self.calls.exclusive():
                yield
            return
        with self.calls.shared(), self._model_lock(model):
            yield

    def _model_lock(self, model: Any) -> threading.Lock:
        with self._model_locks_guard:
            lock = self._model_locks.get(model)
            if lock is None:
                lock = self._model_locks[model] = threading.Lock()
            return lock


GENERATION_LOCK = GenerationLock()
"""The lock every :class:`~mappa_agents.hf.HFPolicy` of the process generates under."""

RANDOM_DRAWS = SharedExclusiveLock()
"""Held shared around each id a decoder samples and alone around each CUDA graph capture.

A capture puts the device's random generator in its capturing mode for its whole length,
and a draw from the default generator in another thread meanwhile fails ("Offset
increment outside graph capture"): with calls decoding beside each other, one policy's
recording of a new shape would fail another's sampling. Only the decoders' own draws
hold it: a draw elsewhere during a capture (dropout in a sweep's update running beside
rollouts, an in-process vLLM engine's sampling beside Hugging Face agents that record)
is not kept out. mappa's recipes train with no dropout."""
