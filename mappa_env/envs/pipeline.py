"""A pipeline of text agents as a PettingZoo AEC environment with an async core.

Both MathChat-v0 and DSBench-v0 are pipelines: agents act in a fixed order, each for
one or more turns; every action may run code in a sandbox and is scored by a coach.
This module holds what they share: the PettingZoo bookkeeping, credit (each action's
reward, :mod:`mappa_env.credit`), coach calls, action validation, transcripts and the
sync layer over the async core.

The async core (:meth:`PipelineEnv.areset`, :meth:`PipelineEnv.astep`) lets a batched
runner drive many episodes in one event loop, so coach calls and sandbox runs of
different episodes overlap. :meth:`PipelineEnv.reset` and :meth:`PipelineEnv.step` are
thin synchronous wrappers over it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import reprlib
import shutil
import time
import warnings
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium
from pettingzoo import AECEnv

from mappa_env._async import BackgroundLoop
from mappa_env._fs import remove_tree
from mappa_env.coach.base import (
    Coach,
    CoachRequest,
    CoachStop,
    CoachVerdict,
    FileInfo,
    RevealPolicy,
    Rubric,
    cap_verdict,
)
from mappa_env.credit import (
    COACH_MODES,
    CREDIT_MODES,
    CreditMode,
    CreditSettings,
)
from mappa_env.envs._prestart import PrestartedSandbox, new_workspace
from mappa_env.options import integer_option, number_option, seed_option
from mappa_env.sandbox.base import ExecError, ExecResult, Sandbox, SandboxFactory, check_sandbox
from mappa_env.sandbox.isolation import (
    Confinement,
    IsolationMode,
    IsolationUnavailableError,
    UidLease,
    declared_confinement,
    isolation_required,
    resolve_confinement,
)
from mappa_env.sandbox.quota import QUOTA_ERROR, quota_error, trim_workspace, workspace_usage
from mappa_env.spaces import UnicodeText, make_observation, text_observation_space

if TYPE_CHECKING:
    from mappa_env.audit.battery import AuditActions

logger = logging.getLogger(__name__)

REVEAL_POLICIES: tuple[str, ...] = ("never", "last_agent", "always")

#: Largest ``max_new_tokens`` accepted (a budget stated in prompts, not a buffer size).
MAX_NEW_TOKENS = 1_048_576
#: Smallest ``code_timeout_s`` accepted. A kernel round trip alone takes milliseconds and
#: a timed-out run is interrupted (or its kernel restarted) before the next: below this
#: every code action would time out, whatever it does.
MIN_CODE_TIMEOUT_S = 0.1
#: Default ``workspace_quota_mb``: 1 GiB, room for a data set, its copies and models.
DEFAULT_WORKSPACE_QUOTA_MB = 1024
#: Largest ``code_timeout_s`` accepted: a day; an infinite wait is never meant.
MAX_CODE_TIMEOUT_S = 86_400.0
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


@dataclass
class ToolOutcome:
    """What an action did besides producing text.

    Attributes:
        code: The code that ran (all blocks joined), or ``None`` when none ran.
        result: The sandbox's result, or ``None`` when no code ran.
        output: The result as rendered for the agent and the coach.
        ends_slot: True when this action ends the agent's slot early.
        extra: Environment-specific facts for ``infos`` and the coach (e.g. files).
    """

    code: str | None = None
    result: ExecResult | None = None
    output: str | None = None
    ends_slot: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ActionRecord:
    """One action of one agent, as kept in the transcript.

    Attributes:
        agent: Agent id.
        turn: 0-based turn of this agent.
        messages: The exact chat messages the agent was prompted with.
        action: The action text as used by the environment (after cutting oversize text).
        action_truncated: True when the submitted action was longer than allowed.
        tool: What running the action did.
        verdict: The coach's verdict, or ``None`` when no coach was called.
        reward: The action's reward under the environment's credit mode: provisional
            while the episode runs, final once it has ended
            (:mod:`mappa_env.credit`); ``invalid_reward`` (NaN by default) when it
            rests on an invalid coach verdict.
        reward_valid: False when ``reward`` rests on an invalid verdict (or the episode
            could not be credited): it must not be trained on.
    """

    agent: str
    turn: int
    messages: tuple[dict[str, str], ...]
    action: str
    action_truncated: bool
    tool: ToolOutcome
    verdict: CoachVerdict | None = None
    reward: float = 0.0
    reward_valid: bool = True

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable) of the record."""
        return {
            "agent": self.agent,
            "turn": self.turn,
            "messages": [dict(m) for m in self.messages],
            "action": self.action,
            "action_truncated": self.action_truncated,
            "code": self.tool.code,
            "tool": None if self.tool.result is None else self.tool.result.to_dict(),
            "tool_output": self.tool.output,
            "coach": None if self.verdict is None else self.verdict.to_dict(),
            "reward": self.reward,
            "reward_valid": self.reward_valid,
        }


