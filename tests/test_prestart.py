"""Sandboxes started ahead of an episode's first code run, and per-task code timeouts."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

import mappa_env
from mappa_env.envs import pipeline
from mappa_env.sandbox import jupyter
from mappa_env.sandbox.isolation import IsolationUnavailableError, resolve_confinement
from mappa_env.tasks import KIND_CODE_TIMEOUT_S, MathTask, generate_math_tasks
from tests.fakes import InProcessSandbox

try:
    resolve_confinement("namespaces")
    UNAVAILABLE = ""
except IsolationUnavailableError as exc:
    UNAVAILABLE = str(exc)
needs_namespaces = pytest.mark.skipif(bool(UNAVAILABLE), reason=UNAVAILABLE)

SOLVER = "I think it is 3."


def code(text: str) -> str:
    return f"```python\n{text}\n```"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_started(env) -> None:
    """Let the starts in flight end, so that what the code step starts is counted alone."""
    for spare in (env._prestarted, env._spare):
        if spare is not None:
            assert spare.wait_started(timeout=120)


def test_the_code_step_starts_no_kernel_the_next_episodes_started_ahead(monkeypatch):
    starts: list[Path] = []
    real_start = jupyter.start_kernel

    def counting_start(workdir, *args, **kwargs):
        starts.append(Path(workdir))
        return real_start(workdir, *args, **kwargs)

    monkeypatch.setattr(jupyter, "start_kernel", counting_start)
    monkeypatch.setattr(pipeline, "PRESTART_MIN_CPUS", 1)  # a machine with cores to spare
    env = mappa_env.make("MathChat-v0", tasks="gen:3", isolation="none")
    try:
        assert env.prestart_sandbox  # on by default for sandbox="jupyter"
        for episode in range(3):
            env.reset(seed=0 if episode == 0 else None)
            wait_started(env)
            if episode == 0:
                # Reset once, an environment starts no kernel for a next episode it may
                # never run (a script, a test); this episode's started at its reset.
                assert env._spare is None
                assert starts[-1] == env.workdir
            else:
                # The next one's, in its own workspace. Its start and this episode's (the
                # spare of the last reset) run in threads of their own: either may be
                # recorded first.
                assert env._spare.workdir in starts
                assert env._spare.workdir != env.workdir
            before = len(starts)
            env.step(SOLVER)
            env.step(code("import os\nprint(os.getcwd())"))
            tool = env.infos["code_executor"]["tool"]
            assert tool["ok"], tool
            assert tool["stdout"].strip() == str(env.workdir.resolve())
            assert len(starts) == before, "a kernel started on the code step's path"
        # One kernel per episode plus the spare: none started twice.
        assert len(starts) == len(set(starts)) == 4
    finally:
        env.close()


@needs_namespaces
def test_a_prestarted_confined_kernel_sees_only_its_fresh_workspace():
    env = mappa_env.make(
        "MathChat-v0", tasks="gen:2", isolation="namespaces", prestart_sandbox=True
    )
    try:
        # From the second episode on, after one that ran code, the next one's starts ahead.
        env.reset(seed=0)
        env.step(SOLVER)
        env.step(code("print(1)"))
        env.reset()
        env.step(SOLVER)
        env.step(code("open('secret.txt', 'w').write('episode one')\nprint('ok')"))
        assert env.infos["code_executor"]["tool"]["ok"], env.infos["code_executor"]
        first = env.workdir
        assert (first / "secret.txt").exists()
        wait_started(env)
        spare_pid = env._spare._sandbox.kernel_pid
        assert spare_pid is not None

        env.reset()
        assert env.workdir != first
        env.step(SOLVER)
        probe = (
            "import os\n"
            "print(sorted(os.listdir('.')))\n"
            f"print(os.path.exists({str(first)!r}), os.path.exists({str(first / 'secret.txt')!r}))"
        )
        env.step(code(probe))
        tool = env.infos["code_executor"]["tool"]
        assert tool["ok"], tool
        assert tool["stdout"].splitlines() == ["[]", "False False"]
        # The code ran in the kernel started during episode one, confined as ever.
        assert env._sandboxes["episode"].kernel_pid == spare_pid
        assert not first.exists()
    finally:
        env.close()


def test_close_stops_every_kernel_and_removes_every_workspace():
    env = mappa_env.make("MathChat-v0", tasks="gen:2", isolation="auto", prestart_sandbox=True)
    env.reset(seed=0)
    env.step(SOLVER)
    env.step(code("print(1)"))
    env.reset()
    wait_started(env)
    current, spare = env._prestarted, env._spare
    pids = [current._sandbox.kernel_pid, spare._sandbox.kernel_pid]
    assert None not in pids
    workspaces = [env.workdir, spare.workdir]
    env.close()
    assert all(gone(pid) for pid in pids)
    assert not any(path.exists() for path in workspaces)


def test_an_unused_prestarted_sandbox_is_closed_at_the_next_reset():
    made = []

    class Tracked(InProcessSandbox):
        started = False

        def __init__(self, workdir: Path) -> None:
            super().__init__(workdir)
            made.append(self)

        def start(self) -> None:
            self.started = True

        def run(self, code_text: str, timeout: float | None = None):
            assert self.started, "code ran before the sandbox's start"
            return super().run(code_text, timeout)

    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=Tracked, prestart_sandbox=True)
    try:
        env.reset(seed=0)
        assert len(made) == 1  # this episode's (the next one's from the second episode on)
        env.step(SOLVER)
        env.step("No code: the answer is \\boxed{3}.")  # the executor's slot ends unused
        env.reset()
        assert made[0].closed
        # After an episode that ran no code, nothing starts ahead.
        assert len(made) == 1
    finally:
        env.close()
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=Tracked, prestart_sandbox=True)
    try:
        env.reset(seed=0)
        env.step(SOLVER)
        env.step(code("print(2)"))
        assert env.infos["code_executor"]["tool"]["stdout"] == "2\n"
        assert len(made) == 2
        env.reset()  # after an episode that ran code: this one's and the next one's
        assert len(made) == 4
        assert made[2].workdir == env.workdir
    finally:
        env.close()
    assert all(sandbox.closed for sandbox in made)


def test_prestarting_is_off_when_asked_for_other_factories_and_on_few_cpus(monkeypatch):
    env = mappa_env.make("MathChat-v0", tasks="gen:2", isolation="none", prestart_sandbox=False)
    try:
        env.reset(seed=0)
        assert env._prestarted is None
        assert env._spare is None
    finally:
        env.close()
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=InProcessSandbox)
    assert not env.prestart_sandbox
    env.close()
    # Where cores are few, starts that go unused cost more than the waits they save.
    monkeypatch.setattr(pipeline, "PRESTART_MIN_CPUS", 10**6)
    env = mappa_env.make("MathChat-v0", tasks="gen:2", isolation="none")
    assert not env.prestart_sandbox
    env.close()
    with pytest.raises(TypeError, match="prestart_sandbox"):
        mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=None, prestart_sandbox="yes")


# ------------------------------------------------------------------ per-task code timeouts


class TimedSandbox(InProcessSandbox):
    timeouts: list[float | None] = []  # noqa: RUF012 - the test reads every call's timeout

    def run(self, code_text: str, timeout: float | None = None):
        TimedSandbox.timeouts.append(timeout)
        return super().run(code_text, timeout)


def first_code_timeout(task: MathTask, **options) -> float | None:
    TimedSandbox.timeouts.clear()
    env = mappa_env.make("MathChat-v0", tasks=[task], sandbox=TimedSandbox, **options)
    try:
        env.reset(options={"task": task})
        env.step(SOLVER)
        env.step(code("print(1)"))
        assert env.infos["code_executor"]["tool"]["ok"]
    finally:
        env.close()
    return TimedSandbox.timeouts[0]


def test_a_short_problem_gets_its_kinds_timeout_and_the_users_wins():
    expression = generate_math_tasks(1, kinds=["expression"], secret="")[0]
    word = generate_math_tasks(1, kinds=["word_change"], secret="")[0]
    hard = generate_math_tasks(1, kinds=["divisor_sum"], secret="")[0]
    assert first_code_timeout(expression) == KIND_CODE_TIMEOUT_S["expression"] < 30.0
    assert first_code_timeout(word) == KIND_CODE_TIMEOUT_S["word_change"] < 30.0
    assert first_code_timeout(hard) == 30.0  # MathChat's default
    assert first_code_timeout(expression, code_timeout_s=45) == 45.0


def test_a_task_carries_its_own_timeout_and_a_bad_one_is_named():
    carried = MathTask(
        id="t-own", prompt="What is 2 + 3?", answer="5", metadata={"code_timeout_s": 3}
    )
    assert first_code_timeout(carried) == 3.0
    assert first_code_timeout(carried, code_timeout_s=12.5) == 12.5
    bad = MathTask("t-bad", "What is 2 + 3?", "5", metadata={"code_timeout_s": 0})
    env = mappa_env.make("MathChat-v0", tasks=[bad], sandbox=InProcessSandbox)
    try:
        env.reset()
        with pytest.raises(ValueError, match="code_timeout_s of task 't-bad'"):
            _ = env.code_timeout_s
    finally:
        env.close()


def test_the_option_is_checked_as_before():
    with pytest.raises(ValueError, match="code_timeout_s"):
        mappa_env.make("MathChat-v0", tasks="gen:1", sandbox=None, code_timeout_s=float("nan"))
    env = mappa_env.make("MathChat-v0", tasks="gen:1", sandbox=None, code_timeout_s=5)
    assert env.code_timeout_s == 5.0
    env.close()


class _Tracked(InProcessSandbox):
    """An in-process sandbox that remembers every instance made."""

    made: list[_Tracked] = []  # noqa: RUF012 - the tests read what was made

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        _Tracked.made.append(self)


def _code_episode(env, *, reset: bool = True) -> dict:
    """One episode whose code executor prints 3; returns the code run's tool info."""
    if reset:
        env.reset()
    tool: dict = {}
    for agent in env.agent_iter():
        *_, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
        elif agent == "code_executor":
            env.step(code("print(3)"))
            tool = env.infos[agent]["tool"]
        else:
            env.step("The answer is \\boxed{3}.")
    return tool


