"""A sandbox that cannot work stops a run with its cause; kernels import what the parent does."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

import mappa_env
from mappa_env.sandbox import (
    ExecError,
    ExecResult,
    JupyterSandbox,
    SandboxUnavailableError,
    check_sandbox,
    inherited_import_paths,
)


def broken_ipykernel_dir(root: Path) -> Path:
    """A directory whose ``ipykernel`` package fails to import (a broken installation)."""
    (root / "ipykernel").mkdir(parents=True)
    (root / "ipykernel" / "__init__.py").write_text("raise ImportError('ipykernel is broken')")
    return root


class StartFailsSandbox:
    """A sandbox whose interpreter never starts: every run is a SandboxError result."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        return ExecResult(error=ExecError("SandboxError", "no kernel could be started: boom"))

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        return self.run(code, timeout)

    def close(self) -> None:
        pass


def test_inherited_import_paths_are_absolute_existing_and_unique(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path)
    parent = {"PYTHONPATH": os.pathsep.join(["a", "", str(tmp_path / "a"), "missing"])}
    assert inherited_import_paths(parent) == [str(tmp_path / "a")]
    assert inherited_import_paths({}) == []


def test_kernel_imports_a_package_reachable_only_through_pythonpath(tmp_path, monkeypatch):
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "only_on_pythonpath.py").write_text("VALUE = 'seen'\n")
    monkeypatch.setenv("PYTHONPATH", str(extra))
    with JupyterSandbox(tmp_path / "work") as sandbox:
        result = sandbox.run("import only_on_pythonpath\nprint(only_on_pythonpath.VALUE)")
        assert result.ok, result.render()
        assert result.stdout == "seen\n"
        # The variable itself stays off the kernel's environment allow-list.
        assert sandbox.run("import os\nprint('PYTHONPATH' in os.environ)").stdout == "False\n"


def test_check_sandbox_passes_for_a_working_sandbox():
    check_sandbox(JupyterSandbox.factory())


def test_check_sandbox_names_the_kernel_start_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(broken_ipykernel_dir(tmp_path / "site")))
    with pytest.raises(SandboxUnavailableError) as caught:
        check_sandbox(JupyterSandbox.factory())
    message = str(caught.value)
    assert "ipykernel is broken" in message  # the cause, from the kernel's own traceback
    assert "pip install ipykernel" in message  # and what to do
    assert "--sandbox none" in message


def test_check_sandbox_reports_a_factory_that_raises():
    def factory(workdir: Path):
        raise OSError("no room for kernels")

    with pytest.raises(SandboxUnavailableError, match="OSError: no room for kernels"):
        check_sandbox(factory)


def test_check_sandbox_reports_wrong_output(tmp_path):
    class Liar(StartFailsSandbox):
        def run(self, code: str, timeout: float | None = None) -> ExecResult:
            return ExecResult(stdout="41\n")

    with pytest.raises(SandboxUnavailableError, match="printed '41'"):
        check_sandbox(Liar)


def test_env_check_sandbox_uses_its_factory_and_skips_without_one():
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=StartFailsSandbox)
    with pytest.raises(SandboxUnavailableError, match="boom"):
        env.check_sandbox()
    env.close()
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=None)
    env.check_sandbox()  # no code execution: nothing to check
    env.close()


def test_an_action_whose_sandbox_failed_is_flagged_not_scored():
    env = mappa_env.make("MathChat-v0", tasks="gen:2", sandbox=StartFailsSandbox, seed=0)
    env.reset(seed=0)
    env.step("I think the answer is \\boxed{3}.")
    env.step("```python\nprint(1 + 1)\n```")
    info = env.infos["code_executor"]
    assert info["reward_valid"] is False
    assert math.isnan(env.rewards["code_executor"])
    assert "sandbox could not run" in info["coach"]["analysis"]
    env.close()


def test_mappa_eval_stops_before_loading_models_when_no_kernel_starts(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from mappa_agents import cli
    from mappa_train.command import build_parser

    monkeypatch.setenv("PYTHONPATH", str(broken_ipykernel_dir(tmp_path / "site")))

    def no_models(*args, **kwargs):
        raise AssertionError("models must not load when the sandbox cannot work")

    monkeypatch.setattr("mappa_agents.system.AgentSystem.from_spec", no_models)
    args = build_parser().parse_args(
        ["eval", "--num-tasks", "2", "--episodes", "2", "--out", str(tmp_path / "out")]
    )
    with pytest.raises(SandboxUnavailableError, match="ipykernel is broken"):
        cli.run_eval(args)


def test_trainer_stops_before_loading_models_when_no_kernel_starts(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from mappa_train.config import TrainConfig
    from mappa_train.trainer import Trainer

    monkeypatch.setenv("PYTHONPATH", str(broken_ipykernel_dir(tmp_path / "site")))
    config = TrainConfig(
        env="MathChat-v0",
        env_options={"tasks": "gen:4"},
        system=str(tmp_path / "no-such-model"),  # loading it would fail differently
        steps=1,
        tensorboard=False,
        progress=False,
        output_dir=str(tmp_path / "run"),
    )
    trainer = Trainer(config)
    with pytest.raises(SandboxUnavailableError, match="ipykernel is broken"):
        trainer.setup()
    trainer.close()


def test_a_kernel_that_hangs_gets_advice_for_a_hang(tmp_path):
    # It was told to install ipykernel, which was there all along.
    class Hangs(StartFailsSandbox):
        def run(self, code: str, timeout: float | None = None) -> ExecResult:
            error = "kernel pid 4242 did not answer within the start timeout"
            return ExecResult(error=ExecError("SandboxError", error))

    with pytest.raises(SandboxUnavailableError) as caught:
        check_sandbox(Hangs)
    message = str(caught.value)
    assert "did not answer within the start timeout" in message
    assert "SandboxLimits(start_timeout_s=...)" in message
    assert "--concurrency" in message
    assert "pip install" not in message


def test_bubblewrap_refusing_a_kernel_is_reported_with_what_it_said(tmp_path, monkeypatch):
    from mappa_env.sandbox.isolation import (
        Confinement,
        IsolationUnavailableError,
        resolve_confinement,
    )

    try:
        resolve_confinement("namespaces")
    except IsolationUnavailableError as exc:
        pytest.skip(f"no namespaces here: {exc}")
    command = Confinement.command

    def refused(self, argv, **kwargs):
        # A bind of a source that does not exist: bubblewrap refuses before the kernel runs.
        full = command(self, argv, **kwargs)
        at = full.index(self.bwrap) + 1
        return [*full[:at], "--ro-bind", str(tmp_path / "no-such-source"), "/x", *full[at:]]

    monkeypatch.setattr(Confinement, "command", refused)
    with pytest.raises(SandboxUnavailableError) as caught:
        check_sandbox(JupyterSandbox.factory(isolation="namespaces"))
    message = str(caught.value)
    assert "bubblewrap refused to start the kernel" in message
    assert f"Can't find source path {tmp_path / 'no-such-source'}" in message
    assert "--isolation none" in message
