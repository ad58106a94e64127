"""Garbage, faults and adversaries through the environments' own entry points.

Each test keeps one attack running: agent text built to stall the text readers, cheap
DSBench work built to collect high coach scores, options that would turn a run into
nonsense, and (where bubblewrap confines) agent code that reaches for other sandboxes'
resources. The namespace boundary's own attack table is ``tests/test_isolation.py``.
Budget: the whole module runs in well under 30 s on two cores.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import mappa_env
from mappa_agents.report import describe_isolation, format_table, isolation_of
from mappa_env.coach import CoachTemplates, RulesCoach
from mappa_env.dsbench import BuiltinTaskSet, outcome_cap, score_submission
from mappa_env.dsbench.reference import engineer_action
from mappa_env.envs.dsbench import DSBenchEnv
from mappa_env.errors import SettingsError
from mappa_env.sandbox import JupyterSandbox, KernelPool, SandboxLimits
from mappa_env.sandbox.base import ExecResult
from mappa_env.sandbox.isolation import (
    Confinement,
    IsolationUnavailableError,
    UidPool,
    resolve_confinement,
)
from mappa_env.tasks import MathTask
from mappa_env.tasks.math import _read_rows
from tests.fakes import FixedCoach, InProcessSandbox

TASK = MathTask(id="t-add", prompt="What is 2 + 3?", answer="5")
#: The cap on an action's length (``max_action_chars``'s default).
ACTION_CHARS = 32_768
#: A reader of agent text must be linear: at 8x the text, a step may take at most this many
#: times as long (a linear reader measured 2-6x here, the quadratic readers this module
#: once caught 40-70x, the cubic one far more). A ratio, not seconds, so a slow machine
#: slows both sides alike; each side is the fastest of three tries, timed in this
#: process's CPU time (``cpu_seconds``), which other processes on the cores do not add to.
GROWTH_BOUND = 24
#: Below this a step is too quick to time: a ratio of two such steps is noise.
TIMING_FLOOR_S = 0.002


#: The clock of the growth checks: CPU time of this process (all its threads), the work
#: done, not the wall time a loaded machine stretches.
cpu_seconds = time.process_time


class EchoSandbox:
    """Prints the code it is given back as stdout: hostile text reaches the output readers."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = Path(workdir)

    @property
    def workdir(self) -> Path:
        return self._workdir

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        return ExecResult(stdout=code)

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        return self.run(code, timeout)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- hostile text


#: Pieces whose repetition once stalled a reader (backticks: cubic in the fence
#: expression; newlines: quadratic in the answer-line fallback; unclosed ``<think>``
#: tags and ``\boxed`` runs: quadratic), and neighbours of them.
HOSTILE_PIECES = [
    "`", "``", "```", "````\n", "```python\n", "\n", "\r\n", " ", "\t", "<think>",
    "</think>", "<think>`", "\\boxed", "\\boxed{", "{", "\\{", "$", "Answer:", "answer\n",
    "final answer", "the answer is ", "**", "%time ", "!", "1.", "\x1b[", "PROCESS_SCORE",
]  # fmt: skip


