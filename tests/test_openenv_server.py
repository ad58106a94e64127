"""`mappa serve`: MathChat-v0 over OpenEnv, played with openenv-core's own client.

Every server here listens on 127.0.0.1 and is started by the test itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from mappa_agents.openenv_server import (
    MappaAction,
    MappaEnvClient,
    MappaOpenEnv,
    ServeConfig,
    running_server,
)
from mappa_agents.scripted import ScriptedPolicy
from mappa_env.tasks import MathTask

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import mathchat_scripts  # noqa: E402

TASKS = [MathTask(id="product", prompt="What is 1234 times 5678?", answer="7006652")]
ENV_OPTIONS = {"tasks": TASKS, "coach": "rules", "isolation": "none", "seed": 0}


def scripted(agent: str) -> ScriptedPolicy:
    return ScriptedPolicy(getattr(mathchat_scripts, agent), name=f"script:{agent}")


def ego_config(ego: str, **env_options) -> ServeConfig:
    others = {a: scripted(a) for a in ("problem_solver", "code_executor", "verifier") if a != ego}
    return ServeConfig(
        "MathChat-v0",
        {**ENV_OPTIONS, **env_options},
        mode="ego",
        ego_agent=ego,
        others=others,
        allow_task_ids=True,
    )


def test_ego_mode_plays_a_whole_episode_with_the_others_played_by_the_server():
    with running_server(ego_config("verifier")) as url, MappaEnvClient(url).sync() as env:
        result = env.reset(task_id="product")
        observation = result.observation
        assert (result.done, result.reward, observation.agent) == (False, None, "verifier")
        played = observation.info["others"]
        assert [p["agent"] for p in played] == ["problem_solver", "code_executor", "code_executor"]
        assert all(p["coach"]["valid"] for p in played)
        # The ego is prompted with what the others handed on: the code's boxed output.
        assert "\\boxed{7006652}" in observation.messages[-1]["content"]
        assert observation.messages[0]["role"] == "system"

        reply = mathchat_scripts.verifier(observation.messages)
        result = env.step(MappaAction(text=reply))
        info = result.observation.info
        assert result.done
        assert result.observation.agent is None
        assert info["acting_agent"] == "verifier"
        assert info["outcome"]["correct"] is True
        coach = info["action"]["coach"]
        assert coach["valid"]
        assert info["action"]["reward_valid"] is True
        # process credit: the reward is the verifier's own coach score, scaled to [0, 1].
        assert result.reward == pytest.approx(coach["score"] / 10)
        assert info["returns"]["verifier"] == pytest.approx(result.reward)
        assert info["action_rewards"]["code_executor"] == [p["reward"] for p in played[1:]]

        state = env.state()
        assert state.done
        assert [a["agent"] for a in state.actions][-1] == "verifier"
        assert state.ego_agent == "verifier"
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step(MappaAction(text="again"))


def test_ego_rewards_settle_at_the_end_even_when_others_end_the_episode():
    # Outcome credit pays nothing when an action is taken and the outcome at the end.
    # The ego acts first; the episode ends on the verifier's action, played by the server,
    # and the ego's observation then carries its settlement: its return.
    config = ego_config("problem_solver", credit_mode="outcome")
    with running_server(config) as url, MappaEnvClient(url).sync() as env:
        first = env.reset(task_id="product")
        assert first.observation.agent == "problem_solver"
        assert first.observation.info["others"] == []
        result = env.step(MappaAction(text=mathchat_scripts.problem_solver([]), agent=None))
        info = result.observation.info
        assert result.done
        assert info["outcome"]["correct"] is True
        assert [p["agent"] for p in info["others"]] == [
            "code_executor",
            "code_executor",
            "verifier",
        ]
        assert result.reward == pytest.approx(1.0)  # paid 0 when taken, 1 at the end
        assert info["returns"] == {"problem_solver": 1.0, "code_executor": 2.0, "verifier": 1.0}
        assert info["paid"]["problem_solver"] == pytest.approx(1.0)


def test_multiplexed_mode_refuses_the_wrong_agent_and_pays_each_agent_its_own_reward():
    config = ServeConfig(
        "MathChat-v0",
        {**ENV_OPTIONS, "credit_mode": "mixed"},
        mode="multiplexed",
        allow_task_ids=True,
    )
    with running_server(config) as url, MappaEnvClient(url).sync() as env:
        result = env.reset(task_id="product")
        received: dict[str, list[float]] = {}
        steps = 0
        while not result.done:
            agent = result.observation.agent
            assert agent is not None
            if steps == 0:  # naming another agent is refused, and changes nothing
                with pytest.raises(RuntimeError, match=r"refused.*'verifier'.*problem_solver's"):
                    env.step(MappaAction(text="skip ahead", agent="verifier"))
                with pytest.raises(RuntimeError, match="must name its agent"):
                    env.step(MappaAction(text="who am I"))
                state = env.state()
                assert (state.agent, state.step_count, state.actions) == (agent, 0, [])
            reply = getattr(mathchat_scripts, agent)(result.observation.messages)
            result = env.step(MappaAction(text=reply, agent=agent))
            steps += 1
            info = result.observation.info
            assert info["acting_agent"] == agent
            assert info["paid"][agent] == pytest.approx(result.reward)
            received.setdefault(agent, []).append(result.reward)
            for other, amount in info["paid"].items():  # what the others got this step
                if other != agent and amount:
                    received.setdefault(other, []).append(amount)
        assert steps == 4
        info = result.observation.info
        assert info["outcome"]["correct"] is True
        # mixed credit: half the outcome is paid at the end, to every agent.
        assert info["paid"]["code_executor"] == pytest.approx(0.5 * 2)
        assert info["paid"]["problem_solver"] == pytest.approx(0.5)
        for agent, rewards in received.items():  # an agent's rewards add up to its return
            assert sum(rewards) == pytest.approx(info["returns"][agent]), agent


def _workspace(info: dict) -> Path:
    return Path(info["action"]["tool_output"].strip().splitlines()[-1])


def test_concurrent_sessions_have_their_own_workspace_closed_with_the_session():
    config = ServeConfig(
        "MathChat-v0", ENV_OPTIONS, mode="multiplexed", max_sessions=2, allow_task_ids=True
    )
    code = "```python\nimport os\nprint(os.getcwd())\n```"
    with running_server(config) as url:
        first, second = MappaEnvClient(url).sync(), MappaEnvClient(url).sync()
        workspaces = []
        for env in (first, second):
            env.connect()
            env.reset(task_id="product")
            env.step(MappaAction(text="No idea.", agent="problem_solver"))
            result = env.step(MappaAction(text=code, agent="code_executor"))
            workspaces.append(_workspace(result.observation.info))
        assert workspaces[0] != workspaces[1]
        assert all(w.is_dir() for w in workspaces)
        first.close()  # the session ends: its environment, sandbox and workspace go
        _wait_until(lambda: not workspaces[0].exists())
        assert workspaces[1].is_dir()
        result = second.step(MappaAction(text="Done: \\boxed{1}", agent="code_executor"))
        assert result.observation.agent == "verifier"
        second.close()
        _wait_until(lambda: not workspaces[1].exists())


def _wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_bad_settings_and_requests_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"missing \['code_executor'\]"):
        MappaOpenEnv(
            ServeConfig(
                "MathChat-v0", ENV_OPTIONS, ego_agent="verifier", others={"problem_solver": None}
            )
        )
    with pytest.raises(ValueError, match="unknown ego agent 'judge'"):
        MappaOpenEnv(ServeConfig("MathChat-v0", ENV_OPTIONS, ego_agent="judge"))
    with pytest.raises(ValueError, match="multiplexed mode plays every agent"):
        ServeConfig("MathChat-v0", ENV_OPTIONS, mode="multiplexed", ego_agent="verifier")
    with pytest.raises(ValueError, match="mode must be one of"):
        ServeConfig("MathChat-v0", ENV_OPTIONS, mode="solo")
    env = MappaOpenEnv(ServeConfig("MathChat-v0", ENV_OPTIONS, mode="multiplexed"))
    try:
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(MappaAction(text="hi", agent="problem_solver"))
        with pytest.raises(ValueError, match="unknown reset options"):
            env.reset(task="product")
        assert env.get_metadata().name == "MathChat-v0"
    finally:
        env.close()


def test_without_openenv_the_error_names_the_extra(monkeypatch):
    from mappa_env._optional import MissingExtraError

    monkeypatch.setitem(sys.modules, "openenv", None)  # makes `import openenv` fail
    monkeypatch.delitem(sys.modules, "mappa_agents.openenv_server")
    with pytest.raises(MissingExtraError, match=r"mappa-rl\[openenv\]"):
        import mappa_agents.openenv_server  # noqa: F401


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_mappa_serve_command_serves_an_episode(tmp_path):
    tasks = tmp_path / "product.json"
    tasks.write_text(
        json.dumps([{"id": "product", "prompt": TASKS[0].prompt, "answer": "7006652"}])
    )
    port = _free_port()
    others = ",".join(
        f"{a}=script:mathchat_scripts:{a}" for a in ("problem_solver", "code_executor")
    )
    command = [
        *(sys.executable, "-m", "mappa_train", "serve", "--env", "MathChat-v0"),
        *("--tasks", str(tasks), "--isolation", "none", "--ego", "verifier"),
        *("--others", others, "--port", str(port)),
    ]
    # From examples/, where mathchat_scripts lives; this checkout's packages first.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    server = subprocess.Popen(
        command,
        cwd=ROOT / "examples",
        env={**os.environ, "PYTHONPATH": path, "MAPPA_SERVE_TOKEN": "a-shared-token"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        env = MappaEnvClient(f"http://127.0.0.1:{port}", token="a-shared-token").sync()
        deadline = time.monotonic() + 60
        while True:
            try:
                env.connect()
                break
            except ConnectionError:
                assert server.poll() is None, server.stdout.read().decode()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        with env:
            result = env.reset()
            assert result.observation.agent == "verifier"
            result = env.step(MappaAction(text="\\boxed{7006652}", agent="verifier"))
            assert result.done
            assert result.observation.info["outcome"]["correct"] is True
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_failing_server_side_policy_is_named_to_the_client_and_logged(caplog):
    def broken(messages):
        raise ZeroDivisionError("the script divided by zero")

    others = {
        "problem_solver": ScriptedPolicy(broken, name="script:broken"),
        "code_executor": scripted("code_executor"),
    }
    config = ServeConfig(
        "MathChat-v0",
        ENV_OPTIONS,
        mode="ego",
        ego_agent="verifier",
        others=others,
        allow_task_ids=True,
    )
    with (
        running_server(config) as url,
        MappaEnvClient(url).sync() as env,
        pytest.raises(
            RuntimeError,
            match=r"policy 'script:broken' playing agent 'problem_solver' failed: "
            r"ZeroDivisionError: the script divided by zero",
        ),
    ):
        env.reset(task_id="product")
    logged = [r for r in caplog.records if "'script:broken' playing agent" in r.getMessage()]
    assert logged
    assert logged[0].levelname == "ERROR"
    assert logged[0].exc_info is not None  # with the traceback
