"""The namespace boundary: every way out of the sandbox an agent was seen to take fails.

Each test is one row of the attack table (agent code run through ``JupyterSandbox`` or
an environment's ``step``), tried under ``isolation="namespaces"``. They need Linux and
bubblewrap; ``.ci/run`` installs bubblewrap where it can, and they are skipped (with
the reason) where namespaces cannot work.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import mappa_env
from mappa_env._fs import remove_tree
from mappa_env.sandbox import JupyterSandbox, SandboxLimits
from mappa_env.sandbox.isolation import (
    Confinement,
    IsolationUnavailableError,
    bindable,
    resolve_confinement,
)

ROOT = Path(__file__).resolve().parents[1]

try:
    CONFINEMENT: Confinement | None = resolve_confinement("namespaces")
    UNAVAILABLE = ""
except IsolationUnavailableError as exc:  # the reason is shown by pytest -ra
    CONFINEMENT, UNAVAILABLE = None, str(exc)

needs_namespaces = pytest.mark.skipif(CONFINEMENT is None, reason=UNAVAILABLE)
pytestmark = needs_namespaces


@pytest.fixture
def confined(tmp_path: Path):
    with JupyterSandbox(tmp_path / "work", isolation="namespaces") as sandbox:
        yield sandbox


def run_ok(sandbox: JupyterSandbox, code: str) -> str:
    result = sandbox.run(code)
    assert result.ok, result.render()
    return result.stdout


def test_resolution_and_the_environment_option():
    assert resolve_confinement("none").isolated is False
    with pytest.raises(ValueError, match="isolation must be one of"):
        resolve_confinement("sometimes")
    env = mappa_env.make("MathChat-v0", tasks="gen:2", isolation="namespaces")
    assert env.sandbox_confinement.isolated
    env.close()
    env = mappa_env.make("MathChat-v0", tasks="gen:2", isolation="none")
    assert not env.sandbox_confinement.isolated
    env.close()


def test_this_package_cannot_be_imported_and_its_source_is_not_there(confined):
    out = run_ok(
        confined,
        "import importlib.util, os\n"
        "print([importlib.util.find_spec(n) is not None for n in "
        "('mappa_env', 'mappa_agents', 'mappa_train')])\n"
        f"print(os.path.exists({str(ROOT / 'mappa_env' / 'tasks' / 'generator.py')!r}))\n"
        f"print(os.listdir({str(ROOT)!r}) if os.path.isdir({str(ROOT)!r}) else None)",
    )
    found, source, listing = out.splitlines()
    assert found == "[False, False, False]"
    assert source == "False"
    # The checkout's directory exists inside only as a parent of the venv, if at all.
    assert listing in ("None", "[]", "['.venv']")
    result = confined.run("import mappa_env")
    assert result.error is not None
    assert result.error.name == "ModuleNotFoundError"


def test_task_files_and_answers_elsewhere_on_disk_are_not_visible(confined, tmp_path):
    answers = tmp_path / "data" / "answers" / "task" / "test_answer.csv"
    answers.parent.mkdir(parents=True)
    answers.write_text("id,y\n1,42\n")
    bench = ROOT.parent / "shared" / "data" / "bench"
    out = run_ok(
        confined,
        "import os\n"
        "hits = []\n"
        "for top in ('/', ):\n"
        "    for root, dirs, files in os.walk(top):\n"
        "        if root.startswith(('/proc', '/usr', '/sys')):\n"
        "            dirs[:] = []\n"
        "            continue\n"
        "        hits += [os.path.join(root, f) for f in files\n"
        "                 if f == 'test_answer.csv' or f.endswith('aime_2025.json')]\n"
        f"print(hits, os.path.exists({str(bench)!r}), os.path.exists({str(answers)!r}))",
    )
    assert out.strip() == "[] False False"


def test_the_environment_process_is_invisible_and_out_of_reach(confined):
    me = os.getpid()
    out = run_ok(
        confined,
        "import os, signal\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(os.getppid(), pids[:2])\n"
        f"try:\n    os.kill({me}, signal.SIGSTOP)\n    print('signalled')\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
        "try:\n    open('/proc/1/mem', 'rb').read(1)\n    print('read init memory')\n"
        "except OSError as e:\n    print(type(e).__name__)\n",
    )
    lines = out.splitlines()
    assert lines[0].startswith("1 [1, 2")  # bubblewrap's init and the kernel itself
    assert lines[1] in ("ProcessLookupError", "PermissionError")
    assert lines[2] in ("PermissionError", "FileNotFoundError", "OSError")
    assert psutil.Process(me).status() != psutil.STATUS_STOPPED


def test_killing_its_parent_only_ends_the_sandbox(confined):
    confined.run("x = 1")
    result = confined.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    # Its parent is the namespace's init, owned by another user (refused); had it died,
    # only the sandbox would have ended and come back.
    assert result.error is not None
    assert result.error.name in ("PermissionError", "KernelDied")
    assert confined.run("print('back')").stdout == "back\n"


def test_no_network_not_even_servers_on_the_hosts_loopback(confined):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    out = run_ok(
        confined,
        "import socket\n"
        f"try:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    s.sendall(b'secret')\n    print('connected')\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    print('out')\n"
        "except OSError as e:\n    print(type(e).__name__)\n",
    )
    stop.set()
    thread.join(2)
    server.close()
    assert "connected" not in out
    assert "out" not in out.split()
    assert accepted == []


def test_api_keys_are_in_no_environment_it_can_read(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-mappa-test-secret")
    with JupyterSandbox(tmp_path, isolation="namespaces") as sandbox:
        out = run_ok(
            sandbox,
            "import os, glob\n"
            "found = 'sk-mappa-test-secret' in str(os.environ)\n"
            "for path in glob.glob('/proc/*/environ'):\n"
            "    try:\n        found |= b'sk-mappa-test-secret' in open(path, 'rb').read()\n"
            "    except OSError:\n        pass\n"
            "print(found)",
        )
    assert out.strip() == "False"


def test_nothing_outside_its_workspace_can_be_written_or_reached(tmp_path):
    other = tmp_path / "other-episode"
    with (
        JupyterSandbox(tmp_path / "mine", isolation="namespaces") as mine,
        JupyterSandbox(other, isolation="namespaces") as theirs,
    ):
        run_ok(theirs, "open('theirs.txt', 'w').write('keep')")
        runtime = theirs._res.kernel.runtime_dir
        out = run_ok(
            mine,
            "import os, shutil\n"
            "results = []\n"
            f"for target in ({str(tmp_path / 'escape.txt')!r}, '/usr/escape.txt',\n"
            f"               {str(ROOT / 'escape.txt')!r}, {str(other / 'x.txt')!r}):\n"
            "    try:\n        open(target, 'w').write('x')\n        results.append('wrote')\n"
            "    except OSError as e:\n        results.append(type(e).__name__)\n"
            f"print(results, os.path.exists({str(other)!r}), os.path.exists({str(runtime)!r}))\n"
            f"shutil.rmtree({str(other)!r}, ignore_errors=True)\n"
            "shutil.rmtree(os.getcwd(), ignore_errors=True)\n",
        )
        results, visible_other, visible_runtime = out.strip().rsplit(" ", 2)
        assert "wrote" not in results
        assert (visible_other, visible_runtime) == ("False", "False")
        assert (other / "theirs.txt").read_text() == "keep"
        assert not (tmp_path / "escape.txt").exists()
        assert not (ROOT / "escape.txt").exists()
        assert mine.workdir.is_dir()  # a mount point inside: it cannot be removed
        assert theirs.run("print(open('theirs.txt').read())").stdout == "keep\n"


def test_a_planted_module_changes_nothing_for_later_kernels(tmp_path):
    workdir = tmp_path / "work"
    with JupyterSandbox(workdir, isolation="namespaces") as planter:
        run_ok(
            planter,
            "for name in ('json', 'zmq', 'ipykernel', 'traitlets', 'os'):\n"
            "    open(name + '.py', 'w').write(\"open('/tmp/../' + __file__ + '.ran', 'w')\\n\""
            " \"raise SystemExit('planted')\\n\")\n",
        )
    with JupyterSandbox(workdir, isolation="namespaces") as later:
        out = run_ok(later, "import json\nprint(json.dumps([1]))")
        assert out == "[1]\n"
    assert not list(workdir.glob("*.ran"))


def test_shared_memory_and_children_count_against_one_memory_limit(tmp_path):
    if CONFINEMENT is None or CONFINEMENT.cgroups is None:
        pytest.skip("this machine does not let this process make memory cgroups")
    limits = SandboxLimits(total_memory_bytes=256 * 1024**2, tmp_bytes=512 * 1024**2)
    with JupyterSandbox(tmp_path, limits, isolation="namespaces") as sandbox:
        run_ok(sandbox, "x = 1")
        # MAP_SHARED anonymous memory is not RLIMIT_DATA's: only the cgroup holds it.
        result = sandbox.run(
            "import mmap\nm = mmap.mmap(-1, 400 * 1024**2, flags=mmap.MAP_SHARED)\n"
            "for i in range(0, len(m), 4096):\n    m[i] = 1\nprint('filled')"
        )
        assert result.error is not None, result.render()
        assert result.error.name == "MemoryError", result.render()
        assert result.restarted
        # Children share the one limit too (each well below its own RLIMIT_DATA).
        result = sandbox.run(
            "import subprocess, sys\n"
            "code = 'b = bytearray(120 * 1024**2); import time; time.sleep(5)'\n"
            "ps = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(3)]\n"
            "print([p.wait() for p in ps])"
        )
        assert result.error is None or result.error.name in ("MemoryError", "KernelDied")
        if result.error is None:
            assert any(int(c) != 0 for c in result.stdout.strip("[]\n").split(", "))
        # A private /dev/shm: what is written there is gone with the sandbox.
        before = set(os.listdir("/dev/shm"))
        run_ok(sandbox, "open('/dev/shm/mappa-left-behind', 'wb').write(b'x' * 1024)")
        assert set(os.listdir("/dev/shm")) == before


def _sandbox_processes(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def test_no_process_outlives_close_not_even_a_pid_hopper(tmp_path):
    marker = f"mappa-hopper-{os.getpid()}-{time.monotonic_ns()}"
    # Each hop forks, the parent exits and the child detaches (setsid): a new pid every
    # 200 ms, each appended to hops.log in the workspace, so the test sees it hop
    # whether or not it catches a pid alive.
    hopper = (
        "import os, sys, time\n"
        "while True:\n"
        "    if os.fork():\n"
        "        os._exit(0)\n"
        "    os.setsid()\n"
        "    with open('hops.log', 'a') as log:\n"
        "        log.write(f'{os.getpid()}\\n')\n"
        "    time.sleep(0.2)\n"
    )
    sandbox = JupyterSandbox(tmp_path, isolation="namespaces")
    run_ok(
        sandbox,
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {hopper!r}, {marker!r}])\n",
    )
    hops = tmp_path / "hops.log"

    def hop_count() -> int:
        return len(hops.read_text().split()) if hops.exists() else 0

    started = time.monotonic()
    deadline = started + 60  # left after 3 hops: long only for a busy machine
    while hop_count() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hop_count() >= 3, sandbox.run("print(open('hops.log').read())")
    # Five hops' time as this machine runs them now (0.2 s each when idle, more when
    # busy): a surviving hopper would have written again.
    hop_s = (time.monotonic() - started) / hop_count()
    sandbox.close()
    settled = hop_count()
    time.sleep(max(1.0, 5 * hop_s))
    assert hop_count() == settled
    assert not [p for p in _sandbox_processes(marker) if p.status() != psutil.STATUS_ZOMBIE]


def test_its_crash_log_cannot_be_pointed_at_a_file_of_ours(tmp_path, monkeypatch):
    # The environment reads the kernel's fault log after a crash: a log swapped for a
    # link would make it read, and hand back, a file the code itself cannot.
    monkeypatch.setenv("MAPPA_FAULT_SECRET", "fault-secret-value")
    with JupyterSandbox(tmp_path, isolation="namespaces") as sandbox:
        sandbox.start()
        runtime = sandbox._res.kernel.runtime_dir
        out = run_ok(
            sandbox,
            "import os\nresults = []\n"
            f"log = {str(runtime / 'fault.log')!r}\n"
            "for action in (lambda: os.unlink(log),\n"
            "               lambda: os.rename(log, log + '.old'),\n"
            "               lambda: os.symlink('/proc/1/environ', log + '.new')):\n"
            "    try:\n        action()\n        results.append('done')\n"
            "    except OSError as e:\n        results.append(type(e).__name__)\n"
            "print(results)",
        )
        assert "done" not in out
        result = sandbox.run("import ctypes\nctypes.string_at(0)")
        assert result.error is not None
        assert result.error.name == "KernelDied"
        assert "fault-secret-value" not in result.render()


def test_a_kernel_started_from_a_short_lived_thread_outlives_it(tmp_path):
    # The parent-death signal bubblewrap relies on follows the starting thread.
    with JupyterSandbox(tmp_path, isolation="namespaces") as sandbox:
        thread = threading.Thread(target=sandbox.run, args=("x = 41",))
        thread.start()
        thread.join()
        time.sleep(0.3)
        assert sandbox.run("print(x + 1)").stdout == "42\n"


def test_a_fork_bomb_is_stopped_inside_too(tmp_path):
    bomb = "import os, time\nfor _ in range(10):\n    os.fork()\ntime.sleep(60)"
    limits = SandboxLimits(max_processes=32)
    with JupyterSandbox(tmp_path, limits, isolation="namespaces") as sandbox:
        run_ok(sandbox, "x = 1")
        result = sandbox.run(bomb, timeout=50)
        assert result.error is not None
        assert result.error.name == "ProcessLimitExceeded"
        assert result.restarted
        assert sandbox.run("'recovered'").stdout == "'recovered'\n"


def test_files_the_environment_put_there_are_the_agents_to_change():
    env = mappa_env.make("MathChat-v0", tasks="gen:2", isolation="namespaces")
    try:
        env.reset(seed=0)
        (env.workdir / "given.txt").write_text("old")
        env.step("I think it is 3.")
        env.step("```python\nopen('given.txt', 'a').write(' new')\nprint(1)\n```")
        assert env.infos["code_executor"]["tool"]["ok"], env.infos["code_executor"]
        assert (env.workdir / "given.txt").read_text() == "old new"
    finally:
        env.close()


def test_a_directory_the_caller_gives_keeps_its_files_and_its_interpreter_is_refused(tmp_path):
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    with JupyterSandbox(workdir, isolation="namespaces") as sandbox:
        out = run_ok(
            sandbox,
            "open('new.txt', 'w').write('x')\n"
            "try:\n    open('notes.txt', 'a').write('!')\n    print('changed')\n"
            "except OSError as e:\n    print(type(e).__name__)",
        )
        assert out.strip() == "PermissionError"
    assert (workdir / "notes.txt").stat().st_uid == os.getuid()
    assert (workdir / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="binds read-only"):
        JupyterSandbox(Path(sys.prefix).resolve().parent, isolation="namespaces")
    with pytest.raises(ValueError, match="binds read-only"):
        JupyterSandbox(Path(sys.prefix).resolve() / "work", isolation="namespaces")


def test_it_runs_as_an_unprivileged_user_without_capabilities(confined):
    out = run_ok(
        confined,
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "caps = [l.split()[1] for l in status.splitlines() if l.startswith('CapEff')]\n"
        "print(os.getuid() != 0 or None, caps[0])",
    )
    allowed, caps = out.split()
    assert allowed == "True"
    assert int(caps, 16) == 0


def test_nothing_of_the_checkout_is_bound_but_the_interpreters_own_prefix(tmp_path):
    checkout = Path(mappa_env.__file__).resolve().parents[1]
    outside = tmp_path / "extra-site"
    outside.mkdir()
    kept, hidden = bindable([checkout, checkout / "tests", checkout / "benchmarks", outside])
    assert kept == [str(outside.resolve())]
    assert hidden == []
    prefix = Path(sys.prefix).resolve()
    kept, hidden = bindable([prefix, checkout / "tests"])
    assert kept == [str(prefix)]  # a .venv inside the checkout is the interpreter's own
    # Wherever a bound path holds the project's packages, they are covered.
    assert all(not Path(h).is_relative_to(prefix) or "mappa" in h for h in hidden)


def test_the_inspector_command_is_confined_too():
    from mappa_env.envs.dsbench import DSBenchEnv

    env = DSBenchEnv(isolation="namespaces")
    try:
        env.reset(seed=0)
        command = env._inspector_command()
        assert command[0] == "/bin/sh"
        assert any(part.endswith("bwrap") for part in command)
        assert "-I" in command
        done = subprocess.run(
            [*command[:-1], "import os, json; print(json.dumps(os.getuid()))"],
            capture_output=True,
            text=True,
            cwd=env.workdir,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) != 0 or CONFINEMENT.run_as is None
    finally:
        env.close()


def test_a_workspace_removed_under_a_live_kernel_restarts_it_there(tmp_path):
    workdir = tmp_path / "work"
    with JupyterSandbox(workdir, isolation="namespaces") as sandbox:
        run_ok(sandbox, "kept = 1")
        remove_tree(workdir)  # the environment's doing: agent code cannot remove it
        result = sandbox.run("open('new.txt', 'w').write('x')\nprint('ok')")
        assert result.ok, result.render()
        assert result.restarted  # its view of the old directory could not be repaired
        assert "restarted in it" in result.stderr
        assert (workdir / "new.txt").read_text() == "x"
        assert sandbox.run("kept").error.name == "NameError"


if __name__ == "__main__":  # pragma: no cover - a quick look at what is bound
    print(json.dumps(resolve_confinement("namespaces").describe(), indent=2), file=sys.stderr)


def test_the_running_scripts_directory_is_not_bound(tmp_path):
    folder = tmp_path / "experiment"
    folder.mkdir()
    (folder / "answers.csv").write_text("id,y\n1,42\n")
    script = folder / "run.py"
    script.write_text(
        "from mappa_env.sandbox import JupyterSandbox\n"
        "with JupyterSandbox(isolation='namespaces') as sandbox:\n"
        f'    print(sandbox.run("import os; print(os.path.exists({str(folder)!r}))").stdout)\n'
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", done.stderr


def test_system_calls_that_reach_past_the_namespaces_are_refused(confined):
    if CONFINEMENT is None or CONFINEMENT.seccomp is None:
        pytest.skip("no seccomp filter for this architecture")
    out = run_ok(
        confined,
        "import ctypes, os, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def refused(result):\n"
        "    return result == -1 and ctypes.get_errno() == 1\n"
        "checks = {\n"
        "    'unshare user': refused(libc.unshare(0x10000000)),\n"
        "    'add_key': refused(libc.syscall(248 if os.uname().machine == 'x86_64' else 217,\n"
        "        b'user', b'channel', b'answer', 6, -2)),\n"
        "    'ptrace': refused(libc.ptrace(16, 1, 0, 0)),\n"
        "}\n"
        "checks['unshare command'] = subprocess.run(['unshare', '-Ur', 'true'],\n"
        "    capture_output=True).returncode != 0\n"
        "box = []\n"
        "t = threading.Thread(target=box.append, args=(1,)); t.start(); t.join()\n"
        "checks['threads still work'] = box == [1]\n"
        "checks['processes still work'] = subprocess.run(['true']).returncode == 0\n"
        "print(sorted(k for k, v in checks.items() if not v))",
    )
    assert out.strip() == "[]"


def test_python_started_by_a_relative_path_through_a_linked_folder_is_confined(tmp_path):
    executable = Path(sys.executable)
    if executable.parent.parent != Path(sys.prefix):
        pytest.skip("the interpreter is not in its prefix's bin directory")
    (tmp_path / "venv").symlink_to(sys.prefix, target_is_directory=True)
    (tmp_path / "real-packages").mkdir()
    (tmp_path / "real-packages" / "linked_module.py").write_text("VALUE = 5\n")
    (tmp_path / "packages").symlink_to(tmp_path / "real-packages", target_is_directory=True)
    (tmp_path / "cwd").mkdir()
    script = (
        "from mappa_env.sandbox import JupyterSandbox\n"
        "from mappa_env.sandbox.isolation import resolve_confinement\n"
        "print(resolve_confinement('auto').mode)\n"
        "with JupyterSandbox(isolation='auto') as sandbox:\n"
        "    result = sandbox.run('import linked_module; print(linked_module.VALUE)')\n"
        "    print(sandbox.confinement.mode, result.stdout.strip() or result.render())\n"
    )
    done = subprocess.run(
        [f"../venv/bin/{executable.name}", "-c", script],
        cwd=tmp_path / "cwd",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), "../packages"])},
    )
    assert done.returncode == 0, done.stderr
    # Not "none" after a warning that setpriv could not execute "../venv/bin/python".
    assert done.stdout.split() == ["namespaces", "namespaces", "5"], done.stdout + done.stderr
