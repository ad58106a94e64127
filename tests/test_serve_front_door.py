"""`mappa serve` in front of other people: token, limits, withheld answers, confinement.

Every server here listens on 127.0.0.1 and is started by the test itself.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from websockets.exceptions import ConnectionClosed

from mappa_agents.openenv_server import (
    MappaAction,
    MappaEnvClient,
    ServeConfig,
    ServeLimits,
    running_server,
)
from mappa_agents.scripted import ScriptedPolicy
from mappa_env.tasks import MathTask

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import mathchat_scripts  # noqa: E402

TASKS = [MathTask(id="product", prompt="What is 1234 times 5678?", answer="7006652")]
ENV_OPTIONS = {"tasks": TASKS, "coach": "rules", "isolation": "none", "seed": 0}
TOKEN = "a-test-token"
# How a client learns that the server refused it or closed its session.
REFUSED = (RuntimeError, ConnectionError, ConnectionClosed, OSError)


def multiplexed(**settings) -> ServeConfig:
    return ServeConfig("MathChat-v0", ENV_OPTIONS, mode="multiplexed", **settings)


def ego(**settings) -> ServeConfig:
    others = {
        a: ScriptedPolicy(getattr(mathchat_scripts, a), name=f"script:{a}")
        for a in ("problem_solver", "code_executor")
    }
    return ServeConfig(
        "MathChat-v0", ENV_OPTIONS, mode="ego", ego_agent="verifier", others=others, **settings
    )


def play(env) -> dict:
    """A whole episode with the scripted agents; the last step's info."""
    result = env.reset()
    while not result.done:
        agent = result.observation.agent
        reply = getattr(mathchat_scripts, agent)(result.observation.messages)
        result = env.step(MappaAction(text=reply, agent=agent))
    return result.observation.info


