"""The runner's episodes schedule over the stand-in engine: one request per turn, no lock-step."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import mappa_env
from mappa_agents.policy import RequestPolicy, SamplingParams, batches_requests
from mappa_agents.runner import RolloutRunner
from mappa_agents.scripted import ScriptedPolicy
from mappa_agents.standin import StandInEngine
from mappa_agents.system import AgentSystem
from tests.fakes import InProcessSandbox
from tests.test_runner import AGENTS, TASKS, solver_script


def task_number(prompt_ids) -> int:
    """The ``i`` of the task ``What is i * 7?`` a stand-in prompt (UTF-8 bytes) is about."""
    return int(bytes(prompt_ids).decode().split("What is ")[1].split(" ")[0])


def longer_for_earlier_tasks(prompt_ids) -> int:
    """Task i's replies take 3 + 8 (5 - i) tokens: episodes end in the reverse of their order.

    Tests that use it tick slowly enough (5-10 ms) that an environment step on a loaded
    machine (tens of milliseconds) cannot reorder what the reply lengths order.
    """
    return 3 + 8 * (5 - task_number(prompt_ids))


def failing_on(task_id):
    """A MathChat-v0 factory whose environments' steps raise on ``task_id`` (a bug)."""

    def make():
        env = mappa_env.make("MathChat-v0", tasks=TASKS, sandbox=InProcessSandbox)
        step = env.astep

        async def astep(action):
            if env.task_facts()[0] == task_id:
                raise RuntimeError(f"env bug on {task_id}")
            return await step(action)

        env.astep = astep
        return env

    return make


def runner_for(system, schedule, coach="rules", concurrency=6, on_episode=None, factory=None):
    return RolloutRunner(
        factory
        or (
            lambda: mappa_env.make(
                "MathChat-v0", tasks=TASKS, sandbox=InProcessSandbox, coach=coach
            )
        ),
        system,
        SamplingParams(max_new_tokens=64),
        concurrency=concurrency,
        progress=False,
        schedule=schedule,
        on_episode=on_episode,
    )


def test_the_stand_in_is_a_request_policy_with_deterministic_replies():
    engine = StandInEngine(reply_tokens=(2, 9), seed=3)
    assert isinstance(engine, RequestPolicy)
    assert batches_requests(engine)
    assert not batches_requests(ScriptedPolicy(solver_script))
    prompt = [{"role": "user", "content": "hi"}]
    params = SamplingParams(max_new_tokens=5)
    first = asyncio.run(engine.agenerate_one(prompt, params))
    again = engine.generate([prompt], params)[0]
    assert (first.response_ids, first.logprobs) == (again.response_ids, again.logprobs)
    assert first.trainable
    assert len(first.response_ids) <= 5
    assert first.prompt_ids == list(b"user\nhi\n")
    other_seed = StandInEngine(reply_tokens=(2, 9), seed=4).generate([prompt], params)[0]
    assert other_seed.response_ids != first.response_ids
    engine.load_weights([])
    assert engine.generate([prompt], params)[0].response_ids != first.response_ids
    cut = StandInEngine(reply_tokens=8).generate([prompt], SamplingParams(max_new_tokens=3))[0]
    assert (len(cut.response_ids), cut.finish_reason) == (3, "length")


def test_requests_join_the_running_batch_at_tick_boundaries():
    # The long request decodes for 23 ticks (92 ms); the short one comes 5 ms in.
    engine = StandInEngine(token_latency_s=0.004, reply_tokens=lambda ids: len(ids))

    async def staggered():
        params = SamplingParams(max_new_tokens=64)
        long = asyncio.create_task(
            engine.agenerate_one([{"role": "u", "content": "x" * 20}], params)
        )
        await asyncio.sleep(0.005)  # a few ticks in
        short = await engine.agenerate_one([{"role": "u", "content": "y"}], params)
        return await long, short

    long, short = asyncio.run(staggered())
    # 23 and 4 tokens ("u\n" + text + "\n") decoded together: the short request joined
    # the long one's batch and never waited for it to end.
    assert len(long.response_ids) == 23
    assert len(short.response_ids) == 4
    assert engine.decode_ticks == 23
    assert engine.tokens == 27
    assert engine.most_in_flight == 2


LONG_TURN = 60
"""Tokens of the one long reply of each episode in :func:`one_long_turn`."""


def one_long_turn(prompt_ids) -> int:
    """``LONG_TURN`` tokens for agent ``i % 3``'s reply in task i's episode, 3 for the others."""
    text = bytes(prompt_ids).decode()
    roles = ("problem solver", "code executor", "verifier")
    agent = next(k for k, role in enumerate(roles) if f"You are the {role}" in text)
    return LONG_TURN if agent == task_number(prompt_ids) % 3 else 3


def test_sequential_waits_follow_the_longest_episode_not_the_sum_of_batches():
    engines = {}
    for schedule in ("ticks", "episodes"):
        engines[schedule] = engine = StandInEngine(
            token_latency_s=0.003, reply_tokens=one_long_turn
        )
        episodes = runner_for(AgentSystem.shared(engine, AGENTS), schedule).run(6)
        actions = [len(e.actions) for e in episodes]
        assert all(not e.aborted for e in episodes)
        assert actions == [3] * 6
    ticks, per_episode = engines["ticks"], engines["episodes"]
    # Ticks: one batch per turn, each as long as its longest reply (some episode's long
    # turn falls in every tick): 3 waits of LONG_TURN decode ticks.
    assert ticks.batch_calls == ticks.sequential_waits == 3
    assert ticks.decode_ticks == 3 * LONG_TURN
    # Episodes: each episode waited once per action, in a task of its own, never on a
    # batch, and the engine decoded for about as long as one episode's replies
    # (LONG_TURN + 3 + 3 tokens), plus the ticks others decode while an episode steps and
    # rejoins: a step is a few ticks on an idle machine and can be tens on a loaded one,
    # so the bound is the lock-step figure, which is far off either way.
    assert per_episode.waits == {f"episode-{i}": 3 for i in range(6)}
    assert per_episode.batch_calls == 0
    assert per_episode.sequential_waits == 3
    assert LONG_TURN + 6 <= per_episode.decode_ticks < ticks.decode_ticks
    assert per_episode.most_in_flight == 6


