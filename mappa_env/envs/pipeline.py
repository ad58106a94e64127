"""A pipeline of text agents as a PettingZoo AEC environment with an async core.

Both MathChat-v0 and DSBench-v0 are pipelines: agents act in a fixed order, each for
one or more turns; every action may run code in a sandbox and is scored by a coach.
This module holds the shell they share: the options, turn order, the PettingZoo
bookkeeping, action validation, the hooks a subclass fills in and the sync layer over
the async core. :class:`PipelineEnv` is composed of three parts that live in modules of
their own: the workspace and sandboxes (:mod:`mappa_env.envs.workspace`), judging by the
coach (:mod:`mappa_env.envs.judging`) and the transcript's records with the episode's
outcome and credit (:mod:`mappa_env.envs.records`, :mod:`mappa_env.credit`).

The async core (:meth:`PipelineEnv.areset`, :meth:`PipelineEnv.astep`) lets a batched
runner drive many episodes in one event loop, so coach calls and sandbox runs of
different episodes overlap. :meth:`PipelineEnv.reset` and :meth:`PipelineEnv.step` are
thin synchronous wrappers over it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium
from pettingzoo import AECEnv

from mappa_env._async import BackgroundLoop
from mappa_env.coach.base import Coach, RevealPolicy, Rubric
from mappa_env.credit import CreditMode
from mappa_env.envs.judging import REVEAL_POLICIES, CoachJudging, check_invalid_reward  # noqa: F401
from mappa_env.envs.outcome import EpisodeOutcome
from mappa_env.envs.records import ActionRecord, EpisodeRecords, ToolOutcome
from mappa_env.envs.workspace import (
    DEFAULT_WORKSPACE_QUOTA_MB,
    MAX_CODE_TIMEOUT_S,
    MIN_CODE_TIMEOUT_S,
    EpisodeWorkspace,
    resolve_sandbox_factory,  # noqa: F401
)
from mappa_env.options import integer_option, number_option, seed_option
from mappa_env.sandbox.base import SandboxFactory
from mappa_env.sandbox.isolation import IsolationMode
from mappa_env.spaces import UnicodeText, make_observation, text_observation_space

if TYPE_CHECKING:
    from mappa_env.audit.battery import AuditActions

logger = logging.getLogger(__name__)

#: Largest ``max_new_tokens`` accepted (a budget stated in prompts, not a buffer size).
MAX_NEW_TOKENS = 1_048_576
#: Largest turn limit of one agent.
MAX_TURNS = 1_000

#: Bound on observation text; parts of prompts are cut well before this.
MAX_OBSERVATION_CHARS = 2_000_000


@dataclass(frozen=True)
class AgentSpec:
    """One agent of a pipeline.

    Attributes:
        name: Agent id, e.g. ``"code_executor"``.
        title: Human-readable role name used in prompts, e.g. ``"code executor"``.
        max_turns: Most actions the agent may take in its slot.
    """

    name: str
    title: str
    max_turns: int


class PipelineEnv(EpisodeWorkspace, CoachJudging, EpisodeRecords, AECEnv):
    """Base class of the pipeline environments (an ``AECEnv`` with an async core).

    A subclass is one environment: its agents, prompts, tools, tasks, outcome grading and
    coach rubrics live on it, and nothing elsewhere branches on its id. The contract:

    Class attributes:
        env_id: The id used by :func:`mappa_env.register`, coach requests and reports.
        roles: The agents, in order, as :class:`AgentSpec` (name, title, default turns).
        task_class: Type of the task objects (checked for ``options["task"]``).
        coach_rubrics: ``{agent: rubric text}`` an LLM coach judges each role by.
        rules_rubric: ``request -> (score, analysis)`` for the offline ``"rules"``
            coach, or ``None`` when the environment has none.
        shows_workspace: The coach is shown the workspace's file list (even when empty).
        tool_agent: The agent whose tool use is the headline of reports, if any.
        reports_agent_correct: :meth:`episode_outcome` says, for every agent that acted,
            whether its own final answer was right (``"agent_correct"``), which the
            ``agent_oracle`` credit mode pays.
        default_code_timeout_s: ``code_timeout_s`` when none is given.
        hands_over_through_files: Agents pass work on only through workspace files and
            their final messages, so a coach audit may rebuild an agent's context from
            the files and the upstream final messages (:mod:`mappa_env.audit`).

    Required hooks: :meth:`role_description`, :meth:`agent_messages`,
    :meth:`run_action`, :meth:`episode_outcome`, :meth:`task_facts`, the property
    :attr:`system_description`, and ``self.tasks`` (a non-empty sequence of task objects
    with an ``id``) set in ``__init__``, before or after ``super().__init__(**options)``.

    Optional hooks: :meth:`next_agent` (who acts next: loops and revisits),
    :meth:`coach_metadata`, :meth:`select_task`, :meth:`on_episode_start`,
    :meth:`on_slot_end`, :meth:`on_episode_end`, :meth:`on_close`, the class method
    :meth:`summarize_outcomes` (environment-specific numbers for reports), and for coach
    audits :meth:`audit_actions` and the class method :meth:`audit_env_options`.

    A subclass takes its own options and passes the rest on once: ``def __init__(self,
    tasks=None, *, my_option=1, **options)`` then ``super().__init__(**options)``. See
    ``examples/custom_env.py`` for a complete environment in one file.

    Args:
        coach: Scores every action; ``None`` is allowed only with a credit mode that
            does not use it (``outcome``, ``agent_oracle``).
        credit_mode: How each action's reward is made (:mod:`mappa_env.credit`):
            ``"process"`` (the coach's score of the action, scaled to [0, 1]),
            ``"outcome"`` (the episode's outcome, given to every action),
            ``"agent_oracle"`` (whether the acting agent's own final answer is right),
            ``"mixed"`` (``(1 - w) * coach + w * outcome``) or ``"backprop"`` (the
            outcome's disagreement with the final coach score passed back upstream).
            Rewards that need the outcome are paid at the episode's end: each action's
            step reward is provisional until then, and the end pays every agent the
            difference, so an agent's return is the sum of its actions' final rewards.
        reward_mode: Former name of ``credit_mode`` (deprecated).
        outcome_weight: Weight ``w`` of the outcome in ``mixed`` credit.
        backprop_decay: Decay per action of the outcome's error in ``backprop`` credit.
        reveal: Which actions the coach judges with the ground truth in view; ``None``
            takes the coach's own ``default_reveal`` (the rules coach: ``"always"``,
            with an answer-blind rubric for the other agents under ``"last_agent"``;
            LLM coaches: the last agent, as in the paper).
        max_action_chars: Longer actions are cut to this length; ``infos`` flags it
            (an integer from 1 to :data:`MAX_OBSERVATION_CHARS`).
        max_cycles: Truncate the episode after this many actions in total (all agents
            together; an integer >= 1); ``None`` bounds episodes only by the agents'
            turn limits.
        invalid_reward: Reward recorded when it rests on an invalid coach verdict
            (``process``, ``mixed``, ``backprop``). NaN by default, so a failed judgement
            can never pass for a real score; a number in ``[-1, 0]`` is accepted, nothing
            that would pay more than the worst real score. ``infos[agent]["reward_valid"]``
            is False either way.
        render_mode: ``None``, ``"ansi"`` (``render()`` returns the transcript) or
            ``"human"`` (``render()`` prints it).
        seed: Seeds task order (an integer from 0 to ``2**64 - 1``, or ``None``).
        shuffle: Visit tasks in a seeded random order.
        sandbox: ``"jupyter"``, a callable ``workdir -> Sandbox``, or ``None`` (no code).
        isolation: How agents' code is confined (see
            :mod:`mappa_env.sandbox.isolation`): ``"auto"`` (Linux namespaces where
            bubblewrap works, else none with a warning), ``"namespaces"`` (or raise
            :class:`~mappa_env.sandbox.isolation.IsolationUnavailableError`) or ``"none"``.
        turns: Per-agent turn limits replacing the defaults of :attr:`roles`, e.g.
            ``{"code_executor": 3}`` (integers from 1 to :data:`MAX_TURNS`).
        max_new_tokens: Token budget per action, stated in the prompts (an integer from
            1 to :data:`MAX_NEW_TOKENS`).
        code_timeout_s: Wall-clock limit of one code run, in seconds (finite, from
            :data:`MIN_CODE_TIMEOUT_S` to :data:`MAX_CODE_TIMEOUT_S`). ``None``: the limit
            the episode's task carries or implies (:meth:`task_code_timeout_s`), else the
            class's :attr:`default_code_timeout_s`. A number given here wins over the
            task's.
        prestart_sandbox: Make the next episode's workspace and start its first sandbox
            in the background while the current episode runs (from the second episode
            on, after an episode that ran code; an episode without one starts its own at
            its reset when the last one ran code), so the first code
            run of an episode does not wait for a kernel start. Each such sandbox
            starts in its own fresh workspace, confined to it as one started on demand.
            ``None`` (default): on for ``sandbox="jupyter"`` and factories made by
            ``JupyterSandbox.factory`` (cold starts) on a machine with at least
            :data:`PRESTART_MIN_CPUS` usable CPUs, off for other factories (a
            :class:`~mappa_env.sandbox.KernelPool` is warm already) and on fewer
            CPUs; ``False`` turns it off, ``True`` turns it on for any factory.
        tool_output_chars: Code output longer than this is cut from the middle.
        workspace_quota_mb: Disk quota of the episode's workspace, in MiB (default
            1024; ``None``: none). Checked after every code run whatever the sandbox,
            and, by the Jupyter sandbox, while the code runs: code that takes the
            workspace over it is stopped, its interpreter is closed (its variables are
            gone), what it wrote is deleted until the workspace is back under the
            quota, and the action's tool result carries the error
            ``WorkspaceQuotaExceeded`` (see :mod:`mappa_env.sandbox.quota`); the episode
            goes on.

    Every numeric option is checked here: a value of the wrong type, NaN, an infinity or
    one out of range raises ``TypeError`` / ``ValueError`` naming the option, the value
    and the allowed range (see :mod:`mappa_env.options`).
    """

    #: PettingZoo's metadata; a subclass that sets none gets these, named after its env_id.
    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["human", "ansi"],
        "name": "pipeline_v0",
        "is_parallelizable": False,
    }
    #: Environment id used in coach requests and registries.
    env_id: ClassVar[str] = "Pipeline-v0"
    #: The agents in pipeline order, with their default turn limits.
    roles: ClassVar[tuple[AgentSpec, ...]] = ()
    #: Type of the task objects in ``self.tasks`` (checked for ``options["task"]``).
    task_class: ClassVar[type] = object
    #: Per-role rubric texts for LLM coaches (roles without one get the general rubric).
    coach_rubrics: ClassVar[Mapping[str, str]] = {}
    #: The rules coach's scorer for this environment (``None``: no offline rubric).
    rules_rubric: ClassVar[Rubric | None] = None
    #: Whether coaches are shown the workspace's files after each action.
    shows_workspace: ClassVar[bool] = False
    #: The agent whose tool use reports single out (``None``: none in particular).
    tool_agent: ClassVar[str | None] = None
    #: Whether ``episode_outcome()`` reports ``"agent_correct"`` (``agent_oracle`` credit).
    reports_agent_correct: ClassVar[bool] = False
    #: ``code_timeout_s`` when the caller gives none.
    default_code_timeout_s: ClassVar[float] = 30.0
    #: Whether agents hand work over only through workspace files and final messages.
    hands_over_through_files: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "metadata" not in cls.__dict__:
            # "MathChat-v0" -> "mathchat_v0", PettingZoo's spelling of environment names.
            name = cls.env_id.lower().replace("-", "_")
            cls.metadata = {**PipelineEnv.metadata, "name": name}

    def __init__(
        self,
        *,
        coach: Coach | str | None,
        credit_mode: CreditMode = "process",
        outcome_weight: float = 0.5,
        backprop_decay: float = 0.5,
        reward_mode: str | None = None,
        reveal: RevealPolicy | None = None,
        max_action_chars: int = 32_768,
        max_cycles: int | None = None,
        invalid_reward: float = math.nan,
        render_mode: str | None = None,
        seed: int | None = None,
        shuffle: bool = True,
        sandbox: str | SandboxFactory | None = None,
        isolation: IsolationMode = "auto",
        turns: Mapping[str, int] | None = None,
        max_new_tokens: int = 4096,
        code_timeout_s: float | None = None,
        tool_output_chars: int = 4000,
        workspace_quota_mb: float | None = DEFAULT_WORKSPACE_QUOTA_MB,
        prestart_sandbox: bool | None = None,
    ) -> None:
        super().__init__()
        if not self.roles:
            raise TypeError(
                f"{type(self).__name__} declares no agents: set the class attribute "
                "roles = (AgentSpec(name, title, max_turns), ...)"
            )
        # Every number is checked here, before anything is started: a NaN timeout made
        # every code action an environment error, an infinite one let a loop run for ever.
        self.max_new_tokens = integer_option(
            "max_new_tokens", max_new_tokens, high=MAX_NEW_TOKENS, hint="e.g. 4096 (the paper's)"
        )
        self._code_timeout_option: float | None = None
        if code_timeout_s is not None:
            self.code_timeout_s = code_timeout_s
        self.tool_output_chars = integer_option(
            "tool_output_chars", tool_output_chars, high=MAX_OBSERVATION_CHARS
        )
        self.workspace_quota_bytes: int | None = None
        if workspace_quota_mb is not None:
            quota_mb = number_option(
                "workspace_quota_mb",
                workspace_quota_mb,
                low=0.0,
                low_open=True,
                hint="MiB the agents' files may take on disk, e.g. 1024, or None for none",
            )
            self.workspace_quota_bytes = max(1, int(quota_mb * 1024**2))
        limits = parse_turn_limits({r.name: r.max_turns for r in self.roles}, turns)
        self._specs: dict[str, AgentSpec] = {
            r.name: replace(r, max_turns=limits[r.name]) for r in self.roles
        }
        # Checked now: isolation="namespaces" where it cannot work fails here, by name.
        self._open_workspace(sandbox, isolation)
        if prestart_sandbox is not None and not isinstance(prestart_sandbox, bool):
            raise TypeError(
                f"prestart_sandbox must be True, False or None, got {prestart_sandbox!r}"
            )
        self.prestart_sandbox = self._sandbox_factory is not None and (
            _cold_starts(self._sandbox_factory) if prestart_sandbox is None else prestart_sandbox
        )
        self.expect_next_episode: bool = True
        """Whether another episode is expected soon after the one the next reset starts.

        With ``False`` that reset starts no sandbox ahead for a next episode. A runner
        that knows the environment gets no further episode in its run (the episodes left
        are fewer than its environments) sets it, so no kernel is started for nothing."""
        coach, credit, credit_mode, reveal = self._take_coach(
            coach, credit_mode, outcome_weight, backprop_decay, reward_mode, reveal
        )
        max_action_chars = integer_option(
            "max_action_chars", max_action_chars, high=MAX_OBSERVATION_CHARS
        )
        if max_cycles is not None:
            max_cycles = integer_option(
                "max_cycles", max_cycles, hint="or None to bound episodes by turns only"
            )
        invalid_reward = check_invalid_reward(invalid_reward)
        seed = seed_option(seed)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, "
                f"got {render_mode!r}"
            )
        self.coach = coach
        self.credit = credit
        self.credit_mode: CreditMode = credit_mode
        self.outcome_weight = credit.outcome_weight
        self.backprop_decay = credit.backprop_decay
        self.reveal: RevealPolicy = reveal
        self.max_action_chars = max_action_chars
        self.max_cycles = max_cycles
        self.invalid_reward = invalid_reward
        self.render_mode = render_mode

        self.possible_agents: list[str] = list(self._specs)
        self.agents: list[str] = []
        observation_space = text_observation_space(MAX_OBSERVATION_CHARS)
        action_space = UnicodeText(self.max_action_chars)
        # One space object per agent, returned identically on every call (PettingZoo checks).
        self.observation_spaces = {a: observation_space for a in self.possible_agents}
        self.action_spaces = {a: action_space for a in self.possible_agents}

        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection: str = self.possible_agents[0]

        self.transcript: list[ActionRecord] = []
        self.outcome: EpisodeOutcome | None = None
        self.turns: dict[str, int] = {}
        self.episode_index = -1
        self.np_random, _ = gymnasium.utils.seeding.np_random(seed)
        self.shuffle = bool(shuffle)
        self._order: list[int] = []
        self._cursor = 0
        self._workdir: Path | None = None
        # One loop for the whole life of the env: the episode's loop-bound state survives
        # between reset/step calls, whether or not the caller runs a loop itself.
        self._sync = BackgroundLoop(name="mappa-env-sync")
        self._closed = False

    # ------------------------------------------------------------------ subclass hooks

    def agent_specs(self) -> tuple[AgentSpec, ...]:
        """The agents in pipeline order, with this environment's turn limits."""
        return tuple(self._specs.values())

    @property
    @abstractmethod
    def system_description(self) -> str:
        """What the whole system is, for prompts and coaches."""

    @abstractmethod
    def role_description(self, agent: str) -> str:
        """The instructions of one agent (its system prompt)."""

    @abstractmethod
    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """The chat messages ``agent`` is prompted with now."""

    @abstractmethod
    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        """Carry out ``action`` (run its code, collect files) and say what happened."""

    @abstractmethod
    async def episode_outcome(self) -> dict[str, Any]:
        """Judge the finished episode by rule.

        Returns:
            A dict with at least ``"reward"`` (float in [0, 1], the outcome reward);
            it becomes :attr:`outcome`, an :class:`~mappa_env.envs.outcome.EpisodeOutcome`,
            and its dict form is stored in ``infos[agent]["outcome"]`` for every agent.
            Reports count an episode as a success by its ``"correct"`` or ``"success"``
            key, else by a reward of 1; ``"task_type"`` groups tasks in reports and coach
            reports.
        """

    def select_task(self, options: Mapping[str, Any] | None) -> Any:
        """Pick the episode's task from ``self.tasks`` and store it in ``self.task``.

        ``options["task"]`` (a task object) or ``options["task_id"]`` choose one;
        otherwise tasks are visited in passes, each pass in a seeded random order (or in
        the given order with ``shuffle=False``).

        Raises:
            TypeError: For an ``options["task"]`` of the wrong type.
            KeyError: For an unknown ``options["task_id"]``.
        """
        options = options or {}
        tasks = self.tasks
        if "task" in options:
            task = options["task"]
            if not isinstance(task, self.task_class):
                raise TypeError(
                    f"options['task'] must be a {self.task_class.__name__}, "
                    f"got {type(task).__name__}"
                )
        elif "task_id" in options:
            wanted = str(options["task_id"])
            task = next((t for t in tasks if t.id == wanted), None)
            if task is None:
                raise KeyError(
                    f"no task with id {wanted!r}; {len(tasks)} tasks, e.g. {tasks[0].id!r}"
                )
        else:
            if self._cursor >= len(self._order):
                n = len(tasks)
                self._order = (
                    [int(i) for i in self.np_random.permutation(n)]
                    if self.shuffle
                    else list(range(n))
                )
                self._cursor = 0
            task = tasks[self._order[self._cursor]]
            self._cursor += 1
        self.task = task
        return task

    @abstractmethod
    def task_facts(self) -> tuple[str, str, str | None]:
        """``(task_id, task statement, ground truth)`` of the current episode."""

    def coach_metadata(self, record: ActionRecord) -> dict[str, Any]:
        """Extra facts for the coach about ``record`` (override to add more).

        An ``"outcome_cap"`` entry is the most the action may score (e.g. for a measured
        outcome): the coach is told, and the environment lowers any verdict above it
        (:func:`~mappa_env.coach.base.cap_verdict`).
        """
        return {}

    async def on_episode_start(self) -> None:
        """Prepare per-episode resources (called by :meth:`areset` after task selection)."""

    async def on_slot_end(self, agent: str, next_agent: str | None) -> None:
        """Called when ``agent`` has taken its last turn (``next_agent`` is None at the end)."""

    async def on_episode_end(self) -> None:
        """Release per-episode resources; called at the end, before a new episode, on close.

        Subclasses that override it must call ``await super().on_episode_end()``.
        """
        for owner in list(self._sandboxes):
            await self.release_sandbox(owner)

    def on_close(self) -> None:
        """Release what lives as long as the environment (called once by close/aclose)."""

    def audit_actions(self, agent: str) -> AuditActions | None:
        """What a coach audit scores for ``agent`` at the start of its slot, in this episode.

        The honest turns (the first one does the job correctly), a confident wrong
        action, a placeholder, several answers, and the channels where the agent's words
        reach the coach (:class:`~mappa_env.audit.battery.AuditActions`). ``None`` (the
        default): this environment cannot be audited.
        """
        return None

    @classmethod
    def audit_env_options(cls) -> dict[str, Any]:
        """Constructor options a coach audit uses unless the caller gives others.

        E.g. tasks whose honest actions the environment knows how to write.
        """
        return {}

    # ------------------------------------------------------------------ PettingZoo API

    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        """The observation space of ``agent`` (the same object on every call)."""
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        """The action space of ``agent``: any string up to ``max_action_chars``."""
        return self.action_spaces[agent]

    def observe(self, agent: str) -> dict[str, Any]:
        """The observation of ``agent``: ``{"text": str, "messages": tuple[dict, ...]}``."""
        return make_observation(self.agent_messages(agent))

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start a new episode (synchronous wrapper of :meth:`areset`).

        Args:
            seed: Reseeds task order (and anything else random) when given.
            options: Environment-specific choices, e.g. ``{"task_id": "..."}`` or
                ``{"task": <task object>}`` to pick the task.

        Raises:
            TypeError: For a seed that is not an integer.
            ValueError: For a seed below 0 or above ``2**64 - 1``.
        """
        self._sync.run(self.areset(seed=seed, options=options))

    def step(self, action: str | None) -> None:
        """Act for ``agent_selection`` (synchronous wrapper of :meth:`astep`).

        Args:
            action: The agent's output text; ``None`` only for a terminated or
                truncated agent (PettingZoo's dead step).

        Raises:
            TypeError: When ``action`` is not a string (or ``None`` for a dead agent).
            ValueError: When a dead agent is given an action other than ``None``.
            RuntimeError: When the episode is over and :meth:`reset` was not called.
        """
        self._sync.run(self.astep(action))

    async def areset(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> None:
        """Start a new episode (async core of :meth:`reset`)."""
        self._check_open()
        seed = seed_option(seed)
        if seed is not None:
            self.np_random, _ = gymnasium.utils.seeding.np_random(seed)
            self._order, self._cursor = [], 0  # a new seed restarts the task order
            for i, agent in enumerate(self.possible_agents):
                self.action_spaces[agent].seed(seed + i)
        await self.on_episode_end()
        if self._workdir is not None or self._workspace_lease is not None:
            # Removing a tree can take a while: off the loop. Most episodes of an
            # environment without code made none, and the thread hop is all they'd pay.
            await asyncio.to_thread(self._remove_workdir)
        self.select_task(options)
        self._code_ran, self._code_ran_now = self._code_ran_now or self.episode_index < 0, False
        if self.prestart_sandbox and self._code_ran:
            # The workspace and first sandbox started ahead for this episode, or (the first
            # episode) made and started now, while the agents before the code think.
            spare, self._spare = self._spare, None
            if spare is None:
                spare = await asyncio.to_thread(self._prestart)
            if spare is not None:
                self._workdir, self._workspace_lease = spare.adopt_workspace()
                self._prestarted = spare
        self.episode_index += 1
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.turns = dict.fromkeys(self.agents, 0)
        self.transcript = []
        self.outcome = None
        self.agent_selection = self.agents[0]
        await self.on_episode_start()
        if (
            self.prestart_sandbox
            and self.expect_next_episode
            and self.episode_index >= 1
            and self._code_ran
        ):
            # From the second episode on, after one that ran code: an environment reset
            # once (a script, a test), or whose agents seldom write code, would leave the
            # next episode's kernel unused.
            self._spare = await asyncio.to_thread(self._prestart)

    async def astep(self, action: str | None) -> None:
        """Act for ``agent_selection`` (async core of :meth:`step`)."""
        self._check_open()
        if not self.agents:
            raise RuntimeError("the episode is over: call reset() to start a new one")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        text, cut = self._validate_action(action)

        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        # Prompts are built from agents' earlier text: off the event loop, like every
        # reading of agent text, so no action can stall other episodes' steps.
        messages = await asyncio.to_thread(self.agent_messages, agent)
        record = ActionRecord(
            agent=agent,
            turn=self.turns[agent],
            messages=tuple(messages),
            action=text,
            action_truncated=cut,
            tool=ToolOutcome(),
        )
        try:
            record.tool = await self.run_action(agent, text)
        except Exception as exc:  # an agent's action must never crash the environment
            logger.exception("carrying out %s's action failed", agent)
            record.tool = ToolOutcome(
                output=f"[environment error] the action could not be carried out: "
                f"{type(exc).__name__}: {exc}",
                extra={"environment_error": f"{type(exc).__name__}: {exc}"},
            )
        if self.coach is not None:
            record.verdict = await self._judge(record)
        record.reward, record.reward_valid = self._provisional_reward(record.verdict)
        self.transcript.append(record)
        self.turns[agent] += 1
        self.rewards[agent] = record.reward
        self.infos[agent] = self._step_info(record)

        next_agent = self.next_agent(agent, record)
        if next_agent != agent:
            await self.on_slot_end(agent, next_agent)
        if next_agent is None:
            await self._finish(truncated=False)
        elif self.max_cycles is not None and len(self.transcript) >= self.max_cycles:
            await self._finish(truncated=True)
        else:
            self.agent_selection = next_agent
        self._accumulate_rewards()
        if self.outcome is not None:
            self._deads_step_first()

    def render(self) -> str | None:
        """Show the transcript: returned as text (``"ansi"``) or printed (``"human"``)."""
        if self.render_mode is None:
            gymnasium.logger.warn(
                "render() was called without a render_mode; pass render_mode='ansi' or 'human'"
            )
            return None
        text = self.transcript_text()
        if self.render_mode == "human":
            print(text)  # "human" rendering means printing to the terminal
            return None
        return text

    def close(self) -> None:
        """Close sandboxes, remove temporary files and stop the private event loop."""
        if self._closed:
            return
        try:
            self._sync.run(self.on_episode_end())
        finally:
            self._close_spare()
            self._remove_workdir()
            self._sync.close()
            self._closed = True
            self._release()

    async def aclose(self) -> None:
        """Async variant of :meth:`close` for callers inside an event loop."""
        if self._closed:
            return
        try:
            await self.on_episode_end()
        finally:
            await asyncio.to_thread(self._close_spare)
            self._remove_workdir()
            self._sync.close()
            self._closed = True
            self._release()

    # ------------------------------------------------------------------ helpers

    @property
    def code_timeout_s(self) -> float:
        """Wall-clock limit of one code run in this episode, in seconds.

        The ``code_timeout_s`` option when one was given; else the limit the episode's
        task carries or implies (:meth:`task_code_timeout_s`); else the class's
        :attr:`default_code_timeout_s`.
        """
        if self._code_timeout_option is not None:
            return self._code_timeout_option
        task_limit = self.task_code_timeout_s()
        return self.default_code_timeout_s if task_limit is None else task_limit

    @code_timeout_s.setter
    def code_timeout_s(self, value: float) -> None:
        self._code_timeout_option = number_option(
            "code_timeout_s",
            value,
            low=MIN_CODE_TIMEOUT_S,
            high=MAX_CODE_TIMEOUT_S,
            hint="seconds one code run may take, e.g. 30 (below 0.1 every run would time out)",
        )

    def spec_of(self, agent: str) -> AgentSpec:
        """The :class:`AgentSpec` of ``agent``."""
        return self._specs[agent]

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the environment is closed; create a new one")

    def _validate_action(self, action: object) -> tuple[str, bool]:
        if action is None:
            raise TypeError(
                f"agent {self.agent_selection!r} is active: pass its output text, "
                "not None (None is only for terminated or truncated agents)"
            )
        if isinstance(action, bytes):
            raise TypeError("actions are text: decode bytes to str before calling step()")
        if not isinstance(action, str):
            raise TypeError(
                f"actions are text: expected str, got {type(action).__name__}; "
                "pass the model's output string"
            )
        # Lone surrogates (a JSON escape cut inside an emoji) cannot be encoded as UTF-8
        # for the sandbox, the coach or a JSONL export: replace them, keep the rest.
        action = action.encode("utf-8", "replace").decode("utf-8")
        if len(action) > self.max_action_chars:
            return action[: self.max_action_chars], True
        return action, False

    def next_agent(self, agent: str, record: ActionRecord) -> str | None:
        """Who acts after ``agent``'s action ``record``; ``None`` ends the episode.

        The default is a chain: an agent keeps the turn until its slot ends (the action
        says so, or its turns are used up), then the next agent of :attr:`roles` acts.
        Override it for loops or revisits (a tester sending work back to a coder);
        :attr:`max_cycles` then bounds the episode. ``self.turns`` counts each agent's
        actions so far, this one included.
        """
        slot_over = record.tool.ends_slot or self.turns[agent] >= self._specs[agent].max_turns
        if not slot_over:
            return agent
        index = self.possible_agents.index(agent) + 1
        return self.possible_agents[index] if index < len(self.possible_agents) else None

    @classmethod
    def cli_options(cls, flags: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor options from the task flags of ``mappa eval``.

        Args:
            flags: ``tasks``, ``num_tasks``, ``task_seed``, ``task_secret``,
                ``data_dir`` and ``task_ids`` (a list), each ``None`` when not given.

        Returns:
            Options for the constructor. The default passes ``--tasks`` on as ``tasks``
            and refuses the other flags; environments whose tasks come otherwise
            override it.

        Raises:
            ValueError: For a flag this environment does not take.
        """
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("num_tasks", "task_secret", "data_dir", "task_ids")
            if flags.get(name) is not None
        ]
        if given:
            raise ValueError(
                f"{cls.env_id} does not take {', '.join(given)}: pass its task options "
                "with --tasks or --env-option KEY=VALUE"
            )
        return {} if flags.get("tasks") is None else {"tasks": flags["tasks"]}

    @classmethod
    def summarize_outcomes(cls, outcomes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Environment-specific numbers for reports, from finished episodes' outcomes.

        Args:
            outcomes: The ``outcome`` dicts of the finished (not aborted) episodes.

        Returns:
            Extra report fields (none by default).
        """
        return {}

    def _release(self) -> None:
        self.on_close()
        close_coach = getattr(self.coach, "close", None)
        if self._owns_coach and callable(close_coach):
            close_coach()

    def __del__(self) -> None:
        # Best effort: a forgotten env should not leave kernels or temp dirs behind.
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # nothing can be reported from __del__
                logger.debug("close() during garbage collection failed", exc_info=True)


#: Fewest usable CPUs for kernels to start ahead by default. A kernel started ahead for
#: an episode that runs no code is a start wasted; where cores are few, those starts slow
#: the run more than the waits they save. Measured on 2 cores (the reproduction smoke,
#: code in about half its episodes): 359 kernel starts and 120 s started ahead, 180 and
#: 85 s on demand.
PRESTART_MIN_CPUS = 4


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cold_starts(factory: SandboxFactory) -> bool:
    """Whether starting ahead pays by default.

    That is: ``factory`` starts a kernel per sandbox, and the machine has
    :data:`PRESTART_MIN_CPUS` to spare for the starts.
    """
    from mappa_env.sandbox.jupyter import JupyterSandboxFactory

    return isinstance(factory, JupyterSandboxFactory) and _usable_cpus() >= PRESTART_MIN_CPUS


def parse_turn_limits(
    defaults: Mapping[str, int], turns: Mapping[str, int] | None
) -> dict[str, int]:
    """Per-agent turn limits: ``defaults`` updated by ``turns``.

    Raises:
        ValueError: For an unknown agent or a limit below 1.
    """
    limits = dict(defaults)
    if turns is not None and not isinstance(turns, Mapping):
        raise TypeError(
            f"turns={turns!r}: turns must map agent names to turn limits, e.g. "
            f"{{{next(iter(limits), 'agent')!r}: 2}}"
        )
    for agent, limit in (turns or {}).items():
        if agent not in limits:
            raise ValueError(f"unknown agent {agent!r} in turns; agents: {list(limits)}")
        limits[agent] = integer_option(f"turns[{agent!r}]", limit, high=MAX_TURNS)
    return limits