def test_an_idle_environment_lets_go_of_the_next_episodes_kernel_and_its_workspace():
    _Tracked.made.clear()
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=_Tracked, prestart_sandbox=True)
    try:
        env.reset(seed=0)
        _code_episode(env, reset=False)
        _code_episode(env)  # after an episode that ran code, the next one's starts ahead
        spare, finished = env._spare, env.workdir
        assert spare is not None
        assert finished.exists()
        env.release_idle_resources()
        assert env._spare is None
        assert all(sandbox.closed for sandbox in _Tracked.made)
        assert not finished.exists()
        assert not spare.workdir.exists()
        assert env._workspace_lease is None  # the finished episode's uid is free again
        # The next episode starts its sandbox ahead again and runs code as ever.
        assert _code_episode(env)["stdout"] == "3\n"
        # In a live episode only the next episode's sandbox goes; this one's code runs on.
        env.reset()
        env.step(SOLVER)
        env.step(code("x = 41"))
        live = env.workdir
        env.release_idle_resources()
        assert env._spare is None
        assert live.exists()
        env.step(code("print(x + 1)"))
        assert env.infos["code_executor"]["tool"]["stdout"] == "42\n"
    finally:
        env.close()
    env.release_idle_resources()  # a closed environment: nothing to do, no error


