"""Ctrl-C that a training run cannot lose.

Python raises ``KeyboardInterrupt`` in the main thread wherever it happens to be, and an
exception raised inside a finalizer (``__del__``, a ``weakref.finalize`` callback, a
garbage-collected generator's cleanup) is printed as "Exception ignored" and dropped. A
training step creates and frees many such objects. Under load a run was seen to lose
its Ctrl-C and go on training (its main thread in the next rollout 150 s after SIGINT);
a finalizer is one way that happens. :func:`ctrl_c_guard` records every SIGINT before
raising (and, inside a finalizer, instead of raising), and the trainer calls
:func:`raise_if_interrupted` at the end of each step: a Ctrl-C dropped wherever it was
raised stops the run there, as a delivered one would.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_pressed = threading.Event()


def _inside_finalizer(frame: Any) -> bool:
    """Whether ``frame`` or a caller of it is a finalizer (``__del__``, ``weakref.finalize``)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
            code.co_name == "__call__" and frame.f_globals.get("__name__") == "weakref"
        ):
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: Any) -> None:
    """Record the Ctrl-C, then raise as Python's own handler does, except in a finalizer.

    Raised there, the exception would be printed with its traceback and dropped: the
    record alone stops the run at the end of its step.
    """
    _pressed.set()
    if not _inside_finalizer(frame):
        raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_guard() -> Iterator[None]:
    """Within the block, every SIGINT is recorded before ``KeyboardInterrupt`` is raised.

    Installed only from the main thread (where Python delivers signals) and only over
    Python's default handler (a caller's own handler is left alone); restored on exit,
    and the record is cleared on entry and exit. asyncio's runner then leaves SIGINT to
    this handler: a Ctrl-C during a rollout raises in the event loop, whose shutdown
    cancels the rollout's tasks.
    """
    installable = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    _pressed.clear()
    if not installable:
        yield
        return
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _pressed.clear()


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` when a Ctrl-C was recorded (see :func:`ctrl_c_guard`).

    Raises:
        KeyboardInterrupt: If a SIGINT arrived inside the guard, even one whose
            exception was dropped where it was raised.
    """
    if _pressed.is_set():
        raise KeyboardInterrupt