def http(url: str, *, token: str | None = TOKEN, method: str = "GET", body: bytes | None = None):
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def closed_by_server(sock: socket.socket, within_s: float = 30.0) -> bool:
    """Whether the server closes ``sock`` (reads to its end; a reset counts as closed)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def _wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_every_route_needs_the_token_and_openenv_clients_connect_with_it():
    with running_server(multiplexed(), token=TOKEN) as url:
        assert http(f"{url}/health", token=None)[0] == 401
        assert http(f"{url}/health", token="wrong")[0] == 401
        assert http(f"{url}/health")[0] == 200
        with pytest.raises(ConnectionError, match="403"):
            MappaEnvClient(url, token="wrong").sync().connect()
        # openenv-core's client, with the token in its header
        with MappaEnvClient(url, token=TOKEN).sync() as env:
            assert play(env)["outcome"]["correct"] is True

        # A WebSocket client that cannot set headers puts it in the query.
        class QueryClient(MappaEnvClient):
            def __init__(self, base_url: str) -> None:
                super().__init__(base_url, token="")
                self._ws_url += f"?token={TOKEN}"

        with QueryClient(url).sync() as env:
            assert env.reset().observation.agent == "problem_solver"


def test_the_client_reads_the_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("MAPPA_SERVE_TOKEN", TOKEN)
    with running_server(multiplexed(), token=TOKEN) as url, MappaEnvClient(url).sync() as env:
        assert env.reset().observation.agent == "problem_solver"


def test_only_the_session_routes_are_served():
    with running_server(multiplexed(), token=TOKEN) as url:
        assert http(f"{url}/metadata")[0] == 200
        assert http(f"{url}/schema")[0] == 200
        for path in ("/reset", "/step", "/mcp"):
            assert http(f"{url}{path}", method="POST", body=b"{}")[0] in (404, 405), path
        for path in ("/state", "/docs", "/openapi.json"):
            assert http(f"{url}{path}")[0] == 404, path


def test_answers_stay_with_the_server_unless_revealed():
    with running_server(multiplexed()) as url, MappaEnvClient(url).sync() as env:
        info = play(env)
        assert info["outcome"]["correct"] is True
        assert "answer" not in info["outcome"]
        assert "answer" not in env.state().outcome
    with running_server(multiplexed(reveal_answers=True)) as url, MappaEnvClient(url).sync() as env:
        assert play(env)["outcome"]["answer"] == "7006652"


def test_a_reset_naming_a_task_or_a_seed_is_refused_unless_allowed():
    with running_server(multiplexed()) as url, MappaEnvClient(url).sync() as env:
        with pytest.raises(RuntimeError, match=r"names a task id.*--allow-task-ids"):
            env.reset(task_id="product")
        with pytest.raises(RuntimeError, match=r"names a seed.*--allow-task-ids"):
            env.reset(seed=3)
        assert env.reset().observation.agent == "problem_solver"
    config = multiplexed(allow_task_ids=True)
    with running_server(config) as url, MappaEnvClient(url).sync() as env:
        assert env.reset(task_id="product", seed=3).observation.agent == "problem_solver"


def test_an_idle_session_is_closed_and_its_slot_freed():
    # 3 s: the client's connect and reset follow each other well within it on a busy
    # machine, and the slot is still freed within the wait below.
    limits = ServeLimits(idle_timeout_s=3)
    with running_server(multiplexed(max_sessions=1), token=TOKEN, limits=limits) as url:
        idle = MappaEnvClient(url, token=TOKEN).sync()
        idle.connect()
        idle.reset()  # holds the only slot, then sends nothing

        def a_session_opens() -> bool:
            try:
                with MappaEnvClient(url, token=TOKEN).sync() as env:
                    return env.reset().observation.agent == "problem_solver"
            except REFUSED:
                return False

        _wait_until(a_session_opens)
        with pytest.raises(Exception):  # noqa: B017 - the server closed it
            idle.reset()


def test_ego_resets_are_rate_limited_per_token():
    limits = ServeLimits(resets_per_minute=2)
    with running_server(ego(), token=TOKEN, limits=limits) as url:
        with MappaEnvClient(url, token=TOKEN).sync() as env:
            env.reset()
            env.reset()
            with pytest.raises(RuntimeError, match=r"too many resets.*retry in \d+ s"):
                env.reset()
        with (
            MappaEnvClient(url, token=TOKEN).sync() as env,  # a new session: same token
            pytest.raises(RuntimeError, match="too many resets"),
        ):
            env.reset()


def test_oversized_bodies_and_messages_are_refused():
    limits = ServeLimits(max_body_bytes=1000)
    with running_server(multiplexed(), token=TOKEN, limits=limits) as url:
        assert http(f"{url}/health", method="POST", body=b"x" * 5000)[0] == 413
        with MappaEnvClient(url, token=TOKEN).sync() as env:
            env.reset()
            with pytest.raises(Exception, match=r"1009|too big|closed"):
                env.step(MappaAction(text="x" * 5000, agent="problem_solver"))


def test_silent_connections_are_closed_and_extra_ones_refused_on_arrival():
    limits = ServeLimits(keep_alive_s=0.5)
    with running_server(multiplexed(), token=TOKEN, limits=limits) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as silent:
            silent.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest
            assert closed_by_server(silent)
    # Silent for far longer than the test waits: only the cap can close the fourth.
    limits = ServeLimits(max_connections=3, keep_alive_s=600.0)
    with running_server(multiplexed(), token=TOKEN, limits=limits) as url:
        host, port = url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port))) for _ in range(3)]
        try:
            with socket.create_connection((host, int(port))) as extra:
                assert closed_by_server(extra, within_s=10.0)
        finally:
            for sock in held:
                sock.close()


def test_a_well_behaved_client_finishes_an_episode_during_a_flood():
    limits = ServeLimits(
        idle_timeout_s=1.0, max_connections=24, max_body_bytes=10_000, keep_alive_s=1.0
    )
    config = multiplexed(max_sessions=2)
    with running_server(config, token=TOKEN, limits=limits) as url:
        host, port = url.removeprefix("http://").split(":")
        stop = threading.Event()

        def slow_clients() -> None:  # connections that never finish a request
            socks = []
            while not stop.is_set():
                try:
                    sock = socket.create_connection((host, int(port)), timeout=5)
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                    socks.append(sock)
                except OSError:
                    pass
                time.sleep(0.01)
            for sock in socks:
                sock.close()

        def big_bodies() -> None:
            while not stop.is_set():
                try:
                    http(f"{url}/health", method="POST", body=b"x" * 200_000)
                except OSError:
                    pass

        def idle_sessions() -> None:  # take both slots, then say nothing
            held = []
            while not stop.is_set():
                try:
                    env = MappaEnvClient(url, token=TOKEN).sync()
                    env.connect()
                    env.reset()
                    held.append(env)
                except REFUSED:
                    time.sleep(0.1)
            for env in held:
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - the server may have closed it already
                    pass

        flood = [threading.Thread(target=f, daemon=True) for f in (slow_clients, big_bodies)]
        flood += [threading.Thread(target=idle_sessions, daemon=True) for _ in range(3)]
        for thread in flood:
            thread.start()
        try:
            outcome = None

            def an_episode_completes() -> bool:
                nonlocal outcome
                try:
                    with MappaEnvClient(url, token=TOKEN).sync() as env:
                        outcome = play(env)["outcome"]
                        return True
                except REFUSED:
                    return False

            _wait_until(an_episode_completes, timeout_s=120.0)
            assert outcome["correct"] is True
        finally:
            stop.set()
            for thread in flood:
                thread.join(timeout=30)


# ---------------------------------------------------------------------- the command


@pytest.fixture
def served(monkeypatch, tmp_path):
    """Runs ``mappa serve`` up to the point it would serve; what it would serve with."""
    import mappa_agents.openenv_server as server

    calls: list[dict] = []
    monkeypatch.setattr(
        server, "serve", lambda config, **kw: calls.append({"config": config, **kw})
    )
    monkeypatch.delenv("MAPPA_SERVE_TOKEN", raising=False)
    tasks = tmp_path / "tasks.json"
    tasks.write_text('[{"id": "product", "prompt": "What is 2 times 3?", "answer": "6"}]')

    def run(*flags: str) -> int:
        from mappa_train.command import main

        base = ("serve", "--env", "MathChat-v0", "--tasks", str(tasks), "--mode", "multiplexed")
        return main([*base, *flags])

    run.calls = calls
    return run


def test_auto_isolation_confines_or_refuses_to_start(served, monkeypatch, capsys):
    import mappa_env.sandbox.isolation as isolation

    monkeypatch.setattr(isolation, "unconfined_reason", lambda mode: "bwrap is not installed.")
    assert served("--isolation", "auto") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "cannot be confined here (bwrap is not installed)" in err[0]
    assert "install bubblewrap, or pass --isolation none" in err[0]
    assert served.calls == []


def test_no_isolation_is_named_unsafe_first(served, caplog):
    assert served("--isolation", "none") == 0
    first = next(r for r in caplog.records if r.name == "mappa")
    assert "--isolation none is UNSAFE" in first.getMessage()
    assert served.calls[0]["config"].reveal_answers is False


def test_a_token_is_made_on_loopback_and_required_elsewhere(served, caplog, capsys):
    assert served("--sandbox", "none") == 0
    made = served.calls[-1]["token"]
    assert len(made) >= 32
    assert any(made in r.getMessage() for r in caplog.records)
    assert served("--sandbox", "none", "--token", "given") == 0
    assert served.calls[-1]["token"] == "given"
    capsys.readouterr()
    assert served("--sandbox", "none", "--host", "0.0.0.0") == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 lets other machines connect" in err
    assert "--token or $MAPPA_SERVE_TOKEN" in err
    assert len(served.calls) == 2


def test_the_limits_are_flags_with_their_defaults_in_help(served, capsys):
    from mappa_train.command import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--idle-timeout", "--max-connections", "--max-body-bytes", "--keep-alive"):
        assert flag in shown
    assert "(default: 300.0)" in shown
    assert "none = UNSAFE" in shown
    flags = ("--sandbox", "none", "--idle-timeout", "2", "--resets-per-minute", "0")
    assert served(*flags, "--reveal-answers", "--allow-task-ids") == 0
    call = served.calls[-1]
    assert call["limits"] == ServeLimits(idle_timeout_s=2.0, resets_per_minute=0)
    assert (call["config"].reveal_answers, call["config"].allow_task_ids) == (True, True)
    assert served("--sandbox", "none", "--max-connections", "0") == 2
    assert "--max-connections must be > 0, got 0" in capsys.readouterr().err
