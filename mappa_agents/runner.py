"""The batched rollout runner: many episodes at once, batched generation per policy.

Three schedules (``schedule=``):

- ``"ticks"`` (default): the runner advances episodes in ticks. At each tick it collects
  the pending generation request of every live episode, sends one batch per policy
  (policies run concurrently), then steps every episode at once, so the coach calls and
  sandbox runs of all episodes overlap. Ticks make batching deterministic: a batch holds
  exactly the episodes waiting at that tick, in episode order, and each batch gets a
  seed derived from the run seed, the tick and the policy. With a deterministic backend
  (greedy decoding, or seeded sampling on the same hardware), the same run seed gives
  the same trajectories, which is what a resumed training run needs.
- ``"continuous"``: every episode runs on its own, and each policy serves requests as
  they arrive: whatever is pending when the policy is free goes out as the next batch,
  and the rest wait for the one after. One agent's generation overlaps the sandbox and
  coach work of other episodes, and a slow step holds up only its own episode. Which
  requests share a batch depends on timing, so seeded runs are not reproducible in this
  mode (batch seeds derive from the run seed, the policy and the batch number).
- ``"episodes"``: every episode is a coroutine of its own, and each of its turns sends
  one request to its agent's policy and awaits it. A policy whose engine batches
  continuously (a :class:`~mappa_agents.policy.RequestPolicy`: vLLM's async engine, the
  stand-in :class:`~mappa_agents.standin.StandInEngine`) adds the request to its running
  batch and answers it when its own reply ends, so an episode never waits for another
  episode's longer reply, the agents' policies decode at the same time, and one episode's
  sandbox and coach work overlaps the others' decoding. Other policies get the
  ``continuous`` schedule's coalesced batches. No seed goes with any request (a seeded
  request takes a slower sampling path in vLLM, and which requests share a decode step
  depends on timing anyway): such a run is reproduced from its saved token ids and
  log-probs, not by running it again.

Finished episodes free their slot for the next one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mappa_agents.policy import (
    Generation,
    GenerationError,
    Policy,
    SamplingParams,
    batches_requests,
)
from mappa_agents.seeds import derive_seed
from mappa_agents.system import AgentSystem
from mappa_agents.trajectory import ActionSample, EpisodeResult
from mappa_env._async import run_sync
from mappa_env.coach.base import CoachStop
from mappa_env.envs.outcome import EpisodeOutcome
from mappa_env.envs.pipeline import PipelineEnv
from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

# Failures every episode would meet (a coach or a policy whose API refuses every call,
# a replaying coach's cache miss): they stop the run instead of ending one episode.
_RUN_STOPPERS = (CoachStop, SettingsError)

EnvFactory = Callable[[], PipelineEnv]
SCHEDULES: tuple[str, ...] = ("ticks", "continuous", "episodes")
Schedule = Literal["ticks", "continuous", "episodes"]


@dataclass
class _Live:
    """An episode in flight."""

    index: int
    env: PipelineEnv
    samples: list[ActionSample]
    started: float
    task_id: str = ""


@dataclass
class _Request:
    live: _Live
    agent: str
    messages: list[dict[str, str]]


_TIMEOUT_MARKERS = ("timeout", "timed out", "deadline_s")


def classify_verdict(coach: Mapping[str, Any] | None) -> str | None:
    """What a recorded coach verdict (``ActionSample.coach``) was, for counting.

    Returns:
        ``None`` without a verdict, ``"valid"``, ``"timeout"`` for an invalid verdict
        whose error names a timeout or the coach's ``deadline_s``, else ``"invalid"``.
    """
    if coach is None:
        return None
    if coach.get("valid", False):
        return "valid"
    if coach.get("failure") == "timeout":
        return "timeout"
    error = str(coach.get("error") or coach.get("analysis") or "").lower()
    return "timeout" if any(marker in error for marker in _TIMEOUT_MARKERS) else "invalid"


def verdict_failure(coach: Mapping[str, Any] | None) -> str | None:
    """Why a recorded coach verdict has no score, by cause, for ``mappa eval``'s report.

    Returns:
        ``None`` for a valid verdict or none; else the verdict's ``failure``
        (``timeout``, ``connection``, ``http_<status>``, ``format``, ``api_error``; see
        :class:`~mappa_env.coach.CoachVerdict`), or for a coach that records none,
        ``timeout`` or ``invalid`` as :func:`classify_verdict` tells them apart.
    """
    kind = classify_verdict(coach)
    if kind in (None, "valid"):
        return None
    return str((coach or {}).get("failure") or kind)


def progress_postfix(
    results: Mapping[int, EpisodeResult],
    verdicts: Mapping[str, int],
    episodes: int | None = None,
) -> dict[str, str]:
    """The progress line's fields: episodes done, successes, the coach's failures.

    Args:
        results: Finished episodes so far.
        verdicts: Counts by :func:`classify_verdict` of every action's verdict so far.
        episodes: The run's episodes; given, the line starts with ``episodes: done/all``.

    Returns:
        ``{"episodes": "5/8", "success": "3/5", "coach_timeouts": "1",
        "coach_invalid": "2/40"}``; the coach fields only once the coach has judged an
        action. ``coach_invalid`` counts every invalid verdict (timeouts included) over
        all verdicts.
    """
    wins = sum(r.succeeded for r in results.values())
    postfix = {} if episodes is None else {"episodes": f"{len(results)}/{episodes}"}
    postfix["success"] = f"{wins}/{len(results)}"
    judged = sum(verdicts.values())
    if judged:
        invalid = verdicts.get("invalid", 0) + verdicts.get("timeout", 0)
        postfix["coach_timeouts"] = str(verdicts.get("timeout", 0))
        postfix["coach_invalid"] = f"{invalid}/{judged}"
    return postfix


def _current_task_id(env: PipelineEnv) -> str:
    """The id of the task ``env`` is on, or "" when it cannot say."""
    try:
        return str(env.task_facts()[0])
    except Exception:  # noqa: BLE001 - a report label only; the episode carries on
        return ""


def most_actions(env: PipelineEnv) -> int:
    """The most actions an episode of ``env`` takes: its ``max_cycles``, else the turn limits.

    The sum of the agents' turn limits bounds a chain (the default
    :meth:`~mappa_env.envs.pipeline.PipelineEnv.next_agent`); an environment that loops
    back bounds its episodes with ``max_cycles``, or runs past this estimate.
    """
    if env.max_cycles is not None:
        return int(env.max_cycles)
    return sum(spec.max_turns for spec in env.agent_specs())


class _ActionProgress:
    """The progress line: a bar over actions, with the episodes done in its fields.

    A bar over episodes stands still while every episode is in flight (eight episodes
    eight at a time showed 0/8 for as long as the slowest took); one over actions moves
    with every action. Its total starts at each episode's most actions
    (:func:`most_actions`) times the episodes and drops by what each episode leaves
    unused when it ends, so it is the true count once the last one has ended.
    """

    def __init__(self, bar: Any, episodes: int, per_episode: int) -> None:
        self.bar = bar
        self.episodes = episodes
        self.per_episode = max(1, per_episode)
        bar.total = episodes * self.per_episode
        bar.refresh()

    def action(self) -> None:
        """One action taken."""
        if self.bar.n + 1 > self.bar.total:  # an episode past the estimate
            self.bar.total = self.bar.n + 1
        self.bar.update(1)

    def episode(
        self, actions: int, results: Mapping[int, EpisodeResult], verdicts: Mapping[str, int]
    ) -> None:
        """An episode that took ``actions`` actions ended (or could not start)."""
        self.bar.total = max(self.bar.n, self.bar.total - max(0, self.per_episode - actions))
        self.refresh(results, verdicts)

    def refresh(self, results: Mapping[int, EpisodeResult], verdicts: Mapping[str, int]) -> None:
        """Redraw the fields: episodes done, successes, the coach's counts."""
        self.bar.set_postfix(progress_postfix(results, verdicts, self.episodes))

    def close(self) -> None:
        """End the line."""
        self.bar.close()


