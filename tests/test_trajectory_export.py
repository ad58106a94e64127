"""The trajectory export: OpenAI-style ``messages``/``completion`` rows and their loader."""

from __future__ import annotations

import json
import math

import pytest

from mappa_agents.trajectory import ActionSample, load_jsonl, load_trajectories, save_jsonl


def _sample(step: int, reward: float = 0.5) -> ActionSample:
    return ActionSample(
        episode_id="ep-00000",
        task_id="t0",
        env_id="MathChat-v0",
        agent="problem_solver",
        turn=0,
        step=step,
        policy="tiny",
        messages=[{"role": "system", "content": "Solve."}, {"role": "user", "content": "1+1?"}],
        text=f"\\boxed{{{step}}}",
        reasoning=None,
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        finish_reason="stop",
        reward=reward,
        reward_valid=not math.isnan(reward),
        coach={"score": 5.0, "valid": True, "reward": 0.5},
        outcome={"correct": True, "reward": 1.0},
        sampling={"temperature": 0.6},
    )


def test_rows_carry_messages_and_completion_and_round_trip(tmp_path):
    samples = [_sample(0), _sample(1, reward=math.nan)]
    path = save_jsonl(tmp_path / "t.jsonl", samples)
    rows = load_trajectories(path)
    assert [r["completion"] for r in rows] == ["\\boxed{0}", "\\boxed{1}"]
    assert rows[0]["messages"][1] == {"role": "user", "content": "1+1?"}
    assert rows[0]["prompt_ids"] == [1, 2, 3]
    assert rows[0]["response_ids"] == [4, 5]
    assert rows[1]["reward"] is None  # NaN is written as null
    loaded = load_jsonl(path)  # the dataclass loader ignores the added field
    assert loaded[0] == samples[0]
    assert math.isnan(loaded[1].reward)
    assert load_trajectories(tmp_path) == rows  # a directory: its *.jsonl files
    assert len(load_trajectories([path, path])) == 4


def test_old_rows_without_completion_still_load(tmp_path):
    row = json.loads(_sample(0).to_json())
    del row["completion"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(row) + "\n")
    [loaded] = load_trajectories(path)
    assert loaded["completion"] == loaded["text"] == "\\boxed{0}"
    assert load_jsonl(path)[0].text == "\\boxed{0}"


def test_loader_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(_sample(0).to_json() + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_trajectories(path)
    with pytest.raises(FileNotFoundError):
        load_trajectories(tmp_path / "missing.jsonl")


def test_as_dataset_gives_a_datasets_dataset(tmp_path):
    pytest.importorskip("datasets")
    path = save_jsonl(tmp_path / "t.jsonl", [_sample(0), _sample(1)])
    dataset = load_trajectories(path, as_dataset=True)
    assert len(dataset) == 2
    assert dataset[1]["completion"] == "\\boxed{1}"
    assert dataset[0]["messages"][0]["role"] == "system"
    assert dataset[0]["response_ids"] == [4, 5]