def hostile(piece: str, wrap: bool = False, chars: int = ACTION_CHARS) -> str:
    """An action of ``piece`` repeated to ``chars`` (inside a code fence if ``wrap``)."""
    if wrap:
        body = hostile(piece, chars=chars)[: chars - 20]
        return f"```python\n{body}\n```"
    return (piece * (chars // len(piece) + 1))[:chars]


def grows_linearly(seconds_at) -> tuple[bool, float, float]:
    """Whether ``seconds_at(chars)`` at the length cap stays within ``GROWTH_BOUND`` times
    its value at an eighth of it; up to three tries (another process may stall one).

    Returns:
        The verdict and the last tries' seconds at an eighth and at the cap.
    """
    small = big = 0.0
    for _ in range(3):
        small = min(seconds_at(ACTION_CHARS // 8) for _ in range(3))
        big = min(seconds_at(ACTION_CHARS) for _ in range(3))
        if big <= GROWTH_BOUND * max(small, TIMING_FLOOR_S):
            return True, small, big
    return False, small, big


def test_the_growth_bound_catches_a_quadratic_reader():
    def quadratic(chars: int) -> float:
        start = cpu_seconds()
        text = hostile("\n", chars=chars)
        for _ in range(chars // 4):  # a reader that rescans the text per line it finds
            text.count("\n")
        return cpu_seconds() - start

    def linear(chars: int) -> float:
        start = cpu_seconds()
        for _ in range(16):
            hostile("\n", chars=chars).count("\n")
        return cpu_seconds() - start

    assert not grows_linearly(quadratic)[0]
    assert grows_linearly(linear)[0]


def timed_episode(env, actions: dict[str, str]) -> dict[str, float]:
    """CPU seconds each agent's step took in one episode of ``actions``."""
    env.reset(options={"task": TASK})
    took: dict[str, float] = {}
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        start = cpu_seconds()
        env.step(actions[agent])
        took[agent] = max(took.get(agent, 0.0), cpu_seconds() - start)
    return took


def test_no_hostile_action_makes_a_mathchat_step_grow_faster_than_its_text():
    # The rules coach, the verifier's fallbacks and code output echoing the action: every
    # reader of agent text runs.
    env = mappa_env.make(
        "MathChat-v0",
        tasks=[TASK],
        sandbox=EchoSandbox,
        isolation="none",
        strict_boxed=False,
        turns={"code_executor": 1},
    )
    try:
        for piece in HOSTILE_PIECES:
            for wrap in (False, True):

                def slowest_step(chars: int, piece=piece, wrap=wrap) -> float:
                    actions = dict.fromkeys(env.possible_agents, hostile(piece, wrap, chars))
                    return max(timed_episode(env, actions).values())

                linear, small, big = grows_linearly(slowest_step)
                assert linear, (piece, wrap, small, big)
    finally:
        env.close()


def test_the_llm_coachs_prompt_of_a_hostile_action_renders_quickly():
    coach = FixedCoach()
    env = mappa_env.make(
        "MathChat-v0", tasks=[TASK], sandbox=EchoSandbox, isolation="none", coach=coach
    )
    templates = CoachTemplates()
    try:
        for piece in HOSTILE_PIECES:
            requests = {}
            for chars in (ACTION_CHARS // 8, ACTION_CHARS):
                coach.requests.clear()
                actions = dict.fromkeys(env.possible_agents, hostile(piece, True, chars))
                timed_episode(env, actions)
                requests[chars] = list(coach.requests)

            def render_all(chars: int, requests=requests) -> float:
                start = cpu_seconds()
                for request in requests[chars]:
                    templates.render(request)
                return cpu_seconds() - start

            linear, small, big = grows_linearly(render_all)
            assert linear, (piece, small, big)
    finally:
        env.close()


def test_reading_agent_text_never_blocks_other_episodes(monkeypatch):
    # A reader slowed on purpose stands for any expensive reading of agent text: it runs
    # in a worker thread, so other episodes in the same event loop keep stepping.
    # The reader waits until the event loop has ticked 5 more times: a reader run on the
    # loop's own thread blocks the ticks and waits out its 60 s patience (far past any
    # scheduling delay on a loaded machine) with fewer.
    import mappa_env.envs.mathchat.env as mathchat

    ticks = [0]
    seen_while_reading: list[int] = []

    def slow_blocks(text: str) -> list[str]:
        first = ticks[0]
        deadline = time.monotonic() + 60
        while ticks[0] < first + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_while_reading.append(ticks[0] - first)
        return []

    monkeypatch.setattr(mathchat, "extract_code_blocks", slow_blocks)
    env = mappa_env.make(
        "MathChat-v0", tasks=[TASK], sandbox=EchoSandbox, isolation="none", coach=RulesCoach()
    )

    async def main() -> None:
        await env.areset(options={"task": TASK})
        await env.astep("The answer is 5.")  # the solver; the code executor is next
        stop = asyncio.Event()

        async def ticker() -> None:  # the other episode in the same loop
            while not stop.is_set():
                await asyncio.sleep(0.01)
                ticks[0] += 1

        ticking = asyncio.create_task(ticker())
        await env.astep(hostile("`"))
        stop.set()
        await ticking

    try:
        asyncio.run(main())
        assert seen_while_reading, "the reader was not called"
        assert min(seen_while_reading) >= 5, seen_while_reading
    finally:
        env.close()


# ---------------------------------------------------------------- options


BAD_OPTIONS = [
    ("MathChat-v0", {"code_timeout_s": math.nan}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"code_timeout_s": math.inf}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"code_timeout_s": 0}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"turns": {"code_executor": 2.7}}, TypeError, "turns['code_executor']"),
    ("MathChat-v0", {"turns": {"code_executor": True}}, TypeError, "turns['code_executor']"),
    ("MathChat-v0", {"turns": 2}, TypeError, "turns"),
    ("MathChat-v0", {"invalid_reward": 5.0}, ValueError, "invalid_reward"),
    ("MathChat-v0", {"invalid_reward": math.inf}, ValueError, "invalid_reward"),
    ("MathChat-v0", {"tasks": "gen:10000000"}, ValueError, "tasks='gen:10000000'"),
    ("MathChat-v0", {"tasks": "gen:0"}, ValueError, "tasks='gen:0'"),
    ("MathChat-v0", {"tasks": {"n": 0}}, ValueError, "tasks['n']"),
    ("MathChat-v0", {"tasks": 42}, TypeError, "tasks=42"),
    ("MathChat-v0", {"tasks": []}, ValueError, "tasks=[]"),
    ("MathChat-v0", {"max_new_tokens": "4096"}, TypeError, "max_new_tokens"),
    ("MathChat-v0", {"max_new_tokens": math.nan}, TypeError, "max_new_tokens"),
    ("MathChat-v0", {"max_new_tokens": math.inf}, TypeError, "max_new_tokens"),
    ("MathChat-v0", {"max_new_tokens": 0}, ValueError, "max_new_tokens"),
    ("MathChat-v0", {"max_action_chars": 10.5}, TypeError, "max_action_chars"),
    ("MathChat-v0", {"max_cycles": 0.5}, TypeError, "max_cycles"),
    ("MathChat-v0", {"tool_output_chars": -1}, ValueError, "tool_output_chars"),
    ("MathChat-v0", {"seed": -1}, ValueError, "seed"),
    # Below the floor every code run times out; seeds past 64 bits fail in torch later.
    ("MathChat-v0", {"code_timeout_s": 1e-9}, ValueError, "code_timeout_s"),
    ("MathChat-v0", {"seed": 2**70}, ValueError, "seed"),
    ("MathChat-v0", {"seed": 2**64}, ValueError, "seed"),
    ("MathChat-v0", {"seed": True}, TypeError, "seed"),
    ("DSBench-v0", {"seed": 2**64}, ValueError, "seed"),
    # Taken as is, a coach that is no coach failed at the first reset (AttributeError).
    ("MathChat-v0", {"coach": 5}, TypeError, "coach=5"),
    ("MathChat-v0", {"coach": object()}, TypeError, "coach="),
    ("DSBench-v0", {"task_ids": "iris"}, TypeError, "task_ids='iris'"),
    ("DSBench-v0", {"tasks": 42}, TypeError, "tasks=42"),
    ("DSBench-v0", {"tasks": "iris"}, TypeError, "tasks='iris'"),
]


@pytest.mark.parametrize(("env_id", "options", "error", "named"), BAD_OPTIONS)
def test_bad_options_stop_the_constructor_naming_the_option(env_id, options, error, named):
    options = {"sandbox": None, "isolation": "none", **options}
    with pytest.raises(error) as raised:
        mappa_env.make(env_id, **options).close()
    message = str(raised.value)
    assert named in message, message
    assert "must" in message or "gives no tasks" in message, message  # the allowed range


@pytest.mark.parametrize("seed", [2**64, 2**70, -1])
def test_a_seed_out_of_range_is_refused_at_reset(seed):
    env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=None, isolation="none")
    try:
        with pytest.raises(ValueError, match=r"^seed=-?\d+ is out of range: seed must be"):
            env.reset(seed=seed)
        env.reset(seed=2**64 - 1)  # the largest 64-bit seed still works
    finally:
        env.close()


def test_a_fifo_task_file_is_named_as_such_and_never_opened_blocking(tmp_path):
    fifo = tmp_path / "tasks.json"
    os.mkfifo(fifo)
    # Opening a FIFO for reading blocks until a writer comes: the test would hang, not
    # fail, on a reader that opened it; the alarm turns a hang into a failure.
    signal.signal(signal.SIGALRM, _hung)
    signal.alarm(20)
    try:
        with pytest.raises(SettingsError) as raised:
            mappa_env.make("MathChat-v0", tasks=str(fifo), sandbox=None, isolation="none")
        with pytest.raises(SettingsError, match="FIFO"):
            _read_rows(fifo)  # past the check, as if the file was swapped after it
    finally:
        signal.alarm(0)
    message = str(raised.value)
    assert "FIFO (named pipe), not a regular file" in message, message
    assert "not found" not in message
    assert "\n" not in message


def _hung(signum, frame):
    raise AssertionError("reading the task file blocked")


def test_an_empty_task_file_is_refused_by_name(tmp_path):
    empty = tmp_path / "tasks.json"
    empty.write_text("[]")
    with pytest.raises(ValueError, match=r"tasks='.*tasks\.json' gives no tasks"):
        mappa_env.make("MathChat-v0", tasks=str(empty), sandbox=None, isolation="none")


def test_an_action_the_environment_cannot_carry_out_is_never_scored(monkeypatch):
    import mappa_env.envs.mathchat as mathchat

    async def broken(self, agent, action):
        raise RuntimeError("the workspace vanished")

    monkeypatch.setattr(mathchat.MathChatEnv, "run_action", broken)
    env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=None, isolation="none")
    try:
        env.reset()
        env.step("2 + 3 = 5")
        verdict = env.transcript[0].verdict
        assert verdict is not None
        assert not verdict.valid, verdict
        assert "could not carry out" in verdict.analysis
        assert env.infos["problem_solver"]["reward_valid"] is False
        assert math.isnan(env.rewards["problem_solver"])
    finally:
        env.close()


# ---------------------------------------------------------------- sandboxes and isolation


def _namespaces() -> Confinement | None:
    try:
        return resolve_confinement("namespaces")
    except IsolationUnavailableError:
        return None


CONFINED = _namespaces()
needs_namespaces = pytest.mark.skipif(
    CONFINED is None, reason="bubblewrap cannot confine processes on this machine"
)
#: Threads a sandbox may run in the tests below (the kernel itself runs about 15).
FEW_THREADS = 64
START_THREADS = (
    "import threading\n"
    "stop = threading.Event()\n"
    "started = 0\n"
    "try:\n"
    "    for _ in range(200):\n"
    "        threading.Thread(target=stop.wait, daemon=True).start()\n"
    "        started += 1\n"
    "except RuntimeError as exc:\n"
    "    print('refused:', exc)\n"
    "print('started', started)\n"
)


def test_threads_count_against_the_sandbox_even_unconfined(tmp_path):
    # max_processes alone let 1,000 threads through; every thread now counts.
    limits = SandboxLimits(max_threads=FEW_THREADS)
    with JupyterSandbox(tmp_path, limits, isolation="none") as sandbox:
        result = sandbox.run(START_THREADS)
        assert result.error is not None
        assert result.error.name == "ProcessLimitExceeded"
        assert f"more than {FEW_THREADS} threads" in result.error.value
        assert sandbox.run("print(6 * 7)").stdout.strip() == "42"  # restarted, usable


def test_counting_a_crowd_of_threads_reads_one_file(monkeypatch):
    # 3,000 threads made the host-side watch read 3,000 child lists every 50 ms (42% of
    # a core); past the limit the count stops before reading any.
    from mappa_env.sandbox import _process

    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(300)]
    for thread in threads:
        thread.start()
    reads: list[int] = []
    original = _process._children_from_proc
    monkeypatch.setattr(
        _process, "_children_from_proc", lambda pid: reads.append(pid) or original(pid)
    )
    try:
        assert _process.tree_threads(os.getpid(), stop_after=FEW_THREADS) > FEW_THREADS
        assert reads == []
    finally:
        stop.set()


