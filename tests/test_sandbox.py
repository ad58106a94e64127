"""Tests for the Jupyter sandbox (mappa_env.sandbox.jupyter): execution, failures, lifecycle."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from mappa_env.sandbox import (
    ExecResult,
    JupyterSandbox,
    Sandbox,
    SandboxError,
    SandboxLimits,
    jupyter,
)
from mappa_env.sandbox._kernel import launcher_source
from mappa_env.sandbox.jupyter import _BoundedText, strip_ansi, utf8_safe

REPO_ROOT = Path(__file__).resolve().parents[1]


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 30.0) -> bool:
    # Returns as soon as they are gone: the long timeout only matters on a busy machine.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return all(gone(pid) for pid in pids)


def kill_kernel_and_wait(sandbox: JupyterSandbox) -> None:
    """Start the kernel, kill it with SIGKILL and wait until the sandbox has seen it end."""
    sandbox.start()
    pid = sandbox.kernel_pid
    assert pid is not None
    os.kill(pid, 9)
    deadline = time.monotonic() + 30  # left as soon as seen: long only for a busy machine
    while sandbox.kernel_pid is not None and time.monotonic() < deadline:
        time.sleep(0.02)  # all of the kernel's threads must have ended


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> JupyterSandbox:
    """One sandbox for the tests whose state does not matter (saves kernel starts)."""
    sandbox = JupyterSandbox(tmp_path_factory.mktemp("shared"), SandboxLimits(timeout_s=20))
    yield sandbox
    sandbox.close()


# --------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------


def test_strip_ansi_removes_colour_codes() -> None:
    coloured = "\x1b[31mZeroDivisionError\x1b[39m: \x1b[38;5;28;01mdivision\x1b[0m"
    assert strip_ansi(coloured) == "ZeroDivisionError: division"


def test_bounded_text_keeps_head_and_tail_with_bounded_memory() -> None:
    buffer = _BoundedText(limit=100)
    chunks = [f"line {i}\n" for i in range(100_000)]
    for chunk in chunks:
        buffer.append(chunk)
        # Never more than head + 3x the limit is held, however much arrives.
        assert len(buffer._head) + buffer._tail_chars <= 3 * 100
    text, cut = buffer.text()
    full = "".join(chunks)
    assert cut
    assert buffer.total_chars == len(full)
    assert len(text) <= 100
    assert text.endswith(full[-20:])
    assert text.startswith(full[:5])
    assert str(len(full)) in text  # the marker says how much there was


def test_bounded_text_short_input_is_unchanged() -> None:
    buffer = _BoundedText(limit=100)
    buffer.append("abc")
    buffer.append("def")
    assert buffer.text() == ("abcdef", False)


def test_utf8_safe_joins_pairs_and_replaces_lone_surrogates() -> None:
    assert utf8_safe("plain é 😀") == "plain é 😀"
    assert utf8_safe("a\ud83d\ude00b") == "a😀b"  # a pair is the character it encodes
    assert utf8_safe("x\ud800y\udcffz") == "x\ufffdy\ufffdz"
    utf8_safe("\ud83d" * 3 + "\ude00").encode("utf-8")  # never raises


def assert_encodable(result: ExecResult) -> None:
    """Every text of ``result`` can be written as UTF-8 (to a file, to a model API)."""
    for text in (result.stdout, result.stderr, result.render()):
        text.encode("utf-8")
    if result.error is not None:
        for text in (result.error.name, result.error.value, result.error.traceback):
            text.encode("utf-8")


def test_launcher_source_survives_kernel_command_templating() -> None:
    # jupyter-client substitutes {name} patterns in every argv element.
    import re

    assert not re.search(r"\{[A-Za-z0-9_]+\}", launcher_source())


def test_import_is_light() -> None:
    code = (
        "import sys, mappa_env.sandbox\n"
        "heavy = [m for m in ('torch', 'litellm', 'transformers', 'jupyter_client', 'zmq')"
        " if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------


def test_sandbox_satisfies_protocol(shared: JupyterSandbox) -> None:
    assert isinstance(shared, Sandbox)


def test_state_persists_and_last_expression_is_shown(shared: JupyterSandbox) -> None:
    assert shared.run("persisted = 6 * 7").ok
    result = shared.run("print('value:', persisted)\npersisted + 1")
    assert result.ok
    assert result.stdout == "value: 42\n43\n"
    assert result.stderr == ""
    assert result.duration_s > 0


def test_display_data_and_stderr_are_separated(shared: JupyterSandbox) -> None:
    code = (
        "import sys\n"
        "from IPython.display import display\n"
        "display({'k': 1})\n"
        "print('to err', file=sys.stderr)\n"
    )
    result = shared.run(code)
    assert result.stdout == "{'k': 1}\n"
    assert result.stderr == "to err\n"


def test_exception_becomes_exec_error_without_ansi(shared: JupyterSandbox) -> None:
    result = shared.run("def f():\n    return 1 / 0\nf()")
    assert not result.ok
    assert result.error is not None
    assert result.error.name == "ZeroDivisionError"
    assert result.error.value == "division by zero"
    assert "return 1 / 0" in result.error.traceback
    assert "\x1b" not in result.error.traceback
    assert not result.restarted


def test_syntax_error_is_a_result(shared: JupyterSandbox) -> None:
    result = shared.run("def broken(:\n    pass")
    assert result.error is not None
    assert result.error.name == "SyntaxError"


def test_sys_exit_does_not_kill_the_kernel(shared: JupyterSandbox) -> None:
    shared.run("survivor = 'still here'")
    result = shared.run("import sys\nsys.exit(3)")
    assert result.error is not None
    assert result.error.name == "SystemExit"
    assert not result.restarted
    assert shared.run("survivor").stdout == "'still here'\n"


def test_input_is_refused_instead_of_hanging(shared: JupyterSandbox) -> None:
    result = shared.run("input('your name? ')", timeout=60)
    assert not result.timed_out  # a call waiting for input would have timed out
    assert result.error is not None
    assert result.error.name == "StdinNotImplementedError"


def test_binary_output_is_decoded_with_replacement(shared: JupyterSandbox) -> None:
    result = shared.run("import os\nos.write(1, b'bytes:\\xff\\xfe\\n')")
    assert "bytes:\ufffd\ufffd" in result.stdout
    # ipykernel's stdout has no .buffer; the attempt is an ordinary error.
    result = shared.run("import sys\nsys.stdout.buffer.write(b'\\xff')")
    assert result.error is not None
    assert shared.run("1 + 1").stdout == "2\n"


def test_code_with_a_lone_surrogate_is_refused_without_running(shared: JupyterSandbox) -> None:
    shared.run("before_surrogate = 1")
    pid = shared.kernel_pid
    # Half of an emoji, as left by a JSON escape cut in the middle.
    result = shared.run("before_surrogate = 2\nprint('\ud83d')")
    assert result.error is not None
    assert result.error.name == "UnicodeEncodeError"
    assert "cannot be encoded as UTF-8" in result.error.value
    assert "U+D83D at line 2, column 8" in result.error.value
    assert "was not run" in result.error.value
    assert not result.ok
    assert not result.restarted
    assert_encodable(result)
    assert shared.kernel_pid == pid
    assert shared.run("before_surrogate").stdout == "1\n"  # nothing of it ran
    async_result = asyncio.run(shared.arun("print(1)\ud800"))
    assert async_result.error is not None
    assert async_result.error.name == "UnicodeEncodeError"
    assert "U+D800 at line 1, column 9" in async_result.error.value
    assert shared.run("print(1)").stdout == "1\n"


def test_code_with_a_lone_surrogate_does_not_start_a_kernel(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        result = sandbox.run("'\udcff'")
        assert result.error is not None
        assert result.error.name == "UnicodeEncodeError"
        assert sandbox.kernel_pid is None


def test_unencodable_output_cannot_break_a_result(shared: JupyterSandbox) -> None:
    # A low surrogate travels as an invalid byte and arrives replaced.
    result = shared.run("print('\\udcff')")
    assert result.ok, result.render()
    assert result.stdout == "\ufffd\n"
    # Other surrogates cannot be sent by the kernel: whatever arrives is a plain result.
    for code in (
        "print('\\ud800')",
        "import sys\nsys.stderr.write('\\ud83d x\\n')",
        "raise ValueError('\\ud800')",
        "'\\ud800'",
    ):
        result = shared.run(code)
        assert not result.timed_out, code
        assert not result.restarted, code
        assert_encodable(result)
    assert shared.run("print('still here')").stdout == "still here\n"


def test_long_output_is_cut_from_the_middle_keeping_the_traceback(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path, SandboxLimits(max_output_chars=1000)) as sandbox:
        result = sandbox.run(
            "print('HEAD'); print('x' * 50_000); print('TAIL')\nraise ValueError('end')"
        )
    assert result.truncated
    assert len(result.stdout) <= 1000
    assert result.stdout.startswith("HEAD")
    assert result.stdout.rstrip().endswith("TAIL")
    assert result.error is not None
    assert result.error.value == "end"


def test_non_string_code_is_a_type_error(shared: JupyterSandbox) -> None:
    with pytest.raises(TypeError):
        shared.run(b"1 + 1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        asyncio.run(shared.arun(None))  # type: ignore[arg-type]


def test_non_positive_timeout_is_a_value_error(shared: JupyterSandbox) -> None:
    with pytest.raises(ValueError, match="timeout"):
        shared.run("1", timeout=0)


def test_render_of_a_real_result(shared: JupyterSandbox) -> None:
    text = shared.run("print('hello')\n[][1]").render()
    assert "[stdout]\nhello" in text
    assert "IndexError" in text


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------


def test_files_written_lists_created_and_modified_files() -> None:
    # A workspace the sandbox made: files put in it before the kernel starts are the
    # agent's to change (a directory the caller gives keeps its files' owners, which
    # tests/test_isolation.py checks).
    with JupyterSandbox() as sandbox:
        (sandbox.workdir / "untouched.txt").write_text("same")
        (sandbox.workdir / "edited.txt").write_text("old")
        result = sandbox.run(
            "import os\n"
            "os.makedirs('sub', exist_ok=True)\n"
            "open('sub/new.csv', 'w').write('a,b')\n"
            "open('edited.txt', 'a').write(' and new')\n"
            "print(os.getcwd())"
        )
        assert result.ok, result.error
        assert result.stdout.strip() == str(sandbox.workdir)
        assert result.files_written == ("edited.txt", os.path.join("sub", "new.csv"))
        assert sandbox.run("x = 1").files_written == ()


def test_file_tracking_is_skipped_for_huge_workspaces(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i}.txt").write_text("x")
    with JupyterSandbox(tmp_path, SandboxLimits(max_tracked_files=10)) as sandbox:
        result = sandbox.run("open('new.txt', 'w').write('y')")
    assert result.ok
    assert result.files_written == ()
    assert (tmp_path / "new.txt").exists()


def test_sandboxes_share_a_workdir_and_never_delete_a_given_one(tmp_path: Path) -> None:
    writer = JupyterSandbox(tmp_path)
    reader = JupyterSandbox(tmp_path)
    try:
        assert writer.run("open('handoff.txt', 'w').write('from writer')").ok
        writer.close()
        assert tmp_path.is_dir()
        assert reader.run("print(open('handoff.txt').read())").stdout == "from writer\n"
    finally:
        reader.close()
    assert (tmp_path / "handoff.txt").read_text() == "from writer"


def test_missing_workdir_is_created(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    sandbox = JupyterSandbox(target)
    try:
        assert target.is_dir()
        assert sandbox.workdir == target.resolve()
    finally:
        sandbox.close()
    assert target.is_dir()


# --------------------------------------------------------------------------------------
# Timeouts and dying kernels
# --------------------------------------------------------------------------------------


def test_timeout_interrupts_and_keeps_state(shared: JupyterSandbox) -> None:
    shared.run("kept = 'state'")
    started = time.monotonic()
    # 3 s: the print comes first however busy the machine is; the hour's sleep does not,
    # so returning within a minute shows the timeout ended it.
    result = shared.run("import time\nprint('before')\ntime.sleep(3600)", timeout=3)
    assert time.monotonic() - started < 60
    assert result.timed_out
    assert not result.ok
    assert result.error is not None
    assert result.error.name == "TimeoutError"
    assert "KeyboardInterrupt" in result.error.traceback
    assert result.stdout == "before\n"
    assert not result.restarted
    assert shared.run("kept").stdout == "'state'\n"


@pytest.mark.slow
def test_uninterruptible_code_restarts_the_kernel(tmp_path: Path) -> None:
    limits = SandboxLimits(interrupt_grace_s=0.5)
    with JupyterSandbox(tmp_path, limits) as sandbox:
        sandbox.run("lost = 1")
        old_pid = sandbox.kernel_pid
        code = (
            "import signal, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "while True:\n"
            "    time.sleep(0.05)"
        )
        result = sandbox.run(code, timeout=0.5)
        assert result.timed_out
        assert result.restarted
        assert result.error is not None
        assert result.error.name == "TimeoutError"
        assert wait_gone([old_pid])
        assert sandbox.kernel_pid not in (None, old_pid)
        after = sandbox.run("lost")
        assert after.error is not None
        assert after.error.name == "NameError"
        assert sandbox.run("'works'").stdout == "'works'\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "describes"),
    [
        ("import os\nos._exit(1)", "exit status 1"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
    ],
)
def test_kernel_death_is_reported_and_recovered(tmp_path: Path, code: str, describes: str) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        sandbox.run("lost = 1")
        result = sandbox.run(code)
        assert result.restarted
        assert result.error is not None
        assert result.error.name == "KernelDied"
        assert describes in result.error.value
        assert sandbox.run("'alive'").stdout == "'alive'\n"
        assert sandbox.run("lost").error is not None


@pytest.mark.slow
def test_exit_restarts_without_error(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        result = sandbox.run("exit()")
        assert result.restarted
        assert result.error is None
        assert sandbox.run("1 + 2").stdout == "3\n"


@pytest.mark.slow
def test_kernel_killed_between_calls_is_restarted(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        kill_kernel_and_wait(sandbox)
        result = sandbox.run("'back'")
        assert result.restarted
        assert result.ok
        assert result.stdout == "'back'\n"
        assert "restarted" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("given_workdir", [True, False], ids=["given", "owned"])
def test_deleted_workdir_and_killed_kernel_recover(tmp_path: Path, given_workdir: bool) -> None:
    # Unconfined: confined code cannot delete its workspace (see test_isolation.py).
    sandbox = JupyterSandbox(tmp_path / "work" if given_workdir else None, isolation="none")
    try:
        workdir = sandbox.workdir
        assert sandbox.run("open('first.txt', 'w').write('1')").ok
        result = sandbox.run("import os, shutil\nshutil.rmtree(os.getcwd())\nos._exit(0)")
        assert result.restarted
        assert result.error is not None
        assert result.error.name == "KernelDied"
        assert "could not be restarted" not in result.error.value
        assert workdir.is_dir()  # created again for the new kernel
        result = sandbox.run(
            "import os\nopen('second.txt', 'w').write('2')\nprint(os.getcwd(), os.listdir())"
        )
        assert result.ok, result.render()
        assert result.stdout == f"{workdir} ['second.txt']\n"
        assert result.files_written == ("second.txt",)
        assert (workdir / "second.txt").read_text() == "2"
    finally:
        sandbox.close()
    assert workdir.is_dir() == given_workdir  # an owned one is still deleted on close


def test_deleted_workdir_under_a_live_kernel_is_restored(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    with JupyterSandbox(workdir, isolation="none") as sandbox:
        result = sandbox.run("import os, shutil\nkept = 'state'\nshutil.rmtree(os.getcwd())")
        assert result.ok, result.render()
        result = sandbox.run("open('new.txt', 'w').write('x')\nprint(kept, os.getcwd())")
        assert result.ok, result.render()
        assert result.stdout == f"state {workdir.resolve()}\n"  # state survived
        assert "working directory had been deleted" in result.stderr
        assert not result.restarted
        assert result.files_written == ("new.txt",)
        assert (workdir / "new.txt").read_text() == "x"
        assert sandbox.run("1").stderr == ""  # noted once


def flaky_start(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """Make the next ``failures`` kernel starts fail; return the list of attempts."""
    real = jupyter.start_kernel
    attempts: list[int] = []

    def start(*args: object, **kwargs: object) -> object:
        attempts.append(1)
        if len(attempts) <= failures:
            raise SandboxError("no kernel today")
        return real(*args, **kwargs)

    monkeypatch.setattr(jupyter, "start_kernel", start)
    return attempts


def test_start_failure_in_run_is_a_result_and_the_next_run_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = flaky_start(monkeypatch, failures=1)
    with JupyterSandbox(tmp_path) as sandbox:
        result = sandbox.run("1 + 1")
        assert result.error is not None
        assert result.error.name == "SandboxError"
        assert "could not be started" in result.error.value
        assert "no kernel today" in result.error.value
        assert not result.ok
        assert sandbox.kernel_pid is None
        result = sandbox.run("1 + 1")
        assert result.ok, result.render()
        assert result.stdout == "2\n"
        assert len(attempts) == 2


def test_start_failure_is_still_raised_by_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky_start(monkeypatch, failures=1)
    with JupyterSandbox(tmp_path) as sandbox:
        with pytest.raises(SandboxError, match="no kernel today"):
            sandbox.start()
        sandbox.start()
        assert sandbox.kernel_pid is not None


@pytest.mark.slow
def test_failed_restart_is_reported_and_the_next_run_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        sandbox.start()
        attempts = flaky_start(monkeypatch, failures=2)
        died = sandbox.run("import os\nos._exit(1)")
        assert died.error is not None
        assert died.error.name == "KernelDied"
        assert "could not be restarted" in died.error.value
        assert sandbox.kernel_pid is None

        async def later() -> ExecResult:
            return await sandbox.arun("1 + 1")

        failed = asyncio.run(later())
        assert failed.error is not None
        assert failed.error.name == "SandboxError"
        assert "no kernel today" in failed.error.value
        back = asyncio.run(later())
        assert back.ok, back.render()
        assert back.stdout == "2\n"
        assert len(attempts) == 3


@pytest.mark.slow
def test_failed_start_after_the_kernel_ended_between_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        kill_kernel_and_wait(sandbox)
        flaky_start(monkeypatch, failures=1)
        failed = sandbox.run("1")
        assert failed.error is not None
        assert failed.error.name == "SandboxError"
        assert "had ended (killed by SIGKILL); earlier variables are gone" in failed.stderr
        assert "restarted" not in failed.stderr  # it was not
        back = sandbox.run("'back'")
        assert back.ok, back.render()
        assert back.stdout == "'back'\n"


def test_hand_out_to_a_missing_workdir_creates_it(tmp_path: Path) -> None:
    target = (tmp_path / "not" / "yet").resolve()
    # Only unconfined kernels move (a confined one sees only the workspace it started in).
    with JupyterSandbox(tmp_path / "waiting", isolation="none") as sandbox:
        sandbox.start()
        assert sandbox._move_to(target, owned=False)
        assert target.is_dir()
        assert sandbox.workdir == target
        assert sandbox.run("import os\nos.getcwd()").stdout == f"{str(target)!r}\n"


# --------------------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------------------


def test_kernel_start_failure_is_reported_with_its_cause(tmp_path: Path) -> None:
    # A package on the kernel's path that shadows ipykernel makes the start fail.
    fake = tmp_path / "fake"
    (fake / "ipykernel").mkdir(parents=True)
    (fake / "ipykernel" / "__init__.py").write_text("raise ImportError('ipykernel is broken')")
    sandbox = JupyterSandbox(tmp_path / "work", env={"PYTHONPATH": str(fake)})
    try:
        with pytest.raises(SandboxError, match="ipykernel is broken"):
            sandbox.start()
        # Inside run() the failure is a result, and every call tries again.
        for _ in range(2):
            result = sandbox.run("1")
            assert result.error is not None
            assert result.error.name == "SandboxError"
            assert "could not be started" in result.error.value
            assert "ipykernel is broken" in result.error.value
            assert not result.restarted
            assert sandbox.kernel_pid is None
    finally:
        sandbox.close()


def test_kernel_starts_lazily(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        assert sandbox.kernel_pid is None
        sandbox.run("1")
        assert sandbox.kernel_pid is not None


def test_close_kills_the_process_tree_and_removes_its_files() -> None:
    # Pids as the code sees them are the host's only without namespaces (a confined
    # sandbox's processes die with its PID namespace: test_isolation.py).
    sandbox = JupyterSandbox(isolation="none")
    workdir = sandbox.workdir
    # A plain child, and a daemon that double-forks into its own session (it leaves the
    # kernel's process group; the kernel adopts it as a subreaper).
    daemon = (
        "import os, sys, time\n"
        "if os.fork():\n"
        "    sys.exit()\n"
        "os.setsid()\n"
        "open('daemon.pid', 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    result = sandbox.run(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"subprocess.run([sys.executable, '-c', {daemon!r}], check=True)\n"
        "while not os.path.exists('daemon.pid') or not open('daemon.pid').read():\n"
        "    time.sleep(0.01)\n"
        "print(child.pid, open('daemon.pid').read())"
    )
    assert result.ok, result.render()
    child_pids = [int(pid) for pid in result.stdout.split()]
    assert len(child_pids) == 2
    kernel = sandbox._res.kernel
    assert kernel is not None
    pids = [kernel.pid, *child_pids]
    assert not any(gone(pid) for pid in pids)
    sandbox.close()
    assert wait_gone(pids)
    assert not kernel.runtime_dir.exists()  # connection file and sockets
    assert not workdir.exists()  # the sandbox made it, so it removed it
    assert sandbox.closed
    sandbox.close()  # idempotent
    with pytest.raises(SandboxError):
        sandbox.run("1")


def test_context_manager_closes(tmp_path: Path) -> None:
    with JupyterSandbox(tmp_path) as sandbox:
        sandbox.start()
        pid = sandbox.kernel_pid
    assert pid is not None
    assert wait_gone([pid])
    assert tmp_path.is_dir()


def test_garbage_collection_closes() -> None:
    sandbox = JupyterSandbox()
    sandbox.start()
    pid, workdir = sandbox.kernel_pid, sandbox.workdir
    assert pid is not None
    del sandbox
    gc.collect()
    assert wait_gone([pid])
    assert not workdir.exists()


@pytest.mark.slow
def test_interpreter_exit_closes(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from mappa_env.sandbox import JupyterSandbox
        sandbox = JupyterSandbox(isolation="none")
        result = sandbox.run(
            "import os, subprocess\\n"
            "child = subprocess.Popen(['sleep', '60'])\\n"
            "print(os.getpid(), child.pid)"
        )
        print(result.stdout.strip(), sandbox.workdir, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=True,
    )
    kernel_pid, child_pid, workdir = out.stdout.split()
    assert wait_gone([int(kernel_pid), int(child_pid)])
    assert not Path(workdir).exists()


def test_factory_makes_configured_sandboxes(tmp_path: Path) -> None:
    limits = SandboxLimits(timeout_s=7)
    factory = JupyterSandbox.factory(limits, env={"MAPPA_FACTORY_VAR": "yes"})
    sandbox = factory(tmp_path)
    try:
        assert isinstance(sandbox, JupyterSandbox)
        assert sandbox.limits is limits
        assert sandbox.workdir == tmp_path.resolve()
        assert sandbox.run("import os\nos.environ['MAPPA_FACTORY_VAR']").stdout == "'yes'\n"
    finally:
        sandbox.close()


# --------------------------------------------------------------------------------------
# Concurrency
# --------------------------------------------------------------------------------------


def test_threads_are_serialised_on_one_sandbox(shared: JupyterSandbox) -> None:
    shared.run("import time")
    mismatches: list[tuple[str, str]] = []

    def worker(token: str) -> None:
        for i in range(15):
            expected = f"{token}-{i}"
            result = shared.run(f"time.sleep(0.001)\nprint({expected!r})")
            if result.stdout != expected + "\n":
                mismatches.append((expected, result.stdout))

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mismatches == []


@pytest.mark.slow
def test_arun_overlaps_sandboxes_and_does_not_block_the_loop(tmp_path: Path) -> None:
    sandboxes = [JupyterSandbox(tmp_path / str(i)) for i in range(3)]

    # Each kernel prints when its 2 s sleep began and ended: the sleeps overlapped when
    # the last began before the first ended, which holds unless the three requests are
    # sent 2 s apart, and fails for sandboxes run one after another however fast.
    code = "import time\nbegan = time.time()\ntime.sleep(2)\nprint(began, time.time())"

    async def main() -> tuple[list[ExecResult], int]:
        await asyncio.gather(*(s.arun("1") for s in sandboxes))  # start the kernels
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        results = await asyncio.gather(*(s.arun(code) for s in sandboxes))
        tick_task.cancel()
        return results, ticks

    try:
        results, ticks = asyncio.run(main())
    finally:
        for sandbox in sandboxes:
            sandbox.close()
    assert all(result.ok for result in results)
    spans = [tuple(map(float, result.stdout.split())) for result in results]
    assert max(began for began, _ in spans) < min(ended for _, ended in spans), spans
    assert ticks >= 20  # the loop kept running while the code ran (some 200 ticks' time)


@pytest.mark.slow
def test_close_from_another_thread_ends_a_running_call(tmp_path: Path) -> None:
    sandbox = JupyterSandbox(tmp_path)
    sandbox.start()
    outcome: list[ExecResult] = []
    runner = threading.Thread(
        target=lambda: outcome.append(sandbox.run("import time\ntime.sleep(3600)", timeout=600))
    )
    runner.start()
    time.sleep(0.5)
    sandbox.close()
    # The call would last an hour (or its 600 s timeout): ending within a minute shows
    # the close ended it, on however busy a machine.
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert outcome[0].error is not None
    assert outcome[0].error.name == "SandboxClosed"


def test_printed_lone_surrogates_are_replaced_not_lost():
    with JupyterSandbox() as sandbox:
        result = sandbox.run('print("a" + chr(0xD800) + "b")')
        assert result.stdout == "a?b\n"
        assert result.error is None
        assert "Traceback" not in result.stderr


def test_kernels_start_and_close_from_worker_threads_of_a_running_loop(tmp_path: Path) -> None:
    # jupyter-client remembers the running loop in a context variable (a notebook's
    # ipykernel sets it too); a worker thread of asyncio.to_thread inherits it and cannot
    # run jupyter's sync wrappers on it: the kernel did not start ("This event loop is
    # already running"), and a close dropped the cleanup coroutine unawaited, leaving
    # the control socket and zmq context of every closed kernel behind.
    import warnings

    from jupyter_core.utils import ensure_event_loop

    async def run_and_close() -> object:
        ensure_event_loop()  # what jupyter-client's own calls do inside a running loop
        sandbox = JupyterSandbox(tmp_path, SandboxLimits(timeout_s=20), isolation="none")
        result = await asyncio.to_thread(sandbox.run, "1 + 1")
        manager = sandbox._res.kernel.manager
        await asyncio.to_thread(sandbox.close)
        return result, manager

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, manager = asyncio.run(run_and_close())
        gc.collect()
    assert result.stdout == "2\n"
    assert manager._control_socket is None  # closed by jupyter-client's cleanup
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert not [w for w in caught if "unclosed event loop" in str(w.message)]


def test_one_process_can_hold_more_kernel_sockets_than_zeromqs_default() -> None:
    # A live kernel holds 8 sockets of the shared context; ZeroMQ's default cap of 1,023
    # stopped a process at 127 kernels. 1,100 sockets need as many open files.
    import resource

    import zmq

    from mappa_env.sandbox._kernel import _zmq_context

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if wanted < 2048:
        pytest.skip(f"the open-file limit ({hard}) is too low to hold 1,100 sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    context = _zmq_context(SandboxLimits().max_message_bytes)
    sockets = []
    try:
        for _ in range(1100):
            sockets.append(context.socket(zmq.PAIR))
    finally:
        for socket in sockets:
            socket.close(linger=0)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(sockets) == 1100


def test_a_start_that_fails_after_the_launch_leaves_no_kernel_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    import zmq

    from mappa_env.sandbox._kernel import _manager_class

    def out_of_files(self: object) -> None:
        raise zmq.ZMQError(errno.EMFILE)

    # Connecting the manager's control socket comes after the kernel process started.
    monkeypatch.setattr(_manager_class(), "_connect_control_socket", out_of_files)
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    runtime_dirs = set(Path(tempfile.gettempdir()).glob("mappa-kernel-*"))
    with (
        JupyterSandbox(tmp_path, isolation="none") as sandbox,
        pytest.raises(SandboxError) as raised,
    ):
        sandbox.start()
    message = str(raised.value)
    assert "could not launch the kernel process" in message
    assert "open files of this process's limit" in message
    assert "ulimit -n" in message
    left = [c for c in me.children(recursive=True) if c.pid not in before and c.is_running()]
    assert [c for c in left if c.status() != psutil.STATUS_ZOMBIE] == []
    assert set(Path(tempfile.gettempdir()).glob("mappa-kernel-*")) <= runtime_dirs


def test_the_first_kernel_context_raises_a_low_open_file_limit() -> None:
    # In a child whose soft limit is 256 (under a hard limit above it): the shared
    # context's creation raises the soft limit, and never lowers a higher one.
    script = textwrap.dedent(
        """
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        from mappa_env.sandbox._kernel import _zmq_context, raise_open_files_limit
        _zmq_context(1024)
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
        print(raise_open_files_limit(300))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    soft, hard, again = int(out[0]), int(out[1]), int(out[2])
    if hard != -1 and hard <= 256:
        pytest.skip(f"the hard open-file limit ({hard}) leaves nothing to raise")
    assert soft == (65536 if hard == -1 else min(65536, hard))
    assert again == soft  # asking for less lowers nothing
