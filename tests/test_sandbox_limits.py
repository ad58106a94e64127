"""Tests that every sandbox limit really bites, and that the kernel sees no secrets."""

from __future__ import annotations

import errno
import resource
import time
from pathlib import Path

import pytest

from mappa_env.sandbox import JupyterSandbox, SandboxLimits, kernel_environment
from mappa_env.sandbox.limits import ENV_ALLOW, THREAD_ENV_VARS

MIB = 1024**2


def gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --------------------------------------------------------------------------------------
# SandboxLimits and the environment, without a kernel
# --------------------------------------------------------------------------------------


def test_limits_validate_their_values() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        SandboxLimits(memory_bytes=0)
    with pytest.raises(ValueError, match="max_output_chars"):
        SandboxLimits(max_output_chars=10)
    SandboxLimits(memory_bytes=None, cpu_seconds=None, max_processes=None)


def test_rlimits_mapping() -> None:
    limits = SandboxLimits(
        memory_bytes=100 * MIB,
        cpu_seconds=7,
        open_files=50,
        file_size_bytes=MIB,
        user_processes=9,
    )
    assert limits.rlimits() == {
        "RLIMIT_DATA": [100 * MIB, 100 * MIB],
        "RLIMIT_CPU": [7, 12],
        "RLIMIT_NOFILE": [50, 50],
        "RLIMIT_FSIZE": [MIB, MIB],
        "RLIMIT_NPROC": [9, 9],
    }
    off = SandboxLimits(
        memory_bytes=None,
        cpu_seconds=None,
        open_files=None,
        file_size_bytes=None,
        workspace_bytes=None,
    )
    assert off.rlimits() == {}


def test_environment_is_an_allow_list() -> None:
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LC_ALL": "C.UTF-8",
        "OPENAI_API_KEY": "sk-secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "HF_TOKEN": "secret",
        "PYTHONPATH": "/somewhere",
    }
    env = kernel_environment(SandboxLimits(numeric_threads=2), {"EXTRA": "1"}, parent=parent)
    assert env["PATH"] == "/usr/bin"
    assert env["HOME"] == "/home/u"
    assert env["LC_ALL"] == "C.UTF-8"
    assert env["EXTRA"] == "1"
    for secret in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "PYTHONPATH"):
        assert secret not in env
    assert all(env[key] == "2" for key in THREAD_ENV_VARS)
    assert "sk-secret" not in env.values()
    # Only allow-listed, locale, thread-cap, fixed and explicit extra keys appear.
    fixed = {"NO_COLOR", "PYDEVD_DISABLE_FILE_VALIDATION", "EXTRA"}
    assert set(env) <= ENV_ALLOW | set(THREAD_ENV_VARS) | fixed | {"LC_ALL"}


def test_extra_environment_overrides_thread_caps() -> None:
    env = kernel_environment(SandboxLimits(), {"OMP_NUM_THREADS": "16"}, parent={})
    assert env["OMP_NUM_THREADS"] == "16"
    assert "PATH" in env  # a default PATH, so the kernel can still find programs


# --------------------------------------------------------------------------------------
# Inside the kernel
# --------------------------------------------------------------------------------------


def test_kernel_does_not_see_parent_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAPPA_TEST_FAKE_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("LC_TIME", "C")
    with JupyterSandbox(tmp_path, env={"MAPPA_VISIBLE": "ok"}) as sandbox:
        result = sandbox.run(
            "import os\n"
            "print(os.environ.get('MAPPA_TEST_FAKE_API_KEY'))\n"
            "print(os.environ.get('MAPPA_VISIBLE'), os.environ.get('LC_TIME'))\n"
            "print('sk-do-not-leak' in repr(dict(os.environ)))"
        )
    assert result.stdout.splitlines() == ["None", "ok C", "False"]


