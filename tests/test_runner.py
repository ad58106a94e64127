"""The batched rollout runner, trajectories and reports, with scripted policies (no model)."""

from __future__ import annotations

import json
import math
import time

import pytest

import mappa_env
from mappa_agents.policy import SamplingParams
from mappa_agents.report import format_table, plot_report, summarize
from mappa_agents.runner import RolloutRunner, derive_seed
from mappa_agents.scripted import ScriptedPolicy
from mappa_agents.system import AgentSystem, parse_system_spec
from mappa_agents.trajectory import group_episodes, load_jsonl, save_jsonl
from mappa_env.tasks import MathTask
from tests.fakes import FixedCoach, InProcessSandbox

AGENTS = ["problem_solver", "code_executor", "verifier"]
TASKS = [MathTask(id=f"t{i}", prompt=f"What is {i} * 7?", answer=str(i * 7)) for i in range(6)]


def solver_script(messages):
    """A 'policy' that reads the problem and answers correctly for even i, wrongly for odd i."""
    prompt = messages[1]["content"]
    i = int(prompt.split("What is ")[1].split(" *")[0])
    if messages[0]["content"].startswith("You are the code executor"):
        if len(messages) == 2:
            return f"```python\nprint({i} * 7)\n```"
        return f"Checked: \\boxed{{{i * 7}}}"
    return f"\\boxed{{{i * 7 if i % 2 == 0 else i * 7 + 1}}}"


def make_runner(coach=None, concurrency=4, seed=0, sampling=None):
    policy = ScriptedPolicy(solver_script)
    system = AgentSystem.shared(policy, AGENTS)
    env_factory = lambda: mappa_env.make(  # noqa: E731
        "MathChat-v0",
        tasks=TASKS,
        sandbox=InProcessSandbox,
        coach=coach or "rules",
    )
    return RolloutRunner(
        env_factory, system, sampling, concurrency=concurrency, seed=seed, progress=False
    ), policy


def test_runner_runs_every_task_and_records_every_action():
    runner, policy = make_runner()
    episodes = runner.run(6)
    assert [e.task_id for e in episodes] == [t.id for t in TASKS]
    assert [e.succeeded for e in episodes] == [i % 2 == 0 for i in range(6)]
    for episode in episodes:
        assert [a.agent for a in episode.actions] == [
            "problem_solver",
            "code_executor",
            "code_executor",
            "verifier",
        ]
        assert all(a.outcome == episode.outcome for a in episode.actions)
        assert [a.step for a in episode.actions] == [0, 1, 2, 3]
        assert episode.actions[1].code is not None
        assert episode.actions[1].tool["stdout"].strip() == episode.outcome["answer"]
    # 4 slots, 6 episodes of 4 actions: ticks batch the waiting episodes together.
    assert policy.calls < 6 * 4


def test_runner_batches_across_episodes():
    runner, policy = make_runner(concurrency=6)
    runner.run(6)
    # Every tick batches all 6 episodes into one call: 4 actions each -> 4 calls.
    assert policy.calls == 4


def test_runner_hides_coach_latency_across_episodes():
    # Every coach call waits until all 6 episodes have one in flight: a runner that scored
    # one action after another would never get there.
    coach = FixedCoach(score=6.0, gather=6)
    runner, _ = make_runner(coach=coach, concurrency=6)
    episodes = runner.run(6)
    assert coach.most_in_flight == 6
    assert all(a.reward == pytest.approx(0.6) for e in episodes for a in e.actions)


def test_jsonl_round_trip_and_datasets_loading(tmp_path):
    runner, _ = make_runner(coach=FixedCoach(score=None))
    episodes = runner.run(3)
    samples = [a for e in episodes for a in e.actions]
    path = save_jsonl(tmp_path / "t.jsonl", samples)
    loaded = load_jsonl(path)
    assert len(loaded) == len(samples)
    for original, copy in zip(samples, loaded):
        assert copy.agent == original.agent
        assert copy.messages == original.messages
        assert copy.coach == original.coach
        assert math.isnan(copy.reward)
        assert math.isnan(original.reward)
        assert copy.reward_valid is False
    assert set(group_episodes(loaded)) == {e.episode_id for e in episodes}
    first = json.loads(path.read_text().splitlines()[0])
    assert first["reward"] is None  # NaN is written as null, valid JSON
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    assert ds.num_rows == len(samples)
    assert ds[0]["agent"] == "problem_solver"


def test_load_jsonl_reports_the_bad_line(tmp_path):
    runner, _ = make_runner()
    good = runner.run(1)[0].actions[0].to_json()
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match=":1: not an action record"):
        load_jsonl(path)
    path.write_text(good + "\nnot json\n")
    with pytest.raises(ValueError, match=":2:"):
        load_jsonl(path)


def test_summary_report_and_plots(tmp_path):
    runner, _ = make_runner()
    start = time.perf_counter()
    episodes = runner.run(6)
    report = summarize(episodes, wall_time_s=time.perf_counter() - start)
    assert report["accuracy"] == pytest.approx(0.5)
    assert report["per_agent"]["code_executor"]["tool_call_rate"] == pytest.approx(0.5)
    assert report["code_agent_tool_call_rate"] == pytest.approx(0.5)
    assert report["invalid_coach_rate"] == 0.0
    text = format_table(report)
    assert "code_executor" in text
    assert "50.0%" in text
    json.dumps(report)  # serialisable
    paths = plot_report(episodes, tmp_path)
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)


