"""The workspace disk quota: code that writes past it is stopped, what it wrote deleted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import mappa_env
from mappa_env.sandbox import JupyterSandbox, SandboxLimits
from mappa_env.sandbox.isolation import unconfined_reason
from mappa_env.sandbox.quota import QUOTA_ERROR, trim_workspace, workspace_usage
from mappa_env.tasks import MathTask
from tests.fakes import InProcessSandbox

MIB = 1024**2
QUOTA = 4 * MIB

# Writes 1 MiB files for ever: only the quota's watch can stop it before the timeout.
ENDLESS_WRITER = """
i = 0
while True:
    with open(f"f{i}", "wb") as f:
        f.write(b"x" * (1024 * 1024))
    i += 1
"""

ISOLATIONS = [
    "none",
    pytest.param(
        "namespaces",
        marks=pytest.mark.skipif(
            unconfined_reason("namespaces") is not None, reason="bubblewrap cannot run here"
        ),
    ),
]


# --------------------------------------------------------------------------------------
# Measuring and trimming, without a kernel
# --------------------------------------------------------------------------------------


def test_usage_counts_what_files_take_on_disk(tmp_path: Path) -> None:
    (tmp_path / "dense").write_bytes(b"x" * MIB)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1024 * MIB)  # a GiB long, nothing written
    os.link(tmp_path / "dense", tmp_path / "same")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (nested / "deep").write_bytes(b"y" * MIB)
    usage = workspace_usage(tmp_path)
    assert usage.complete
    assert 2 * MIB <= usage.bytes < 3 * MIB  # the sparse file and the hard link add ~0
    assert workspace_usage(tmp_path / "missing").bytes == 0


def test_a_workspace_of_too_many_entries_is_over_any_quota(tmp_path: Path) -> None:
    for i in range(12):
        (tmp_path / str(i)).touch()
    usage = workspace_usage(tmp_path, max_entries=10)
    assert not usage.complete
    assert usage.over(10**12)


def test_trim_deletes_what_the_call_wrote_largest_first(tmp_path: Path) -> None:
    old = tmp_path / "data.csv"
    old.write_bytes(b"d" * MIB)
    os.utime(old, ns=(0, 0))  # written before the call
    since = time.time_ns()
    (tmp_path / "small").write_bytes(b"s" * 1000)
    (tmp_path / "big").write_bytes(b"b" * 3 * MIB)
    removed, after = trim_workspace(tmp_path, 2 * MIB, since)
    assert removed == ["big"]
    assert old.exists()
    assert (tmp_path / "small").exists()
    assert not after.over(2 * MIB)


# --------------------------------------------------------------------------------------
# The Jupyter sandbox
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_code_that_keeps_writing_is_stopped_and_its_files_deleted(
    tmp_path: Path, isolation: str
) -> None:
    limits = SandboxLimits(workspace_bytes=QUOTA)
    with JupyterSandbox(tmp_path, limits, isolation=isolation) as sandbox:
        assert sandbox.run("x = 1").ok
        result = sandbox.run(ENDLESS_WRITER, timeout=120)
        assert result.error is not None, result
        assert result.error.name == QUOTA_ERROR, result
        assert not result.timed_out  # stopped by the quota's watch, not by the timeout
        assert result.restarted
        assert "disk quota of 4,194,304 bytes" in result.error.value
        assert "file(s) were deleted" in result.error.value
        assert workspace_usage(tmp_path).bytes <= QUOTA  # nothing beyond it stays
        # The sandbox goes on: a fresh interpreter, in the same workspace.
        after = sandbox.run("import os; print(len(os.listdir('.')) > 0, 'x' in dir())")
        assert after.ok, after
        assert after.stdout.strip() == "True False"


def test_a_call_that_ends_over_the_quota_is_caught_after_it(tmp_path: Path) -> None:
    # The watch while the code runs never comes round: only the check after the call.
    limits = SandboxLimits(workspace_bytes=QUOTA, workspace_watch_interval_s=3600)
    with JupyterSandbox(tmp_path, limits, isolation="none") as sandbox:
        code = "for i in range(6):\n    open(f'part{i}', 'wb').write(b'x' * 1024 * 1024)"
        result = sandbox.run(code)
        assert result.error is not None, result
        assert result.error.name == QUOTA_ERROR, result
        assert workspace_usage(tmp_path).bytes <= QUOTA
        assert sandbox.run("print(6 * 7)").stdout.strip() == "42"


def test_one_file_cannot_grow_past_the_quota(tmp_path: Path) -> None:
    limits = SandboxLimits(workspace_bytes=QUOTA)
    with JupyterSandbox(tmp_path, limits, isolation="none") as sandbox:
        result = sandbox.run("open('big', 'wb').write(b'x' * 64 * 1024 * 1024)")
        assert result.error is not None
        assert result.error.name == "OSError"
        assert "too large" in result.error.value
        assert (tmp_path / "big").stat().st_size <= QUOTA


def test_the_quota_bounds_the_file_size_limit() -> None:
    assert SandboxLimits(workspace_bytes=QUOTA).rlimits()["RLIMIT_FSIZE"] == [QUOTA, QUOTA]
    with pytest.raises(ValueError, match="workspace_bytes"):
        SandboxLimits(workspace_bytes=0)


# --------------------------------------------------------------------------------------
# The environment: any sandbox, the episode goes on
# --------------------------------------------------------------------------------------


def test_the_environment_flags_an_action_over_the_quota_and_goes_on() -> None:
    # A sandbox with no quota of its own: the environment's check after the run holds.
    task = MathTask(id="t", prompt="What is 2 + 3?", answer="5")
    env = mappa_env.make(
        "MathChat-v0",
        tasks=[task],
        sandbox=InProcessSandbox,
        isolation="none",
        workspace_quota_mb=QUOTA / MIB,
    )
    try:
        env.reset()
        env.step("Let me write.")  # problem solver
        writer = "for i in range(8):\n    open(f'w{i}', 'wb').write(b'x' * 1024 * 1024)"
        env.step(f"```python\n{writer}\n```")  # code executor
        record = env.transcript[-1]
        assert record.tool is not None
        assert record.tool.result is not None
        error = record.tool.result.error
        assert error is not None
        assert error.name == QUOTA_ERROR
        assert env.infos[record.agent]["tool"]["error"]["name"] == QUOTA_ERROR
        assert workspace_usage(env.workdir).bytes <= QUOTA
        assert env.agents  # the episode goes on
        env.step("The answer is \\boxed{5}.")
    finally:
        env.close()


def test_the_quota_option_is_checked() -> None:
    with pytest.raises(ValueError, match="workspace_quota_mb"):
        mappa_env.make("MathChat-v0", sandbox=None, isolation="none", workspace_quota_mb=0)
    env = mappa_env.make("MathChat-v0", sandbox=None, isolation="none", workspace_quota_mb=None)
    assert env.workspace_quota_bytes is None
    env.close()
