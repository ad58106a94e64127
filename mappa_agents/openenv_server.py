"""Any registered environment as an OpenEnv server (``mappa serve``), and its client.

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ (the ``openenv-core`` package, the
``openenv`` extra) serves an environment over HTTP and WebSocket; TRL, Unsloth and the
Hub's environment collection speak it. This module wraps a mappa environment (a
PettingZoo AEC pipeline) as an OpenEnv ``Environment`` in one of two modes:

- ``"ego"``: one agent (the *ego*, e.g. the one a trainer trains) is the OpenEnv actor.
  The other agents act inside the server, each through a policy given at start (an API
  model, a local model, ``script:module:function``): after ``reset`` and after each of the
  ego's actions the server plays them until it is the ego's turn again or the episode
  ends.
- ``"multiplexed"``: every agent is played by the client (one policy per agent, e.g. a
  multi-policy trainer). Each action names its agent; an action for an agent whose turn
  it is not is refused, and every observation says whose turn is next.

Each WebSocket session gets its own environment (its own workspace and sandbox), closed
with the session.

Rewards. The environment owns each action's reward under its ``credit_mode``
(:mod:`mappa_env.credit`): a reward that needs the outcome is provisional while the
episode runs, and when it ends every agent is paid the difference. An observation's
``reward`` is what the environment paid the acting agent (in ego mode, the ego) for the
step: its action's reward as paid when taken, and, on the step that ends the episode,
plus the settlement of that agent's earlier actions. So the rewards of one agent's steps
add up to its return, the sum of its actions' final rewards; it is never PettingZoo's
cumulative ``last()`` value. ``None`` when the action's reward rests on an invalid coach
verdict. What every agent was paid at the step (the others' settlements at the end), the
final reward of every action and each agent's return are in the observation's
``info`` (``paid``, ``action_rewards``, ``returns``), with the coach's verdict, the
invalid flags and the outcome.

OpenEnv's own ``metadata`` field holds the same dict in the server process, but
openenv-core 0.3 leaves ``metadata`` out of what it sends, so clients read ``info``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from mappa_env._optional import require

require("openenv", "openenv", purpose="serving environments over OpenEnv")

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import (  # noqa: E402
    Action,
    EnvironmentMetadata,
    Observation,
    State,
)
from pydantic import Field  # noqa: E402

import mappa_env  # noqa: E402
from mappa_agents.policy import Policy, SamplingParams  # noqa: E402
from mappa_agents.serve_gate import Gate, guarded_http_protocol  # noqa: E402
from mappa_agents.serving import TOKEN_ENV, ServeLimits  # noqa: E402

logger = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("ego", "multiplexed")
"""How agents map to OpenEnv actors (see the module docstring)."""

RESET_OPTIONS: tuple[str, ...] = ("task_id",)
"""Keyword arguments of ``reset`` besides ``seed`` and ``episode_id``."""

WITHHELD_FIELDS: frozenset[str] = frozenset(
    {
        "answer",
        "accepted_answers",
        "expected_answer",
        "final_answer",
        "reference",
        "reference_answer",
        "reference_solution",
        "solution",
    }
)
"""Outcome fields that hold the task's answer, left out of what a client receives
unless :attr:`ServeConfig.reveal_answers` is set."""


class MappaAction(Action):
    """One agent's reply.

    Attributes:
        text: The reply, as the environment's ``step`` takes it.
        agent: The agent the reply is for. Required in multiplexed mode (it must be the
            agent whose turn it is); optional in ego mode, where it must name the ego.
    """

    text: str = Field(..., description="the acting agent's reply")
    agent: str | None = Field(default=None, description="the agent this reply is for")


class MappaObservation(Observation):
    """What the client sees after ``reset`` and each ``step``.

    Attributes:
        agent: Whose turn it is: the agent the next action must be for (in ego mode the
            ego); ``None`` once the episode is over.
        messages: The chat messages that agent is to be prompted with.
        text: The same observation as one text.
        info: Facts about the step (see the module docstring): ``acting_agent``,
            ``action`` (the acting agent's ``infos``: coach verdict, ``reward_valid``,
            ``action_truncated``, tool output), ``paid``, ``others`` (ego mode: the other
            agents' actions the server played), and at the end ``outcome``,
            ``action_rewards`` and ``returns``.
    """

    agent: str | None = Field(default=None, description="whose turn it is next")
    messages: list[dict[str, str]] = Field(default_factory=list)
    text: str = ""
    info: dict[str, Any] = Field(default_factory=dict)


class MappaState(State):
    """The episode as a whole (OpenEnv's ``state``).

    Attributes:
        env_id: The environment's id.
        mode: ``"ego"`` or ``"multiplexed"``.
        ego_agent: The ego (ego mode), else ``None``.
        agents: Every agent, in pipeline order.
        agent: Whose turn it is (``None`` when no episode runs).
        task_id: The episode's task.
        actions: Every action so far, as the environment records it.
        outcome: The outcome, once the episode has ended.
        done: Whether the episode has ended.
    """

    env_id: str = ""
    mode: str = "ego"
    ego_agent: str | None = None
    agents: list[str] = Field(default_factory=list)
    agent: str | None = None
    task_id: str | None = None
    actions: list[dict[str, Any]] = Field(default_factory=list)
    outcome: dict[str, Any] | None = None
    done: bool = False


@dataclasses.dataclass
class ServeConfig:
    """What ``mappa serve`` serves.

    Attributes:
        env_id: A registered environment id (or ``module:Class``).
        env_options: Options of the environment's constructor for every session (a coach
            given as a spec string is built per session and closed with it).
        mode: ``"ego"`` or ``"multiplexed"``.
        ego_agent: Ego mode: the agent the client plays (default: the first agent).
        others: Ego mode: agent -> the policy that plays it, for every other agent.
            Policies are shared by all sessions.
        sampling: How the other agents' policies sample.
        max_sessions: Most concurrent sessions (each holds an environment and sandbox).
        reveal_answers: Send the task's answer fields (:data:`WITHHELD_FIELDS`) in the
            outcome. Off by default: a client that sees them can harvest the answers.
        allow_task_ids: Let a ``reset`` name its task (``task_id``) or a seed, which
            replays a task the client has seen. Off by default: such a reset is refused.
    """

    env_id: str
    env_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    mode: str = "ego"
    ego_agent: str | None = None
    others: Mapping[str, Policy] = dataclasses.field(default_factory=dict)
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    max_sessions: int = 4
    reveal_answers: bool = False
    allow_task_ids: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.mode == "multiplexed" and (self.others or self.ego_agent):
            raise ValueError(
                "multiplexed mode plays every agent from the client: give no ego agent and "
                "no policies for the others (that is ego mode)"
            )


class MappaOpenEnv(Environment[MappaAction, MappaObservation, MappaState]):
    """One session's environment: a mappa environment behind OpenEnv's interface.

    Args:
        config: What to serve; the environment is made from it at once.

    Raises:
        ValueError: For an unknown ego agent, or (ego mode) a missing or unknown agent
            among the policies of the others.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: ServeConfig) -> None:
        super().__init__()
        self.config = config
        self.env = mappa_env.make(config.env_id, **dict(config.env_options))
        try:
            self.ego = self._check_agents()
        except ValueError:
            self.env.close()
            raise
        self._episode_id: str | None = None
        self._step_count = 0
        self._started = False
        self._snapshot = self._make_state()

    # ------------------------------------------------------------------ OpenEnv API

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **options: Any
    ) -> MappaObservation:
        """Start an episode; in ego mode, play the other agents up to the ego's turn.

        Args:
            seed: Seeds the environment (task order, sampling of the action space).
            episode_id: A label for the episode (a random one by default).
            **options: ``task_id`` picks the task.

        Raises:
            ValueError: For an option other than :data:`RESET_OPTIONS`.
            PermissionError: For a ``task_id`` or a seed, unless
                :attr:`ServeConfig.allow_task_ids` is set: either replays a known task.
        """
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; reset takes {RESET_OPTIONS}")
        if not self.config.allow_task_ids and (options or seed is not None):
            named = "a task id" if options else "a seed"
            raise PermissionError(
                f"refused: this reset names {named}, which replays a task, and the server "
                "does not allow it (its operator can pass --allow-task-ids); reset "
                "without task_id and seed for the next task"
            )
        self.env.reset(seed=seed, options=options or None)
        self._episode_id = episode_id or uuid.uuid4().hex
        self._step_count = 0
        self._started = True
        paid = dict.fromkeys(self.env.possible_agents, 0.0)
        others = self._play_others(paid)
        info: dict[str, Any] = {"paid": _json_safe(paid)}
        if self.ego is not None:
            info["others"] = others
        return self._observation(reward=None, info=info)

    def step(
        self, action: MappaAction, timeout_s: float | None = None, **kwargs: Any
    ) -> MappaObservation:
        """Act for the agent whose turn it is; in ego mode, then play the others.

        Raises:
            RuntimeError: Before ``reset``, or once the episode is over.
            ValueError: For an action naming an agent whose turn it is not (or, in ego
                mode, an agent other than the ego).
        """
        if not self._started:
            raise RuntimeError("no episode is running: call reset() first")
        if self._done():
            raise RuntimeError("the episode is over: call reset() to start a new one")
        actor = self.env.agent_selection
        expected = self.ego or actor
        if self.config.mode == "multiplexed" and action.agent is None:
            raise ValueError(
                f"multiplexed mode: the action must name its agent; it is {actor}'s turn"
            )
        if action.agent is not None and action.agent != expected:
            raise ValueError(
                f"refused: the action is for {action.agent!r}, but it is {expected}'s turn"
            )
        paid = dict.fromkeys(self.env.possible_agents, 0.0)
        self._act(actor, action.text, paid)
        self._step_count += 1
        action_info = _json_safe(self.env.infos[actor])
        others = self._play_others(paid)
        info: dict[str, Any] = {"acting_agent": actor, "action": action_info}
        if self.ego is not None:
            info["others"] = others
        info["paid"] = _json_safe(paid)
        reward = paid[actor] if action_info.get("reward_valid", True) else None
        return self._observation(reward=_finite_or_none(reward), info=info)

    @property
    def state(self) -> MappaState:
        """The episode as of the last reset or step (a snapshot: never blocks on a step)."""
        return self._snapshot

    def get_metadata(self) -> EnvironmentMetadata:
        """Name and description of the served environment."""
        cls = type(self.env)
        return EnvironmentMetadata(
            name=self.config.env_id,
            description=(cls.__doc__ or cls.__name__).strip().splitlines()[0],
            version=mappa_env.__version__,
        )

    def close(self) -> None:
        """Close the environment: its sandbox and workspace go with the session."""
        self.env.close()

    # ------------------------------------------------------------------ helpers

    def _check_agents(self) -> str | None:
        agents = list(self.env.possible_agents)
        if self.config.mode == "multiplexed":
            return None
        ego = self.config.ego_agent or agents[0]
        if ego not in agents:
            raise ValueError(f"unknown ego agent {ego!r}; {self.config.env_id} has {agents}")
        needed = [a for a in agents if a != ego]
        missing = [a for a in needed if a not in self.config.others]
        unknown = sorted(set(self.config.others) - set(needed))
        if missing or unknown:
            raise ValueError(
                f"ego mode with ego {ego!r} needs a policy for each other agent {needed}: "
                f"missing {missing}, not other agents {unknown}"
            )
        return ego

    def _done(self) -> bool:
        agents = self.env.agents
        return not agents or all(
            self.env.terminations[a] or self.env.truncations[a] for a in agents
        )

    def _act(self, agent: str, text: str, paid: dict[str, float]) -> None:
        """One environment step; adds what it paid each agent to ``paid``."""
        self.env.step(text)
        for name, amount in self.env.rewards.items():
            paid[name] = paid.get(name, 0.0) + amount

    def _play_others(self, paid: dict[str, float]) -> list[dict[str, Any]]:
        """Ego mode: play the other agents until the ego's turn or the episode's end."""
        played: list[dict[str, Any]] = []
        if self.ego is None:
            return played
        while not self._done() and self.env.agent_selection != self.ego:
            agent = self.env.agent_selection
            messages = list(self.env.observe(agent)["messages"])
            started = time.perf_counter()
            policy = self.config.others[agent]
            try:
                (generation,) = policy.generate([messages], self.config.sampling)
            except Exception as exc:
                # The client sees only the message: the traceback stays in the server's log.
                name = getattr(policy, "name", type(policy).__name__)
                logger.exception("the policy %r playing agent %r failed", name, agent)
                raise RuntimeError(
                    f"the server's policy {name!r} playing agent {agent!r} failed: "
                    f"{type(exc).__name__}: {exc} (the traceback is in the server's log)"
                ) from exc
            self._act(agent, generation.text, paid)
            info = self.env.infos[agent]
            played.append(
                _json_safe(
                    {
                        "agent": agent,
                        "action": generation.text,
                        "seconds": time.perf_counter() - started,
                        "reward": self.env.rewards.get(agent),
                        "reward_valid": info.get("reward_valid"),
                        "coach": info.get("coach"),
                    }
                )
            )
        return played

    def _observation(self, reward: float | None, info: dict[str, Any]) -> MappaObservation:
        done = self._done()
        agent = None if done else self.env.agent_selection
        if done:
            info["outcome"] = self._shown_outcome(self.env.outcome)
            final = {
                a: [r.usable_reward for r in self.env.records_of(a)]
                for a in self.env.possible_agents
            }
            info["action_rewards"] = _json_safe(final)
            info["returns"] = _json_safe(
                {a: sum(r for r in rewards if r is not None) for a, rewards in final.items()}
            )
        observation = {} if agent is None else self.env.observe(agent)
        info["episode_id"] = self._episode_id
        self._snapshot = self._make_state()
        return MappaObservation(
            done=done,
            reward=reward,
            agent=agent,
            messages=[dict(m) for m in observation.get("messages", ())],
            text=observation.get("text", ""),
            info=info,
            metadata=info,
        )

    def _make_state(self) -> MappaState:
        snapshot = self.env.state() if self._started_episode() else {}
        return MappaState(
            episode_id=getattr(self, "_episode_id", None),
            step_count=getattr(self, "_step_count", 0),
            env_id=self.config.env_id,
            mode=self.config.mode,
            ego_agent=self.ego,
            agents=list(self.env.possible_agents),
            agent=snapshot.get("agent_selection"),
            task_id=snapshot.get("task_id"),
            actions=_json_safe(snapshot.get("actions", [])),
            outcome=self._shown_outcome(snapshot.get("outcome")),
            done=bool(snapshot) and self._done(),
        )

    def _shown_outcome(self, outcome: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The outcome as a client may see it: without the answer fields unless revealed."""
        if outcome is None or self.config.reveal_answers:
            return _json_safe(outcome)
        return _json_safe({k: v for k, v in outcome.items() if k not in WITHHELD_FIELDS})

    def _started_episode(self) -> bool:
        return getattr(self, "_started", False)


# ---------------------------------------------------------------------- the server

ROUTES: tuple[str, ...] = ("/ws", "/health", "/schema", "/metadata")
"""The routes served: OpenEnv's session route and three that describe the server.

openenv-core's stateless ``/reset``, ``/step`` and ``/state`` (a fresh environment per
request, so no episode to act in), its MCP routes (a mappa environment has no MCP tools,
and each MCP session held a slot of its own) and the API docs are not served.
"""


def create_app(
    config: ServeConfig, *, token: str | None = None, limits: ServeLimits | None = None
) -> Any:
    """The ASGI app serving ``config``: OpenEnv's ``/ws`` sessions behind a gate.

    Sessions use the WebSocket route (``/ws``), as OpenEnv's clients do; each gets its
    own environment. Only :data:`ROUTES` are served. The gate checks the token on every
    route, bounds request bodies, closes idle sessions and, in ego mode, limits resets
    per token (see :class:`ServeLimits`).

    Args:
        config: What to serve.
        token: The token every request must carry (``Authorization: Bearer <token>``,
            or a ``token`` query parameter); ``None`` serves without one, for a server
            only this process talks to (:func:`running_server` in tests and examples).
        limits: Bounds on what clients hold (default: :class:`ServeLimits`'s).

    Returns:
        An ASGI application (run it with uvicorn: :func:`serve` sets its limits).
    """
    limits = limits or ServeLimits()
    # One environment made now checks the options and agents before the first client;
    # its metadata is served from then on, so /metadata makes no environment.
    probe = MappaOpenEnv(config)
    try:
        metadata = probe.get_metadata()
    finally:
        probe.close()
    factory = functools.partial(MappaOpenEnv, config)
    app = create_fastapi_app(
        factory, MappaAction, MappaObservation, max_concurrent_envs=config.max_sessions
    )
    app.router.routes[:] = [
        route
        for route in app.router.routes
        if getattr(route, "path", None) in ROUTES and route.path != "/metadata"
    ]
    app.add_api_route(
        "/metadata", lambda: metadata, methods=["GET"], response_model=EnvironmentMetadata
    )
    return Gate(app, token=token, limits=limits, ego=config.mode == "ego")


def uvicorn_config(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServeLimits | None = None,
    log_level: str = "info",
) -> Any:
    """The ``uvicorn.Config`` that runs ``app`` within ``limits``.

    Bodies and WebSocket messages are bounded by ``max_body_bytes``, keep-alive by
    ``keep_alive_s``; connections over ``max_connections`` and ones that send no
    whole request head within ``keep_alive_s`` are closed. uvicorn's access log is off:
    it would write query-parameter tokens into the log.
    """
    import uvicorn

    limits = limits or ServeLimits()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=guarded_http_protocol(limits),
        ws_max_size=limits.max_body_bytes,
        timeout_keep_alive=limits.keep_alive_s,
        limit_concurrency=limits.max_connections,
    )


@contextlib.contextmanager
def running_server(
    config: ServeConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    limits: ServeLimits | None = None,
) -> Iterator[str]:
    """Serve ``config`` from a background thread for the duration of a ``with`` block.

    Args:
        config: What to serve.
        host: Interface to listen on.
        port: Port (``0``: a free one).
        token: The token clients must send (see :func:`create_app`); ``None``: none.
        limits: Bounds on what clients hold (default: :class:`ServeLimits`'s).

    Yields:
        The server's base URL, e.g. ``"http://127.0.0.1:40123"``.
    """
    import uvicorn

    app = create_app(config, token=token, limits=limits)
    server = uvicorn.Server(uvicorn_config(app, host, port, limits, log_level="warning"))
    thread = threading.Thread(target=server.run, name="mappa-openenv-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the OpenEnv server did not start on {host}:{port}")
        time.sleep(0.02)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30.0)


def serve(
    config: ServeConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    token: str | None = None,
    limits: ServeLimits | None = None,
) -> None:
    """Serve ``config`` until interrupted (what ``mappa serve`` runs)."""
    import uvicorn

    app = create_app(config, token=token, limits=limits)
    uvicorn.Server(uvicorn_config(app, host, port, limits)).run()


# ---------------------------------------------------------------------- the client


class MappaEnvClient(EnvClient[MappaAction, MappaObservation, MappaState]):
    """OpenEnv's WebSocket client for a ``mappa serve`` server.

    Async like every ``EnvClient``; ``.sync()`` gives the blocking wrapper::

        with MappaEnvClient("http://127.0.0.1:8000", token=token).sync() as env:
            result = env.reset()
            while not result.done:
                reply = my_model(result.observation.messages)
                result = env.step(MappaAction(text=reply, agent=result.observation.agent))

    Args:
        base_url: The server's URL, e.g. ``"http://127.0.0.1:8000"``.
        token: The server's token, sent as ``Authorization: Bearer <token>``; by
            default the :data:`TOKEN_ENV` variable's value, if set.
        **kwargs: ``EnvClient``'s other arguments (timeouts, message size).
    """

    def __init__(self, base_url: str, token: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._token = token if token is not None else os.environ.get(TOKEN_ENV) or None

    async def connect(self) -> MappaEnvClient:
        """Open the session's WebSocket, sending the token in a header where there is one."""
        if self._ws is not None or self._token is None:
            await super().connect()
            return self
        from websockets.asyncio.client import connect as ws_connect

        host = urllib.parse.urlsplit(self._ws_url).hostname
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers={"Authorization": f"Bearer {self._token}"},
                # As openenv-core's client does: no proxy for a server on this machine.
                proxy=None if host in ("127.0.0.1", "localhost", "::1") else True,
            )
        except Exception as exc:
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    async def disconnect(self) -> None:
        """End the session: ask the server to close, and wait until it has.

        openenv-core 0.3's client closes its end at once, and the server's own close
        of the WebSocket then fails with a logged traceback; waiting for the server's
        close frame ends the session cleanly.
        """
        if self._ws is None:
            return
        with contextlib.suppress(Exception):  # the connection may already be gone
            await self._send({"type": "close"})
            # recv() ends (ConnectionClosed) once the server's close frame arrives.
            await asyncio.wait_for(self._ws.recv(), timeout=self._message_timeout)
        with contextlib.suppress(Exception):
            await self._ws.close()
        self._ws = None

    def _step_payload(self, action: MappaAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MappaObservation]:
        fields = dict(payload.get("observation", {}))
        observation = MappaObservation(
            done=payload.get("done", False), reward=payload.get("reward"), **fields
        )
        observation.metadata = observation.info
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload.get("done", False)
        )

    def _parse_state(self, payload: dict[str, Any]) -> MappaState:
        return MappaState(**payload)


# ---------------------------------------------------------------------- helpers


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _json_safe(value: Any) -> Any:
    """Plain JSON data: NaN and infinities become ``None``, tuples lists, keys strings."""
    if isinstance(value, float):
        return _finite_or_none(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)
