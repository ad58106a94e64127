"""The runner's continuous schedule: requests served as they arrive, slow steps isolated."""

from __future__ import annotations

import asyncio

import pytest

import mappa_env
from mappa_agents.runner import RolloutRunner
from mappa_agents.scripted import ScriptedPolicy
from mappa_agents.system import AgentSystem
from mappa_env.coach.base import CoachVerdict
from tests.fakes import FixedCoach, InProcessSandbox
from tests.test_runner import AGENTS, TASKS, FlakyPolicy, solver_script


class SlowOnOneTask(FixedCoach):
    """Takes ``delay_s`` to score every action of task t1; the others at once.

    With a ``policy``, ``batches_meanwhile`` counts, per t1 action, the batches it
    generated while that action was being scored: the other episodes' progress then.
    """

    def __init__(self, delay_s: float, policy: RecordingPolicy | None = None) -> None:
        super().__init__(delay_s=delay_s)
        self.policy = policy
        self.batches_meanwhile: list[int] = []

    async def ascore(self, request):
        if request.task_id == "t1":
            batches = self.policy.batch_sizes if self.policy is not None else []
            before = len(batches)
            await asyncio.sleep(self.delay_s)
            self.batches_meanwhile.append(len(batches) - before)
        return CoachVerdict(score=6.0, valid=True, analysis="fixed", coach=self.name)


class RecordingPolicy(ScriptedPolicy):
    """A scripted policy that takes ``delay_s`` per batch and records batch sizes."""

    def __init__(self, respond, delay_s: float = 0.0) -> None:
        super().__init__(respond)
        self.delay_s = delay_s
        self.batch_sizes: list[int] = []

    async def agenerate(self, batch, params):
        self.batch_sizes.append(len(batch))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.generate(batch, params)


def runner_for(policy, schedule, coach="rules", concurrency=6, keep_envs=False):
    return RolloutRunner(
        lambda: mappa_env.make("MathChat-v0", tasks=TASKS, sandbox=InProcessSandbox, coach=coach),
        AgentSystem.shared(policy, AGENTS),
        concurrency=concurrency,
        progress=False,
        schedule=schedule,
        keep_envs=keep_envs,
    )


def test_continuous_gives_the_same_episodes_as_ticks_with_a_deterministic_policy():
    by_schedule = {}
    for schedule in ("ticks", "continuous"):
        episodes = runner_for(ScriptedPolicy(solver_script), schedule, concurrency=4).run(6)
        by_schedule[schedule] = [
            (e.task_id, e.succeeded, [(a.agent, a.text, a.reward) for a in e.actions])
            for e in episodes
        ]
    assert by_schedule["continuous"] == by_schedule["ticks"]
    assert [task for task, _, _ in by_schedule["continuous"]] == [t.id for t in TASKS]


def test_requests_pending_when_the_policy_is_free_share_a_batch():
    policy = RecordingPolicy(solver_script, delay_s=0.05)
    runner_for(policy, "continuous").run(6)
    # 6 episodes x 4 actions: the first batch takes all six starts, and requests that
    # arrive while a batch generates wait for the next one instead of going one by one.
    assert sum(policy.batch_sizes) == 24
    assert policy.batch_sizes[0] == 6
    assert len(policy.batch_sizes) <= 8, policy.batch_sizes


def test_a_slow_episode_holds_up_only_itself():
    meanwhile = {}
    for schedule in ("ticks", "continuous"):
        policy = RecordingPolicy(solver_script)
        coach = SlowOnOneTask(delay_s=0.3, policy=policy)
        episodes = runner_for(policy, schedule, coach=coach).run(12)  # 6 slots, 2 passes
        assert all(not e.aborted for e in episodes)
        meanwhile[schedule] = coach.batches_meanwhile
    # Ticks wait for task t1's slow coach at every tick of both passes: nothing is
    # generated meanwhile. Continuous lets the other slots run ahead: over the 8 slow
    # scorings (1.2 s in all for a scripted policy's instant batches) some are generated.
    assert meanwhile["ticks"] == [0] * 8, meanwhile
    assert len(meanwhile["continuous"]) == 8
    assert sum(meanwhile["continuous"]) > 0, meanwhile