@functools.lru_cache(maxsize=64)
def _sampling_record(params: SamplingParams) -> dict[str, Any]:
    """``params`` as the dict each action records (made once per settings, then copied)."""
    return dataclasses.asdict(params)


class RolloutRunner:
    """Runs episodes of a pipeline environment with a multiagent system, batched.

    Args:
        env_factory: Makes one environment; the runner makes ``concurrency`` of them
            and reuses each for successive episodes.
        system: Which policy acts for which agent.
        sampling: Sampling settings for every agent, or a mapping agent -> settings.
        concurrency: Most episodes in flight at once.
        seed: Run seed: episode ``i`` resets its environment with ``seed + i`` and
            generation seeds derive from it. ``None`` leaves sampling unseeded.
        progress: Show a progress bar (tqdm) over the run's actions, which moves with
            every action; its fields count the episodes done.
        keep_envs: Keep the environments between :meth:`run` calls (a trainer running
            many steps); then call :meth:`close` when done. Kept environments let go of
            their sandboxes and workspaces when a run ends
            (:meth:`~mappa_env.envs.pipeline.PipelineEnv.arelease_idle_resources`). By
            default each run closes the environments it made.
        schedule: ``"ticks"`` (deterministic batches: reproducible seeded runs),
            ``"continuous"`` (requests served as they arrive: more of the engine busy,
            not reproducible) or ``"episodes"`` (one request per turn into engines
            that batch continuously, unseeded); see the module docstring.
        on_episode: Called with each episode as soon as it finishes (in finishing
            order), e.g. to write it out at once.

    A generation that fails (an API error after its retries, for example) or an
    environment step that raises ends only the episodes concerned: they are returned with
    ``outcome.error`` and ``outcome.aborted`` set and no outcome reward, and the
    other episodes carry on.
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        system: AgentSystem,
        sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
        *,
        concurrency: int = 8,
        seed: int | None = 0,
        progress: bool = True,
        keep_envs: bool = False,
        schedule: Schedule = "ticks",
        on_episode: Callable[[EpisodeResult], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.schedule = schedule
        self.env_factory = env_factory
        self.system = system
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.concurrency = int(concurrency)
        self.seed = seed
        self.progress = progress
        self.keep_envs = keep_envs
        self.on_episode = on_episode
        # A policy's place in the system (agent order) salts its generation seeds; it does
        # not depend on which policy happened to generate first in a run.
        self._policy_index = {id(p): i for i, p in enumerate(system.unique_policies())}
        self._envs: list[PipelineEnv] = []
        self._verdicts: Counter[str] = Counter()
        self._bar: _ActionProgress | None = None

    def _finish(
        self, results: dict[int, EpisodeResult], index: int, episode: EpisodeResult
    ) -> None:
        """Record a finished episode and hand it to :attr:`on_episode`."""
        results[index] = episode
        if self._bar is not None:
            self._bar.episode(len(episode.actions), results, self._verdicts)
        if self.on_episode is not None:
            self.on_episode(episode)

    @property
    def coach_verdict_counts(self) -> dict[str, int]:
        """Coach verdicts of the last run by kind: ``valid``, ``timeout``, ``invalid``.

        Counted as the actions happen (see :func:`classify_verdict`); the progress line
        shows the timeouts and invalid verdicts live.
        """
        return dict(self._verdicts)

    def sampling_for(self, agent: str) -> SamplingParams:
        """The sampling settings of ``agent``."""
        if isinstance(self.sampling, SamplingParams):
            return self.sampling
        try:
            return self.sampling[agent]
        except KeyError:
            raise KeyError(f"no sampling settings for agent {agent!r}") from None

    def run(
        self,
        num_episodes: int,
        episode_options: Sequence[Mapping[str, Any]] | None = None,
        *,
        seed: int | None = None,
    ) -> list[EpisodeResult]:
        """Synchronous :meth:`arun` (also from inside a running loop, e.g. a notebook)."""
        return run_sync(self.arun(num_episodes, episode_options, seed=seed))

    def close(self) -> None:
        """Close the environments kept between runs (``keep_envs=True``)."""
        envs, self._envs = self._envs, []
        for env in envs:
            env.close()

    def __enter__(self) -> RolloutRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _release_idle_envs(self) -> None:
        released = await asyncio.gather(
            # No episode is driven once a run ends: one left unfinished (a failed
            # generation or step) is ended too, or it would keep its kernel and uid.
            *(env.arelease_idle_resources(end_episode=True) for env in self._envs),
            return_exceptions=True,
        )
        for env, outcome in zip(self._envs, released):
            if isinstance(outcome, BaseException):
                logger.warning(
                    "releasing an idle %s environment's sandboxes failed",
                    type(env).__name__,
                    exc_info=outcome,
                )

    async def _ensure_envs(self, count: int) -> list[PipelineEnv]:
        while len(self._envs) < count:
            # Building an environment can take a moment (DSBench writes its tasks).
            env = await asyncio.to_thread(self.env_factory)
            if not isinstance(env, PipelineEnv):
                close = getattr(env, "close", None)
                if callable(close):
                    close()
                raise TypeError(
                    f"env_factory must make mappa pipeline environments (with an async "
                    f"core), got {type(env).__name__}"
                )
            self._envs.append(env)
        return self._envs[:count]

    async def arun(
        self,
        num_episodes: int,
        episode_options: Sequence[Mapping[str, Any]] | None = None,
        *,
        seed: int | None = None,
    ) -> list[EpisodeResult]:
        """Run ``num_episodes`` episodes and return them in episode order.

        Args:
            num_episodes: How many episodes to run.
            episode_options: Reset options per episode (e.g. ``{"task_id": ...}``);
                by default episode ``i`` takes the environment's task ``i`` (cycling), so
                a run covers the task list in order.
            seed: Overrides the runner's seed for this run.

        Returns:
            One :class:`EpisodeResult` per episode.
        """
        if num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
        if episode_options is not None and len(episode_options) < num_episodes:
            raise ValueError(
                f"episode_options has {len(episode_options)} entries for {num_episodes} episodes"
            )
        n_slots = min(self.concurrency, num_episodes)
        run_seed = self.seed if seed is None else seed
        options = list(episode_options) if episode_options is not None else None
        results: dict[int, EpisodeResult] = {}
        # The task each episode was given: kept for episodes that abort before acting, so
        # reports still count them against their task.
        planned: dict[int, str] = {}
        next_index = 0
        self._verdicts = Counter()
        try:
            envs = await self._ensure_envs(n_slots)
            self._bar = self._progress_bar(num_episodes, envs[0])
            default_tasks = [t.id for t in getattr(envs[0], "tasks", [])]
            live: list[_Live] = []

            async def start(env: PipelineEnv) -> _Live | None:
                nonlocal next_index
                if next_index >= num_episodes:
                    return None
                index = next_index
                next_index += 1
                # A kernel started ahead for a next episode is wasted where this
                # environment gets none in this run: fewer episodes are left to start
                # than environments to take them (one episode each per step in a
                # trainer's usual step).
                env.expect_next_episode = num_episodes - next_index >= n_slots
                if options is not None:
                    reset_options: Mapping[str, Any] | None = options[index]
                elif default_tasks:
                    reset_options = {"task_id": default_tasks[index % len(default_tasks)]}
                else:
                    reset_options = None
                episode_seed = None if run_seed is None else run_seed + index
                planned[index] = str((reset_options or {}).get("task_id", ""))
                await env.areset(seed=episode_seed, options=reset_options)
                return _Live(
                    index=index,
                    env=env,
                    samples=[],
                    started=time.perf_counter(),
                    task_id=_current_task_id(env) or planned[index],
                )

            async def refill(env: PipelineEnv) -> _Live | None:
                """The slot's next episode; one whose reset fails is recorded as aborted."""
                while True:
                    index = next_index
                    try:
                        return await start(env)
                    except Exception as exc:  # a broken env must not lose the run
                        logger.exception("resetting the environment for episode %d failed", index)
                        self._finish(
                            results,
                            index,
                            self._aborted(
                                index, env, f"reset failed: {exc!r}", planned.get(index, "")
                            ),
                        )

            started = await asyncio.gather(*(refill(env) for env in envs))
            live = [episode for episode in started if episode is not None]
            if self.schedule == "continuous":
                await self._run_continuous(live, refill, results, run_seed)
                live = []
            elif self.schedule == "episodes":
                await self._run_episodes(live, refill, results)
                live = []
            tick = 0
            while live:
                requests = [self._request(episode) for episode in live]
                generations = await self._generate_all(requests, tick, run_seed)
                # Steps of all episodes together; one that raises ends only its episode.
                stepped = await asyncio.gather(
                    *(
                        self._step(request, gen)
                        for request, gen in zip(requests, generations)
                        if isinstance(gen, Generation)
                    ),
                    return_exceptions=True,
                )
                step_errors = iter(stepped)
                still_live = []
                for request, gen in zip(requests, generations):
                    episode = request.live
                    error: str | None = None if isinstance(gen, Generation) else gen
                    if error is None:
                        raised = next(step_errors)
                        if isinstance(raised, BaseException):
                            if not isinstance(raised, Exception) or isinstance(
                                raised, _RUN_STOPPERS
                            ):
                                raise raised  # Ctrl-C, cancellation, a run stopper: stop the run
                            logger.error("episode %d failed: %r", episode.index, raised)
                            error = f"environment step failed: {raised!r}"
                    if error is not None or self._finished(episode.env):
                        self._finish(results, episode.index, await self._collect(episode, error))
                        replacement = await refill(episode.env)
                        if replacement is not None:
                            still_live.append(replacement)
                    else:
                        still_live.append(episode)
                live = still_live
                tick += 1
                if self._bar is not None:
                    self._bar.refresh(results, self._verdicts)
        finally:
            bar, self._bar = self._bar, None
            if bar is not None:
                bar.close()
            if not self.keep_envs:
                envs_made, self._envs = self._envs, []
                await asyncio.gather(*(env.aclose() for env in envs_made), return_exceptions=True)
            else:
                # Kept environments wait for the next run (a trainer's evaluation sets for
                # several steps): none holds a kernel or workspace meanwhile.
                await self._release_idle_envs()
        return [results[i] for i in range(num_episodes)]

    # ------------------------------------------------------------------ internals

    def _request(self, episode: _Live) -> _Request:
        env = episode.env
        agent = env.agent_selection
        return _Request(live=episode, agent=agent, messages=list(env.observe(agent)["messages"]))

    async def _generate_all(
        self, requests: Sequence[_Request], tick: int, run_seed: int | None
    ) -> list[Generation | str]:
        """One batch per (policy, sampling settings), all batches concurrently.

        Returns one generation per request, or an error message where it failed.
        """
        groups: dict[tuple[int, SamplingParams], list[int]] = {}
        policies: dict[int, Policy] = {}
        for i, request in enumerate(requests):
            policy = self.system.policy_for(request.agent)
            policies[id(policy)] = policy
            key = (id(policy), self.sampling_for(request.agent))
            groups.setdefault(key, []).append(i)
        generations: list[Generation | str] = ["no generation"] * len(requests)

        async def generate(key: tuple[int, SamplingParams], members: list[int]) -> None:
            policy_id, params = key
            if run_seed is not None and params.seed is None:
                slot = self._policy_index[policy_id]
                params = dataclasses.replace(params, seed=derive_seed(run_seed, tick, slot))
            outputs = await self._generate_batch(
                policies[policy_id], params, [requests[i].messages for i in members]
            )
            for i, output in zip(members, outputs):
                generations[i] = output

        await asyncio.gather(*(generate(key, members) for key, members in groups.items()))
        return generations

    async def _generate_batch(
        self, policy: Policy, params: SamplingParams, batch: list[list[dict[str, str]]]
    ) -> list[Generation | str]:
        """One batch through ``policy``: a generation per prompt, or why it failed."""
        try:
            outputs: list[Generation | None] = list(await policy.agenerate(batch, params))
            errors: list[BaseException | None] = [None] * len(outputs)
        except GenerationError as exc:  # some prompts failed; keep the others
            outputs, errors = list(exc.generations), list(exc.errors)
        except _RUN_STOPPERS:
            raise
        except Exception as exc:  # a backend failure ends these episodes, not the run
            logger.exception("policy %r failed on a batch of %d", policy.name, len(batch))
            outputs, errors = [None] * len(batch), [exc] * len(batch)
        if len(outputs) != len(batch):
            raise RuntimeError(
                f"policy {policy.name!r} returned {len(outputs)} generations "
                f"for a batch of {len(batch)}"
            )
        return [
            output if output is not None else f"generation failed: {type(error).__name__}: {error}"
            for output, error in zip(outputs, errors)
        ]

    async def _run_continuous(
        self,
        live: list[_Live],
        refill: Callable[[PipelineEnv], Any],
        results: dict[int, EpisodeResult],
        run_seed: int | None,
    ) -> None:
        """Drive every slot on its own; each policy batches what is pending when free."""
        batchers = _Batchers(self, run_seed)

        async def generate(request: _Request) -> Generation | str:
            policy = self.system.policy_for(request.agent)
            params = self.sampling_for(request.agent)
            return await batchers.submit(policy, params, request.messages)

        try:
            await self._drive_slots(live, refill, results, generate)
        finally:
            await batchers.close()

    async def _run_episodes(
        self,
        live: list[_Live],
        refill: Callable[[PipelineEnv], Any],
        results: dict[int, EpisodeResult],
    ) -> None:
        """Drive every episode on its own; each turn is one unseeded request.

        A policy that batches requests continuously gets each request as it comes; any
        other policy gets coalesced batches, as in the ``continuous`` schedule.
        """
        batchers = _Batchers(self, None)
        sampling = self.sampling
        settings = [sampling] if isinstance(sampling, SamplingParams) else list(sampling.values())
        if any(params.seed is not None for params in settings):
            logger.warning("the episodes schedule sends no sampling seeds: the seed set is ignored")

        async def generate(request: _Request) -> Generation | str:
            policy = self.system.policy_for(request.agent)
            params = dataclasses.replace(self.sampling_for(request.agent), seed=None)
            if batches_requests(policy):
                return await self._generate_one(policy, params, request.messages)
            return await batchers.submit(policy, params, request.messages)

        try:
            await self._drive_slots(live, refill, results, generate)
        finally:
            await batchers.close()

    async def _generate_one(
        self, policy: Any, params: SamplingParams, messages: list[dict[str, str]]
    ) -> Generation | str:
        """One request through a continuously batching policy, or why it failed."""
        try:
            output = await policy.agenerate_one(messages, params)
        except _RUN_STOPPERS:
            raise
        except Exception as exc:  # a failed request ends its episode, not the run
            logger.exception("policy %r failed on a request", policy.name)
            return f"generation failed: {type(exc).__name__}: {exc}"
        if not isinstance(output, Generation):
            raise RuntimeError(
                f"policy {policy.name!r} returned {type(output).__name__} for one request, "
                "not a Generation"
            )
        return output

    async def _drive_slots(
        self,
        live: list[_Live],
        refill: Callable[[PipelineEnv], Any],
        results: dict[int, EpisodeResult],
        generate: Callable[[_Request], Any],
    ) -> None:
        """Run each slot's episodes one after another, every episode in a task of its own.

        ``generate`` answers one request of one episode (a generation, or why none came).
        A task per episode, named ``episode-<index>``, lets an engine tell the waits of
        one episode from another's.
        """

        async def play(episode: _Live) -> None:
            error: str | None = None
            while error is None and not self._finished(episode.env):
                request = self._request(episode)
                gen = await generate(request)
                if not isinstance(gen, Generation):
                    error = gen
                    break
                try:
                    await self._step(request, gen)
                except _RUN_STOPPERS:
                    raise
                except Exception as exc:  # ends this episode, not the run
                    logger.exception("episode %d failed", episode.index)
                    error = f"environment step failed: {exc!r}"
            self._finish(results, episode.index, await self._collect(episode, error))

        async def drive(episode: _Live | None) -> None:
            while episode is not None:
                await asyncio.create_task(play(episode), name=f"episode-{episode.index}")
                episode = await refill(episode.env)

        drivers = [asyncio.ensure_future(drive(episode)) for episode in live]
        try:
            await asyncio.gather(*drivers)
        finally:
            # One driver's failure (or a cancellation) stops the others before the
            # environments close: none is left waiting on a batch that never comes.
            for driver in drivers:
                driver.cancel()
            await asyncio.gather(*drivers, return_exceptions=True)

    async def _step(self, request: _Request, gen: Generation) -> None:
        episode = request.live
        env = episode.env
        await env.astep(gen.text)
        record = env.transcript[-1]
        info = env.infos.get(request.agent, {})
        policy = self.system.policy_for(request.agent)
        sample = ActionSample(
            episode_id=f"ep-{episode.index:05d}",
            task_id=str(info.get("task_id", "")),
            env_id=env.env_id,
            agent=request.agent,
            turn=record.turn,
            step=len(episode.samples),
            policy=policy.name,
            messages=request.messages,
            text=gen.text,
            reasoning=gen.reasoning,
            prompt_ids=list(gen.prompt_ids),
            response_ids=list(gen.response_ids),
            logprobs=list(gen.logprobs),
            finish_reason=gen.finish_reason,
            reward=float(record.reward),
            reward_valid=bool(info.get("reward_valid", False)),
            coach=None if record.verdict is None else record.verdict.to_dict(),
            tool=None if record.tool.result is None else record.tool.result.to_dict(),
            code=record.tool.code,
            action_truncated=record.action_truncated,
            sampling=dict(_sampling_record(self.sampling_for(request.agent))),
            credit=info.get("credit"),
        )
        episode.samples.append(sample)
        kind = classify_verdict(sample.coach)
        if kind is not None:
            self._verdicts[kind] += 1
        if self._bar is not None:
            self._bar.action()
        # Terminated agents take PettingZoo's dead step here, so the next tick only sees
        # agents that must act.
        while env.agents and (
            env.terminations[env.agent_selection] or env.truncations[env.agent_selection]
        ):
            await env.astep(None)

    @staticmethod
    def _finished(env: PipelineEnv) -> bool:
        return not env.agents

    async def _collect(self, episode: _Live, error: str | None = None) -> EpisodeResult:
        env = episode.env
        task_id = episode.samples[0].task_id if episode.samples else episode.task_id
        if error is None:
            outcome = env.outcome if env.outcome is not None else EpisodeOutcome()
            # The episode is over: its actions' rewards are final now.
            for sample, record in zip(episode.samples, env.transcript):
                sample.reward, sample.reward_valid = float(record.reward), record.reward_valid
        else:
            # The episode could not go on: no graded outcome, so its credit was never
            # settled, and none of its actions is trained on.
            outcome = EpisodeOutcome.aborted_with(error, task_id)
            for sample in episode.samples:
                sample.reward, sample.reward_valid = math.nan, False
        for sample in episode.samples:
            sample.outcome = outcome
        return EpisodeResult(
            episode_id=f"ep-{episode.index:05d}",
            task_id=task_id,
            env_id=env.env_id,
            actions=episode.samples,
            outcome=outcome,
            wall_time_s=time.perf_counter() - episode.started,
        )

    @staticmethod
    def _aborted(index: int, env: PipelineEnv, error: str, task_id: str = "") -> EpisodeResult:
        outcome = EpisodeOutcome.aborted_with(error, task_id)
        return EpisodeResult(
            episode_id=f"ep-{index:05d}",
            task_id=task_id,
            env_id=env.env_id,
            actions=[],
            outcome=outcome,
        )

    def _progress_bar(self, episodes: int, env: PipelineEnv) -> _ActionProgress | None:
        if not self.progress:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            logger.info("tqdm is not installed: no progress bar")
            return None
        bar = tqdm(total=None, desc="actions", unit="action", dynamic_ncols=True)
        return _ActionProgress(bar, episodes, most_actions(env))


