"""``benchmarks.bench_rollout_overhead`` on small sizes: the figures and the file."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from benchmarks import bench_rollout_overhead as bench


def test_small_sizes_give_a_row_per_size_and_leave_no_stand_in_behind(tmp_path, capsys):
    before = sys.modules.get("vllm")
    argv = ["--samples", "4,8", "--samples-per-prompt", "2", "--max-new-tokens", "8",
            "--warmup-steps", "0", "--steps", "2", "--vocab", "64"]  # fmt: skip
    summary = bench.main([*argv, "--out", str(tmp_path)])
    rows = summary["rows"]
    assert [row["samples"] for row in rows] == [4, 8]
    for row in rows:
        assert row["rollout_s"] > 0
        assert row["best_s"] <= row["rollout_s"]
        assert row["policy_s"] + row["env_runner_s"] == pytest.approx(row["rollout_s"], abs=1e-3)
        assert row["jsonl_s"] > 0
    written = json.loads((tmp_path / "rollout_overhead.json").read_text())
    assert written["rows"] == rows
    assert len(written["steps"]["8"]) == 2
    assert "Rollout step without the engine" in capsys.readouterr().out
    # The stand-in engine was ``vllm`` only while the policy was built.
    assert sys.modules.get("vllm") is before


def test_the_instant_reply_has_a_logprob_per_token_and_is_cut_by_length():
    reply = bench.instant_reply(5, vocab=64)
    assert len(reply.token_ids) == len(reply.logprobs) == 5
    assert all(bench.FIRST_WORD_ID <= t < 64 for t in reply.token_ids)
    assert reply.text.split() == [f"w{t}" for t in reply.token_ids]
    assert reply.finish_reason == "length"


def test_a_size_that_is_not_whole_groups_is_refused():
    with pytest.raises(ValueError, match="whole groups"):
        bench.measure(6, samples_per_prompt=4, max_new_tokens=4, warmup_steps=0, steps=1, vocab=64)