def test_a_failed_generation_ends_only_its_episode_in_continuous_mode_too():
    episodes = runner_for(FlakyPolicy(solver_script), "continuous").run(6)
    assert "HTTP 503" in episodes[3].outcome["error"]
    assert [e.aborted for e in episodes] == [False, False, False, True, False, False]


def test_a_policy_that_breaks_fails_the_run_instead_of_hanging():
    class Broken(ScriptedPolicy):
        async def agenerate(self, batch, params):
            return []  # a wrong number of generations: a bug, not an API error

    with pytest.raises(RuntimeError, match="returned 0 generations"):
        runner_for(Broken(solver_script), "continuous").run(2)


def test_unknown_schedules_are_refused():
    with pytest.raises(ValueError, match="schedule must be one of"):
        runner_for(ScriptedPolicy(solver_script), "greedy")


@pytest.mark.parametrize("schedule", ["continuous", "episodes"])
def test_the_trainer_and_mappa_eval_take_the_schedule(tmp_path, schedule):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.command import main
    from mappa_train.config import TrainConfig
    from mappa_train.trainer import Trainer
    from tests.toy_env import LetterEnv

    model_dir = tiny_model_dir(tmp_path / "model")
    config = TrainConfig(
        env="Letter-v0", system=str(model_dir), steps=1, prompts_per_step=4,
        samples_per_prompt=2, concurrency=8, max_new_tokens=8, mask_truncated=False,
        train_batch_size=8, save_every=0, tensorboard=False, progress=False,
        gradient_checkpointing=False, output_dir=str(tmp_path / "run"),
        rollout_schedule=schedule,
    )  # fmt: skip
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    (metrics,) = trainer.train()
    trainer.close()
    assert metrics["rollout/episodes"] == 8
    with pytest.raises(ValueError, match="rollout_schedule"):
        TrainConfig(rollout_schedule="greedy")
    code = main(
        [
            "eval", "--system", str(model_dir), "--episodes", "2", "--num-tasks", "2",
            "--max-new-tokens", "4", "--sandbox", "none", "--schedule", schedule,
            "--out", str(tmp_path / "eval"), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0


class WrongCountOnTask(ScriptedPolicy):
    """Returns one generation too few whenever a batch holds task t5's verifier prompt."""

    async def agenerate(self, batch, params):
        outputs = self.generate(batch, params)
        if any(
            " 5 *" in p[1]["content"] and p[0]["content"].startswith("You are the verifier")
            for p in batch
        ):
            return outputs[:-1]
        return outputs


def test_a_failing_episode_leaves_no_task_waiting_behind():
    async def run_and_look():
        # Kept environments (as the trainer keeps them) stay usable after the failure, so
        # an episode still in its slow coach call would carry on and ask for a batch.
        runner = runner_for(
            WrongCountOnTask(solver_script),
            "continuous",
            coach=SlowOnOneTask(delay_s=0.2),
            keep_envs=True,
        )
        with pytest.raises(RuntimeError, match="generations"):
            await runner.arun(6)
        await asyncio.sleep(0.5)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for env in runner._envs:
            await env.aclose()
        return left

    assert asyncio.run(run_and_look()) == []


@pytest.mark.parametrize("schedule", ["ticks", "continuous"])
def test_an_episode_that_fails_before_acting_keeps_its_task(schedule):
    from mappa_agents.report import per_task_results

    options = [{"task_id": t.id} for t in TASKS for _ in range(2)]
    episodes = runner_for(FlakyPolicy(solver_script), schedule).run(len(options), options)
    failed = [e for e in episodes if e.aborted]
    assert [e.task_id for e in failed] == ["t3", "t3"]
    rows = {row["task_id"]: row for row in per_task_results(episodes)}
    assert rows["t3"]["aborted"] == 2


def test_a_fixed_sampling_seed_still_differs_between_continuous_batches():
    from mappa_agents.policy import SamplingParams

    seeds = []

    class SeedRecorder(RecordingPolicy):
        async def agenerate(self, batch, params):
            seeds.append(params.seed)
            return await super().agenerate(batch, params)

    runner = runner_for(SeedRecorder(solver_script, delay_s=0.01), "continuous")
    runner.sampling = SamplingParams(seed=123)
    runner.run(6)
    assert len(seeds) >= 4
    assert len(set(seeds)) == len(seeds)
