"""Tests for the warm kernel pool (mappa_env.sandbox.pool)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from mappa_env.sandbox import JupyterSandbox, KernelPool, Sandbox, SandboxError, SandboxLimits


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    # Returns as soon as the condition holds: the long timeout only matters on a busy machine.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture(scope="module")
def pool() -> KernelPool:
    with KernelPool(2, SandboxLimits(timeout_s=20)) as kernel_pool:
        assert kernel_pool.wait_ready(timeout=60)
        yield kernel_pool


def test_pool_hands_out_started_kernels_in_the_workdir(pool: KernelPool, tmp_path: Path) -> None:
    assert pool.wait_ready(timeout=60)
    hits = pool.hits
    sandbox = pool(tmp_path)
    try:
        assert isinstance(sandbox, Sandbox)
        assert pool.hits == hits + 1
        assert sandbox.kernel_pid is not None  # started before it was asked for
        assert sandbox.workdir == tmp_path.resolve()
        result = sandbox.run(
            "import os\nprint(os.getcwd())\nwith open('out.txt', 'w') as f:\n    f.write('x')"
        )
        assert result.stdout.strip() == str(tmp_path.resolve())
        assert result.files_written == ("out.txt",)
        assert (tmp_path / "out.txt").read_text() == "x"
        # The hand-out ran no visible code: nothing in the namespace, no output.
        leftovers = sandbox.run("[name for name in dir() if 'mappa' in name]")
        assert leftovers.stdout == "[]\n"
    finally:
        sandbox.close()
    assert tmp_path.is_dir()  # a given workdir is never deleted


def test_pool_refills_in_the_background(pool: KernelPool, tmp_path: Path) -> None:
    assert pool.wait_ready(timeout=60)
    taken = [pool.acquire(tmp_path / str(i)) for i in range(2)]
    try:
        assert pool.ready_count == 0
        assert pool.wait_ready(timeout=60)
        assert pool.ready_count == 2
    finally:
        for sandbox in taken:
            sandbox.close()


def test_restart_of_a_pooled_sandbox_stays_in_its_workdir(pool: KernelPool, tmp_path: Path) -> None:
    with pool(tmp_path) as sandbox:
        died = sandbox.run("import os\nos._exit(3)")
        assert died.restarted
        assert sandbox.run("import os\nprint(os.getcwd())").stdout.strip() == str(
            tmp_path.resolve()
        )


def test_acquire_without_workdir_owns_a_temporary_one(pool: KernelPool) -> None:
    sandbox = pool.acquire()
    workdir = sandbox.workdir
    assert workdir.is_dir()
    assert sandbox.run("import os\nos.getcwd()").stdout.strip() == repr(str(workdir))
    sandbox.close()
    assert not workdir.exists()


def test_dead_pooled_kernels_are_skipped(pool: KernelPool, tmp_path: Path) -> None:
    assert pool.wait_ready(timeout=60)
    waiting = list(pool._state.ready)
    for sandbox in waiting:
        pid = sandbox.kernel_pid
        assert pid is not None
        os.kill(pid, 9)
    assert wait_until(lambda: all(s.kernel_pid is None for s in waiting))
    misses = pool.misses
    with pool(tmp_path) as sandbox:
        assert pool.misses == misses + 1  # nothing alive was waiting: a cold sandbox
        assert sandbox.run("1 + 1").stdout == "2\n"
    assert all(sandbox.closed for sandbox in waiting)


def test_empty_pool_falls_back_to_a_cold_sandbox(tmp_path: Path) -> None:
    with KernelPool(0) as empty:
        assert empty.wait_ready(timeout=60)
        sandbox = empty(tmp_path)
        try:
            assert empty.misses == 1
            assert isinstance(sandbox, JupyterSandbox)
            assert sandbox.kernel_pid is None  # starts lazily, like any sandbox
            assert sandbox.run("'cold'").stdout == "'cold'\n"
        finally:
            sandbox.close()


def test_close_stops_waiting_kernels_and_refuses_hand_outs(tmp_path: Path) -> None:
    kernel_pool = KernelPool(1)
    assert kernel_pool.wait_ready(timeout=60)
    pids = [s.kernel_pid for s in kernel_pool._state.ready]
    neutral_dir = kernel_pool._state.neutral_dir
    handed_out = kernel_pool(tmp_path)
    handed_pid = handed_out.kernel_pid
    assert kernel_pool.wait_ready(timeout=60)
    pids += [s.kernel_pid for s in kernel_pool._state.ready]
    kernel_pool.close()
    assert wait_until(lambda: all(gone(pid) for pid in pids if pid != handed_pid))
    assert not neutral_dir.exists()
    with pytest.raises(SandboxError):
        kernel_pool.acquire(tmp_path)
    kernel_pool.close()  # idempotent
    # A sandbox handed out earlier belongs to its caller and keeps working.
    assert handed_out.run("'mine'").stdout == "'mine'\n"
    handed_out.close()


def test_negative_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="size"):
        KernelPool(-1)