class _Batchers:
    """One :class:`_Batcher` per (policy, sampling settings) pair, made on first use."""

    def __init__(self, runner: RolloutRunner, run_seed: int | None) -> None:
        self.runner = runner
        self.run_seed = run_seed
        self._by_key: dict[tuple[int, SamplingParams], _Batcher] = {}

    async def submit(
        self, policy: Policy, params: SamplingParams, messages: list[dict[str, str]]
    ) -> Generation | str:
        """``messages`` into the batcher of ``policy`` and ``params``."""
        key = (id(policy), params)
        if key not in self._by_key:
            slot = self.runner._policy_index[id(policy)]
            self._by_key[key] = _Batcher(self.runner, policy, params, self.run_seed, slot)
        return await self._by_key[key].submit(messages)

    async def close(self) -> None:
        """Stop every batcher."""
        for batcher in self._by_key.values():
            await batcher.close()


class _Batcher:
    """Serves one (policy, sampling settings) pair: a batch of whatever is pending.

    Requests arriving while a batch is being generated wait for the next one; the next
    batch starts as soon as the policy is free and something is pending.
    """

    def __init__(
        self,
        runner: RolloutRunner,
        policy: Policy,
        params: SamplingParams,
        run_seed: int | None,
        slot: int,
    ) -> None:
        self.runner = runner
        self.policy = policy
        self.params = params
        self.run_seed = run_seed
        self.slot = slot
        self.batches = 0
        self.batch_sizes: list[int] = []
        self._pending: list[tuple[list[dict[str, str]], asyncio.Future[Generation | str]]] = []
        self._closed = False
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._serve(), name=f"batcher-{policy.name}")

    async def submit(self, messages: list[dict[str, str]]) -> Generation | str:
        """The generation for ``messages`` (or why it failed), once its batch is done.

        Raises:
            RuntimeError: If the batcher is closed or its serving task has ended.
        """
        if self._closed or self._task.done():
            raise RuntimeError(f"the batcher of policy {self.policy.name!r} is closed")
        future: asyncio.Future[Generation | str] = asyncio.get_running_loop().create_future()
        self._pending.append((messages, future))
        self._wakeup.set()
        return await future

    async def _serve(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # Let episodes woken by the same event (a batch just delivered) submit too.
            await asyncio.sleep(0)
            batch, self._pending = self._pending, []
            if not batch:
                continue
            params = self.params
            # A fixed seed is mixed with the batch number too: batches here may hold one
            # copy of a prompt each, and the same seed would give every copy one sample.
            base = self.params.seed if self.params.seed is not None else self.run_seed
            if base is not None:
                seed = derive_seed(base, "continuous", self.slot, self.batches)
                params = dataclasses.replace(params, seed=seed)
            self.batches += 1
            self.batch_sizes.append(len(batch))
            try:
                outputs = await self.runner._generate_batch(
                    self.policy, params, [messages for messages, _ in batch]
                )
            except asyncio.CancelledError:
                # Closed mid-batch: the waiting episodes must not wait for ever.
                for _, future in batch:
                    future.cancel()
                raise
            # A broken policy: every waiting episode hears of it (and fails with it).
            except Exception as exc:  # noqa: BLE001 - handed on to each waiting episode
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), output in zip(batch, outputs):
                if not future.done():
                    future.set_result(output)

    async def close(self) -> None:
        """Stop serving; requests still waiting fail with CancelledError."""
        self._closed = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        for _, future in self._pending:
            future.cancel()
        self._pending = []
