"""``benchmarks.bench_async_rollouts --quick``: a row per schedule and the file."""

from __future__ import annotations

import json

from benchmarks import bench_async_rollouts as bench


def test_quick_run_compares_every_schedule_on_the_same_replies(tmp_path, capsys):
    payload = bench.main(["--quick", "--out", str(tmp_path)])
    rows = {row["schedule"]: row for row in payload["rows"]}
    assert set(rows) == {"ticks", "continuous", "episodes"}
    # Replies are a function of the prompt: every schedule decodes the same tokens.
    assert len({row["tokens"] for row in rows.values()}) == 1
    assert all(row["aborted"] == 0 and row["decode_ticks"] > 0 for row in rows.values())
    assert rows["episodes"]["s_per_step_over_episodes"] == 1.0
    written = json.loads((tmp_path / "async_rollouts.json").read_text())
    assert written["rows"] == json.loads(json.dumps(payload["rows"]))
    assert "faster than ticks" in capsys.readouterr().out