class PipelineEnv(AECEnv):
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
        self.isolation: IsolationMode = isolation
        self._confinement = resolve_confinement(isolation)
        self._sandbox_factory = resolve_sandbox_factory(
            sandbox, isolation, workspace_bytes=self.workspace_quota_bytes
        )
        self._agent_confinement = _agent_confinement(self._sandbox_factory, self._confinement)
        if (
            isolation != "none"
            and not self._agent_confinement.isolated
            # The same reason as the environment's own: resolve_confinement warned.
            and self._agent_confinement.reason != self._confinement.reason
        ):
            _warn_unconfined_agents(self._agent_confinement.reason)
        self._workspace_lease: UidLease | None = None
        self._sandboxes: dict[str, Sandbox] = {}
        if prestart_sandbox is not None and not isinstance(prestart_sandbox, bool):
            raise TypeError(
                f"prestart_sandbox must be True, False or None, got {prestart_sandbox!r}"
            )
        self.prestart_sandbox = self._sandbox_factory is not None and (
            _cold_starts(self._sandbox_factory) if prestart_sandbox is None else prestart_sandbox
        )
        # This episode's sandbox started ahead (until its first code run takes it), and the
        # next episode's, started while this one runs.
        self._prestarted: PrestartedSandbox | None = None
        self._spare: PrestartedSandbox | None = None
        # Whether the last episode ran code: kernels start ahead only after one that did
        # (a policy that seldom writes code would leave most of them unused).
        self._code_ran: bool = True
        self._code_ran_now: bool = False
        # A coach built here from a spec string belongs to this env and is closed with it;
        # a coach object passed in is shared (e.g. by every env of a runner) and is not.
        self._owns_coach = isinstance(coach, str)
        if coach is not None and not isinstance(coach, (str, Coach)):
            # Taken as is, it failed at the first reset with an AttributeError.
            raise TypeError(
                f"coach={reprlib.repr(coach)}: coach must be a Coach object (with name, "
                "score() and ascore()), a spec string ('rules' or 'llm:<model>') or None, "
                f"got {type(coach).__name__}"
            )
        if isinstance(coach, str):
            from mappa_env.coach import make_coach

            coach = make_coach(coach)
        if reward_mode is not None:
            warnings.warn(
                "reward_mode is deprecated: pass credit_mode (the same values, and more)",
                DeprecationWarning,
                stacklevel=2,
            )
            credit_mode = reward_mode  # type: ignore[assignment]
        credit = CreditSettings(credit_mode, outcome_weight, backprop_decay)
        if coach is None and credit.uses_coach:
            free = [m for m in CREDIT_MODES if m not in COACH_MODES]
            raise ValueError(
                f"credit_mode={credit_mode!r} needs a coach; pass coach=... "
                f"or use a credit mode that needs none ({', '.join(free)})"
            )
        if credit.needs_agent_correct and not self.reports_agent_correct:
            raise ValueError(
                f"{type(self).__name__} cannot pay {credit_mode} credit: its episode_outcome() "
                "does not say whether each agent's own answer was right (set the class "
                "attribute reports_agent_correct = True once it returns 'agent_correct'); "
                f"use one of {[m for m in CREDIT_MODES if m != credit_mode]}"
            )
        if reveal is None:
            reveal = getattr(coach, "default_reveal", "last_agent")
        if reveal not in REVEAL_POLICIES:
            raise ValueError(f"reveal must be one of {REVEAL_POLICIES}, got {reveal!r}")
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
        self.outcome: dict[str, Any] | None = None
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
            it is stored in ``infos[agent]["outcome"]`` for every agent. Reports count
            an episode as a success by its ``"correct"`` or ``"success"`` key, else by
            a reward of 1; ``"task_type"`` groups tasks in reports and coach reports.
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
        if self.prestart_sandbox and self.episode_index >= 1 and self._code_ran:
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

    def state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the episode: task, actions so far, outcome."""
        task_id, task_text, _ = self.task_facts()
        return {
            "env_id": self.env_id,
            "episode_index": self.episode_index,
            "task_id": task_id,
            "task": task_text,
            "agent_selection": self.agent_selection if self.agents else None,
            "actions": [r.to_dict() for r in self.transcript],
            "outcome": self.outcome,
        }

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

    def transcript_text(self) -> str:
        """The episode so far as readable text."""
        task_id, task_text, _ = self.task_facts()
        lines = [f"=== {self.env_id} | task {task_id} ===", task_text, ""]
        for r in self.transcript:
            lines.append(f"--- {r.agent} (turn {r.turn + 1}) ---")
            lines.append(r.action)
            if r.tool.output is not None:
                lines.append(f"--- tool output ---\n{r.tool.output}")
            if r.verdict is not None:
                score = "invalid" if not r.verdict.valid else f"{r.verdict.score:g}/10"
                lines.append(f"--- coach: {score} | {r.verdict.analysis}")
            lines.append("")
        if self.outcome is not None:
            lines.append(f"=== outcome: {self.outcome} ===")
        return "\n".join(lines)

    @property
    def workdir(self) -> Path:
        """This episode's workspace directory (created on first use, removed at episode end)."""
        if self._workdir is None:
            self._workdir, self._workspace_lease = new_workspace(
                self.env_id.lower(), self._confinement
            )
        return self._workdir

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

    def task_code_timeout_s(self) -> float | None:
        """The code timeout the episode's task carries or implies, or ``None``.

        By default :func:`mappa_env.tasks.task_code_timeout_s` of ``self.task``: a
        ``code_timeout_s`` in the task's metadata, else the limit of its kind (a short
        arithmetic problem needs seconds, not the class default). Override for tasks
        of another shape.

        Raises:
            ValueError: If the task's ``code_timeout_s`` is not a number above 0 and at
                most :data:`MAX_CODE_TIMEOUT_S`.
        """
        from mappa_env.tasks import task_code_timeout_s

        return task_code_timeout_s(getattr(self, "task", None), high=MAX_CODE_TIMEOUT_S)

    def copy_workspace(self, destination: Path) -> None:
        """Copy this episode's workspace to ``destination`` (links copied as links)."""
        shutil.copytree(self.workdir, destination, symlinks=True)

    def restore_workspace(self, source: Path) -> None:
        """Copy the files of ``source`` (a :meth:`copy_workspace`) into the workspace.

        They are handed over to the confined user, as files the agents' own code wrote.
        """
        shutil.copytree(source, self.workdir, symlinks=True, dirs_exist_ok=True)
        self._confinement.prepare_writable(self.workdir, contents=True)

    def coach_sees_truth(self, agent: str) -> bool:
        """Whether the coach judges ``agent``'s actions with the ground truth in view.

        As :attr:`reveal` says: every agent (``"always"``), the last one
        (``"last_agent"``) or none (``"never"``). Environments that hand the coach more
        facts (:meth:`coach_metadata`) hold back the ones that give the answer away when
        this is False.
        """
        is_last = agent == self.possible_agents[-1]
        return self.reveal == "always" or (self.reveal == "last_agent" and is_last)

    def spec_of(self, agent: str) -> AgentSpec:
        """The :class:`AgentSpec` of ``agent``."""
        return self._specs[agent]

    def last_record(self, agent: str) -> ActionRecord | None:
        """The most recent action of ``agent`` in this episode, if any."""
        for record in reversed(self.transcript):
            if record.agent == agent:
                return record
        return None

    def records_of(self, agent: str) -> list[ActionRecord]:
        """All actions of ``agent`` in this episode, in order."""
        return [r for r in self.transcript if r.agent == agent]

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

    async def _judge(self, record: ActionRecord) -> CoachVerdict:
        assert self.coach is not None
        result = record.tool.result
        if result is not None and result.error is not None and result.error.name == "SandboxError":
            # The environment failed to run the code, not the agent: no score, flagged.
            return CoachVerdict.invalid(
                f"not scored: the sandbox could not run this action's code ({result.error.value})",
                coach=self.coach.name,
            )
        failure = record.tool.extra.get("environment_error")
        if failure is not None:
            # The environment could not carry the action out: whatever a coach made of
            # it would score the environment's fault as the agent's.
            return CoachVerdict.invalid(
                f"not scored: the environment could not carry out this action ({failure})",
                coach=self.coach.name,
            )
        # The request's facts are read from agent text (answers, code): off the loop.
        request = await asyncio.to_thread(self._coach_request, record)
        try:
            verdict = await self.coach.ascore(request)
        except CoachStop:
            raise
        except Exception as exc:  # a coach bug must not lose the episode
            logger.exception("coach %s raised while scoring %s", self.coach.name, record.agent)
            return CoachVerdict.invalid(
                f"coach raised {type(exc).__name__}: {exc}", coach=self.coach.name
            )
        # A cap from a measured outcome binds the verdict, whatever the coach made of it.
        return cap_verdict(verdict, request.score_cap)

    def _coach_request(self, record: ActionRecord) -> CoachRequest:
        """What the coach is shown about ``record``."""
        task_id, task_text, truth = self.task_facts()
        is_last = record.agent == self.possible_agents[-1]
        tool = record.tool
        return CoachRequest(
            env_id=self.env_id,
            task_id=task_id,
            task=task_text,
            agent=record.agent,
            system_description=self.system_description,
            role_description=self.role_description(record.agent),
            agent_input=record.messages,
            action=record.action,
            turn=record.turn,
            is_last_agent=is_last,
            tool_result=None if tool.result is None else tool.result.to_dict(),
            tool_output=tool.output,
            files=_file_infos(tool.extra.get("files", ())),
            upstream_files=_file_infos(tool.extra.get("upstream_files", ())),
            ground_truth=truth if self.coach_sees_truth(record.agent) else None,
            metadata=self.coach_metadata(record),
            rubric=self.coach_rubrics.get(record.agent),
            shows_workspace=self.shows_workspace,
            rules_rubric=type(self).rules_rubric,
        )

    def _provisional_reward(self, verdict: CoachVerdict | None) -> tuple[float, bool]:
        """``(reward, valid)`` of an action when it is taken (see :mod:`mappa_env.credit`)."""
        score = None if verdict is None else verdict.reward
        reward = self.credit.provisional(score)
        return (self.invalid_reward, False) if reward is None else (reward, True)

    @property
    def credit_settings(self) -> dict[str, Any]:
        """The credit mode and its weights, as recorded in ``infos`` and trajectories."""
        return self.credit.to_dict()

    def _final_rewards(self, outcome: Mapping[str, Any]) -> list[float | None]:
        """Every action's final reward under the credit mode, in transcript order."""
        scores = [
            None if r.verdict is None or not r.verdict.valid else r.verdict.reward
            for r in self.transcript
        ]
        agent_correct = None
        if self.credit.needs_agent_correct:
            correct = outcome.get("agent_correct")
            if not isinstance(correct, Mapping):
                raise RuntimeError(
                    f"{type(self).__name__}.episode_outcome() returned no 'agent_correct' "
                    "mapping, which agent_oracle credit pays"
                )
            agent_correct = [
                None if correct.get(r.agent) is None else float(bool(correct[r.agent]))
                for r in self.transcript
            ]
        return self.credit.settle(scores, float(outcome.get("reward", 0.0)), agent_correct)

    def _step_info(self, record: ActionRecord) -> dict[str, Any]:
        verdict = record.verdict
        task_id, _, _ = self.task_facts()
        return {
            "env_id": self.env_id,
            "task_id": task_id,
            "episode_index": self.episode_index,
            "turn": record.turn,
            "action_truncated": record.action_truncated,
            "code": record.tool.code,
            "tool": None if record.tool.result is None else record.tool.result.to_dict(),
            "tool_output": record.tool.output,
            "coach": None if verdict is None else verdict.to_dict(),
            "credit": self.credit_settings,
            "reward_valid": record.reward_valid,
            **record.tool.extra,
        }

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

    async def _finish(self, truncated: bool) -> None:
        outcome = dict(await self.episode_outcome())
        outcome["truncated"] = truncated
        self.outcome = outcome
        # Each action's reward becomes final; every agent is paid what its actions were
        # not paid along the way, so its return is the sum of their final rewards.
        owed = dict.fromkeys(self.agents, 0.0)
        for record, final in zip(self.transcript, self._final_rewards(outcome)):
            paid = record.reward if record.reward_valid else None
            record.reward, record.reward_valid = (
                (self.invalid_reward, False) if final is None else (final, True)
            )
            if final is not None and final != paid and record.agent in owed:
                owed[record.agent] += final - (paid or 0.0)
        for agent in self.agents:
            if owed[agent]:
                self.rewards[agent] += owed[agent]
            self.infos[agent] = {
                **self.infos[agent],
                "outcome": outcome,
                "action_rewards": [
                    r.reward if r.reward_valid else None for r in self.records_of(agent)
                ],
            }
            if truncated:
                self.truncations[agent] = True
            else:
                self.terminations[agent] = True
        await self.on_episode_end()

    def _release(self) -> None:
        self.on_close()
        close_coach = getattr(self.coach, "close", None)
        if self._owns_coach and callable(close_coach):
            close_coach()

    async def run_code(
        self, code: str, owner: str, timeout: float, output_chars: int
    ) -> tuple[ExecResult | None, str]:
        """Run ``code`` in ``owner``'s sandbox in the episode's workspace.

        Each owner (an agent, or one name for a whole episode) keeps its interpreter, and
        so its variables, until :meth:`release_sandbox` or the end of the episode. The
        sandbox is made off the event loop: a kernel start or pooled hand-out blocks.

        Returns:
            ``(result, rendered output)``; ``(None, note)`` when code execution is disabled.
        """
        if self._sandbox_factory is None:
            return None, "(code execution is disabled in this environment)"
        self._code_ran_now = True
        sandbox = self._sandboxes.get(owner)
        if sandbox is None:
            self.workdir.mkdir(parents=True, exist_ok=True)  # agent code may have removed it
            sandbox = await self._take_prestarted()
            if sandbox is None:
                try:
                    sandbox = await asyncio.to_thread(self._sandbox_factory, self.workdir)
                except Exception as exc:  # e.g. a closed pool: a tool failure, not a crash
                    logger.exception("making a sandbox failed")
                    error = ExecError("SandboxError", f"no sandbox could be made: {exc}")
                    result = ExecResult(error=error)
                    return result, result.render(output_chars)
            self._sandboxes[owner] = sandbox
        started_ns = time.time_ns()
        result = await sandbox.arun(code, timeout=timeout)
        if self.workspace_quota_bytes is not None and (
            result.error is None or result.error.name != QUOTA_ERROR
        ):
            result = await asyncio.to_thread(self._hold_quota, owner, result, started_ns)
        return result, result.render(output_chars)

    def _hold_quota(self, owner: str, result: ExecResult, started_ns: int) -> ExecResult:
        """``result``, or a quota error when the run left the workspace over its quota.

        The sandbox's own watch (the Jupyter sandbox's) stops code while it writes; this
        check after the run holds for any sandbox. Closing the owner's sandbox stops what
        its code left running before the files it wrote are deleted.
        """
        quota = self.workspace_quota_bytes
        assert quota is not None
        usage = workspace_usage(self.workdir)
        if not usage.over(quota):
            return result
        sandbox = self._sandboxes.pop(owner, None)
        if sandbox is not None:
            sandbox.close()
        removed, after = trim_workspace(self.workdir, quota, started_ns)
        logger.info("%s's code took the workspace over its quota (%s)", owner, usage.describe())
        return replace(result, error=quota_error(quota, usage, removed, after), restarted=True)

    @property
    def sandbox_confinement(self) -> Confinement:
        """How agents' code is confined: what the sandbox factory declares.

        For ``sandbox="jupyter"`` the confinement ``isolation`` resolved to; for a
        callable, its ``confinement`` attribute (see
        :func:`~mappa_env.sandbox.isolation.declared_confinement`), or none when it
        declares none; without code execution, that of the helper interpreters.
        """
        return self._agent_confinement

    @property
    def helper_confinement(self) -> Confinement:
        """How the interpreters the environment itself starts on agents' files are confined.

        For example DSBench's artifact inspector, which loads pickles agent code wrote.
        """
        return self._confinement

    def isolation_report(self) -> dict[str, Any]:
        """What isolation resolved to, for ``report.json``, configs and metrics.

        Returns:
            ``isolation`` (``"namespaces"`` or ``"none"``) and what the confinement
            enforces (:meth:`Confinement.describe
            <mappa_env.sandbox.isolation.Confinement.describe>`), with ``requested``
            (the ``isolation`` option), ``required`` (whether ``MAPPA_REQUIRE_ISOLATION``
            is set) and ``code_execution`` (whether agents' code runs at all).
        """
        return {
            **self.sandbox_confinement.describe(),
            "requested": self.isolation,
            "required": isolation_required(),
            "code_execution": self._sandbox_factory is not None,
        }

    def check_sandbox(self) -> None:
        """Run one trivial cell in a sandbox made as this environment makes them.

        Trainers and evaluation scripts call it before a run, so a sandbox that cannot
        work (no kernel starts) stops the run with its cause instead of turning every
        code action into a tool error. Does nothing when code execution is disabled.

        Raises:
            SandboxUnavailableError: With the cause and what to do.
        """
        if self._sandbox_factory is not None:
            check_sandbox(self._sandbox_factory)

    def _prestart(self) -> PrestartedSandbox | None:
        """A fresh workspace with a sandbox starting in it; None (logged) when that fails."""
        if self._sandbox_factory is None or self._closed:
            return None
        try:
            return PrestartedSandbox(self.env_id.lower(), self._confinement, self._sandbox_factory)
        except Exception:  # the first code run makes its sandbox then, and reports why
            logger.warning("making a sandbox ahead failed", exc_info=True)
            return None

    async def _take_prestarted(self) -> Sandbox | None:
        """The sandbox started ahead in this episode's workspace, once; else None."""
        spare, self._prestarted = self._prestarted, None
        if spare is None or spare.workdir != self._workdir:
            if spare is not None:
                await asyncio.to_thread(spare.close)
            return None
        sandbox = await spare.take()
        confinement = getattr(sandbox, "confinement", None)
        if isinstance(confinement, Confinement):
            # Files the environment put in the workspace after the kernel started (task
            # inputs) become the agents' to change, as a start at this point would make them.
            await asyncio.to_thread(confinement.prepare_writable, self.workdir, contents=True)
        return sandbox

    def _close_spare(self) -> None:
        """Stop the next episode's sandbox and remove its workspace."""
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()

    async def release_sandbox(self, owner: str) -> None:
        """Close ``owner``'s sandbox, if it has one (off the event loop)."""
        sandbox = self._sandboxes.pop(owner, None)
        if sandbox is None:
            return
        try:
            await asyncio.to_thread(sandbox.close)
        except OSError:
            logger.warning("closing the sandbox of %s failed", owner, exc_info=True)

    def _remove_workdir(self) -> None:
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None:
            prestarted.close()  # started for this episode, and no code ran
        if self._workdir is not None:
            # Agents' code may have left a tree shutil.rmtree cannot remove (it recurses).
            left = remove_tree(self._workdir)
            if left:
                logger.warning("could not remove %d entries of %s", len(left), self._workdir)
            self._workdir = None
        if self._workspace_lease is not None:
            # The episode's sandboxes are closed (on_episode_end runs first): its uid is free.
            self._workspace_lease.release()
            self._workspace_lease = None

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


