"""examples/custom_env.py: a user's environment in one file, through every public door."""

from __future__ import annotations

import json

import pettingzoo
import pytest
from pettingzoo.test import api_test, parallel_api_test, seed_test

import mappa_env
from examples.custom_env import HIDDEN_CASES, TASKS, PlannerCoderEnv
from tests.fakes import InProcessSandbox

ENTRY = "examples.custom_env:PlannerCoderEnv"
ADD = TASKS[0]
GOOD_CODE = "```python\ndef add(a, b):\n    return a + b\n```"


def play(env, actions: dict[str, list[str]]) -> dict[str, float]:
    env.reset(options={"task": ADD})
    queues = {agent: list(script) for agent, script in actions.items()}
    returns: dict[str, float] = {}
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last()
        returns[agent] = returns.get(agent, 0.0) + reward
        env.step(None if terminated or truncated else queues[agent].pop(0))
    return returns


def test_pettingzoo_api_tests_pass():
    api_test(PlannerCoderEnv(sandbox=None, isolation="none"), num_cycles=20)
    parallel_api_test(mappa_env.make_parallel("PlannerCoder-v0", sandbox=None), num_cycles=20)
    seed_test(lambda: PlannerCoderEnv(sandbox=None, isolation="none"), num_cycles=10)


def test_registered_with_mappa_and_pettingzoo():
    assert mappa_env.is_registered("PlannerCoder-v0")
    env = pettingzoo.make("aec", "mappa/PlannerCoder-v0", sandbox=None)
    assert isinstance(env, PlannerCoderEnv)
    env.close()
    by_path = mappa_env.make(ENTRY, sandbox=None)
    assert by_path.possible_agents == ["planner", "coder"]
    by_path.close()


def test_a_correct_function_earns_the_outcome_and_ends_the_coders_slot():
    env = PlannerCoderEnv(sandbox=InProcessSandbox, credit_mode="mixed")
    returns = play(env, {"planner": ["1. write add\n2. return a + b"], "coder": [GOOD_CODE]})
    assert env.outcome["correct"] is True
    assert env.outcome["passed"] == env.outcome["cases"] == HIDDEN_CASES
    assert len(env.records_of("coder")) == 1  # next_agent ended the slot at once
    # mixed: 0.5 * coach (6/10 and 9/10) + 0.5 * outcome (1) per action
    assert returns["planner"] == pytest.approx(0.5 * 0.6 + 0.5)
    assert returns["coder"] == pytest.approx(0.5 * 0.9 + 0.5)
    env.close()


def test_the_coder_revises_after_a_failing_example():
    env = PlannerCoderEnv(sandbox=InProcessSandbox)
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    play(env, {"planner": ["Write add."], "coder": [wrong, GOOD_CODE]})
    first, second = env.records_of("coder")
    assert "FAILS" in first.tool.output
    assert first.verdict.score == 3.0
    assert "passes" in second.tool.output
    assert second.verdict.score == 9.0
    assert env.outcome["correct"] is True
    env.close()


def test_turns_that_build_on_each_other_are_graded_together():
    env = PlannerCoderEnv(sandbox=InProcessSandbox)
    helper = "```python\ndef plus(a, b):\n    return a + b\ndef add(a, b):\n    return 0\n```"
    uses_it = "```python\ndef add(a, b):\n    return plus(a, b)\n```"
    play(env, {"planner": ["Write add."], "coder": [helper, uses_it]})
    assert env.outcome["correct"] is True
    env.close()


def test_hardcoding_the_example_is_not_paid_like_the_function():
    env = PlannerCoderEnv(sandbox=InProcessSandbox)  # process rewards, the rules coach
    special = "```python\ndef add(a, b):\n    return 5\n```"
    cheated = play(env, {"planner": ["Write add."], "coder": [special] * 3})
    honest = play(env, {"planner": ["Write add."], "coder": [GOOD_CODE]})
    assert cheated["coder"] / 3 == pytest.approx(0.4)  # each of its three turns
    assert honest["coder"] == pytest.approx(0.9)
    env.close()


def test_hidden_cases_are_drawn_for_each_episode():
    env = PlannerCoderEnv(sandbox=InProcessSandbox, seed=3)
    seen = set()
    for _ in range(3):
        env.reset(options={"task": ADD})
        seen.add(tuple(ADD.draw(env.np_random) for _ in range(HIDDEN_CASES)))
    assert len(seen) == 3
    env.close()


@pytest.mark.parametrize(
    "cheat",
    [
        # Passes the shown example only.
        "def add(a, b):\n    return 5",
        # Prints a result line of its own: the marker is fresh for every check.
        "print('RESULT-0000000000000000', repr(['5', '6', '0', '1000']))\n"
        "def add(a, b):\n    return 0",
        # A value that claims to equal everything: only its repr is compared.
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return 'anything'\n"
        "def add(a, b):\n    return Any()",
    ],
)
def test_ways_around_the_task_earn_no_outcome(cheat):
    env = PlannerCoderEnv(sandbox=InProcessSandbox, credit_mode="outcome")
    returns = play(env, {"planner": ["plan"], "coder": [f"```python\n{cheat}\n```"] * 3})
    assert env.outcome["correct"] is False
    assert returns["coder"] == 0.0
    env.close()


def test_mappa_eval_runs_it_by_import_path(tmp_path, capsys):
    pytest.importorskip("transformers")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.command import main

    out = tmp_path / "out"
    code = main(
        [
            "eval", "--env", ENTRY, "--system", str(tiny_model_dir(tmp_path / "model")),
            "--episodes", "2", "--concurrency", "2", "--max-new-tokens", "8",
            "--sandbox", "none", "--out", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["env_id"] == "PlannerCoder-v0"
    assert set(report["per_agent"]) == {"planner", "coder"}
    assert report["cases_passed"] == 0.0  # an untrained tiny model writes no function
    assert report["code_agent"] == "coder"
    assert "PlannerCoder-v0: 2 episodes" in capsys.readouterr().out


def test_mappa_eval_refuses_task_flags_the_environment_does_not_take(tmp_path):
    from mappa_train.command import main

    with pytest.raises(ValueError, match="does not take --num-tasks"):
        main(["eval", "--env", ENTRY, "--num-tasks", "3", "--out", str(tmp_path)])


def test_mappa_train_runs_one_step_on_it(tmp_path):
    pytest.importorskip("torch")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.command import main

    out = tmp_path / "run"
    code = main(
        [
            "train", "--env", ENTRY, "--system", str(tiny_model_dir(tmp_path / "model")),
            "--env-options", json.dumps({"sandbox": None}), "--steps", "1",
            "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-new-tokens", "8",
            "--train-batch-size", "4", "--micro-batch-size", "2", "--output-dir", str(out),
            "--no-progress", "--no-tensorboard", "--save-every", "0",
        ]
    )  # fmt: skip
    assert code == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 1
    assert {"planner/actions", "coder/actions", "planner/tool_call_rate"} <= set(metrics[-1])
    assert (out / "rollouts" / "step-000000.jsonl").exists()


def test_success_of_an_outcome_without_correct_or_success_is_a_full_reward():
    from mappa_agents.trajectory import EpisodeResult

    def result(outcome):
        return EpisodeResult(
            episode_id="ep-0", task_id="t", env_id="X-v0", actions=[], outcome=outcome
        )

    assert result({"reward": 1.0}).succeeded
    assert not result({"reward": 0.5}).succeeded
    assert not result({"reward": 1.0, "correct": False}).succeeded
    assert result({"success": True, "reward": 0.0}).succeeded