@needs_namespaces
def test_a_pids_cgroup_refuses_threads_past_the_limit(tmp_path):
    if CONFINED.pids_cgroups is None:
        pytest.skip("this process may not make pids cgroups here")
    limits = SandboxLimits(max_threads=FEW_THREADS)
    with JupyterSandbox(tmp_path, limits, isolation="namespaces") as sandbox:
        result = sandbox.run(START_THREADS)
        # The kernel refuses the thread past the limit: the code sees it, nothing dies.
        assert result.ok, result.render()
        assert "refused: can't start new thread" in result.stdout
        started = int(result.stdout.split("started")[-1])
        assert started < FEW_THREADS
        assert sandbox.run("print(6 * 7)").stdout.strip() == "42"


INOTIFY = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fds = [libc.inotify_init1(0) for _ in range({n})]\n"
    "print(sum(fd >= 0 for fd in fds))\n"
)


@needs_namespaces
def test_sandboxes_run_as_users_of_their_own(tmp_path):
    # All sandboxes ran as uid 65534: one could take every inotify instance of the user
    # (128 here) from all the others.
    if CONFINED.uid_pool is None:
        pytest.skip("no uid pool here (not root, or the uids are not mapped)")
    instances = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    if instances > 1024:
        pytest.skip(f"fs.inotify.max_user_instances is {instances}: too many to take")
    limits = SandboxLimits(open_files=instances + 64)
    with (
        JupyterSandbox(tmp_path / "a", limits, isolation="namespaces") as first,
        JupyterSandbox(tmp_path / "b", limits, isolation="namespaces") as second,
    ):
        uids = [int(s.run("import os; print(os.getuid())").stdout) for s in (first, second)]
        assert uids[0] != uids[1]
        assert all(uid in CONFINED.uid_pool.uids for uid in uids)
        taken = int(first.run(INOTIFY.format(n=instances + 8)).stdout)
        assert taken <= instances  # the first took all its user may have
        assert second.run(INOTIFY.format(n=1)).stdout.strip() == "1"