@functools.cache
def _warn_unconfined_agents(reason: str) -> None:
    """Warn once per process and reason that agents' code runs unconfined."""
    logger.warning(
        "agents' code runs without namespace isolation: %s; reports say so (isolation: "
        "none). Pass isolation='none' to accept it.",
        reason,
    )


def _agent_confinement(factory: SandboxFactory | None, helpers: Confinement) -> Confinement:
    """What a sandbox factory's code runs under (see ``PipelineEnv.sandbox_confinement``)."""
    if factory is None:
        return helpers
    declared = declared_confinement(factory)
    if declared is not None:
        return declared
    return Confinement(
        mode="none",
        reason=f"the sandbox factory {factory!r} declares no confinement, so its code is "
        "taken to run unconfined",
    )


def _file_infos(files: Sequence[Mapping[str, Any] | FileInfo]) -> tuple[FileInfo, ...]:
    """File listings travel as plain dicts in ``infos``; coaches get :class:`FileInfo`."""
    return tuple(f if isinstance(f, FileInfo) else FileInfo(f["name"], f["size"]) for f in files)


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


def check_invalid_reward(value: Any) -> float:
    """``invalid_reward`` checked: NaN, or a number in ``[-1, 0]``.

    The reward recorded for an action whose verdict is invalid must never pay more
    than the worst real score (0): NaN (the default) marks it unmistakably; a number
    in ``[-1, 0]`` is accepted for code that cannot hold NaN.

    Raises:
        TypeError: For a value that is not a number.
        ValueError: For a number outside ``[-1, 0]`` other than NaN.
    """
    if isinstance(value, float) and math.isnan(value):
        return value
    return number_option(
        "invalid_reward",
        value,
        low=-1.0,
        high=0.0,
        hint="an invalid verdict must never pay more than the worst real score; "
        "NaN (the default) marks such rewards unmistakably",
    )