def test_resource_limits_are_applied_in_the_kernel(tmp_path: Path) -> None:
    limits = SandboxLimits(
        memory_bytes=1024 * MIB,
        cpu_seconds=300,
        open_files=200,
        file_size_bytes=10 * MIB,
        user_processes=100_000,
    )
    names = ("RLIMIT_DATA", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_NPROC")
    with JupyterSandbox(tmp_path, limits) as sandbox:
        result = sandbox.run(
            "import resource\n"
            f"print([list(resource.getrlimit(getattr(resource, n))) for n in {names!r}])"
        )
    # Limits are only ever lowered, so compare with what this process allows.
    expected = []
    for name, (soft, hard) in limits.rlimits().items():
        _, current_hard = resource.getrlimit(getattr(resource, name))
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
            soft = min(soft, hard)
        expected.append([soft, hard])
    assert result.stdout.strip() == str(expected)


def test_memory_limit_raises_memory_error(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(memory_bytes=768 * MIB)) as sandbox:
        big = sandbox.run("block = bytearray(1024 * 1024 * 1024)")
        assert big.error is not None
        assert big.error.name == "MemoryError"
        growing = sandbox.run(
            "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))", timeout=20
        )
        assert growing.error is not None
        assert growing.error.name == "MemoryError"
        assert not growing.timed_out
        assert not growing.restarted
        freed = sandbox.run("del chunks\nlen(bytearray(64 * 1024 * 1024))")
        assert freed.stdout == f"{64 * MIB}\n"


def test_memory_limit_leaves_room_for_scientific_imports(tmp_path: Path) -> None:
    # RLIMIT_AS at this size breaks scipy; the data-segment limit must not.
    with JupyterSandbox(tmp_path, SandboxLimits(memory_bytes=1024 * MIB)) as sandbox:
        result = sandbox.run(
            "import numpy, pandas, scipy.stats, sklearn.linear_model\nprint('imported')",
            timeout=60,
        )
    assert result.ok, result.render()
    assert result.stdout == "imported\n"


def test_file_size_limit(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(file_size_bytes=MIB)) as sandbox:
        small = sandbox.run("open('small.bin', 'wb').write(b'0' * 1000)")
        big = sandbox.run("open('big.bin', 'wb').write(b'0' * (2 * 1024 * 1024))")
        after = sandbox.run("1 + 1")
    assert small.ok
    assert big.error is not None
    assert big.error.name == "OSError"
    assert f"Errno {errno.EFBIG}" in big.error.value
    assert (tmp_path / "big.bin").stat().st_size <= MIB
    assert after.stdout == "2\n"


def test_open_files_limit(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(open_files=256)) as sandbox:
        result = sandbox.run(
            "handles, failure = [], None\n"
            "try:\n"
            "    while len(handles) < 1000:\n"
            "        handles.append(open('many.txt', 'a'))\n"
            "except OSError as exc:\n"
            "    failure = exc.errno\n"
            "for handle in handles:\n"
            "    handle.close()\n"
            "print(len(handles), failure)"
        )
        opened, failure = result.stdout.split()
        assert int(opened) < 256
        assert int(failure) == errno.EMFILE
        assert sandbox.run("1 + 1").stdout == "2\n"


@pytest.mark.slow
def test_cpu_limit_stops_the_kernel_and_restarts_it(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(cpu_seconds=2)) as sandbox:
        sandbox.start()
        old_pid = sandbox.kernel_pid
        # 2 s of CPU take some 10 s of wall time at load 8 on two cores: the endless loop
        # ends by the CPU limit (not timed out) long before the 120 s timeout.
        result = sandbox.run("while True:\n    pass", timeout=120)
        assert result.error is not None
        assert result.error.name == "CPUTimeLimitExceeded"
        assert result.restarted
        assert not result.timed_out
        assert sandbox.kernel_pid != old_pid
        assert sandbox.run("'fresh budget'").stdout == "'fresh budget'\n"


def test_a_few_child_processes_are_allowed(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(max_processes=8)) as sandbox:
        result = sandbox.run(
            "import subprocess\n"
            "workers = [subprocess.Popen(['sleep', '30']) for _ in range(3)]\n"
            "print(subprocess.run(['echo', 'child ran'], capture_output=True, text=True).stdout)"
        )
        assert result.ok
        assert "child ran" in result.stdout
        assert not result.restarted
        pids = sandbox.run("print(*[w.pid for w in workers])").stdout.split()
        assert len(pids) == 3
        assert not any(gone(int(pid)) for pid in pids)


@pytest.mark.slow
def test_fork_bomb_is_stopped(tmp_path: Path) -> None:
    # Bounded at 2**10 processes so that a broken limit cannot take the machine down;
    # every process records its pid so the test can check that all of them are gone.
    bomb = (
        "import os, time\n"
        "for _ in range(10):\n"
        "    os.fork()\n"
        "    with open('pids.txt', 'a') as f:\n"
        "        f.write(f'{os.getpid()}\\n')\n"
        "time.sleep(60)"
    )
    # The code's pids are the host's only without namespaces.
    with JupyterSandbox(tmp_path, SandboxLimits(max_processes=32), isolation="none") as sandbox:
        sandbox.run("x = 1")
        # Its processes sleep 60 s, past the 50 s timeout: a call that did not time out
        # was ended by the limit.
        result = sandbox.run(bomb, timeout=50)
        assert result.error is not None
        assert result.error.name == "ProcessLimitExceeded"
        assert result.restarted
        assert not result.timed_out
        pids = {int(line) for line in (tmp_path / "pids.txt").read_text().split()}
        # It got going, and was stopped long before its 1,023 forks ran their course.
        assert 8 < len(pids) < 512
        deadline = time.monotonic() + 30  # left once they are gone
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(gone(pid) for pid in pids)
        assert sandbox.run("'recovered'").stdout == "'recovered'\n"


@pytest.mark.slow
def test_processes_left_running_between_calls_are_watched(tmp_path: Path) -> None:
    spawner = "import os, time\nfor _ in range(6):\n    os.fork()\ntime.sleep(60)"
    limits = SandboxLimits(max_processes=16, idle_watch_interval_s=0.1)
    with JupyterSandbox(tmp_path, limits) as sandbox:
        first = sandbox.run(
            "import subprocess, sys\n"
            "slow_start = 'import time\\ntime.sleep(0.5)\\n'\n"
            f"subprocess.Popen([sys.executable, '-c', slow_start + {spawner!r}])"
        )
        assert first.ok
        assert not first.restarted
        # The 64 processes appear after the call returned; the watcher then stops the
        # kernel. Waited for (up to a minute on a busy machine), not slept through.
        deadline = time.monotonic() + 60
        while sandbox.kernel_pid is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        later = sandbox.run("'next call'")
        assert later.restarted
        assert later.stdout == "'next call'\n"
        assert "exceeded the limit of 16" in later.stderr


@pytest.mark.parametrize(
    "code",
    [
        "print('z' * (3 * 1024 * 1024))",
        # The error travels on both channels, so both connections drop.
        "raise ValueError('v' * (3 * 1024 * 1024))",
    ],
)
def test_output_message_above_the_size_limit_is_dropped(tmp_path: Path, code: str) -> None:
    limits = SandboxLimits(max_message_bytes=MIB, max_output_chars=1000)
    with JupyterSandbox(tmp_path, limits) as sandbox:
        sandbox.run("kept = 1")
        result = sandbox.run(code, timeout=60)
        assert not result.timed_out  # the call did not wait for what was dropped
        assert "output of this call was lost" in result.stderr
        assert len(result.stdout) < 1000
        assert not result.restarted
        assert sandbox.run("print('small', kept)").stdout == "small 1\n"


def test_endless_printing_is_bounded(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(max_output_chars=500)) as sandbox:
        result = sandbox.run("i = 0\nwhile True:\n    i += 1\n    print('line', i)", timeout=1.5)
        assert result.timed_out
        assert result.truncated
        assert len(result.stdout) <= 500
        assert result.stdout.startswith("line 1\n")
        assert "characters in all" in result.stdout
        assert sandbox.run("i > 1000").stdout == "True\n"