def _without_timings(sample):
    data = json.loads(sample.to_json())
    if data["tool"]:
        data["tool"].pop("duration_s")  # wall-clock time differs between runs
    return data


def test_seeded_runs_are_identical_and_seeds_are_stable():
    first = [_without_timings(a) for e in make_runner(seed=3)[0].run(4) for a in e.actions]
    second = [_without_timings(a) for e in make_runner(seed=3)[0].run(4) for a in e.actions]
    assert first == second
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert derive_seed(1, 2, 3) != derive_seed(1, 2, 4)


def test_per_agent_sampling_and_spec_parsing():
    sampling = {a: SamplingParams(max_new_tokens=8 + i) for i, a in enumerate(AGENTS)}
    runner, _ = make_runner(sampling=sampling)
    episodes = runner.run(1)
    assert [a.sampling["max_new_tokens"] for a in episodes[0].actions] == [8, 9, 9, 10]
    assert parse_system_spec("m", AGENTS) == dict.fromkeys(AGENTS, "m")
    assert (
        parse_system_spec("problem_solver=a,code_executor=b,verifier=c", AGENTS)["verifier"] == "c"
    )
    with pytest.raises(ValueError, match="no model for agents"):
        parse_system_spec({"problem_solver": "a"}, AGENTS)
    with pytest.raises(ValueError, match="unknown agents"):
        parse_system_spec("judge=a", AGENTS)


class FlakyPolicy(ScriptedPolicy):
    """Fails every prompt of problem i = 3 (an API error), answers the others."""

    def generate(self, batch, params):
        from mappa_agents.policy import GenerationError

        outputs = super().generate(batch, params)
        failed = [" 3 *" in p[1]["content"] for p in batch]
        if not any(failed):
            return outputs
        errors = [RuntimeError("HTTP 503") if f else None for f in failed]
        raise GenerationError([None if f else o for f, o in zip(failed, outputs)], errors)


def test_a_failed_generation_ends_only_its_episode():
    policy = FlakyPolicy(solver_script)
    runner = RolloutRunner(
        lambda: mappa_env.make("MathChat-v0", tasks=TASKS, sandbox=InProcessSandbox),
        AgentSystem.shared(policy, AGENTS),
        concurrency=6,
        progress=False,
    )
    episodes = runner.run(6)
    assert "HTTP 503" in episodes[3].outcome["error"]
    assert episodes[3].actions == []
    others = [e.succeeded for i, e in enumerate(episodes) if i != 3]
    assert others == [True, False, True, True, False]  # even problems solved, as scripted


def test_kept_envs_are_reused_across_runs():
    made = []

    def factory():
        env = mappa_env.make("MathChat-v0", tasks=TASKS, sandbox=InProcessSandbox)
        made.append(env)
        return env

    runner = RolloutRunner(
        factory,
        AgentSystem.shared(ScriptedPolicy(solver_script), AGENTS),
        concurrency=3,
        progress=False,
        keep_envs=True,
    )
    with runner:
        first = runner.run(3, seed=1)
        second = runner.run(3, seed=1)
        assert len(made) == 3
    assert [e.outcome for e in first] == [e.outcome for e in second]
    with pytest.raises(RuntimeError, match="closed"):
        made[0].reset()


def test_runner_rejects_bad_arguments():
    runner, _ = make_runner()
    with pytest.raises(ValueError, match="num_episodes"):
        runner.run(0)
    with pytest.raises(ValueError, match="episode_options"):
        runner.run(3, episode_options=[{}])
    with pytest.raises(ValueError, match="concurrency"):
        RolloutRunner(lambda: None, AgentSystem.shared(ScriptedPolicy(str), AGENTS), concurrency=0)


def test_run_works_inside_a_running_event_loop():
    import asyncio

    async def notebook_cell():
        runner, _ = make_runner()
        return runner.run(2)

    episodes = asyncio.run(notebook_cell())
    assert len(episodes) == 2


def test_an_env_step_that_raises_ends_only_its_episode():
    class Fragile(mappa_env.env_class("MathChat-v0")):
        async def episode_outcome(self):
            if self.task.id == "t2":
                raise OSError("disk full")
            return await super().episode_outcome()

    runner = RolloutRunner(
        lambda: Fragile(tasks=TASKS, sandbox=InProcessSandbox),
        AgentSystem.shared(ScriptedPolicy(solver_script), AGENTS),
        concurrency=3,
        progress=False,
    )
    episodes = runner.run(6)
    assert episodes[2].aborted
    assert "disk full" in episodes[2].outcome["error"]
    assert "reward" not in episodes[2].outcome  # no graded outcome, no outcome reward
    assert [e.succeeded for i, e in enumerate(episodes) if i != 2] == [
        True,
        False,
        False,
        True,
        False,
    ]
    report = summarize(episodes)
    assert report["aborted_episodes"] == 1
    assert report["success_rate"] == pytest.approx(2 / 5)


def test_runner_counts_invalid_coach_verdicts_as_they_happen():
    runner, _ = make_runner(coach=FixedCoach(score=None))
    episodes = runner.run(2)
    actions = sum(len(e.actions) for e in episodes)
    assert runner.coach_verdict_counts == {"invalid": actions}