@needs_namespaces
def test_an_episodes_agents_share_its_workspaces_user(tmp_path):
    if CONFINED.uid_pool is None:
        pytest.skip("no uid pool here (not root, or the uids are not mapped)")
    envs = [mappa_env.make("MathChat-v0", tasks=[TASK], isolation="namespaces") for _ in range(2)]
    try:
        owners = []
        for env in envs:
            env.reset()
            owners.append(os.stat(env.workdir).st_uid)
        assert owners[0] != owners[1]
        assert set(owners) <= set(CONFINED.uid_pool.uids)
    finally:
        for env in envs:
            env.close()


@pytest.fixture
def namespaces_everywhere(monkeypatch):
    """Namespace isolation as resolved on a machine where bubblewrap works."""
    from mappa_env.sandbox import isolation

    confined = Confinement(mode="namespaces", bwrap="/usr/bin/bwrap")
    monkeypatch.setattr(isolation, "_probe", lambda: confined)
    return confined


@pytest.fixture
def no_namespaces(monkeypatch):
    """A machine where bubblewrap is missing."""
    from mappa_env.sandbox import isolation

    missing = IsolationUnavailableError("bubblewrap (bwrap) is not installed")
    monkeypatch.setattr(isolation, "_probe", lambda: missing)
    return missing


