"""Tests for benchmarks/base_rates.py: its statistics, records and scripted upstream."""

from __future__ import annotations

import re

import pytest

import mappa_env
from benchmarks.base_rates import (
    CANDIDATES,
    episode_record,
    merge_rows,
    oracle_upstream,
    summarize_records,
    wilson_interval,
)
from mappa_agents.policy import SamplingParams
from mappa_agents.runner import RolloutRunner
from mappa_agents.scripted import ScriptedPolicy
from mappa_agents.system import AgentSystem
from mappa_env.tasks import generate_math_tasks
from tests.fakes import InProcessSandbox


def test_wilson_interval_known_values():
    # No success in n: the upper end is z^2 / (n + z^2).
    low, high = wilson_interval(0, 64)
    assert low == 0.0
    assert high == pytest.approx(1.959964**2 / (64 + 1.959964**2), rel=1e-6)
    # 5 of 64 (Wilson, z = 1.96): 3.4% to 17.0%.
    low, high = wilson_interval(5, 64)
    assert (round(low, 3), round(high, 3)) == (0.034, 0.17)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_merge_rows_replaces_same_candidate_temperature_and_upstream():
    old = [
        {"candidate": "a", "temperature": 1.0, "rate": 0.1},
        {"candidate": "a", "temperature": 0.6, "rate": 0.2},
    ]
    new = [
        {"candidate": "a", "temperature": 1.0, "upstream": "model", "rate": 0.3},
        {"candidate": "a", "temperature": 1.0, "upstream": "oracle", "rate": 0.4},
    ]
    merged = merge_rows(old, new)
    assert [row["rate"] for row in merged] == [0.3, 0.2, 0.4]


def test_candidates_are_generator_specs_with_a_pinned_secret():
    for spec in CANDIDATES.values():
        assert spec["secret"] == ""
        tasks = generate_math_tasks(
            4, seed=spec["seed"], kinds=spec["kinds"], difficulty=spec["difficulty"], secret=""
        )
        assert len(tasks) == 4
    train = {t.prompt for t in generate_math_tasks(512, **_args(CANDIDATES["word4-easy"]))}
    assert len(train) == 512
    heldout_spec = _args(CANDIDATES["word4-easy-heldout"])
    heldout = {t.prompt for t in generate_math_tasks(128, **heldout_spec)}
    assert len(heldout) == 128
    assert not heldout & train
    one_step = {t.prompt for t in generate_math_tasks(512, **_args(CANDIDATES["one-step-easy"]))}
    one_step_heldout_spec = _args(CANDIDATES["one-step-easy-heldout"])
    one_step_heldout = {t.prompt for t in generate_math_tasks(128, **one_step_heldout_spec)}
    assert len(one_step) == 512
    assert len(one_step_heldout) == 128
    assert not one_step & one_step_heldout
    out_of_family = CANDIDATES["word2-easy-heldout"]["kinds"]
    assert not set(out_of_family) & set(CANDIDATES["word4-easy"]["kinds"])


def _args(spec: dict) -> dict:
    return {k: spec[k] for k in ("seed", "kinds", "difficulty", "secret")}


def test_oracle_upstream_prints_the_answer_and_records_show_the_chain():
    tasks = generate_math_tasks(4, seed=0, kinds=["word_totals"], difficulty=1, secret="")

    def verifier(messages: list[dict[str, str]]) -> str:
        # The last number of the code output it was shown: boxed for the first two
        # tasks, plain for the others (which only a lenient grader counts).
        output = messages[-1]["content"].split("Output of its last code run:")[1]
        number = re.findall(r"-?\d+", output)[-1]
        if any(task.prompt in messages[-1]["content"] for task in tasks[:2]):
            return "The final answer is \\boxed{" + number + "}"
        return f"The final answer is {number}."

    system = AgentSystem({**oracle_upstream(tasks), "verifier": ScriptedPolicy(verifier)})
    runner = RolloutRunner(
        lambda: mappa_env.make(
            "MathChat-v0",
            tasks=tasks,
            sandbox=InProcessSandbox,
            verifier_reply="one_line",
            max_new_tokens=256,
        ),
        system,
        SamplingParams(max_new_tokens=16),
        concurrency=2,
        progress=False,
    )
    episodes = runner.run(4, [{"task_id": t.id} for t in tasks])
    records = [episode_record(e) for e in episodes]
    assert [r["correct"] for r in records] == [True, True, False, False]
    assert [r["boxed"] for r in records] == [True, True, False, False]
    assert all(r["lenient_correct"] and r["answer_printed"] for r in records)
    assert all(r["verifier_states_answer"] for r in records)
    assert records[2]["verifier_reply"].startswith("The final answer is ")
    assert all(r["last_code"].strip() == f"print({r['answer']})" for r in records)
    assert all(r["last_stdout"].strip() == r["answer"] for r in records)
    assert all(r["code_turns"] == 2 and r["code_turns_with_code"] == 1 for r in records)
    # The verifier is shown neither the answer in the executor's words nor the draft's.
    verifier_prompts = [
        a.messages[-1]["content"] for e in episodes for a in e.actions if a.agent == "verifier"
    ]
    assert all(
        "\\boxed" not in p.split("Output of its last code run:")[0] for p in verifier_prompts
    )
    summary = summarize_records(records)
    assert summary["successes"] == 2
    assert summary["lenient"]["successes"] == 4
    assert summary["per_kind"]["word_totals"]["episodes"] == 4
    assert summary["chain"]["answer_printed"] == 1.0
