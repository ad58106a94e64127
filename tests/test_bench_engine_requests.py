"""bench_engine_requests on CPU: every engine and call is timed over a stand-in vLLM."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import bench_engine_requests as bench
from benchmarks.bench_rollout_overhead import (
    FIRST_WORD_ID,
    instant_reply,
    instant_vllm,
    vllm_module,
)


def test_every_engine_and_call_is_timed_against_the_baseline(tmp_path):
    from transformers import AutoTokenizer

    from mappa_agents.tiny_models import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir(tmp_path / "tokenizer"))
    reply = instant_reply(8, FIRST_WORD_ID + 64)
    argv = ["--model", "tiny", "--samples", "3,5", "--max-new-tokens", "8", "--repeats", "2"]
    argv += ["--processes", "one", "--out", str(tmp_path / "out"), "--name", "engines"]
    with vllm_module(instant_vllm(tokenizer, reply)):
        payload = bench.main(argv)
    calls = {(row["engine"], row["call"], row["samples"]): row for row in payload["rows"]}
    for engine, (_, _, kinds) in bench.ENGINES.items():
        for kind in kinds:
            for size in (3, 5):
                assert (engine, kind, size) in calls
                measured = payload["engines"][engine]["calls"][f"{kind}@{size}"]
                assert measured["tokens"] == 8 * size  # every prompt's reply was counted
                assert len(measured["all_seconds"]) == 2
    assert calls[("mappa", "unseeded", 3)]["vs mappa unseeded"] == 1.0
    saved = json.loads((tmp_path / "out" / "engines.json").read_text())
    assert saved["rows"] == payload["rows"]


def test_time_calls_takes_the_median_after_a_warm_up():
    ticks = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])
    made = iter([99, 10, 10, 10])
    figures = bench.time_calls(lambda: next(made), 3, clock=lambda: next(ticks))
    assert figures["all_seconds"] == [1.0, 3.0, 2.0]
    assert figures["seconds"] == 2.0
    assert figures["tokens_per_s"] == 5.0
