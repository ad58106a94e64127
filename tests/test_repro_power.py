"""The power script of the decided test: its table, its false positives, the decided seeds."""

from __future__ import annotations

import json

import pytest

from benchmarks import repro_power


def test_the_script_writes_the_table_on_a_tiny_setting(tmp_path, capsys):
    argv = ["--datasets", "60", "--seeds", "4,6", "--spreads", "0,1", "--out", str(tmp_path)]
    assert repro_power.main(argv) == 0
    data = json.loads((tmp_path / "repro_power.json").read_text())
    assert data["decided"] == {
        "problems": 32, "samples": 4, "seeds": 10, "alpha": 0.05, "min_difference": 0.05,
    }  # fmt: skip
    rows = {(r["spread"], r["seeds"]): r for r in data["rows"]}
    assert set(rows) == {(0.0, 4), (0.0, 6), (1.0, 4), (1.0, 6)}
    # 4 seeds cannot reach p < 0.05 (the smallest p is 1/16): nothing is detectable.
    assert rows[(0.0, 4)]["detectable_gain"] is None
    assert rows[(0.0, 4)]["power_at_target_gain"] == 0.0
    # Agreeing seeds detect a smaller gain than spread ones.
    assert rows[(0.0, 6)]["detectable_gain"] < rows[(1.0, 6)]["detectable_gain"]
    printed = capsys.readouterr().out
    assert "gain (points) detected with 80% power" in printed
    assert "6 seeds" in printed


def test_with_no_gain_the_decided_rule_rarely_meets_its_goal():
    for spread in (0.0, 2.0):
        experiments = repro_power.Experiments(
            seeds=6, spread=spread, problems=32, samples=4, datasets=400, rng_seed=1
        )
        assert experiments.power(0.0, alpha=0.05, min_difference=0.0) <= 0.05
        assert experiments.power(0.3, 0.05, 0.05) > experiments.power(0.05, 0.05, 0.05)


def test_the_decided_seeds_detect_ten_points_at_one_logit_with_80_percent_power():
    settings = repro_power.decided_settings(repro_power.DEFAULT_CONFIG)
    experiments = repro_power.Experiments(
        seeds=settings["seeds"],
        spread=1.0,
        problems=settings["problems"],
        samples=settings["samples"],
        datasets=500,
    )
    power = experiments.power(0.10, settings["alpha"], settings["min_difference"])
    assert power == pytest.approx(0.9, abs=0.03)  # 0.906 over 2,000 experiments
    assert power >= 0.8


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit):
        repro_power.parse_args(["--spreads", "a"])
    assert "--spreads takes comma-separated numbers >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        repro_power.parse_args(["--base-accuracy", "0.95"])
    assert "--base-accuracy" in capsys.readouterr().err
