"""Statistics of the reproduction experiment: hand-computed numbers, edge cases, determinism."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from benchmarks import repro_stats as rs
from benchmarks._common import print_table

STEP, SET = 40, "in_family"


def evaluation(arm, seed, correct, samples=4, step=STEP, task_set=SET):
    """Records of one evaluation: ``correct[t]`` of ``samples`` samples right on problem t."""
    return [
        {"arm": arm, "seed": seed, "step": step, "task_set": task_set, "task_id": f"p{t}",
         "sample": k, "correct": k < c, "scores": {"problem_solver": 7.0, "verifier": None}}
        for t, c in enumerate(correct)
        for k in range(samples)
    ]  # fmt: skip


# ---------------------------------------------------------------- records and accuracy


def test_the_problem_is_the_unit_not_the_episode():
    # p0: 1 sample, right; p1: 3 samples, all wrong. Episodes: 1 of 4 = 0.25; problems: 0.5.
    records = evaluation("process", 0, [1], samples=1) + [
        {**r, "task_id": "p1", "correct": False} for r in evaluation("process", 0, [0], samples=3)
    ]
    key = ("process", 0, STEP, SET)
    assert rs.problem_accuracy(records) == {key: {"p0": 1.0, "p1": 0.0}}
    assert rs.seed_accuracy(records) == {key: 0.5}


def test_accuracy_keeps_evaluations_apart():
    records = (
        evaluation("process", 0, [4, 0])  # 0.5
        + evaluation("process", 0, [1, 1], step=0)  # 0.25, the untrained system
        + evaluation("process", 0, [4, 4], task_set="out_of_family")  # 1.0
        + evaluation("outcome", 1, [3, 0])  # 0.375
    )
    assert rs.seed_accuracy(records) == {
        ("process", 0, STEP, SET): 0.5,
        ("process", 0, 0, SET): 0.25,
        ("process", 0, STEP, "out_of_family"): 1.0,
        ("outcome", 1, STEP, SET): 0.375,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"correct": 1}, "record 3 (arm='process', seed=0, step=40, task_id='p0'): field "
                         "'correct' must be bool, got 1"),
        ({"seed": True}, "field 'seed' must be int, got True"),
        ({"seed": "0"}, "field 'seed' must be int, got '0'"),
        ({"scores": [7]}, "field 'scores' must be dict"),
        ({"scores": {"verifier": 11}}, "'scores': 'verifier' must be 0 to 10 or None, got 11"),
        ({"scores": {"verifier": float("nan")}}, "'verifier' must be 0 to 10 or None, got nan"),
        ({"sample": 0}, "record 3 (arm='process', seed=0, step=40, task_id='p0'): same sample "
                        "of the same evaluation as record 0"),
    ],
)  # fmt: skip
def test_a_bad_record_is_named_with_its_field(change, message):
    records = evaluation("process", 0, [1])
    records[3] = {**records[3], **change}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rs.validate_records(records)


def test_missing_fields_empty_records_and_non_dicts_are_clear_errors():
    record = evaluation("outcome", 2, [1])[0]
    del record["task_set"]
    with pytest.raises(ValueError, match=r"record 0 \(arm='outcome', seed=2, step=40, task_id="
                                         r"'p0'\): missing field 'task_set'"):  # fmt: skip
        rs.validate_records([record])
    with pytest.raises(ValueError, match="no evaluation records"):
        rs.problem_accuracy([])
    with pytest.raises(ValueError, match="record 0: expected a dict, got list"):
        rs.validate_records([["process"]])
    # numpy scalars, as a data frame hands them back, are accepted
    ok = {**record, "task_set": SET, "seed": np.int64(2), "correct": np.bool_(True)}
    assert rs.validate_records([ok]) == [ok]


# ---------------------------------------------------------------- paired seed differences


def test_paired_differences_use_shared_seeds_and_say_which_were_dropped():
    records = (
        evaluation("process", 0, [4, 4])
        + evaluation("process", 1, [4, 2])  # 0.75
        + evaluation("process", 2, [1, 0, 4])  # over shared p0, p1: 0.125
        + evaluation("outcome", 1, [2, 2])  # 0.5
        + evaluation("outcome", 2, [0, 1])  # 0.125
        + evaluation("outcome", 3, [0, 0])
    )
    paired = rs.paired_seed_differences(records, "process", "outcome", STEP, SET)
    assert paired["differences"] == {1: 0.25, 2: 0.0}
    assert paired["dropped_seeds"] == {"process": [0], "outcome": [3]}
    assert paired["unpaired_problems"] == {2: 1}  # p2 of process in seed 2
    np.testing.assert_array_equal(paired["by_problem"][2], [0.25, -0.25])


def test_pairing_errors_say_what_is_there():
    records = evaluation("process", 0, [1]) + evaluation("outcome", 1, [1])
    with pytest.raises(ValueError, match=r"'process' \(seeds \[0\]\) and 'outcome' \(seeds \[1\]\)"
                                         " share no seed"):  # fmt: skip
        rs.paired_seed_differences(records, "process", "outcome", STEP, SET)
    with pytest.raises(
        ValueError,
        match=r"no records of arm 'agent_oracle' at step 40 on task "
        r"set 'in_family'; .*\('outcome', 40, 'in_family'\)",
    ):
        rs.paired_seed_differences(records, "process", "agent_oracle", STEP, SET)  # fmt: skip
    with pytest.raises(ValueError, match="no records of arm 'process' at step 10"):
        rs.paired_seed_differences(records, "process", "outcome", 10, SET)


# ---------------------------------------------------------------- exact tests


def brute_force_wilcoxon(d):
    """Two-sided signed-rank p by enumerating every sign flip (zeros dropped, midranks)."""
    d = np.round(np.asarray(d, dtype=float), 12)
    d = d[d != 0]
    ranks = stats.rankdata(np.abs(d))
    centre, observed = ranks.sum() / 2, ranks[d > 0].sum()
    flips = itertools.product([False, True], repeat=len(d))
    extreme = sum(
        abs(ranks[list(f)].sum() - centre) >= abs(observed - centre) - 1e-9 for f in flips
    )
    return extreme / 2 ** len(d)


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 10])
def test_all_seeds_favouring_one_arm_give_two_to_the_one_minus_n(n):
    result = rs.exact_paired_tests([0.01 * (i + 1) for i in range(n)])
    assert result["sign_p"] == pytest.approx(2.0 ** (1 - n))
    assert result["wilcoxon_p"] == pytest.approx(2.0 ** (1 - n))
    assert (result["n"], result["positives"], result["negatives"]) == (n, n, 0)
    negative = rs.exact_paired_tests({s: -0.1 * (s + 1) for s in range(n)})
    assert negative["sign_p"] == pytest.approx(2.0 ** (1 - n))


def test_exact_tests_drop_zero_differences_and_match_hand_counts():
    # Zero dropped: n = 5, 4 up, 1 down. Sign: 2 * P(B <= 1) = 2 * 6 / 32 = 0.375.
    # Wilcoxon: |d| ranks 0.05 -> 1, 0.1 -> 2, ...; T- = 1, P(T <= 1) = 2 / 32, two-sided 0.125.
    result = rs.exact_paired_tests([0.1, 0.0, -0.05, 0.2, 0.3, 0.4])
    assert result["sign_p"] == pytest.approx(0.375)
    assert result["wilcoxon_p"] == pytest.approx(0.125)
    assert result["wilcoxon_statistic"] == 1.0
    assert (result["n_pairs"], result["n"], result["ties"]) == (6, 5, 1)
    assert result["zero_method"] == "wilcox"
    assert result["wilcoxon_method"] == "exact"


def test_tied_differences_enumerate_every_sign_flip():
    # scipy's exact table ignores ties (it gives 0.09375 here); midranks 2, 2, 2, 4, 5, 6
    # with T- = 2: 4 + 4 of the 64 flips are as extreme -> 0.125.
    tied = [0.1, 0.1, -0.1, 0.2, 0.3, 0.4]
    result = rs.exact_paired_tests(tied)
    assert result["wilcoxon_p"] == pytest.approx(0.125)
    assert result["wilcoxon_method"] == "exact, all sign flips (tied |d|)"
    # Differences equal up to float noise (0.3 - 0.25 and 0.05) are ties too.
    noisy = [0.3 - 0.25, -0.05, 0.2, 0.05, -0.1, 0.4, 0.0]
    assert rs.exact_paired_tests(noisy)["wilcoxon_p"] == pytest.approx(brute_force_wilcoxon(noisy))
    assert rs.exact_paired_tests(noisy)["wilcoxon_method"].startswith("exact, all sign flips")
    rng = np.random.default_rng(3)
    for _ in range(20):
        d = rng.integers(-3, 4, size=int(rng.integers(1, 9))) / 8
        expected = brute_force_wilcoxon(d) if d.any() else 1.0
        assert rs.exact_paired_tests(d)["wilcoxon_p"] == pytest.approx(expected)


def test_exact_tests_without_evidence():
    assert rs.exact_paired_tests([0.0, 0.0])["sign_p"] == 1.0
    assert rs.exact_paired_tests([0.0, 0.0])["wilcoxon_p"] == 1.0
    single = rs.exact_paired_tests({3: 0.2})  # one seed: p = 2^0 = 1
    assert single["sign_p"] == 1.0
    assert single["wilcoxon_p"] == 1.0
    with pytest.raises(ValueError, match="no paired differences"):
        rs.exact_paired_tests([])
    with pytest.raises(ValueError, match="must be finite"):
        rs.exact_paired_tests([0.1, float("nan")])


# ---------------------------------------------------------------- arm summary


def test_arm_summary_reports_every_seed_with_mean_and_median():
    records = (
        evaluation("outcome", 0, [1, 1])  # 0.25
        + evaluation("outcome", 1, [2, 2])  # 0.5
        + evaluation("outcome", 5, [4, 4])  # 1.0
        + evaluation("outcome", 6, [4, 4], step=0)  # another step: not counted
    )
    summary = rs.arm_summary(records, "outcome", STEP, SET)
    assert summary["seeds"] == {0: 0.25, 1: 0.5, 5: 1.0}
    assert summary["mean"] == pytest.approx(1.75 / 3)
    assert (summary["median"], summary["min"], summary["max"], summary["n"]) == (0.5, 0.25, 1.0, 3)
    one = rs.arm_summary(records, "outcome", 0, SET)
    assert (one["mean"], one["median"], one["n"]) == (1.0, 1.0, 1)


# ---------------------------------------------------------------- hierarchical bootstrap


def loop_bootstrap(by_problem, resamples, seed, confidence=0.95):
    """The documented draws, one resample, one seed and one problem at a time."""
    rng = np.random.default_rng(seed)
    n_seeds, width = len(by_problem), max(len(d) for d in by_problem)
    seed_draws = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    uniforms = rng.random((resamples, n_seeds, width))
    means = []
    for r in range(resamples):
        per_seed = []
        for j, s in enumerate(seed_draws[r]):
            problems = by_problem[s]
            picks = [int(uniforms[r, j, i] * len(problems)) for i in range(len(problems))]
            per_seed.append(sum(problems[p] for p in picks) / len(problems))
        means.append(sum(per_seed) / n_seeds)
    tail = (1 - confidence) / 2
    return np.quantile(means, [tail, 1 - tail])


def test_bootstrap_matches_a_plain_loop_on_ragged_seeds(monkeypatch):
    # Seeds with 2, 3 and 5 shared problems; small blocks so that several are drawn.
    monkeypatch.setattr(rs, "BOOTSTRAP_BLOCK", 7)
    a = evaluation("process", 0, [4, 1]) + evaluation("process", 1, [0, 3, 2])
    a += evaluation("process", 2, [1, 1, 4, 0, 2])
    b = evaluation("outcome", 0, [2, 1]) + evaluation("outcome", 1, [1, 0, 2])
    b += evaluation("outcome", 2, [0, 3, 4, 1, 0])
    result = rs.hierarchical_bootstrap(a + b, "process", "outcome", STEP, SET, 500, seed=11)
    by_problem = [[0.5, 0.0], [-0.25, 0.75, 0.0], [0.25, -0.5, 0.0, -0.25, 0.5]]
    low, high = loop_bootstrap(by_problem, 500, seed=11)
    assert result["low"] == pytest.approx(low, abs=1e-12)
    assert result["high"] == pytest.approx(high, abs=1e-12)
    assert result["estimate"] == pytest.approx((0.25 + 0.5 / 3 + 0.0) / 3)
    assert low < result["estimate"] < high


def test_identical_arms_give_a_degenerate_interval_at_zero():
    records = []
    for seed, correct in enumerate([[0, 4, 2, 1], [3, 3, 0, 4], [1, 2, 2, 2]]):
        records += evaluation("process", seed, correct) + evaluation("outcome", seed, correct)
    result = rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET)
    assert (result["estimate"], result["low"], result["high"]) == (0.0, 0.0, 0.0)
    assert (result["resamples"], result["seed"], result["confidence"]) == (10_000, 0, 0.95)


def test_a_constant_shift_on_every_problem_gives_exactly_that_interval():
    # Problems of any difficulty, +1 of 4 samples each: pairing by problem leaves no spread.
    rng = np.random.default_rng(0)
    records = []
    for seed in range(6):
        base = rng.integers(0, 4, size=64)
        records += evaluation("process", seed, base + 1) + evaluation("outcome", seed, base)
    result = rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET)
    assert (result["estimate"], result["low"], result["high"]) == (0.25, 0.25, 0.25)


def test_seed_spread_alone_gives_the_hand_computed_interval():
    # Seed 0 differs by 0 on every problem, seed 1 by 0.5: D* is 0, 0.25 or 0.5 with
    # chances 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles are 0 and 0.5.
    records = evaluation("process", 0, [1, 3]) + evaluation("outcome", 0, [1, 3])
    records += evaluation("process", 1, [2, 4]) + evaluation("outcome", 1, [0, 2])
    result = rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET)
    assert (result["estimate"], result["low"], result["high"]) == (0.25, 0.0, 0.5)
    narrower = rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET, confidence=0.4)
    assert (narrower["low"], narrower["high"]) == (0.25, 0.25)


def six_seeds(shift=0.1, problems=64, samples=4, arms=("process", "outcome"), seeds=range(6)):
    """Records of arms whose chance of a right sample is 0.4 plus ``shift`` per arm index."""
    rng = np.random.default_rng(5)
    records = []
    for index, arm in enumerate(arms):
        for seed in seeds:
            chance = 0.4 + shift * (len(arms) - 1 - index)
            records += evaluation(arm, seed, rng.binomial(samples, chance, problems), samples)
    return records


def test_bootstrap_is_deterministic():
    records = six_seeds()  # 10,000 resamples of 6 seeds x 64 problems (x 4 samples)
    first = rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET)
    assert first == rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET)
    other = rs.hierarchical_bootstrap(records, "process", "outcome", STEP, SET, seed=1)
    assert (other["low"], other["high"]) != (first["low"], first["high"])
    assert other["estimate"] == first["estimate"]
    assert first["low"] < first["estimate"] < first["high"]


# ---------------------------------------------------------------- the void rule


def training_run(
    steps=10, episodes=32, success=0.25, kl=0.01, grad=1.5, agents=("solver", "coder")
):
    """Per-step metrics with the trainer's key names (mappa_train.trainer.learn); a None
    KL or gradient norm is not logged. The first step's KL is 0, as the trainer logs it
    (the policy is still the reference)."""
    run = []
    for step in range(steps):
        metrics = {"step": step + 1, "rollout/episodes": episodes, "lr": 1e-6,
                   "rollout/success_rate": success, "rollout/mean_reward": 0.3}  # fmt: skip
        for agent in agents:
            metrics[f"{agent}/mean_reward"] = 0.3
            if kl is not None:
                metrics[f"{agent}/kl"] = kl if step else 0.0
            if grad is not None:
                metrics[f"{agent}/grad_norm"] = grad
        run.append(metrics)
    return run


def test_an_arm_that_never_succeeded_is_void_with_its_counts():
    metrics = {
        "process": {s: training_run() for s in range(6)},
        "outcome": {s: training_run(success=0.0) for s in range(6)},
    }
    reasons = rs.void_reasons(metrics)
    assert reasons["process"] == []
    assert reasons["outcome"] == [
        "outcome: no training episode succeeded in any seed (0 of 1,920)",
        *(f"outcome seed {s}: 0 of 320 training episodes succeeded" for s in range(6)),
    ]


def test_zero_kl_zero_gradient_and_missing_runs_are_void():
    metrics = {
        "outcome": {0: training_run(), 1: training_run(kl=0.0), 2: training_run(grad=0.0)},
        "agent_oracle": {0: training_run(kl=0.0, grad=0.0), 1: training_run(kl=None)},
    }
    reasons = rs.void_reasons(metrics, seeds=[0, 1, 2])
    assert reasons["outcome"] == [
        "outcome: every logged KL is exactly 0 in seed 1",
        "outcome seed 1: all 20 logged KL values are 0",
        "outcome: every logged gradient norm is exactly 0 in seed 2",
        "outcome seed 2: all 20 logged gradient norm values are 0",
    ]
    assert reasons["agent_oracle"] == [
        "agent_oracle seed 2: no training metrics recorded",
        "agent_oracle: every logged KL is exactly 0 in seeds 0, 1",
        "agent_oracle seed 0: all 20 logged KL values are 0",
        "agent_oracle seed 1: no KL logged",
        "agent_oracle: every logged gradient norm is exactly 0 in seed 0",
        "agent_oracle seed 0: all 20 logged gradient norm values are 0",
    ]
    assert rs.void_reasons({"process": {}}) == {
        "process": ["process: no training metrics recorded"]
    }
    # one step of one agent with a KL is enough: the policy moved
    moved = training_run(kl=0.0)
    moved[-1]["coder/kl"] = 1e-9
    assert rs.void_reasons({"process": {0: moved}}) == {"process": []}


# ---------------------------------------------------------------- comparing arms


def test_comparison_meets_the_goal_only_with_enough_valid_seeds():
    arms = ("process", "outcome", "agent_oracle")
    records = six_seeds(shift=0.1, arms=arms)
    metrics = {arm: {s: training_run() for s in range(6)} for arm in arms}
    metrics["agent_oracle"] = {s: training_run(success=0.0) for s in range(6)}
    comparison = rs.compare_arms(records, metrics, arms, STEP, SET)
    assert comparison["treatment"] == "process"
    assert list(comparison["arms"]) == list(arms)
    versus_outcome, versus_oracle = comparison["pairs"]
    assert versus_outcome["other"] == "outcome"
    assert versus_outcome["seeds"] == list(range(6))
    assert versus_outcome["tests"]["positives"] == 6
    assert versus_outcome["tests"]["sign_p"] == pytest.approx(0.03125)
    assert not versus_outcome["void"]
    summary = comparison["arms"]
    assert versus_outcome["interval"]["estimate"] == pytest.approx(
        summary["process"]["mean"] - summary["outcome"]["mean"]
    )
    assert versus_outcome["verdict"]["met"], versus_outcome["verdict"]["why"]
    assert versus_outcome["verdict"]["checks"] == {
        "difference": True, "sign_test": True, "interval_excludes_0": True
    }  # fmt: skip
    # agent_oracle is better still, so the difference is negative, and the arm is void
    assert versus_oracle["void"]
    assert not versus_oracle["verdict"]["met"]
    assert versus_oracle["verdict"]["why"][0] == (
        "void: agent_oracle: no training episode succeeded in any seed (0 of 1,920)"
    )
    assert rs.compare_arms(records, metrics, arms, STEP, SET) == comparison


def test_comparison_with_fewer_than_six_seeds_or_a_weak_difference_is_not_met():
    records = six_seeds(shift=0.3, seeds=range(5))
    metrics = {arm: {s: training_run() for s in range(6)} for arm in ("process", "outcome")}
    pair = rs.compare_arms(records, metrics, ["process", "outcome"], STEP, SET)["pairs"][0]
    assert pair["tests"]["sign_p"] == pytest.approx(0.0625)  # 5 of 5: 2^-4
    assert pair["interval"]["low"] > 0.2
    assert not pair["verdict"]["met"]
    assert pair["verdict"]["why"] == [
        "5 paired seeds, fewer than the 6 the goal needs",
        "sign test p = 0.0625 is not below 0.05",
    ]
    # the treatment need not come first; the thresholds are arguments
    strict = rs.compare_arms(
        six_seeds(shift=0.1), metrics, ["outcome", "process"], STEP, SET,
        treatment="process", min_difference=0.5,
    )["pairs"][0]  # fmt: skip
    assert strict["other"] == "outcome"
    assert strict["verdict"]["checks"]["difference"] is False
    assert strict["verdict"]["why"][0].startswith("difference +0.")
    assert strict["verdict"]["thresholds"]["min_difference"] == 0.5
    with pytest.raises(ValueError, match="treatment 'x' is not one of the arms"):
        rs.compare_arms(records, metrics, ["process", "outcome"], STEP, SET, treatment="x")


def test_a_difference_of_exactly_five_points_counts_despite_float_noise():
    # Per seed 0.3 - 0.25 (0.04999... in floating point) on 20 problems with 20 samples.
    records, metrics = [], {}
    for seed in range(6):
        records += evaluation("process", seed, [6] * 20, samples=20)
        records += evaluation("outcome", seed, [5] * 20, samples=20)
    for arm in ("process", "outcome"):
        metrics[arm] = {s: training_run() for s in range(6)}
    pair = rs.compare_arms(records, metrics, ["process", "outcome"], STEP, SET)["pairs"][0]
    assert pair["interval"]["estimate"] == pytest.approx(0.05)
    assert pair["verdict"]["met"], pair["verdict"]["why"]


def test_void_counts_only_the_paired_seeds():
    # outcome's seed 7 never succeeded, but process has no seed 7: it is not in this test.
    records = six_seeds(shift=0.1) + evaluation("outcome", 7, [1, 1])
    metrics = {arm: {s: training_run() for s in range(6)} for arm in ("process", "outcome")}
    metrics["outcome"][7] = training_run(success=0.0)
    pair = rs.compare_arms(records, metrics, ["process", "outcome"], STEP, SET)["pairs"][0]
    assert pair["dropped_seeds"] == {"process": [], "outcome": [7]}
    assert not pair["void"]
    del metrics["process"][3]
    pair = rs.compare_arms(records, metrics, ["process", "outcome"], STEP, SET)["pairs"][0]
    assert pair["void_reasons"] == ["process seed 3: no training metrics recorded"]
    assert not pair["verdict"]["met"]


def test_table_rows_show_every_seed_and_each_pair(capsys):
    records = six_seeds(shift=0.1) + evaluation("process", 9, [4] * 64)
    metrics = {arm: {s: training_run() for s in range(10)} for arm in ("process", "outcome")}
    comparison = rs.compare_arms(records, metrics, ["process", "outcome"], STEP, SET)
    arm_rows, pair_rows = rs.format_comparison_table(comparison)
    assert list(arm_rows[0]) == ["arm", *(f"seed {s}" for s in (0, 1, 2, 3, 4, 5, 9)),
                                 "mean", "median", "n"]  # fmt: skip
    assert arm_rows[0]["seed 9"] == "100.0"
    assert arm_rows[1]["seed 9"] == "-"
    outcome = comparison["arms"]["outcome"]
    assert arm_rows[1]["seed 0"] == f"{100 * outcome['seeds'][0]:.1f}"
    assert arm_rows[1]["median"] == f"{100 * outcome['median']:.1f}"
    (row,) = pair_rows
    interval = comparison["pairs"][0]["interval"]
    assert row == {
        "pair": "process - outcome",
        "seeds": 6,
        "diff": f"{100 * interval['estimate']:+.1f}",
        "sign p": "0.03125",
        "wilcoxon p": "0.03125",
        "95% interval": f"[{100 * interval['low']:+.1f}, {100 * interval['high']:+.1f}]",
        "void": "no",
        "goal": "met",
    }
    print_table(arm_rows)
    print_table(pair_rows)
    printed = capsys.readouterr().out
    assert "process - outcome" in printed
    assert "seed 9" in printed