def test_a_runner_that_keeps_its_environments_leaves_them_idle_without_kernels():
    _Tracked.made.clear()
    runner = _runner(_code_reply, concurrency=2)
    try:
        for _ in range(2):
            results = runner.run(6)
            assert len(results) == 6
            assert sum(len(sandbox.calls) for sandbox in _Tracked.made) >= 6  # code ran
            assert all(sandbox.closed for sandbox in _Tracked.made)
            assert all(env._spare is None and env._workdir is None for env in runner._envs)
    finally:
        runner.close()


def _runner(respond, concurrency: int):
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.scripted import ScriptedPolicy
    from mappa_agents.system import AgentSystem

    return RolloutRunner(
        lambda: mappa_env.make(
            "MathChat-v0", tasks="gen:4", sandbox=_Tracked, prestart_sandbox=True
        ),
        AgentSystem.shared(
            ScriptedPolicy(respond), ("problem_solver", "code_executor", "verifier")
        ),
        concurrency=concurrency,
        keep_envs=True,
        progress=False,
    )


def _code_reply(messages) -> str:
    return code("print(3)") if "python" in messages[0]["content"] else "It is \\boxed{3}."


def test_no_kernel_starts_ahead_for_an_episode_the_run_will_not_have():
    # One episode per environment per run, as in a trainer's usual step: a kernel
    # started ahead for a next episode would only be stopped when the run ends.
    _Tracked.made.clear()
    runner = _runner(_code_reply, concurrency=2)
    try:
        for _ in range(3):
            before = len(_Tracked.made)
            runner.run(2)
            assert len(_Tracked.made) - before == 2  # one sandbox per episode, none spare
            assert all(not env.expect_next_episode for env in runner._envs)
        runner.run(6)  # three episodes per environment: the first ones expect another
        assert all(sandbox.closed for sandbox in _Tracked.made)
    finally:
        runner.close()
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=_Tracked, prestart_sandbox=True)
    try:
        _code_episode(env)
        env.expect_next_episode = False
        env.reset()
        assert env._spare is None
        _code_episode(env, reset=False)
        env.expect_next_episode = True
        _code_episode(env)
        assert env._spare is not None
    finally:
        env.close()


def test_an_episode_a_run_stopped_driving_lets_go_of_its_kernel_and_workspace():
    _Tracked.made.clear()

    def fails_at_the_verifier(messages) -> str:
        if "verif" in messages[0]["content"].lower():
            raise RuntimeError("no reply today")
        return _code_reply(messages)

    runner = _runner(fails_at_the_verifier, concurrency=2)
    try:
        results = runner.run(2)
        assert len(results) == 2
        assert len(_Tracked.made) >= 2
        assert all(sandbox.closed for sandbox in _Tracked.made)
        assert all(env._workdir is None for env in runner._envs)
    finally:
        runner.close()