def resolve_sandbox_factory(
    sandbox: str | SandboxFactory | None,
    isolation: IsolationMode = "auto",
    *,
    workspace_bytes: int | None = DEFAULT_WORKSPACE_QUOTA_MB * 1024**2,
) -> SandboxFactory | None:
    """The sandbox factory named by ``sandbox``.

    ``"jupyter"`` gives a Jupyter kernel per sandbox, confined as ``isolation`` says, with
    ``workspace_bytes`` as its workspace quota (``SandboxLimits.workspace_bytes``);
    ``None`` disables code execution. A callable must declare its confinement (a
    :class:`~mappa_env.sandbox.isolation.Confinement` as its ``confinement``
    attribute, as :meth:`JupyterSandbox.factory
    <mappa_env.sandbox.JupyterSandbox.factory>` and
    :class:`~mappa_env.sandbox.KernelPool` do) for ``isolation="namespaces"`` (or
    ``MAPPA_REQUIRE_ISOLATION``) to accept it; one that declares none is taken to run
    code unconfined, and is reported so.

    Raises:
        ValueError: For an unknown name.
        IsolationUnavailableError: For a callable whose declared confinement is not
            namespaces, when ``isolation="namespaces"`` or isolation is required.
    """
    if sandbox is None:
        return None
    if callable(sandbox):
        declared = declared_confinement(sandbox)
        if (isolation == "namespaces" or isolation_required()) and not (
            declared is not None and declared.isolated
        ):
            said = "declares no confinement" if declared is None else "declares no namespaces"
            raise IsolationUnavailableError(
                f"isolation={isolation!r} needs agents' code confined, but the sandbox "
                f"factory {sandbox!r} {said} (a Confinement with isolated=True as its "
                "`confinement` attribute): pass sandbox='jupyter', a factory made by "
                "JupyterSandbox.factory(isolation='namespaces'), or declare the "
                "confinement your factory enforces"
                + ("" if isolation == "namespaces" else "; MAPPA_REQUIRE_ISOLATION is set")
            )
        return sandbox
    if sandbox == "jupyter":
        from mappa_env.sandbox import JupyterSandbox, SandboxLimits

        limits = SandboxLimits(workspace_bytes=workspace_bytes)
        return JupyterSandbox.factory(limits=limits, isolation=isolation)
    raise ValueError(
        f"unknown sandbox {sandbox!r}: pass 'jupyter', None (no code execution) "
        "or a callable workdir -> Sandbox"
    )
