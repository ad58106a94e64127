"""Arms of the reproduction experiment compared over seeds, from per-episode records.

Seeds are the unit of replication and problems the unit of measurement inside a seed: a
problem's accuracy is the mean over its samples, a seed's accuracy the mean over its
problems. Two arms are compared over the seeds both ran: every seed's difference, exact
paired tests (sign, Wilcoxon signed-rank), a hierarchical bootstrap interval (seeds, then
problems within each seed), and a void flag for an arm that could not learn (no
successful training episode, every KL or every gradient norm exactly 0).

Pure functions over plain dicts: :class:`EvalRecord` rows and the trainer's per-step
metrics. The result of :func:`compare_arms` prints with ``benchmarks._common.print_table``
through :func:`format_comparison_table`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, get_origin, get_type_hints

import numpy as np
from scipy import stats

from mappa_agents.metrics import mean_at_k

Key = tuple[str, int, int, str]
"""``(arm, seed, step, task_set)``: one evaluation of one run."""

Problems = dict[Key, dict[str, float]]
"""Per evaluation, task id -> the problem's accuracy (:func:`problem_accuracy`)."""

BOOTSTRAP_BLOCK = 1000
"""Resamples drawn at a time: memory stays at BLOCK x seeds x problems numbers."""

DIGITS = 12
"""Accuracies are ratios of small counts: differences are rounded to this many digits so
that ``0.3 - 0.25`` counts as 0.05 and two equal differences count as a tie."""


class EvalRecord(TypedDict):
    """One held-out evaluation episode, as the experiment keeps it."""

    arm: str
    """The run's training arm (credit mode), e.g. ``"process"``."""
    seed: int
    """The run's seed: the unit of replication."""
    step: int
    """The training step whose weights were evaluated (0: the untrained system)."""
    task_set: str
    """The held-out set the problem belongs to, e.g. ``"in_family"``."""
    task_id: str
    """The problem: the unit of measurement inside a seed."""
    sample: int
    """Which of the problem's samples this episode is."""
    correct: bool
    """Whether the rule grader accepted the episode's answer."""
    scores: dict[str, float | None]
    """Each agent's coach score (0 to 10), None where the coach gave none."""


_FIELDS: dict[str, type] = {
    name: get_origin(hint) or hint for name, hint in get_type_hints(EvalRecord).items()
}
"""Field -> its type (``dict`` for ``scores``), read from :class:`EvalRecord`."""


def _has_type(value: Any, kind: type) -> bool:
    # bool is an int in Python: a seed of True is a mistake, not seed 1.
    if kind is bool:
        return isinstance(value, (bool, np.bool_))
    if kind is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    return isinstance(value, Mapping if kind is dict else kind)


def _score_ok(score: Any) -> bool:
    if score is None:
        return True
    number = isinstance(score, (int, float, np.number)) and not isinstance(score, bool)
    return number and 0 <= score <= 10  # NaN fails the range check


def validate_records(records: Iterable[Mapping[str, Any]]) -> list[EvalRecord]:
    """The records as a list, each checked against :class:`EvalRecord`.

    Raises:
        ValueError: Naming the record (its index, arm, seed, step, task) and the field,
            when a field is missing or of the wrong type, a score is outside 0-10, or two
            records are the same sample of the same evaluation; or when there are none.
    """
    checked: list[EvalRecord] = []
    seen: dict[tuple[Any, ...], int] = {}
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise ValueError(f"record {index}: expected a dict, got {type(record).__name__}")
        where = f"record {index} (" + ", ".join(
            f"{f}={record[f]!r}" for f in ("arm", "seed", "step", "task_id") if f in record
        )
        for field, kind in _FIELDS.items():
            if field not in record:
                raise ValueError(f"{where}): missing field {field!r}")
            if not _has_type(record[field], kind):
                raise ValueError(
                    f"{where}): field {field!r} must be {kind.__name__}, got {record[field]!r}"
                )
        for agent, score in record["scores"].items():
            if not _score_ok(score):
                raise ValueError(
                    f"{where}): field 'scores': {agent!r} must be 0 to 10 or None, got {score!r}"
                )
        sample = tuple(record[f] for f in ("arm", "seed", "step", "task_set", "task_id", "sample"))
        if sample in seen:
            raise ValueError(
                f"{where}): same sample of the same evaluation as record {seen[sample]}"
            )
        seen[sample] = index
        checked.append(record)  # type: ignore[arg-type]
    if not checked:
        raise ValueError("no evaluation records")
    return checked