def test_a_sandbox_factory_that_declares_no_confinement_is_refused(namespaces_everywhere):
    # It passed check_sandbox() and ran kernels as root while the env said isolated.
    with pytest.raises(IsolationUnavailableError, match="declares no confinement"):
        mappa_env.make("MathChat-v0", tasks=[TASK], isolation="namespaces", sandbox=EchoSandbox)
    pool = KernelPool(0)
    try:
        with pytest.raises(IsolationUnavailableError, match="declares no namespaces"):
            mappa_env.make("MathChat-v0", tasks=[TASK], isolation="namespaces", sandbox=pool)
    finally:
        pool.close()
    factory = JupyterSandbox.factory(isolation="namespaces")  # declares what it enforces
    env = mappa_env.make("MathChat-v0", tasks=[TASK], isolation="namespaces", sandbox=factory)
    try:
        assert env.sandbox_confinement.isolated
    finally:
        env.close()


def test_an_undeclared_sandbox_is_reported_unconfined(namespaces_everywhere):
    env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=EchoSandbox)  # isolation="auto"
    try:
        report = env.isolation_report()
        assert report["isolation"] == "none"
        assert "declares no confinement" in report["reason"]
        assert isolation_of(env) == report
        assert "agents' code ran unconfined" in describe_isolation(report)
    finally:
        env.close()


