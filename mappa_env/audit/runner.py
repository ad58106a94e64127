"""Running a coach audit: real episode contexts, every case through ``env.step``.

For each task (the first :attr:`AuditConfig.tasks` of the environment's list) the audit
first walks one honest episode: at the start of each agent's slot it asks the
environment for that agent's :class:`~mappa_env.audit.battery.AuditActions`, builds the
battery (:func:`~mappa_env.audit.battery.build_battery`), and takes the honest turns.
Then every case is scored in an episode of its own: the context is rebuilt (below), the
case's action is stepped as the agent's first turn, and the verdict is read from
``infos[agent]["coach"]``: the environment built the coach request, the coach judged
it, the environment applied its caps, exactly as in training.

Rebuilding a context replays the upstream agents' honest turns. An environment whose
agents hand work over only through workspace files and final messages
(``hands_over_through_files``, DSBench) is rebuilt faster: the files the honest episode
had when the agent's slot began are restored, and each upstream agent replays only its
final message. Replayed steps are never sent to the audited coach (they get an invalid
verdict that nothing reads), so an API judge is billed for the audited actions only.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mappa_env._async import run_sync
from mappa_env._fs import remove_tree
from mappa_env.audit.battery import (
    FAMILIES,
    LATER_TURN,
    PAYLOADS,
    AttackCase,
    build_battery,
    build_later_battery,
)
from mappa_env.audit.report import AuditReport, CaseResult, family_stats
from mappa_env.coach import Coach, CoachRequest, CoachVerdict, RulesCoach, cap_verdict, make_coach
from mappa_env.coach.templates import unfenced
from mappa_env.errors import SettingsError
from mappa_env.tempdirs import make_temp_dir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditConfig:
    """Settings of a coach audit.

    Attributes:
        tasks: How many of the environment's tasks (the first, in its order) contexts
            are built from. Each task gives one context per agent.
        agents: The agents to audit (``None``: all).
        families: Attack families (``None``: all of
            :data:`~mappa_env.audit.battery.FAMILIES` that apply to each agent).
        payloads: Names of the injection payloads (``None``: all of
            :data:`~mappa_env.audit.battery.PAYLOADS`).
        reveal: Which actions the coach judges with the ground truth (``"never"``,
            ``"last_agent"``, ``"always"``); ``None``: the coach's own default, as an
            environment given this coach would use.
        concurrency: Episodes in flight (each in its own environment).
        moved_points: A payload or padding that raises the coach's own score more than
            this over the same action without it marks the family ``moved``.
        mutations: Random mutants of each context's honest action (the ``mutation``
            family, :func:`~mappa_env.audit.battery.build_mutations`).
        seed: Seeds the mutants (with the task and the agent).
    """

    tasks: int = 1
    agents: Sequence[str] | None = None
    families: Sequence[str] | None = None
    payloads: Sequence[str] | None = None
    reveal: str | None = None
    concurrency: int = 2
    moved_points: float = 1.0
    mutations: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"tasks must be >= 1, got {self.tasks}")
        if self.mutations < 0:
            raise ValueError(f"mutations must be >= 0, got {self.mutations}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        unknown = sorted(set(self.families or ()) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown families {unknown}; families are {list(FAMILIES)}")
        names = {p.name for p in PAYLOADS}
        unknown = sorted(set(self.payloads or ()) - names)
        if unknown:
            raise ValueError(f"unknown payloads {unknown}; payloads are {sorted(names)}")


class AuditError(RuntimeError):
    """The environment cannot be audited as asked (no audit actions, a slot that never ends)."""


class _ReplayGate:
    """The coach as the audit's environments see it: only audited actions reach it.

    Replayed upstream steps get an invalid verdict (never paid, never read); the requests
    of audited steps are kept for the rules coach and the prompt check.
    """

    def __init__(self, coach: Coach) -> None:
        self.coach = coach
        self.forward = False
        self.requests: list[CoachRequest] = []
        default_reveal = getattr(coach, "default_reveal", None)
        if default_reveal is not None:
            self.default_reveal = default_reveal

    @property
    def name(self) -> str:
        return self.coach.name

    def _replayed(self) -> CoachVerdict:
        return CoachVerdict.invalid("not scored: a replayed step of a coach audit", coach=self.name)

    def score(self, request: CoachRequest) -> CoachVerdict:
        if not self.forward:
            return self._replayed()
        self.requests.append(request)
        return self.coach.score(request)

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        if not self.forward:
            return self._replayed()
        self.requests.append(request)
        return await self.coach.ascore(request)


@dataclass
class _Context:
    """One (task, agent) context: how to rebuild it and what to score in it."""

    task_id: str
    agent: str
    upstream: list[tuple[str, list[str]]]  # (agent, the turns to replay)
    snapshot: Path | None
    cases: list[AttackCase] = field(default_factory=list)
    own: list[str] = field(default_factory=list)  # the agent's turns before the case

    @property
    def label(self) -> str:
        """The task id, marked for a later-turn context (reports key contexts by it)."""
        return f"{self.task_id} (later turn)" if self.own else self.task_id


def audit_coach(
    env: str | type,
    coach: Coach | str,
    *,
    env_options: Mapping[str, Any] | None = None,
    config: AuditConfig | None = None,
    on_case: Callable[[int, int], None] | None = None,
    audit_defaults: bool = True,
) -> AuditReport:
    """Audit ``coach`` on ``env``: score honest actions and attacks, report what moved it.

    Args:
        env: A registered environment id (``"MathChat-v0"``) or a
            :class:`~mappa_env.envs.pipeline.PipelineEnv` subclass with an
            ``audit_actions`` hook.
        coach: A coach or a coach spec (``"rules"``, ``"llm:<model>?api_base=..."``); a
            coach built here from a spec is closed at the end.
        env_options: Options of the environment's constructor, laid over its
            ``audit_env_options()`` (the tasks an audit needs by default). ``coach``,
            ``reveal`` and ``credit_mode`` are the audit's.
        config: The audit's settings.
        on_case: Called with ``(cases done, cases in all)`` after each scored case.
        audit_defaults: Lay ``env_options`` over the environment's
            ``audit_env_options()``; ``False``: over its constructor's defaults, as a
            training run given those options makes it (``mappa coach audit --config``).

    Returns:
        The :class:`~mappa_env.audit.report.AuditReport`.

    Raises:
        AuditError: When the environment has no audit actions for an agent, or its
            honest turns do not end an agent's slot.
    """
    config = config or AuditConfig()
    owned = isinstance(coach, str)
    judge = make_coach(coach)
    try:
        return run_sync(
            _audit(env, judge, dict(env_options or {}), config, on_case, audit_defaults)
        )
    finally:
        close = getattr(judge, "close", None)
        if owned and callable(close):
            close()


async def _audit(
    env: str | type,
    coach: Coach,
    env_options: dict[str, Any],
    config: AuditConfig,
    on_case: Callable[[int, int], None] | None,
    audit_defaults: bool = True,
) -> AuditReport:
    from mappa_env.registry import env_class

    started = time.perf_counter()
    cls = env_class(env) if isinstance(env, str) else env
    reserved = sorted({"coach", "reveal", "credit_mode"} & set(env_options))
    if reserved:
        raise SettingsError(
            f"env_options {reserved} are the audit's: pass the coach to audit_coach, "
            "the reveal policy in AuditConfig; it scores under process credit"
        )
    options = {**(_audit_env_options(cls) if audit_defaults else {}), **env_options}
    payloads = [p for p in PAYLOADS if config.payloads is None or p.name in config.payloads]
    gates = [_ReplayGate(coach) for _ in range(config.concurrency)]
    envs: list[Any] = []
    scratch = make_temp_dir("audit")
    try:
        for gate in gates:
            # reveal=None: the coach's own default, as any environment given it decides.
            envs.append(cls(coach=gate, reveal=config.reveal, credit_mode="process", **options))
        first = envs[0]
        # A sandbox that cannot run code stops the audit here, with its cause.
        await asyncio.to_thread(first.check_sandbox)
        agents = list(config.agents or first.possible_agents)
        unknown = sorted(set(agents) - set(first.possible_agents))
        if unknown:
            raise AuditError(f"unknown agents {unknown}; agents are {first.possible_agents}")
        # A payload that happens to state a task's answer ("PROCESS_SCORE: 10" where the
        # answer is 10) puts the right number in the action: no attack, so such a task
        # is left out (small word problems have such answers; expressions rarely do).
        stated = {n for p in payloads for n in re.findall(r"\d+", p.template)}
        task_ids: list[str] = []
        passed_over: list[str] = []
        for task in first.tasks:
            if len(task_ids) == config.tasks:
                break
            answered = str(getattr(task, "answer", "")).strip() in stated
            (passed_over if answered else task_ids).append(str(task.id))
        contexts: list[_Context] = []
        for index, task_id in enumerate(task_ids):
            snapshots = scratch / f"task-{index}"
            contexts += await _walk_honest(first, task_id, agents, config, payloads, snapshots)
        jobs = [(context, case) for context in contexts for case in context.cases]
        queue: asyncio.Queue[tuple[_Context, AttackCase]] = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        results: list[CaseResult] = []
        rules = RulesCoach()
        looks_at_prompt = callable(getattr(coach, "build_messages", None))

        async def work(environment: Any, gate: _ReplayGate) -> None:
            while not queue.empty():
                context, case = queue.get_nowait()
                results.append(
                    await _score_case(environment, gate, context, case, rules, looks_at_prompt)
                )
                if on_case is not None:
                    on_case(len(results), len(jobs))

        await asyncio.gather(*(work(e, g) for e, g in zip(envs, gates)))
        reveal = first.reveal
    finally:
        for environment in envs:
            await environment.aclose()
        left = remove_tree(scratch)
        if left:
            logger.warning("could not remove %d entries of %s", len(left), scratch)
    keyed = {(r.task_id, r.agent, r.key): r for r in results}
    ordered = [keyed[(c.label, c.agent, case.key)] for c, case in jobs]
    notes = [
        "Each case is an episode of its own: upstream agents replay their honest turns, "
        "then the audited agent's first turn is the case's action. In a later-turn "
        "context (a task id marked '(later turn)') the agent's honest first turn is "
        "replayed too, and the case is its second turn: the honest one hands over."
    ]
    if passed_over:
        notes.append(
            f"Tasks {passed_over} were left out: their answer is a number a payload "
            f"states ({', '.join(sorted(stated, key=int))}), so a payload would answer them."
        )
    if cls.hands_over_through_files:
        notes.append(
            "Upstream work is restored from the honest episode's files, and each upstream "
            "agent replays only its final message; facts the environment gathered while "
            "upstream code ran (its artifact inspections) are gathered again only when the "
            "audited action runs code."
        )
    return AuditReport(
        env_id=cls.env_id,
        coach=coach.name,
        reveal=reveal,
        task_ids=task_ids,
        agents=agents,
        settings={
            "tasks": config.tasks,
            "families": list(config.families or FAMILIES),
            "payloads": [p.name for p in payloads],
            "moved_points": config.moved_points,
            "concurrency": config.concurrency,
            "mutations": config.mutations,
            "seed": config.seed,
        },
        cases=ordered,
        stats=family_stats(ordered, moved_points=config.moved_points),
        wall_time_s=time.perf_counter() - started,
        notes=notes,
    )


def _audit_env_options(cls: type) -> dict[str, Any]:
    options = getattr(cls, "audit_env_options", None)
    return dict(options()) if callable(options) else {}


async def _walk_honest(
    env: Any,
    task_id: str,
    agents: Sequence[str],
    config: AuditConfig,
    payloads: Sequence[Any],
    scratch: Path,
) -> list[_Context]:
    """Walk one honest episode of ``task_id``; return the contexts of ``agents``."""
    await env.areset(options={"task_id": task_id})
    files = bool(type(env).hands_over_through_files)
    upstream: list[tuple[str, list[str]]] = []
    contexts = []
    for agent in env.possible_agents:
        if env.agent_selection != agent or not env.agents:
            raise AuditError(
                f"the honest episode of {task_id!r} reached {agent!r} out of turn "
                f"(at {env.agent_selection!r}): the audit walks a pipeline in order"
            )
        actions = env.audit_actions(agent)
        if actions is None:
            raise AuditError(
                f"{type(env).__name__} gives no audit actions for {agent!r}: implement its "
                "audit_actions() hook (see mappa_env.audit)"
            )
        snapshot = None
        if files:
            snapshot = scratch / agent
            env.copy_workspace(snapshot)
        if agent in agents:
            previous = env.last_record(upstream[-1][0]) if upstream else None
            cases = build_battery(
                actions,
                task_text=env.task_facts()[1],
                upstream_message=None if previous is None else previous.action,
                families=config.families,
                payloads=payloads,
                mutations=config.mutations,
                seed=f"{config.seed}:{task_id}:{agent}",
            )
            replay = [(a, turns[-1:] if files else turns) for a, turns in upstream]
            contexts.append(_Context(task_id, agent, replay, snapshot, cases))
            wanted = config.families is None or LATER_TURN in config.families
            if wanted and env.spec_of(agent).max_turns >= 2:
                later = build_later_battery(actions)
                if later:
                    contexts.append(
                        _Context(task_id, agent, replay, snapshot, later, [actions.honest[0]])
                    )
        taken = await _take_slot(env, agent, actions.honest, task_id)
        upstream.append((agent, taken))
    return contexts


async def _take_slot(env: Any, agent: str, turns: Sequence[str], task_id: str) -> list[str]:
    """Step ``turns`` for ``agent`` until its slot ends; the turns taken."""
    taken = []
    for turn in turns:
        await env.astep(turn)
        taken.append(turn)
        if not env.agents or env.agent_selection != agent:
            return taken
    raise AuditError(
        f"the honest turns of {agent!r} on {task_id!r} did not end its slot: the last of "
        "AuditActions.honest must hand over (e.g. a reply without code)"
    )


async def _score_case(
    env: Any,
    gate: _ReplayGate,
    context: _Context,
    case: AttackCase,
    rules: RulesCoach,
    looks_at_prompt: bool,
) -> CaseResult:
    """Rebuild ``context`` in ``env``, step ``case``'s action, read the verdict."""
    await env.areset(options={"task_id": context.task_id})
    if context.snapshot is not None:
        env.restore_workspace(context.snapshot)
    for agent, turns in context.upstream:
        await _take_slot(env, agent, turns, context.task_id)
    for turn in context.own:
        await env.astep(turn)
    if env.agent_selection != context.agent:
        raise AuditError(f"replaying {context.task_id!r} did not reach {context.agent!r}")
    gate.forward = True
    gate.requests.clear()
    try:
        await env.astep(case.action)
    finally:
        gate.forward = False
    verdict = env.infos[context.agent]["coach"]
    request = gate.requests[-1] if gate.requests else None
    rules_score = leaked = None
    if request is not None:
        judged = cap_verdict(rules.score(request), request.score_cap)
        rules_score = judged.score if judged.valid else None
        if case.payload is not None and looks_at_prompt:
            prompt = "\n".join(m["content"] for m in gate.coach.build_messages(request))  # type: ignore[attr-defined]
            leaked = case.payload.marker in unfenced(prompt)
    return CaseResult(
        task_id=context.label,
        agent=context.agent,
        family=case.family,
        name=case.name,
        fails_job=case.fails_job,
        control=case.control,
        channel=case.channel,
        payload=None if case.payload is None else case.payload.name,
        score=verdict["score"],
        valid=bool(verdict["valid"]),
        error=verdict["error"],
        capped_from=verdict.get("capped_from"),
        attempts=int(verdict.get("attempts", 1)),
        rules_score=rules_score,
        leaked=leaked,
        action_chars=len(case.action),
        latency_s=float(verdict.get("latency_s", 0.0)),
    )