def problem_accuracy(records: Iterable[Mapping[str, Any]]) -> Problems:
    """Every problem's accuracy in every evaluation.

    ``acc(arm, seed, step, task_set, t) = c_t / n_t``: the mean correctness of problem
    ``t``'s ``n_t`` samples, ``c_t`` of them correct (mean@k of the problem).

    Returns:
        ``{(arm, seed, step, task_set): {task_id: accuracy}}``, task ids sorted.
    """
    counts: dict[Key, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in validate_records(records):
        tally = counts[(r["arm"], int(r["seed"]), int(r["step"]), r["task_set"])][r["task_id"]]
        tally[0] += 1
        tally[1] += int(bool(r["correct"]))
    return {
        key: {task: mean_at_k(n, c) for task, (n, c) in sorted(tasks.items())}
        for key, tasks in counts.items()
    }


def seed_accuracy(records: Iterable[Mapping[str, Any]]) -> dict[Key, float]:
    """Every evaluation's accuracy: ``acc(seed) = (1 / P) * sum_t acc(t)`` over its P problems.

    Returns:
        ``{(arm, seed, step, task_set): accuracy}``.
    """
    return {
        key: statistics.fmean(tasks.values()) for key, tasks in problem_accuracy(records).items()
    }


def _select(problems: Problems, arm: str, step: int, task_set: str) -> dict[int, dict[str, float]]:
    """Seed -> problem accuracies of one arm's evaluations at ``step`` on ``task_set``."""
    mine = {k[1]: v for k, v in problems.items() if (k[0], k[2], k[3]) == (arm, step, task_set)}
    if not mine:
        present = sorted({(k[0], k[2], k[3]) for k in problems})
        raise ValueError(
            f"no records of arm {arm!r} at step {step} on task set {task_set!r}; "
            f"(arm, step, task_set) present: {present}"
        )
    return dict(sorted(mine.items()))


def _paired(problems: Problems, arm_a: str, arm_b: str, step: int, task_set: str) -> dict[str, Any]:
    """Per shared seed, ``acc_a(t) - acc_b(t)`` over the problems both arms have there."""
    a, b = _select(problems, arm_a, step, task_set), _select(problems, arm_b, step, task_set)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(
            f"{arm_a!r} (seeds {sorted(a)}) and {arm_b!r} (seeds {sorted(b)}) share no seed "
            f"at step {step} on {task_set!r}"
        )
    by_problem: dict[int, np.ndarray] = {}
    unpaired: dict[int, int] = {}
    for seed in seeds:
        shared = sorted(set(a[seed]) & set(b[seed]))
        if not shared:
            raise ValueError(f"seed {seed}: {arm_a!r} and {arm_b!r} share no problem")
        by_problem[seed] = np.array([a[seed][t] - b[seed][t] for t in shared])
        unpaired[seed] = len(a[seed]) + len(b[seed]) - 2 * len(shared)
    return {
        "arm_a": arm_a,
        "arm_b": arm_b,
        "step": step,
        "task_set": task_set,
        "differences": {s: float(d.mean()) for s, d in by_problem.items()},
        "dropped_seeds": {arm_a: sorted(set(a) - set(b)), arm_b: sorted(set(b) - set(a))},
        "unpaired_problems": {s: n for s, n in unpaired.items() if n},
        "by_problem": by_problem,
    }


def paired_seed_differences(
    records: Iterable[Mapping[str, Any]], arm_a: str, arm_b: str, step: int, task_set: str
) -> dict[str, Any]:
    """Per seed both arms ran at ``step``: ``d_s = acc_a(s) - acc_b(s)``.

    ``d_s = (1 / P_s) * sum_t [acc_a(s, t) - acc_b(s, t)]`` over the ``P_s`` problems both
    arms evaluated in seed ``s`` (every problem, when the held-out sets match).

    Returns:
        ``differences`` ({seed: d_s}), ``dropped_seeds`` ({arm: seeds only that arm has}),
        ``unpaired_problems`` ({seed: problems only one arm has}, seeds with none left
        out) and ``by_problem`` ({seed: array of per-problem differences}).

    Raises:
        ValueError: When an arm has no records there, or the arms share no seed.
    """
    return _paired(problem_accuracy(records), arm_a, arm_b, step, task_set)


def exact_paired_tests(differences: Mapping[int, float] | Sequence[float]) -> dict[str, Any]:
    """Two-sided exact sign and Wilcoxon signed-rank tests of paired seed differences.

    Sign test: zero differences (ties) dropped, ``n = n_+ + n_-``,
    ``p = P(|B - n/2| >= |n_+ - n/2|)`` for ``B ~ Binomial(n, 1/2)``; ``n`` differences
    all of one sign give ``p = 2^(1-n)``.

    Wilcoxon: ``zero_method="wilcox"`` drops zero differences, as the sign test does, so
    both tests see the same seeds; the null distribution of the signed-rank statistic
    conditional on the remaining ``n`` is then exact. (``"pratt"`` and ``"zsplit"`` keep
    zeros in the ranking, which scipy's exact distribution does not account for.) With
    distinct ``|d|`` it is scipy's ``method="exact"``; with tied ``|d|`` that table is
    wrong, so all ``2^n`` sign flips are enumerated (``PermutationMethod``), exact too.

    Returns:
        ``n_pairs``, ``n`` (untied), ``positives``, ``negatives``, ``ties``, ``sign_p``,
        ``wilcoxon_statistic`` (min of the rank sums), ``wilcoxon_p``,
        ``wilcoxon_method`` and ``zero_method``. Without untied pairs both p are 1.

    Raises:
        ValueError: Without differences, or with a non-finite one.
    """
    values = list(differences.values()) if isinstance(differences, Mapping) else list(differences)
    if not values:
        raise ValueError("no paired differences to test")
    d = np.round(np.asarray(values, dtype=float), DIGITS)
    if not np.isfinite(d).all():
        raise ValueError(f"paired differences must be finite, got {values}")
    nonzero = d[d != 0]
    positives, negatives = int((nonzero > 0).sum()), int((nonzero < 0).sum())
    result: dict[str, Any] = {
        "n_pairs": len(values),
        "n": int(nonzero.size),
        "positives": positives,
        "negatives": negatives,
        "ties": len(values) - int(nonzero.size),
        "sign_p": 1.0,  # no untied pair: no evidence either way
        "wilcoxon_statistic": None,
        "wilcoxon_p": 1.0,
        "wilcoxon_method": "none: every difference is 0",
        "zero_method": "wilcox",
    }
    if nonzero.size == 0:
        return result
    result["sign_p"] = float(stats.binomtest(positives, int(nonzero.size), 0.5).pvalue)
    tied = np.unique(np.abs(nonzero)).size < nonzero.size
    method: Any = stats.PermutationMethod(n_resamples=2**nonzero.size) if tied else "exact"
    test = stats.wilcoxon(nonzero, zero_method="wilcox", method=method)
    result["wilcoxon_statistic"] = float(test.statistic)
    result["wilcoxon_p"] = float(test.pvalue)
    result["wilcoxon_method"] = "exact, all sign flips (tied |d|)" if tied else "exact"
    return result


def _bootstrap(
    by_problem: Sequence[np.ndarray], resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    """The hierarchical bootstrap of :func:`hierarchical_bootstrap` on per-problem arrays."""
    counts = np.array([len(d) for d in by_problem])
    n_seeds, width = len(by_problem), int(counts.max())
    table = np.zeros((n_seeds, width))  # ragged seeds padded; padding is masked out below
    for i, d in enumerate(by_problem):
        table[i, : len(d)] = d
    rng = np.random.default_rng(seed)
    seed_draws = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    columns = np.arange(width)
    means = np.empty(resamples)
    for start in range(0, resamples, BOOTSTRAP_BLOCK):
        drawn = seed_draws[start : start + BOOTSTRAP_BLOCK]  # (B, S)
        n = counts[drawn][..., None]  # (B, S, 1): problems of each drawn seed
        u = rng.random((len(drawn), n_seeds, width))
        picks = np.minimum((u * n).astype(np.intp), n - 1)  # floor(u * P) in [0, P)
        values = table[drawn[..., None], picks]
        per_seed = np.where(columns < n, values, 0.0).sum(axis=-1) / n[..., 0]
        means[start : start + len(drawn)] = per_seed.mean(axis=-1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {
        "estimate": float(np.mean([d.mean() for d in by_problem])),
        "low": float(low),
        "high": float(high),
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
    }


def hierarchical_bootstrap(
    records: Iterable[Mapping[str, Any]],
    arm_a: str,
    arm_b: str,
    step: int,
    task_set: str,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Percentile interval of ``D = (1 / S) * sum_s [acc_a(s) - acc_b(s)]`` over paired seeds.

    Each resample draws ``S`` seeds with replacement, then within each drawn seed its
    ``P_s`` shared problems with replacement, the same problems for both arms (the pair
    is the problem), and recomputes ``D* = mean_s* mean_t* [acc_a(t) - acc_b(t)]``. The
    interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of
    the ``D*``. Draws, from ``numpy.random.default_rng(seed)``: all seed indices first
    (``integers(0, S, (resamples, S))``), then uniforms ``u`` of shape ``(resamples, S,
    max P)`` whose first ``P`` per drawn seed pick problems ``floor(u * P)``.

    Returns:
        ``estimate`` (``D``), ``low``, ``high``, ``confidence``, ``resamples``, ``seed``.
    """
    paired = paired_seed_differences(records, arm_a, arm_b, step, task_set)
    return _bootstrap(list(paired["by_problem"].values()), resamples, seed, confidence)


def _summary(problems: Problems, arm: str, step: int, task_set: str) -> dict[str, Any]:
    seeds = {
        s: statistics.fmean(t.values()) for s, t in _select(problems, arm, step, task_set).items()
    }
    values = list(seeds.values())
    return {
        "arm": arm,
        "step": step,
        "task_set": task_set,
        "seeds": seeds,
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def arm_summary(
    records: Iterable[Mapping[str, Any]], arm: str, step: int, task_set: str
) -> dict[str, Any]:
    """Every seed's accuracy of ``arm`` at ``step``, with their mean, median, min and max.

    Returns:
        ``arm``, ``step``, ``task_set``, ``seeds`` ({seed: accuracy}), ``mean``,
        ``median``, ``min``, ``max``, ``n`` (seeds).
    """
    return _summary(problem_accuracy(records), arm, step, task_set)


def _run_failures(steps: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], int]:
    """The void checks one run fails, each with what it logged; and its training episodes."""
    successes = episodes = 0
    logged: dict[str, list[float]] = {"kl": [], "grad_norm": []}
    for metrics in steps:
        count = int(metrics.get("rollout/episodes") or 0)
        # The rate is over finished episodes: rate * episodes is 0 exactly when none succeeded.
        successes += round(float(metrics.get("rollout/success_rate") or 0.0) * count)
        episodes += count
        for key, value in metrics.items():
            name = key.partition("/")[2]  # per-agent keys: "<agent>/kl"
            if name in logged and value is not None:
                logged[name].append(float(value))
    failures = {}
    if successes == 0:
        failures["success"] = f"0 of {episodes:,} training episodes succeeded"
    for name, label in (("kl", "KL"), ("grad_norm", "gradient norm")):
        if not any(logged[name]):
            n = len(logged[name])
            failures[name] = f"all {n:,} logged {label} values are 0" if n else f"no {label} logged"
    return failures, episodes


_HEADLINES = {  # check -> (what failed, its scope when every seed failed)
    "success": ("no training episode succeeded", "any seed"),
    "kl": ("every logged KL is exactly 0", "every seed"),
    "grad_norm": ("every logged gradient norm is exactly 0", "every seed"),
}


def void_reasons(
    training_metrics: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    seeds: Iterable[int] | None = None,
) -> dict[str, list[str]]:
    """Why each arm could not learn: a comparison with such an arm is void.

    A run (arm, seed) cannot learn when ``sum_steps round(success_rate * episodes) = 0``
    (no training episode succeeded), when every logged ``<agent>/kl`` is exactly 0, or
    when every logged ``<agent>/grad_norm`` is exactly 0 (none logged counts as 0). Any
    such run voids its arm: the paired test is over seeds fixed in advance, and dropping
    a seed after seeing its run would be choosing the evidence.

    Args:
        training_metrics: ``{arm: {seed: [per-step metrics of mappa_train's trainer]}}``.
        seeds: Seeds every arm must have metrics for (default: the seeds given).

    Returns:
        ``{arm: reasons}``, empty where the arm is valid: per failed check a line
        (``"outcome: no training episode succeeded in any seed (0 of 1,920)"``), then
        one per failed seed (``"outcome seed 0: 0 of 320 training episodes succeeded"``).
    """
    reasons: dict[str, list[str]] = {}
    for arm, runs in training_metrics.items():
        wanted = sorted(set(runs) | set(seeds or ()))
        lines = [] if wanted else [f"{arm}: no training metrics recorded"]
        failed: dict[str, dict[int, str]] = defaultdict(dict)
        episodes: dict[int, int] = {}
        for seed in wanted:
            if not runs.get(seed):
                lines.append(f"{arm} seed {seed}: no training metrics recorded")
                continue
            failures, episodes[seed] = _run_failures(runs[seed])
            for check, detail in failures.items():
                failed[check][seed] = detail
        for check, (what, everywhere) in _HEADLINES.items():
            if not failed[check]:
                continue
            listed = ("seed " if len(failed[check]) == 1 else "seeds ") + ", ".join(
                map(str, failed[check])
            )
            scope = everywhere if len(failed[check]) == len(wanted) else listed
            total = sum(episodes[s] for s in failed[check])
            count = f" (0 of {total:,})" if check == "success" else ""
            lines.append(f"{arm}: {what} in {scope}{count}")
            lines += [f"{arm} seed {s}: {detail}" for s, detail in failed[check].items()]
        reasons[arm] = lines
    return reasons


def _verdict(
    pair: Mapping[str, Any], min_difference: float, alpha: float, min_seeds: int
) -> dict[str, Any]:
    """Whether ``treatment - other`` met the goal, and every reason it did not."""
    difference = round(pair["interval"]["estimate"], DIGITS)
    low = round(pair["interval"]["low"], DIGITS)
    sign_p, n = pair["tests"]["sign_p"], len(pair["seeds"])
    checks = {
        "difference": difference >= min_difference,
        "sign_test": sign_p < alpha,
        "interval_excludes_0": low > 0,
    }
    why = [f"void: {reason}" for reason in pair["void_reasons"]]
    if n < min_seeds:
        why.append(f"{n} paired seeds, fewer than the {min_seeds} the goal needs")
    if not checks["difference"]:
        why.append(f"difference {difference:+.4f} is below {min_difference:g}")
    if not checks["sign_test"]:
        why.append(f"sign test p = {sign_p:.4g} is not below {alpha:g}")
    if not checks["interval_excludes_0"]:
        why.append(f"interval low end {low:+.4f} is not above 0")
    return {
        "met": not why,
        "checks": checks,
        "why": why,
        "thresholds": {"min_difference": min_difference, "alpha": alpha, "min_seeds": min_seeds},
    }


def compare_arms(
    records: Iterable[Mapping[str, Any]],
    training_metrics: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    arms: Sequence[str],
    step: int,
    task_set: str,
    *,
    treatment: str | None = None,
    min_difference: float = 0.05,
    alpha: float = 0.05,
    min_seeds: int = 6,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Every arm's seeds, and the treatment against each other arm, with a verdict.

    Each pair ``treatment - other`` gets its per-seed differences
    (:func:`paired_seed_differences`), both exact tests (:func:`exact_paired_tests`),
    the hierarchical bootstrap interval (:func:`hierarchical_bootstrap`), the void
    reasons of both arms over the paired seeds (:func:`void_reasons`), and a verdict:
    the goal is met when ``D >= min_difference``, sign-test ``p < alpha`` and the
    interval's low end is above 0, and never when the pair is void or has fewer than
    ``min_seeds`` paired seeds (n seeds all of one sign give ``p = 2^(1-n)``: 6 are
    needed for ``p < 0.05``).

    Args:
        records: :class:`EvalRecord` rows of every arm.
        training_metrics: ``{arm: {seed: [per-step training metrics]}}``.
        arms: The arms to report, the treatment among them.
        step: The evaluation step compared (decided before the runs).
        task_set: The held-out set compared.
        treatment: The arm compared against each other one (default: ``arms[0]``).
        min_difference: The goal's smallest mean difference (0.05: 5 points).
        alpha: The sign test's significance level.
        min_seeds: The fewest paired seeds a met goal needs.
        resamples: Bootstrap resamples.
        seed: Bootstrap seed.
        confidence: Bootstrap interval coverage.

    Returns:
        ``step``, ``task_set``, ``treatment``, ``arms`` ({arm: :func:`arm_summary`}) and
        ``pairs``: per other arm ``treatment``, ``other``, ``seeds``, ``differences``,
        ``dropped_seeds``, ``unpaired_problems``, ``tests``, ``interval``, ``void``,
        ``void_reasons`` and ``verdict`` (``met``, ``checks``, ``why``, ``thresholds``).
    """
    treatment = arms[0] if treatment is None else treatment
    if treatment not in arms:
        raise ValueError(f"treatment {treatment!r} is not one of the arms {list(arms)}")
    problems = problem_accuracy(records)
    pairs = []
    for other in arms:
        if other == treatment:
            continue
        paired = _paired(problems, treatment, other, step, task_set)
        seeds = sorted(paired["differences"])
        # Only the paired seeds' runs count: a seed one arm lacks is not in this test.
        runs = {
            arm: {s: run for s, run in training_metrics.get(arm, {}).items() if s in seeds}
            for arm in (treatment, other)
        }
        void = void_reasons(runs, seeds)
        pair = {
            "treatment": treatment,
            "other": other,
            "seeds": seeds,
            **{k: paired[k] for k in ("differences", "dropped_seeds", "unpaired_problems")},
            "tests": exact_paired_tests(paired["differences"]),
            "interval": _bootstrap(
                list(paired["by_problem"].values()), resamples, seed, confidence
            ),
            "void_reasons": void[treatment] + void[other],
        }
        pair["void"] = bool(pair["void_reasons"])
        pair["verdict"] = _verdict(pair, min_difference, alpha, min_seeds)
        pairs.append(pair)
    return {
        "step": step,
        "task_set": task_set,
        "treatment": treatment,
        "arms": {arm: _summary(problems, arm, step, task_set) for arm in arms},
        "pairs": pairs,
    }


def _points(value: float, sign: str = "") -> str:
    return f"{100 * value:{sign}.1f}"


def format_comparison_table(
    comparison: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of :func:`compare_arms` for ``benchmarks._common.print_table``, in points.

    Returns:
        ``(arm_rows, pair_rows)``: per arm its accuracy in every seed (``-`` where it
        has none), mean, median and seed count; per pair the paired seeds, the mean
        difference, both p values, the interval, whether it is void and the verdict.
    """
    seeds = sorted({s for summary in comparison["arms"].values() for s in summary["seeds"]})
    arm_rows = [
        {
            "arm": arm,
            **{
                f"seed {s}": _points(summary["seeds"][s]) if s in summary["seeds"] else "-"
                for s in seeds
            },
            "mean": _points(summary["mean"]),
            "median": _points(summary["median"]),
            "n": summary["n"],
        }
        for arm, summary in comparison["arms"].items()
    ]
    pair_rows = []
    for pair in comparison["pairs"]:
        interval = pair["interval"]
        pair_rows.append(
            {
                "pair": f"{pair['treatment']} - {pair['other']}",
                "seeds": len(pair["seeds"]),
                "diff": _points(interval["estimate"], "+"),
                "sign p": f"{pair['tests']['sign_p']:.4g}",
                "wilcoxon p": f"{pair['tests']['wilcoxon_p']:.4g}",
                f"{interval['confidence']:.0%} interval": (
                    f"[{_points(interval['low'], '+')}, {_points(interval['high'], '+')}]"
                ),
                "void": "yes" if pair["void"] else "no",
                "goal": "met" if pair["verdict"]["met"] else "not met",
            }
        )
    return arm_rows, pair_rows