def test_requiring_isolation_refuses_every_unconfined_run(monkeypatch, no_namespaces):
    monkeypatch.setenv("MAPPA_REQUIRE_ISOLATION", "1")
    for isolation in ("auto", "none"):
        with pytest.raises(IsolationUnavailableError, match="MAPPA_REQUIRE_ISOLATION"):
            mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=None, isolation=isolation)
    with pytest.raises(IsolationUnavailableError, match="MAPPA_REQUIRE_ISOLATION"):
        KernelPool(0)
    monkeypatch.setenv("MAPPA_REQUIRE_ISOLATION", "maybe")
    with pytest.raises(ValueError, match="MAPPA_REQUIRE_ISOLATION='maybe'"):
        mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=None, isolation="none")


def test_the_command_line_turns_an_isolation_error_into_one_line(no_namespaces, capsys):
    from mappa_train.command import main

    code = main(
        ["eval", "--env", "MathChat-v0", "--isolation", "namespaces", "--num-tasks", "1",
         "--episodes", "1", "--sandbox", "none", "--no-progress"]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "bubblewrap (bwrap) is not installed" in err
    assert "--isolation none" in err


def test_a_run_that_asked_for_auto_and_got_none_says_so_first_and_in_its_report(
    no_namespaces, tmp_path, monkeypatch, capsys, caplog
):
    from mappa_train.command import main

    (tmp_path / "replies.py").write_text("def reply(messages):\n    return 'The answer is 5.'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "eval"
    with caplog.at_level("WARNING"):
        code = main(
            ["eval", "--system", "script:replies:reply", "--num-tasks", "1", "--episodes",
             "1", "--out", str(out), "--no-progress"]
        )  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("mappa eval: agents' code runs UNCONFINED (isolation auto: "), err
    assert "bubblewrap (bwrap) is not installed" in err[0]
    assert "--require-isolation" in err[0]
    # Said once: not again by the library's own warnings.
    assert "without namespace" not in caplog.text
    report = json.loads((out / "report.json").read_text())["isolation"]
    assert (report["requested"], report["isolation"]) == ("auto", "none")
    assert "bubblewrap (bwrap) is not installed" in report["reason"]


def test_train_says_it_first_too_before_any_model_loads(no_namespaces, monkeypatch, capsys):
    from mappa_env.errors import RunStoppedError
    from mappa_train import trainer
    from mappa_train.command import main

    def no_trainer(config):
        raise RunStoppedError("no trainer in this test")

    monkeypatch.setattr(trainer, "make_trainer", no_trainer)
    assert main(["train", "--steps", "1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("mappa train: agents' code runs UNCONFINED"), err


@pytest.mark.parametrize("command", ["eval", "train"])
def test_require_isolation_refuses_to_start_unconfined_in_one_line(
    no_namespaces, command, tmp_path, capsys, monkeypatch
):
    from mappa_train.command import main

    monkeypatch.delenv("MAPPA_REQUIRE_ISOLATION", raising=False)
    flags = ["--out", str(tmp_path)] if command == "eval" else ["--output-dir", str(tmp_path)]
    assert main([command, "--require-isolation", "--steps" if command == "train" else
                 "--episodes", "1", *flags]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "bubblewrap (bwrap) is not installed" in err
    assert "--require-isolation" in err
    assert "MAPPA_REQUIRE_ISOLATION" not in os.environ  # the flag held for that run only


def test_reports_say_what_isolation_resolved_to():
    env = mappa_env.make("MathChat-v0", tasks=[TASK], sandbox=None, isolation="none")
    try:
        report = isolation_of(env)
    finally:
        env.close()
    assert report["requested"] == "none"
    assert report["code_execution"] is False
    table = format_table(
        {
            "env_id": "MathChat-v0", "episodes": 1, "success_rate": 1.0,
            "mean_outcome_reward": 1.0, "invalid_coach_rate": 0.0, "per_agent": {},
            "isolation": {**report, "code_execution": True},
        }
    )  # fmt: skip
    assert table.splitlines()[-1] == (
        "isolation: NONE: agents' code ran unconfined (isolation='none' was asked for)"
    )


# ---------------------------------------------------------------- DSBench's cheap work


@pytest.fixture(scope="module")
def cancer():
    tasks = BuiltinTaskSet(names=["breast_cancer"], secret="adversarial")
    yield tasks
    tasks.close()


@pytest.fixture
def dsbench(cancer):
    env = DSBenchEnv(tasks=cancer, sandbox=InProcessSandbox, isolation="none")
    env.reset(options={"task_id": "breast_cancer"})
    yield env
    env.close()


def cell(text: str) -> str:
    return f"My code.\n```python\n{text}\n```"


def scores(env: DSBenchEnv) -> dict[tuple[str, int], float]:
    return {(r.agent, r.turn): r.verdict.score for r in env.transcript}


READ = (
    "import pickle, numpy as np, pandas as pd\n"
    "train = pd.read_csv('train.csv'); test = pd.read_csv('test.csv')\n"
    "y = train['malignant']\n"
    "X = train.drop(columns=['id', 'malignant']); X_test = test.drop(columns=['id'])\n"
)
WRITE = (
    "pickle.dump(X, open('X_train.pkl', 'wb')); pickle.dump(y, open('y_train.pkl', 'wb'))\n"
    "pickle.dump(X_test, open('X_test.pkl', 'wb'))\n"
)
FIT = (
    "import pickle\n"
    "from sklearn.model_selection import cross_val_score\n"
    "X = pickle.load(open('X_train.pkl', 'rb')); y = pickle.load(open('y_train.pkl', 'rb'))\n"
    "print('cv accuracy', cross_val_score(model, X, y, cv=3).mean())\n"
    "model.fit(X, y)\n"
    "pickle.dump(model, open('model.pkl', 'wb'))\n"
)
MEMORISER = "from sklearn.neighbors import KNeighborsClassifier\nmodel = KNeighborsClassifier(1)\n"
FOREST = (
    "from sklearn.ensemble import RandomForestClassifier\n"
    "model = RandomForestClassifier(n_estimators=30, random_state=0)\n"
)
#: Real features replaced by noise: a 1-NN model memorises its training rows
#: (training fit 1.0) and predicts the test rows at chance.
NOISE = (
    "rng = np.random.default_rng(0)\n"
    "X = pd.DataFrame(rng.normal(size=(len(X), 30)))\n"
    "X_test = pd.DataFrame(rng.normal(size=(len(X_test), 30)))\n"
)
#: The target leaked into X_train; X_test gets a placeholder column in its place.
LEAK = "X = X.assign(answer=y.to_numpy()); X_test = X_test.assign(answer=0)\n"


def test_a_model_that_memorised_noise_is_capped(dsbench):
    # Before: 9 for the data engineer and 9 for the modeler (a 1-NN model fits its own
    # rows perfectly): the checks looked at training rows only. Test predictions are
    # scored on the answers now, the modeler's and a reference model's on the engineer's
    # files.
    dsbench.step(cell(READ + NOISE + WRITE))
    dsbench.step("Saved X_train.pkl, y_train.pkl and X_test.pkl.")
    dsbench.step(cell(MEMORISER + FIT))
    got = scores(dsbench)
    verdicts = {(r.agent, r.turn): r.verdict.analysis for r in dsbench.transcript}
    assert got[("data_engineer", 0)] <= 4, verdicts[("data_engineer", 0)]
    assert got[("data_engineer", 1)] <= 4, verdicts[("data_engineer", 1)]  # the hand-over
    assert got[("modeler", 0)] <= 4, verdicts[("modeler", 0)]
    assert "predictions on the test rows have skill" in verdicts[("modeler", 0)]
    model = dsbench.transcript[-1].tool.extra["artifacts"]["model.pkl"]
    assert model["train_skill"] > 0.9  # what the former checks saw
    assert model["test_skill"] < 0.3


def test_a_target_leaked_into_the_features_is_capped(dsbench):
    # Before: 9. A model fit on these files leans on the leaked column, which X_test
    # cannot hold: its predictions on the test rows have no skill.
    dsbench.step(cell(READ + LEAK + WRITE))
    verdict = dsbench.transcript[0].verdict
    assert verdict.score <= 4, verdict.analysis
    assert "a reference model's" in verdict.analysis


def test_a_cv_keyword_and_a_repeated_cell_earn_nothing_extra(dsbench, cancer):
    task = cancer.tasks[0]
    honest = engineer_action(task)
    dsbench.step(honest)
    dsbench.step(honest)  # the same cell again: it collected 9 per turn before
    dsbench.step("Saved X_train.pkl, y_train.pkl and X_test.pkl.")
    # A good model, and "cross-validation" that is only a cv= keyword of a dict.
    fake_cv = (
        "import pickle\nfrom sklearn.ensemble import RandomForestClassifier\n"
        "X = pickle.load(open('X_train.pkl', 'rb')); y = pickle.load(open('y_train.pkl', 'rb'))\n"
        "settings = dict(cv=5)\nmodel = RandomForestClassifier(n_estimators=30, random_state=0)\n"
        "model.fit(X, y)\nprint('cv accuracy 0.99')\npickle.dump(model, open('model.pkl', 'wb'))"
    )
    dsbench.step(cell(fake_cv))
    got = scores(dsbench)
    assert got[("data_engineer", 0)] == 9
    assert got[("data_engineer", 1)] == 0  # a later turn is paid what it adds: nothing
    assert got[("data_engineer", 2)] == 8
    assert got[("modeler", 0)] == 7  # usable and trained, no cross-validation seen


def test_a_constant_majority_submission_gets_no_credit_for_accuracy():
    # 92% of the answers are one class: predicting it everywhere scores accuracy 0.92,
    # which the accuracy ladder alone capped at 9; it has no skill over the majority.
    rows = [f"{i},{'no' if i % 25 >= 2 else 'yes'}" for i in range(200)]
    answers = pd.read_csv(io.StringIO("id,label\n" + "\n".join(rows)), dtype=str)
    constant = answers.assign(label="no")
    score = score_submission(constant, answers, "accuracy", "id", ["label"])
    assert score.value == pytest.approx(0.92)
    assert score.normalized == 0.0
    assert outcome_cap(score, "classification") == 3
    honest = answers.copy()
    honest.loc[:9, "label"] = "no"  # a model that finds 12 of the 16 positives
    assert outcome_cap(score_submission(honest, answers, "accuracy", "id", ["label"]), "x") >= 6


# ---------------------------------------------------------------- the boundary, through step


#: The earlier attack table, replayed as the code executor's turns of one episode (one
#: kernel): each cell prints what it reached, and nothing may be reached.
BOUNDARY_CELLS = {
    "package": "import importlib.util\nprint(importlib.util.find_spec('mappa_env') is None)",
    "secret": "import os\nprint(os.environ.get('MAPPA_TASK_SECRET') is None)",
    "keys": "import os\nprint(not any('KEY' in k or 'TOKEN' in k for k in os.environ))",
    "processes": "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) < 10)",
    "signal": "import os, signal\ntry:\n    os.kill({pid}, signal.SIGSTOP)\n    print(False)\n"
    "except OSError:\n    print(True)",
    "network": "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
    "    print(False)\nexcept OSError:\n    print(True)",
    "write": "try:\n    open('{outside}', 'w').write('x')\n    print(False)\nexcept OSError:\n"
    "    print(True)",
}


@needs_namespaces
def test_the_boundary_holds_through_an_environment_step(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-mappa-adversarial")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    facts = {"pid": os.getpid(), "port": server.getsockname()[1], "outside": tmp_path / "x"}
    env = mappa_env.make(
        "MathChat-v0",
        tasks=[TASK],
        isolation="namespaces",
        turns={"code_executor": len(BOUNDARY_CELLS)},
    )
    try:
        env.reset()
        env.step("2 + 3 = 5")
        for name, code in BOUNDARY_CELLS.items():
            env.step(f"```python\n{code.format(**facts)}\n```")
            result = env.infos["code_executor"]["tool"]
            assert result["ok"], (name, result)
            assert result["stdout"].strip() == "True", (name, result["stdout"])
        assert not (tmp_path / "x").exists()
    finally:
        server.close()
        env.close()


def test_uid_leases_are_exclusive_until_released(tmp_path):
    pool = UidPool((64_000, 64_001), tmp_path)
    first, second = pool.lease(), pool.lease()
    assert {first.uid, second.uid} == {64_000, 64_001}
    assert pool.lease() is None  # used up: the sandbox then shares uid 65534
    assert pool.lease(first.uid) is None  # held, even when asked for by number
    first.release()
    again = pool.lease(64_000 if first.uid == 64_000 else 64_001)
    assert again is not None
    again.release()
    second.release()
