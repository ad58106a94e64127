"""The symbolic check of math answers, in a pool of persistent worker processes.

:func:`~mappa_env.envs.mathchat.grading.answers_match` falls back to math-verify (sympy
underneath) when its fast path cannot decide. math-verify bounds its own time with
``signal.alarm``, which only works on the main thread; the environments grade from
worker threads and asyncio loops. So the check runs with math-verify's timeouts
disabled inside worker processes (:class:`SymbolicChecker`): a worker that overruns is
killed and a fresh one started in its place, and workers run under an address-space
limit. This module owns the workers, the checker and the process-wide default one.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

logger = logging.getLogger(__name__)

_MEMORY_ENV = "MAPPA_GRADER_WORKER_MEMORY_BYTES"
_WORKER_BOOT = (
    "from mappa_env.envs.mathchat.symbolic import _serve_symbolic_requests; "
    "_serve_symbolic_requests()"
)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


def _verify_pair(gold_text: str, pred_text: str) -> bool:
    """Run math-verify on one pair with its signal-based timeouts switched off."""
    from math_verify import parse, verify

    gold = parse(gold_text, parsing_timeout=None)
    pred = parse(pred_text, parsing_timeout=None)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def _serve_symbolic_requests() -> None:
    """Entry point of a worker process: answer JSON-line requests on stdin.

    Each request is ``{"gold": str, "pred": str}``; each reply ``{"ok": bool}``, plus
    ``"error"`` when math-verify raised. The first line written is ``{"ready": true}``.
    """
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", buffering=1)
    # Anything else that prints (sympy, antlr) goes to stderr, away from the protocol.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")
    limit = int(os.environ.get(_MEMORY_ENV, "0") or 0)
    if limit > 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError) as exc:
            logger.warning("grader worker runs without a memory limit: %s", exc)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    _verify_pair("$1$", "$1$")  # import sympy/antlr now, not during the first timed request
    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = {"ok": _verify_pair(str(request["gold"]), str(request["pred"]))}
        # The worker must survive any failure of parsing or sympy (including
        # MemoryError and RecursionError); the reply records what happened.
        except Exception as exc:  # noqa: BLE001
            reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        protocol.write(json.dumps(reply) + "\n")


class _Worker:
    """One worker process plus a thread that forwards its output lines to a queue."""

    def __init__(self, memory_limit_bytes: int) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        env[_MEMORY_ENV] = str(memory_limit_bytes)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self.ready = False
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read_lines, name="mappa-grader-reader", daemon=True
        )
        self._reader.start()

    def _read_lines(self) -> None:
        stdout = self.process.stdout
        if stdout is not None:
            for line in stdout:
                self._lines.put(line)
        self._lines.put(None)  # end of output: the worker exited or was killed

    def _next_reply(self, timeout_s: float) -> dict | None:
        try:
            line = self._lines.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None
        if line is None:
            return None
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("grader worker wrote a line that is not JSON: %r", line[:200])
            return None
        return reply if isinstance(reply, dict) else None

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for the worker's start-up message; True when it is ready."""
        if not self.ready:
            reply = self._next_reply(timeout_s)
            self.ready = bool(reply and reply.get("ready"))
        return self.ready

    def check(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        """Send one request; the verdict, or None when no reply came in ``timeout_s``."""
        stdin = self.process.stdin
        if stdin is None:
            return None
        try:
            stdin.write(json.dumps({"gold": gold, "pred": pred}) + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            logger.warning("grader worker is gone: %s", exc)
            return None
        reply = self._next_reply(timeout_s)
        if reply is None:
            return None
        if "error" in reply:
            logger.debug("math-verify failed on %r vs %r: %s", pred, gold, reply["error"])
        return bool(reply.get("ok"))

    def kill(self) -> None:
        """Stop the process and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.error("grader worker %d did not exit after SIGKILL", self.process.pid)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError as exc:
                    logger.debug("closing a grader worker pipe failed: %s", exc)


class SymbolicChecker:
    """Time-bounded math-verify checks that work from any thread.

    Checks run in up to ``max_workers`` persistent worker processes, started on first
    use. A check that does not finish within its time limit is abandoned: its worker
    is killed and a replacement is started, so a runaway sympy computation can
    neither hang the caller nor keep running. Results are cached (LRU).

    The first check in a process also waits for a worker to start (about a second:
    importing sympy); that start-up is bounded by ``startup_timeout_s`` and does not
    count against a check's own time limit.

    Args:
        max_workers: Most worker processes alive at once; callers beyond that wait
            for a free worker (up to ``acquire_timeout_s``).
        memory_limit_bytes: Address-space limit of each worker (Linux/macOS); 0 for
            none. Expressions that would need more fail inside the worker.
        startup_timeout_s: Longest wait for a new worker to become ready.
        acquire_timeout_s: Longest wait for a free worker when all are busy.
        cache_size: Number of (prediction, truth) verdicts kept.
    """

    def __init__(
        self,
        *,
        max_workers: int = 2,
        memory_limit_bytes: int = 1 << 30,
        startup_timeout_s: float = 60.0,
        acquire_timeout_s: float = 60.0,
        cache_size: int = 4096,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.memory_limit_bytes = memory_limit_bytes
        self.startup_timeout_s = startup_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self.cache_size = cache_size
        self.timeouts = 0
        """How many checks were abandoned for running past their limit."""
        self._condition = threading.Condition()
        self._idle: list[_Worker] = []
        self._live = 0
        self._closed = False
        self._pid = os.getpid()
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()

    def check(self, pred: str, truth: str, timeout_s: float) -> bool:
        """Whether math-verify finds ``pred`` equivalent to ``truth`` within ``timeout_s``.

        Args:
            pred: Predicted answer, as LaTeX or plain text.
            truth: Ground-truth answer.
            timeout_s: Longest time to wait for the verdict once a worker is ready.

        Returns:
            The verdict; False on timeout, worker failure, or a closed checker.
        """
        key = (pred, truth)
        with self._condition:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        worker = self._acquire()
        if worker is None:
            return False
        verdict = worker.check(truth, pred, timeout_s)
        if verdict is None:
            with self._condition:
                self.timeouts += 1
            logger.warning(
                "symbolic answer check gave no verdict within %.2fs; restarting its worker "
                "(pred=%r, truth=%r)",
                timeout_s,
                pred[:80],
                truth[:80],
            )
            self._discard(worker, replace=True)
            verdict = False
        else:
            self._release(worker)
        with self._condition:
            self._cache[key] = verdict
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return verdict

    def warm_up(self, workers: int = 1) -> None:
        """Start up to ``workers`` worker processes now instead of on first use."""
        started = []
        with self._condition:
            self._check_pid()
            while self._live < min(workers, self.max_workers) and not self._closed:
                worker = _Worker(self.memory_limit_bytes)
                self._live += 1
                started.append(worker)
            self._idle.extend(started)

    @property
    def live_workers(self) -> int:
        """Number of worker processes currently alive or starting."""
        with self._condition:
            return self._live

    def close(self) -> None:
        """Stop all idle workers; busy ones stop when their check returns."""
        with self._condition:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._condition.notify_all()
        for worker in idle:
            worker.kill()

    def _check_pid(self) -> None:
        # After os.fork the child must not talk to its parent's workers: forget them.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._idle, self._live, self._cache = [], 0, OrderedDict()

    def _acquire(self) -> _Worker | None:
        deadline = time.monotonic() + self.acquire_timeout_s
        with self._condition:
            self._check_pid()
            while True:
                if self._closed:
                    return None
                if self._idle:
                    worker = self._idle.pop()
                    break
                if self._live < self.max_workers:
                    worker = _Worker(self.memory_limit_bytes)
                    self._live += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    logger.warning("no free grader worker within %.1fs", self.acquire_timeout_s)
                    return None
                self._condition.wait(remaining)
        if worker.wait_ready(self.startup_timeout_s):
            return worker
        logger.error(
            "grader worker did not start within %.1fs (is math-verify importable by %s?)",
            self.startup_timeout_s,
            sys.executable,
        )
        self._discard(worker, replace=False)
        return None

    def _release(self, worker: _Worker) -> None:
        with self._condition:
            if self._closed:
                self._live -= 1
            else:
                self._idle.append(worker)
                self._condition.notify()
                return
        worker.kill()

    def _discard(self, worker: _Worker, *, replace: bool) -> None:
        worker.kill()
        with self._condition:
            self._live -= 1
            if replace and not self._closed:
                # Start the replacement now so it is ready by the next check.
                self._idle.append(_Worker(self.memory_limit_bytes))
                self._live += 1
            self._condition.notify()


_default_checker: SymbolicChecker | None = None
_default_lock = threading.Lock()


def default_checker() -> SymbolicChecker:
    """The process-wide :class:`SymbolicChecker` used when none is passed (created lazily)."""
    global _default_checker
    with _default_lock:
        if _default_checker is None:
            _default_checker = SymbolicChecker()
            atexit.register(_default_checker.close)
        return _default_checker


def _forget_default_checker_after_fork() -> None:
    global _default_checker, _default_lock
    _default_checker = None
    _default_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_checker_after_fork)