class TrackedEngine(StandInEngine):
    """A stand-in engine that records which engines have a request in flight at once."""

    def __init__(self, in_flight: Counter, most: list[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.in_flight, self.most = in_flight, most

    async def agenerate_one(self, messages, params):
        self.in_flight[self.name] += 1
        busy = sum(1 for count in self.in_flight.values() if count)
        self.most[0] = max(self.most[0], busy)
        try:
            return await super().agenerate_one(messages, params)
        finally:
            self.in_flight[self.name] -= 1


def test_the_three_agents_decode_at_the_same_time():
    in_flight: Counter = Counter()
    most = [0]
    engines = {
        agent: TrackedEngine(
            in_flight,
            most,
            name=agent,
            # Task 4's verifier turn (ticks 22-33), task 3's executor turn (19-38) and
            # task 0's solver turn (0-43) overlap for 110 ms less the steps between them.
            token_latency_s=0.01,
            reply_tokens=longer_for_earlier_tasks,
        )
        for agent in AGENTS
    }
    episodes = runner_for(AgentSystem(engines), "episodes").run(6)
    assert all(not e.aborted for e in episodes)
    assert most[0] == 3
    # Each engine decoded requests of several episodes at once.
    assert all(engine.most_in_flight >= 2 for engine in engines.values())


def test_results_come_back_in_episode_order_whatever_order_they_end_in():
    # Consecutive tasks' episodes end 24 ticks (120 ms) apart.
    engine = StandInEngine(token_latency_s=0.005, reply_tokens=longer_for_earlier_tasks)
    finished = []
    episodes = runner_for(
        AgentSystem.shared(engine, AGENTS),
        "episodes",
        on_episode=lambda e: finished.append(e.episode_id),
    ).run(6)
    assert [e.episode_id for e in episodes] == [f"ep-{i:05d}" for i in range(6)]
    assert [e.task_id for e in episodes] == [t.id for t in TASKS]
    assert finished == [f"ep-{i:05d}" for i in reversed(range(6))]


def test_an_episode_whose_step_raises_ends_alone():
    engine = StandInEngine(token_latency_s=0.0005, reply_tokens=(2, 12))
    system = AgentSystem.shared(engine, AGENTS)
    episodes = runner_for(system, "episodes", factory=failing_on("t2")).run(6)
    assert [e.aborted for e in episodes] == [i == 2 for i in range(6)]
    assert "env bug on t2" in episodes[2].outcome["error"]
    assert all(len(e.actions) >= 3 for i, e in enumerate(episodes) if i != 2)


def test_a_failed_request_ends_only_its_episode():
    class FailsOnTask3(StandInEngine):
        async def agenerate_one(self, messages, params):
            if "What is 3 *" in messages[1]["content"]:
                raise ConnectionError("engine gone")
            return await super().agenerate_one(messages, params)

    engine = FailsOnTask3(token_latency_s=0.0005)
    episodes = runner_for(AgentSystem.shared(engine, AGENTS), "episodes").run(6)
    assert [e.aborted for e in episodes] == [i == 3 for i in range(6)]
    assert "ConnectionError: engine gone" in episodes[3].outcome["error"]


def test_no_seed_goes_with_any_request_and_weights_stay_fixed_during_a_run(caplog):
    seen = []

    class Recording(StandInEngine):
        async def agenerate_one(self, messages, params):
            generation = await super().agenerate_one(messages, params)
            seen.append((params.seed, generation.info["weights_version"]))
            return generation

    engine = Recording(token_latency_s=0.0005)
    runner = runner_for(AgentSystem.shared(engine, AGENTS), "episodes")
    runner.sampling = SamplingParams(max_new_tokens=16, seed=7)
    runner.run(6, seed=0)
    assert "sends no sampling seeds" in caplog.text
    assert {seed for seed, _ in seen} == {None}
    assert {version for _, version in seen} == {0}
    engine.load_weights([])
    seen.clear()
    runner.run(6, seed=0)
    assert {version for _, version in seen} == {1}


def test_new_weights_while_requests_decode_are_refused():
    engine = StandInEngine(token_latency_s=0.001, reply_tokens=50)

    async def swap_mid_request():
        request = asyncio.create_task(
            engine.agenerate_one([{"role": "u", "content": "x"}], SamplingParams())
        )
        await asyncio.sleep(0.005)
        with pytest.raises(RuntimeError, match="load weights between rollout steps"):
            engine.load_weights([])
        request.cancel()

    asyncio.run(swap_mid_request())
    assert engine.weights_version == 0


def test_a_policy_without_a_request_path_gets_coalesced_unseeded_batches():
    seeds, sizes = [], []

    class Recording(ScriptedPolicy):
        async def agenerate(self, batch, params):
            seeds.append(params.seed)
            sizes.append(len(batch))
            await asyncio.sleep(0.01)
            return self.generate(batch, params)

    policy = Recording(solver_script)
    episodes = runner_for(AgentSystem.shared(policy, AGENTS), "episodes").run(6, seed=0)
    assert [e.succeeded for e in episodes] == [i % 2 == 0 for i in range(6)]
    assert sum(sizes) == 24
    assert sizes[0] == 6
    assert set(seeds) == {None}
