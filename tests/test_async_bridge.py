"""The sync-over-async bridge: BackgroundLoop and run_sync (mappa_env._async)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import multiprocessing
import os
import threading
import time
import warnings

import pytest

from mappa_env._async import BackgroundLoop, run_sync


class Boom(Exception):
    """A distinct exception type, to check types survive the trip."""


async def add(a: int, b: int, delay: float = 0.0) -> int:
    await asyncio.sleep(delay)
    return a + b


async def raise_boom() -> None:
    await asyncio.sleep(0)
    raise Boom("from the coroutine")


def thread_names() -> set[str]:
    return {t.name for t in threading.enumerate()}


@pytest.fixture
def bridge():
    loop = BackgroundLoop(name="test-bridge")
    yield loop
    loop.close()


# ----------------------------------------------------------------- BackgroundLoop


def test_run_from_plain_sync_code(bridge):
    assert bridge.run(add(2, 3)) == 5
    assert bridge.running


def test_loop_is_started_lazily_and_reused(bridge):
    assert not bridge.running
    assert "test-bridge" not in thread_names()

    async def which_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    first = bridge.run(which_loop())
    assert bridge.run(which_loop()) is first  # loop-bound state survives between calls
    assert [t.name for t in threading.enumerate()].count("test-bridge") == 1


def test_run_from_inside_a_running_loop(bridge):
    async def notebook_cell() -> int:
        # The blocking API, called from a thread whose loop is running.
        return bridge.run(add(1, 1))

    assert asyncio.run(notebook_cell()) == 2


def test_run_from_many_threads_at_once(bridge):
    loops: set[int] = set()
    in_flight = [0, 0]  # now, most at once

    async def work(i: int) -> int:
        loops.add(id(asyncio.get_running_loop()))
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        # Each call waits until the 8 threads' calls are all in flight: calls run one
        # after another never get there (and give up 60 s into the test, far past any
        # scheduling delay on a loaded machine).
        while in_flight[1] < 8 and time.monotonic() < give_up_at:
            await asyncio.sleep(0.005)
        in_flight[0] -= 1
        return i * i

    give_up_at = time.monotonic() + 60
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: bridge.run(work(i)), range(32)))
    assert results == [i * i for i in range(32)]
    assert len(loops) == 1  # every caller shares the one loop
    assert in_flight[1] == 8  # callers overlap


def test_timeout_cancels_the_coroutine_and_waits_for_its_cleanup(bridge):
    cleaned = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.set()

    start = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"0\.1 s"):
        bridge.run(slow(), timeout=0.1)
    # The coroutine would sleep an hour: any bound shows it was cancelled, and 60 s
    # holds however busy the machine is.
    assert time.perf_counter() - start < 60
    assert cleaned.is_set()
    assert bridge.run(add(1, 2), timeout=60) == 3  # the loop is still usable


def test_a_timeout_error_of_the_coroutine_itself_is_passed_on(bridge):
    async def own_timeout() -> None:
        raise TimeoutError("the coroutine's own")

    with pytest.raises(TimeoutError, match="the coroutine's own"):
        bridge.run(own_timeout(), timeout=10)


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_exceptions_keep_their_type(bridge, timeout):
    with pytest.raises(Boom, match="from the coroutine"):
        bridge.run(raise_boom(), timeout=timeout)

    async def key_error() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        bridge.run(key_error(), timeout=timeout)


def test_close_cancels_pending_work():
    bridge = BackgroundLoop(name="test-close")
    started, cancelled = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def caller() -> None:
        try:
            bridge.run(forever())
        except concurrent.futures.CancelledError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert started.wait(60)
    bridge.close()
    thread.join(60)
    assert not thread.is_alive()
    assert cancelled.is_set()
    assert len(outcome) == 1  # the blocked caller was told its work was cancelled


def test_close_is_idempotent_and_a_later_call_starts_afresh():
    bridge = BackgroundLoop(name="test-reopen")
    bridge.close()  # never started: nothing to do
    assert bridge.run(add(1, 1)) == 2
    bridge.close()
    bridge.close()
    assert not bridge.running
    assert bridge.run(add(2, 2)) == 4
    bridge.close()
    assert "test-reopen" not in thread_names()


def test_no_threads_left_after_close():
    before = thread_names()
    bridge = BackgroundLoop(name="test-threads")

    async def uses_worker_threads() -> list[int]:
        # asyncio.to_thread starts threads of the loop's default executor.
        return await asyncio.gather(*(asyncio.to_thread(sum, [i, 1]) for i in range(4)))

    assert bridge.run(uses_worker_threads()) == [1, 2, 3, 4]
    assert thread_names() - before
    bridge.close()
    assert thread_names() - before == set()


def test_context_manager_closes():
    with BackgroundLoop(name="test-with") as bridge:
        assert bridge.run(add(3, 4)) == 7
    assert not bridge.running
    assert "test-with" not in thread_names()


def test_garbage_collection_stops_the_thread():
    bridge = BackgroundLoop(name="test-gc")
    bridge.run(add(0, 0))
    (thread,) = [t for t in threading.enumerate() if t.name == "test-gc"]
    del bridge
    gc.collect()
    thread.join(60)
    assert not thread.is_alive()


def test_run_from_the_loops_own_thread_is_refused(bridge):
    async def nested() -> None:
        bridge.run(add(1, 1))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in particular "coroutine was never awaited"
        with pytest.raises(RuntimeError, match="own thread"):
            bridge.run(nested())


def test_arun_from_another_loop_and_from_its_own(bridge):
    async def elsewhere() -> tuple[int, bool]:
        caller = asyncio.get_running_loop()

        async def where() -> bool:
            return asyncio.get_running_loop() is caller

        return await bridge.arun(add(5, 6)), await bridge.arun(where())

    assert asyncio.run(elsewhere()) == (11, False)

    async def on_its_own_loop() -> int:
        return await bridge.arun(add(1, 2))  # awaited directly, no deadlock

    assert bridge.run(on_its_own_loop()) == 3


def test_cancelling_arun_cancels_the_work(bridge):
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def caller() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(bridge.arun(forever()), 0.1)

    asyncio.run(caller())
    assert cancelled.wait(60)


def _child_runs(bridge: BackgroundLoop, queue: multiprocessing.Queue) -> None:
    queue.put(bridge.run(add(20, 22), timeout=60))
    bridge.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_works_in_a_forked_child(bridge):
    assert bridge.run(add(1, 1)) == 2  # the parent's loop thread is running
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock.
        warnings.simplefilter("ignore", DeprecationWarning)
        child = context.Process(target=_child_runs, args=(bridge, queue))
        child.start()
    assert queue.get(timeout=60) == 42
    child.join(60)
    assert child.exitcode == 0
    assert bridge.run(add(2, 2)) == 4  # the parent is unaffected


# ----------------------------------------------------------------- run_sync


def test_run_sync_from_plain_sync_code():
    before = thread_names()
    assert run_sync(add(1, 2)) == 3
    assert thread_names() - before == set()


def test_run_sync_inside_a_running_loop():
    before = thread_names()

    async def notebook_cell() -> int:
        return run_sync(add(4, 5, delay=0.01))

    assert asyncio.run(notebook_cell()) == 9
    assert thread_names() - before == set()  # its temporary loop thread is gone


@pytest.mark.parametrize("inside_a_loop", [False, True])
def test_run_sync_timeout_and_exceptions(inside_a_loop):
    cleaned = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()

    def calls() -> None:
        with pytest.raises(TimeoutError):
            run_sync(slow(), timeout=0.1)
        assert cleaned.is_set()
        with pytest.raises(Boom):
            run_sync(raise_boom())
        assert run_sync(add(1, 1), timeout=60) == 2

    if inside_a_loop:

        async def cell() -> None:
            calls()

        asyncio.run(cell())
    else:
        calls()


def test_run_sync_from_many_threads_at_once():
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: run_sync(add(i, 1, delay=0.01)), range(24)))
    assert results == [i + 1 for i in range(24)]


def test_an_env_left_open_does_not_hang_the_interpreter_at_exit():
    # Its __del__ closes it while the interpreter shuts down, when no thread can start.
    import subprocess
    import sys

    script = (
        "import mappa_env\n"
        "env = mappa_env.make('MathChat-v0', sandbox=None, isolation='none')\n"
        "env.reset(seed=0)\n"
        "print('ready')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ready"
    assert "never awaited" not in done.stderr
