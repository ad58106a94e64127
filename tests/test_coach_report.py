"""Coach bias and calibration report on synthetic records with known structure."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from mappa_env.coach.report import OVERALL, coach_report


def synthetic_records(
    *,
    n: int = 240,
    regression_bonus: float = 0.0,
    regression_success_rate: float = 0.5,
    seed: int = 0,
) -> list[dict]:
    """Analyst actions on classification and regression tasks.

    A good action (outcome True) scores about 7, a bad one about 4; regression actions
    get ``regression_bonus`` extra points whatever their quality.
    """
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        task_type = "regression" if i % 2 else "classification"
        rate = regression_success_rate if task_type == "regression" else 0.5
        outcome = bool(rng.random() < rate)
        score = 4.0 + 3.0 * outcome + rng.normal(0.0, 0.8)
        if task_type == "regression":
            score += regression_bonus
        records.append(
            {
                "agent": "analyst",
                "score": float(np.clip(score, 0.0, 10.0)),
                "valid": True,
                "task_type": task_type,
                "task_id": f"task-{i % 12}",
                "outcome": outcome,
                "step": i // 24,
            }
        )
    return records


def test_paper_regression_bias_is_flagged():
    # The paper's failure: regression actions scored ~1 point above similar
    # classification actions.
    report = coach_report(synthetic_records(regression_bonus=1.0), bias_threshold=0.5)
    [finding] = report.bias
    assert (finding.task_type_a, finding.task_type_b) == ("classification", "regression")
    assert finding.flagged
    assert finding.tested_gap < -0.5  # classification minus regression
    assert finding.ci_high < 0
    assert finding.p_value < 0.01
    assert report.flagged_bias == [finding]
    assert "**BIASED**" in report.to_markdown()


def test_no_bias_is_not_flagged():
    report = coach_report(synthetic_records(regression_bonus=0.0))
    [finding] = report.bias
    assert not finding.flagged
    assert abs(finding.tested_gap) < 0.5


def test_gap_from_real_quality_difference_is_not_bias():
    # Regression actions succeed more often, so they score higher on average, but
    # equal-outcome actions get equal scores: the matched gap is near zero.
    records = synthetic_records(n=400, regression_bonus=0.0, regression_success_rate=0.9)
    report = coach_report(records)
    [finding] = report.bias
    assert finding.gap < -0.5  # the raw gap is large...
    assert abs(finding.matched_gap) < 0.3  # ...but not between like actions
    assert not finding.flagged


def test_small_real_bias_below_threshold_is_not_flagged():
    report = coach_report(synthetic_records(n=600, regression_bonus=0.3), bias_threshold=0.5)
    assert not report.bias[0].flagged
    lower = coach_report(synthetic_records(n=600, regression_bonus=0.3), bias_threshold=0.2)
    assert lower.bias[0].flagged


def test_raw_gap_is_tested_without_outcomes():
    records = synthetic_records(regression_bonus=1.0)
    for record in records:
        record.pop("outcome")
    finding = coach_report(records).bias[0]
    assert finding.matched_gap is None
    assert finding.tested_gap == finding.gap
    assert finding.flagged


def test_score_statistics_match_numpy():
    records = synthetic_records()
    records[0]["score"] = None
    records[0]["valid"] = False
    records[1]["valid"] = False  # a score with valid=False is not counted
    report = coach_report(records)
    scores = np.array([r["score"] for r in records[2:]])
    stats = report.per_agent["analyst"]
    assert stats.count == len(records)
    assert stats.n_valid == len(records) - 2
    assert stats.invalid_rate == pytest.approx(2 / len(records))
    assert stats.mean == pytest.approx(scores.mean())
    assert stats.std == pytest.approx(scores.std(ddof=1))
    assert stats.median == pytest.approx(np.median(scores))
    assert report.per_agent[OVERALL].count == len(records)
    by_type = report.per_agent_task_type["analyst"]
    assert set(by_type) == {"classification", "regression"}
    assert by_type["regression"].count + by_type["classification"].count == len(records)


def test_auroc_matches_sklearn_and_is_none_for_one_class():
    records = synthetic_records()
    report = coach_report(records)
    expected = roc_auc_score([r["outcome"] for r in records], [r["score"] for r in records])
    assert report.auroc["analyst"] == pytest.approx(expected)
    assert report.auroc[OVERALL] == pytest.approx(expected)
    assert report.auroc["analyst"] > 0.9  # scores were built to track the outcome
    one_class = [dict(r, outcome=True) for r in records]
    assert coach_report(one_class).auroc["analyst"] is None


def test_float_outcomes_are_split_at_one_half():
    records = [
        {"agent": "modeler", "score": s, "outcome": o}
        for s, o in [(2, 0.1), (3, 0.4), (7, 0.6), (8, 0.9), (5, 0.55), (4, 0.45)]
    ]
    assert coach_report(records).auroc["modeler"] == 1.0


def test_drift_slope_and_buckets():
    rng = np.random.default_rng(3)
    steps = np.repeat(np.arange(20), 5)
    scores = np.clip(3.0 + 0.2 * steps + rng.normal(0, 0.3, len(steps)), 0, 10)
    records = [
        {"agent": "verifier", "score": float(s), "step": int(t)} for s, t in zip(scores, steps)
    ]
    drift = coach_report(records, n_step_buckets=5).drift["verifier"]
    expected_slope = np.polyfit(steps, scores, 1)[0]
    assert drift.slope == pytest.approx(expected_slope)
    assert drift.slope_p_value < 1e-6
    assert len(drift.buckets) == 5
    assert sum(b["count"] for b in drift.buckets) == len(records)
    means = [b["mean"] for b in drift.buckets]
    assert means == sorted(means)


def test_records_without_steps_have_no_drift():
    report = coach_report([{"agent": "a", "score": 5.0}, {"agent": "a", "score": 6.0}])
    assert report.drift == {}
    assert report.bias == []


def test_to_dict_is_json_and_markdown_has_tables():
    report = coach_report(synthetic_records(regression_bonus=1.0))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["n_records"] == 240
    assert data["flagged_bias"][0]["agent"] == "analyst"
    assert "scores" not in data
    markdown = report.to_markdown()
    assert "| analyst | classification |" in markdown
    assert "AUROC" in markdown


def test_record_without_agent_is_rejected():
    with pytest.raises(ValueError, match="agent"):
        coach_report([{"score": 5.0}])


def test_plot_writes_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    report = coach_report(synthetic_records(regression_bonus=1.0))
    path = report.plot(tmp_path / "coach.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_records_from_recorded_actions_feed_the_report():
    from mappa_env.coach.report import records_from_actions

    rows = [
        {
            "agent": "analyst",
            "task_id": f"t{i}",
            "coach": {"score": 8.0 if i % 2 else 3.0, "valid": True},
            "outcome": {"reward": 1.0 if i % 2 else 0.0, "task_type": "regression"},
        }
        for i in range(10)
    ]
    rows.append({"agent": "modeler", "coach": {"score": None, "valid": False}, "outcome": {}})
    rows.append({"agent": "modeler", "coach": None, "outcome": {}})  # never judged: skipped
    records = records_from_actions(rows, step=4)
    assert len(records) == 11
    assert records[-1] == {
        "agent": "modeler",
        "score": None,
        "valid": False,
        "task_id": None,
        "task_type": None,
        "outcome": None,
        "step": 4,
    }
    report = coach_report(records)
    assert report.auroc["analyst"] == 1.0
