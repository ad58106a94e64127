"""Arms of the reproduction experiment compared over seeds, from per-episode records.

Seeds are the unit of replication and problems the unit of measurement inside a seed: a
problem's accuracy is the mean over its samples (an aborted or missing sample counts as
wrong), a seed's accuracy the mean over its problems. Two arms are compared over the
seeds both ran: every seed's difference, the decided test (a one-sided exact sign-flip
test on the per-seed differences), exact sign and Wilcoxon tests as secondary figures, a
bootstrap interval that resamples seeds and, once per resample, the problems every seed
shares, and a void flag for an arm that could not learn (its own learning signal - the
spread of its rewards within a step, its KL and its gradient norm - under stated floors
in too many steps).

Pure functions over plain dicts: :class:`EvalRecord` rows and the trainer's per-step
metrics. The result of :func:`compare_arms` prints with ``benchmarks._common.print_table``
through :func:`format_comparison_table`.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NotRequired, TypedDict, get_origin, get_type_hints

import numpy as np
from scipy import stats

from mappa_agents.metrics import mean_at_k

Key = tuple[str, int, int, str]
"""``(arm, seed, step, task_set)``: one evaluation of one run."""

Problems = dict[Key, dict[str, float]]
"""Per evaluation, task id -> the problem's accuracy (:func:`problem_accuracy`)."""

BOOTSTRAP_BLOCK = 1000
"""Resamples drawn at a time: memory stays at BLOCK x (seeds + problems) numbers."""

FLIP_BLOCK = 4096
"""Sign patterns enumerated at a time by :func:`sign_flip_pvalues`."""

MAX_FLIP_SEEDS = 24
"""The most seeds :func:`sign_flip_pvalues` enumerates (``2^24`` patterns, seconds)."""

FLIP_TOLERANCE = 1e-9
"""Sums of differences rounded to :data:`DIGITS` digits that are within this count as
equal: a flipped sum that equals the observed one is at least as extreme."""

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
    aborted: NotRequired[bool]
    """The episode could not be finished (``correct`` is then False: it counts as wrong)."""


_FIELDS: dict[str, type] = {
    name: get_origin(hint) or hint for name, hint in get_type_hints(EvalRecord).items()
}
"""Field -> its type (``dict`` for ``scores``), read from :class:`EvalRecord`."""

_OPTIONAL = frozenset({"aborted"})
"""Fields a record may leave out (``NotRequired``, which postponed annotations hide)."""


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
                if field in _OPTIONAL:
                    continue
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


def _tallies(records: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, list[int]]]:
    """Per evaluation, task id -> ``[samples, correct, aborted]``."""
    counts: dict[Key, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for r in validate_records(records):
        tally = counts[(r["arm"], int(r["seed"]), int(r["step"]), r["task_set"])][r["task_id"]]
        tally[0] += 1
        tally[1] += int(bool(r["correct"]) and not r.get("aborted", False))
        tally[2] += int(bool(r.get("aborted", False)))
    return {key: dict(sorted(tasks.items())) for key, tasks in counts.items()}


def problem_accuracy(records: Iterable[Mapping[str, Any]]) -> Problems:
    """Every problem's accuracy in every evaluation, over the samples it has.

    ``acc(arm, seed, step, task_set, t) = c_t / n_t``: the mean correctness of problem
    ``t``'s ``n_t`` samples, ``c_t`` of them correct (mean@k of the problem; an aborted
    sample is wrong). A comparison counts missing samples too (:func:`complete_accuracy`).

    Returns:
        ``{(arm, seed, step, task_set): {task_id: accuracy}}``, task ids sorted.
    """
    return {
        key: {task: mean_at_k(n, c) for task, (n, c, _) in tasks.items()}
        for key, tasks in _tallies(records).items()
    }


def seed_accuracy(records: Iterable[Mapping[str, Any]]) -> dict[Key, float]:
    """Every evaluation's accuracy: ``acc(seed) = (1 / P) * sum_t acc(t)`` over its P problems.

    Returns:
        ``{(arm, seed, step, task_set): accuracy}``.
    """
    return {
        key: statistics.fmean(tasks.values()) for key, tasks in problem_accuracy(records).items()
    }


@dataclass
class Completed:
    """Evaluations of one step and task set over one set of problems, nothing unpaired.

    Attributes:
        problems: Every problem any of the evaluations has, sorted.
        samples: Per problem ``K_t``, the most samples any evaluation has of it.
        accuracy: Per evaluation, per problem ``c_t / K_t``: a missing sample is wrong.
        missing: Per evaluation, ``sum_t (K_t - n_t)``: samples it lacks (0 left out).
        aborted: Per evaluation, samples that could not be finished (0 left out).
    """

    problems: list[str]
    samples: dict[str, int]
    accuracy: dict[Key, dict[str, float]]
    missing: dict[Key, int]
    aborted: dict[Key, int]


def complete_accuracy(
    records: Iterable[Mapping[str, Any]], step: int, task_set: str, arms: Iterable[str]
) -> Completed:
    """The accuracies of ``arms``' evaluations at ``step`` on ``task_set``, every problem in each.

    An evaluation (arm, seed) that lacks a sample another has, or a problem altogether,
    counts the lacking samples as wrong, as it does an aborted episode: every seed of
    every arm is scored on the same problems with the same number of samples, so each
    problem pairs across arms and seeds. ``acc(t) = c_t / K_t`` with ``K_t`` the most
    samples of ``t`` in any of these evaluations.
    """
    wanted = set(arms)
    tallies = {
        k: v
        for k, v in _tallies(records).items()
        if (k[0], k[2], k[3]) in {(a, step, task_set) for a in wanted}
    }
    samples: dict[str, int] = {}
    for tasks in tallies.values():
        for task, (n, _, _) in tasks.items():
            samples[task] = max(samples.get(task, 0), n)
    problems = sorted(samples)
    accuracy, missing, aborted = {}, {}, {}
    for key, tasks in tallies.items():
        accuracy[key] = {t: (tasks[t][1] / samples[t] if t in tasks else 0.0) for t in problems}
        lacking = sum(samples[t] - (tasks[t][0] if t in tasks else 0) for t in problems)
        if lacking:
            missing[key] = lacking
        if sum(v[2] for v in tasks.values()):
            aborted[key] = sum(v[2] for v in tasks.values())
    return Completed(problems, samples, accuracy, missing, aborted)


def _select(
    completed: Completed, arm: str, step: int, task_set: str
) -> dict[int, dict[str, float]]:
    """Seed -> problem accuracies of one arm's evaluations at ``step`` on ``task_set``."""
    problems = completed.accuracy
    mine = {k[1]: v for k, v in problems.items() if (k[0], k[2], k[3]) == (arm, step, task_set)}
    if not mine:
        present = sorted({(k[0], k[2], k[3]) for k in problems})
        raise ValueError(
            f"no records of arm {arm!r} at step {step} on task set {task_set!r}; "
            f"(arm, step, task_set) present: {present}"
        )
    return dict(sorted(mine.items()))


def _per_seed(counts: Mapping[Key, int], arm: str) -> dict[int, int]:
    return {k[1]: v for k, v in sorted(counts.items()) if k[0] == arm}


def _paired(
    completed: Completed, arm_a: str, arm_b: str, step: int, task_set: str
) -> dict[str, Any]:
    """Per shared seed, ``acc_a(t) - acc_b(t)`` over every problem of the comparison."""
    a = _select(completed, arm_a, step, task_set)
    b = _select(completed, arm_b, step, task_set)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(
            f"{arm_a!r} (seeds {sorted(a)}) and {arm_b!r} (seeds {sorted(b)}) share no seed "
            f"at step {step} on {task_set!r}"
        )
    problems = completed.problems
    table = np.array([[a[s][t] - b[s][t] for t in problems] for s in seeds])
    return {
        "arm_a": arm_a,
        "arm_b": arm_b,
        "step": step,
        "task_set": task_set,
        "problems": len(problems),
        "differences": {s: float(row.mean()) for s, row in zip(seeds, table)},
        "dropped_seeds": {arm_a: sorted(set(a) - set(b)), arm_b: sorted(set(b) - set(a))},
        "missing_samples": {
            arm: {s: n for s, n in _per_seed(completed.missing, arm).items() if s in seeds}
            for arm in (arm_a, arm_b)
        },
        "aborted_samples": {
            arm: {s: n for s, n in _per_seed(completed.aborted, arm).items() if s in seeds}
            for arm in (arm_a, arm_b)
        },
        "table": table,
    }


def paired_seed_differences(
    records: Iterable[Mapping[str, Any]], arm_a: str, arm_b: str, step: int, task_set: str
) -> dict[str, Any]:
    """Per seed both arms ran at ``step``: ``d_s = acc_a(s) - acc_b(s)``.

    ``d_s = (1 / P) * sum_t [acc_a(s, t) - acc_b(s, t)]`` over the ``P`` problems of
    either arm's evaluations, a missing or aborted sample counted as wrong
    (:func:`complete_accuracy`).

    Returns:
        ``differences`` ({seed: d_s}), ``dropped_seeds`` ({arm: seeds only that arm has}),
        ``problems`` (P), ``missing_samples`` and ``aborted_samples`` ({arm: {seed:
        count}}, zeros left out) and ``table`` (seeds x problems array of differences).

    Raises:
        ValueError: When an arm has no records there, or the arms share no seed.
    """
    completed = complete_accuracy(records, step, task_set, (arm_a, arm_b))
    return _paired(completed, arm_a, arm_b, step, task_set)


def _flip_signs(start: int, stop: int, n: int) -> np.ndarray:
    """Rows ``start..stop-1`` of all ``2^n`` sign patterns: bit ``j`` of ``k`` flips seed ``j``."""
    k = np.arange(start, stop, dtype=np.int64)[:, None]
    return 1.0 - 2.0 * ((k >> np.arange(n)) & 1)


def sign_flip_pvalues(differences: np.ndarray) -> np.ndarray:
    """One-sided exact sign-flip p of each row of per-seed differences.

    Under the null hypothesis that the treatment changes nothing, each seed's difference
    ``d_s`` is as likely to have either sign. Every one of the ``2^n`` patterns
    ``e in {-1, 1}^n`` is enumerated: ``p = #{e : sum_s e_s d_s >= sum_s d_s} / 2^n``, the
    share of flips whose mean is at least the observed one (the observed pattern among
    them, so ``p >= 2^-n``). Differences are rounded to :data:`DIGITS` digits first, and
    sums within :data:`FLIP_TOLERANCE` count as equal.

    Args:
        differences: ``[n]`` or ``[R, n]`` per-seed differences (treatment minus baseline).

    Returns:
        ``[R]`` p values (a 0-d array for one row).

    Raises:
        ValueError: Without seeds, with more than :data:`MAX_FLIP_SEEDS`, or with a
            non-finite difference.
    """
    d = np.round(np.asarray(differences, dtype=float), DIGITS)
    single = d.ndim == 1
    d = np.atleast_2d(d)
    n = d.shape[1]
    if n == 0 or n > MAX_FLIP_SEEDS:
        raise ValueError(f"the sign-flip test takes 1 to {MAX_FLIP_SEEDS} seeds, got {n}")
    if not np.isfinite(d).all():
        raise ValueError("paired differences must be finite")
    observed = d.sum(axis=1, keepdims=True) - FLIP_TOLERANCE
    extreme = np.zeros(len(d))
    for start in range(0, 2**n, FLIP_BLOCK):
        signs = _flip_signs(start, min(2**n, start + FLIP_BLOCK), n)
        extreme += (d @ signs.T >= observed).sum(axis=1)
    p = extreme / 2**n
    return p[0] if single else p


def sign_flip_test(differences: Mapping[int, float] | Sequence[float]) -> dict[str, Any]:
    """The decided test: one-sided exact sign-flip test of paired seed differences.

    ``H0``: each ``d_s`` (treatment minus baseline) is symmetric about 0; ``H1``: the
    treatment is better. ``p`` is :func:`sign_flip_pvalues`'s: the share of the ``2^n``
    sign patterns whose mean difference is at least the observed mean. Unlike the sign
    test it weighs how large each difference is: 5 seeds at +0.5 and one at 0 give
    ``p = 2 / 64``, where the sign test gives 0.0625.

    Returns:
        ``n``, ``mean``, ``p``, ``flips`` (``2^n``), ``alternative`` ("greater") and
        ``method``.

    Raises:
        ValueError: As :func:`sign_flip_pvalues`.
    """
    values = list(differences.values()) if isinstance(differences, Mapping) else list(differences)
    if not values:
        raise ValueError("no paired differences to test")
    return {
        "n": len(values),
        "mean": float(np.mean(values)),
        "p": float(sign_flip_pvalues(np.asarray(values, dtype=float))),
        "flips": 2 ** len(values),
        "alternative": "greater",
        "method": "exact, all 2^n sign flips of the per-seed differences",
    }


def exact_paired_tests(differences: Mapping[int, float] | Sequence[float]) -> dict[str, Any]:
    """Two-sided exact sign and Wilcoxon signed-rank tests of paired seed differences.

    Secondary figures, reported beside the decided test (:func:`sign_flip_test`): the
    sign test reads only the signs (on 6 seeds it needs all six of one sign for
    ``p < 0.05``, and one tie gives 0.0625), the Wilcoxon test only their ranks.

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


def bootstrap_tail(confidence: float, seeds: int) -> float:
    """The lower quantile level of the expanded percentile interval over ``seeds`` seeds.

    A percentile bootstrap over ``S`` units is too narrow for small ``S``: its spread
    is ``sqrt((S - 1) / S)`` of the sample's, and it uses normal rather than ``t``
    quantiles. The expanded percentile interval (Hesterberg, "What Teachers Should Know
    About the Bootstrap", 2015) takes the quantiles at ``alpha' / 2 = Phi(-sqrt(S / (S -
    1)) * t_{S-1, (1 + confidence) / 2})`` instead of ``(1 - confidence) / 2``; seeds are
    the few units here (problems are many).

    Returns:
        ``alpha' / 2`` (``(1 - confidence) / 2`` for one seed).
    """
    tail = (1.0 - confidence) / 2.0
    if seeds < 2:
        return tail
    wider = math.sqrt(seeds / (seeds - 1)) * stats.t.ppf(1.0 - tail, seeds - 1)
    return float(stats.norm.sf(wider))


def _bootstrap(table: np.ndarray, resamples: int, seed: int, confidence: float) -> dict[str, Any]:
    """The crossed bootstrap of :func:`crossed_bootstrap` on a seeds x problems table."""
    table = np.asarray(table, dtype=float)
    n_seeds, n_problems = table.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, BOOTSTRAP_BLOCK):
        size = min(BOOTSTRAP_BLOCK, resamples - start)
        seed_counts = rng.multinomial(n_seeds, np.full(n_seeds, 1.0 / n_seeds), size=size)
        problem_counts = rng.multinomial(n_problems, np.full(n_problems, 1.0 / n_problems), size)
        means[start : start + size] = ((seed_counts @ table) * problem_counts).sum(axis=1) / (
            n_seeds * n_problems
        )
    tail = bootstrap_tail(confidence, n_seeds)
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {
        "estimate": float(table.mean()),
        "low": float(low),
        "high": float(high),
        "confidence": confidence,
        "quantiles": [tail, 1.0 - tail],
        "resamples": resamples,
        "seed": seed,
        "method": "crossed bootstrap (seeds, and problems once for all seeds), expanded percentile",
    }


def crossed_bootstrap(
    records: Iterable[Mapping[str, Any]],
    arm_a: str,
    arm_b: str,
    step: int,
    task_set: str,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Interval of ``D = (1 / (S P)) * sum_s sum_t [acc_a(s, t) - acc_b(s, t)]``.

    Every seed sees the same ``P`` problems, so seeds and problems are crossed, not
    nested: each resample draws ``S`` seeds with replacement and, once for all of them,
    ``P`` problems with replacement, and recomputes ``D* = (1 / (S P)) * sum_i sum_j
    table[s_i, t_j]`` (the same problems for both arms: the pair is the problem).
    Resampling problems per seed instead treats the shared problems as independent per
    seed and undercovers. The interval takes the quantiles of :func:`bootstrap_tail`
    (the expanded percentile interval). Draws, from ``numpy.random.default_rng(seed)``
    in blocks of :data:`BOOTSTRAP_BLOCK`: the block's seed counts (multinomial, ``S``
    draws), then its problem counts (``P`` draws);
    ``D* = (seed_counts @ table) . problem_counts / (S P)``.

    Coverage in simulation (tests/test_repro_stats.py): logit-normal seed effects, problem
    difficulties shared across seeds.

    Returns:
        ``estimate`` (``D``), ``low``, ``high``, ``confidence``, ``quantiles``,
        ``resamples``, ``seed``, ``method``.
    """
    paired = paired_seed_differences(records, arm_a, arm_b, step, task_set)
    return _bootstrap(paired["table"], resamples, seed, confidence)


def _summary(completed: Completed, arm: str, step: int, task_set: str) -> dict[str, Any]:
    seeds = {
        s: statistics.fmean(t.values()) if t else 0.0
        for s, t in _select(completed, arm, step, task_set).items()
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

    A problem another seed of the arm has and this one lacks counts as wrong
    (:func:`complete_accuracy`).

    Returns:
        ``arm``, ``step``, ``task_set``, ``seeds`` ({seed: accuracy}), ``mean``,
        ``median``, ``min``, ``max``, ``n`` (seeds).
    """
    return _summary(complete_accuracy(records, step, task_set, [arm]), arm, step, task_set)


@dataclass(frozen=True)
class VoidRule:
    """When a run had a learning signal of its own; an arm with a run without one is void.

    Read from the trainer's per-step metrics of steps ``1..through_step``: a check
    passes when, in at least ``min_steps`` of those steps, some agent's value reaches
    the floor. The decided values are in the test file (``void:``); these defaults
    are theirs.

    Attributes:
        through_step: The last step read (the step compared).
        min_steps: Steps each check must pass in: one lucky step is not a signal.
        reward_std: Floor of ``<agent>/reward_std``, the spread of the rewards an agent
            trained on in a step (:func:`mappa_train.advantages.reward_std`; rewards are
            0 to 1). 0 when every action got the same reward: no direction to learn in.
        kl: Floor of ``<agent>/kl``, nats per token from the reference: the policy moved.
        grad_norm: Floor of ``<agent>/grad_norm`` before clipping.
    """

    through_step: int = 20
    min_steps: int = 5
    reward_std: float = 0.05
    kl: float = 1e-4
    grad_norm: float = 1e-3

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> VoidRule:
        """The rule of a test file's ``void:`` mapping (missing fields take the defaults).

        Raises:
            ValueError: For an unknown field or a value that is not a number >= 0.
        """
        values = dict(values or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"void: unknown fields {unknown}; the rule's fields are {names}")
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"void: {name} must be a number >= 0, got {value!r}")
        return cls(**values)


_CHECKS = {  # metric -> (label, headline of a failed check)
    "reward_std": ("reward std", "rewards did not vary within an agent's step"),
    "kl": ("KL", "the policy did not move from the reference (KL)"),
    "grad_norm": ("gradient norm", "no gradient"),
}


def _run_failures(steps: Sequence[Mapping[str, Any]], rule: VoidRule) -> dict[str, str]:
    """The void checks one run fails, each with what it logged."""
    considered = [m for m in steps if int(m.get("step") or 0) <= rule.through_step]
    failures = {}
    for metric, (label, _) in _CHECKS.items():
        floor = getattr(rule, metric)
        logged, passed = 0, 0
        for metrics in considered:
            values = [
                float(v)
                for key, v in metrics.items()
                if key.partition("/")[2] == metric and v is not None  # "<agent>/kl"
            ]
            logged += bool(values)
            passed += any(v >= floor for v in values)
        if passed < rule.min_steps:
            failures[metric] = (
                f"{label} >= {floor:g} in {passed} of {len(considered)} steps "
                f"(1-{rule.through_step}), fewer than {rule.min_steps}"
                if logged
                else f"no {label} logged"
            )
    return failures


def void_reasons(
    training_metrics: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    seeds: Iterable[int] | None = None,
    rule: VoidRule | None = None,
) -> dict[str, list[str]]:
    """Why each arm could not learn: a comparison with such an arm is void.

    A run (arm, seed) has a learning signal when, in at least ``rule.min_steps`` of
    steps ``1..rule.through_step``, some agent's reward spread reaches
    ``rule.reward_std``, in as many some agent's KL reaches ``rule.kl``, and in as many
    some agent's gradient norm reaches ``rule.grad_norm`` (:class:`VoidRule`). Training
    successes are not asked for: an arm may learn from coach scores without solving a
    training episode, and one success in hundreds is not a signal. Any run without a
    signal voids its arm: the paired test is over seeds fixed in advance, and dropping
    a seed after seeing its run would be choosing the evidence.

    Args:
        training_metrics: ``{arm: {seed: [per-step metrics of mappa_train's trainer]}}``.
        seeds: Seeds every arm must have metrics for (default: the seeds given).
        rule: The floors (default: :class:`VoidRule`'s).

    Returns:
        ``{arm: reasons}``, empty where the arm is valid: per failed check a line
        (``"outcome: rewards did not vary within an agent's step in every seed"``),
        then one per failed seed (``"outcome seed 0: reward std >= 0.05 in 0 of 20
        steps (1-20), fewer than 5"``).
    """
    rule = rule or VoidRule()
    reasons: dict[str, list[str]] = {}
    for arm, runs in training_metrics.items():
        wanted = sorted(set(runs) | set(seeds or ()))
        lines = [] if wanted else [f"{arm}: no training metrics recorded"]
        failed: dict[str, dict[int, str]] = defaultdict(dict)
        for seed in wanted:
            if not runs.get(seed):
                lines.append(f"{arm} seed {seed}: no training metrics recorded")
                continue
            for check, detail in _run_failures(runs[seed], rule).items():
                failed[check][seed] = detail
        for check, (_, what) in _CHECKS.items():
            if not failed[check]:
                continue
            listed = ("seed " if len(failed[check]) == 1 else "seeds ") + ", ".join(
                map(str, failed[check])
            )
            scope = "every seed" if len(failed[check]) == len(wanted) else listed
            lines.append(f"{arm}: {what} in {scope}")
            lines += [f"{arm} seed {s}: {detail}" for s, detail in failed[check].items()]
        reasons[arm] = lines
    return reasons


def _verdict(
    pair: Mapping[str, Any], min_difference: float, alpha: float, min_seeds: int
) -> dict[str, Any]:
    """Whether ``treatment - baseline`` met the goal, and every reason it did not."""
    difference = round(pair["interval"]["estimate"], DIGITS)
    p, n = pair["test"]["p"], len(pair["seeds"])
    checks = {
        "sign_flip_test": p < alpha,
        "difference": difference >= min_difference,
        "seeds": n >= min_seeds,
        "valid": not pair["void_reasons"],
    }
    why = [f"void: {reason}" for reason in pair["void_reasons"]]
    if not checks["seeds"]:
        why.append(f"{n} paired seeds, fewer than the {min_seeds} the goal needs")
    if not checks["sign_flip_test"]:
        why.append(f"sign-flip test p = {p:.4g} is not below {alpha:g}")
    if not checks["difference"]:
        why.append(f"difference {difference:+.4f} is below {min_difference:g}")
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
    baseline: str | None = None,
    min_difference: float = 0.05,
    alpha: float = 0.05,
    min_seeds: int = 10,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    void_rule: VoidRule | None = None,
) -> dict[str, Any]:
    """Every arm's seeds, the decided pair with a verdict, and the secondary pairs.

    Every arm is scored on the same problems, a missing or aborted sample counted as
    wrong (:func:`complete_accuracy`). The decided pair is ``treatment - baseline``;
    every other arm is compared with the baseline too, as a secondary figure outside
    the claim (no verdict). Each pair gets its per-seed differences, the decided test
    (:func:`sign_flip_test`), the secondary sign and Wilcoxon tests
    (:func:`exact_paired_tests`), the crossed bootstrap interval
    (:func:`crossed_bootstrap`), the void reasons of both arms over the paired seeds
    (:func:`void_reasons`), and the missing and aborted samples per arm and seed. The
    goal is met when the sign-flip ``p < alpha`` and ``D >= min_difference``, over at
    least ``min_seeds`` paired seeds, and never when the pair is void. The interval is
    reported, not decided on.

    Args:
        records: :class:`EvalRecord` rows of every arm.
        training_metrics: ``{arm: {seed: [per-step training metrics]}}``.
        arms: The arms to report, the treatment and baseline among them.
        step: The evaluation step compared (decided before the runs).
        task_set: The held-out set compared.
        treatment: The decided pair's treatment (default: ``arms[0]``).
        baseline: The decided pair's baseline (default: the first other arm).
        min_difference: The goal's smallest mean difference (0.05: 5 points).
        alpha: The sign-flip test's significance level.
        min_seeds: The fewest paired seeds a met goal needs.
        resamples: Bootstrap resamples.
        seed: Bootstrap seed.
        confidence: Bootstrap interval coverage.
        void_rule: The void floors (default: :class:`VoidRule`'s).

    Returns:
        ``step``, ``task_set``, ``treatment``, ``baseline``, ``problems``, ``arms``
        ({arm: :func:`arm_summary`}) and ``pairs``, the decided one first: per pair
        ``treatment``, ``other``, ``decided``, ``seeds``, ``differences``,
        ``dropped_seeds``, ``missing_samples``, ``aborted_samples``, ``test``, ``tests``
        (secondary), ``interval``, ``void``, ``void_reasons`` and ``verdict`` (``met``,
        ``checks``, ``why``, ``thresholds``; ``met`` None for a secondary pair).
    """
    treatment = arms[0] if treatment is None else treatment
    if treatment not in arms:
        raise ValueError(f"treatment {treatment!r} is not one of the arms {list(arms)}")
    others = [arm for arm in arms if arm != treatment]
    baseline = (others[0] if others else None) if baseline is None else baseline
    if baseline is None or baseline not in others:
        raise ValueError(
            f"baseline {baseline!r} must be one of the arms {list(arms)} other than the "
            f"treatment {treatment!r}"
        )
    rule = void_rule or VoidRule()
    completed = complete_accuracy(records, step, task_set, arms)
    order = [(treatment, baseline)] + [(a, baseline) for a in others if a != baseline]
    pairs = []
    for first, other in order:
        paired = _paired(completed, first, other, step, task_set)
        seeds = sorted(paired["differences"])
        # Only the paired seeds' runs count: a seed one arm lacks is not in this test.
        runs = {
            arm: {s: run for s, run in training_metrics.get(arm, {}).items() if s in seeds}
            for arm in (first, other)
        }
        void = void_reasons(runs, seeds, rule)
        pair = {
            "treatment": first,
            "other": other,
            "decided": first == treatment,
            "seeds": seeds,
            **{
                k: paired[k]
                for k in ("differences", "dropped_seeds", "missing_samples", "aborted_samples")
            },
            "test": sign_flip_test(paired["differences"]),
            "tests": exact_paired_tests(paired["differences"]),
            "interval": _bootstrap(paired["table"], resamples, seed, confidence),
            "void_reasons": void[first] + void[other],
        }
        pair["void"] = bool(pair["void_reasons"])
        if pair["decided"]:
            pair["verdict"] = _verdict(pair, min_difference, alpha, min_seeds)
        else:
            pair["verdict"] = {
                "met": None,
                "checks": {},
                "why": ["secondary: reported beside the decided pair, outside the claim"],
                "thresholds": {},
            }
        pairs.append(pair)
    return {
        "step": step,
        "task_set": task_set,
        "treatment": treatment,
        "baseline": baseline,
        "problems": len(completed.problems),
        "void_rule": asdict(rule),
        "arms": {arm: _summary(completed, arm, step, task_set) for arm in arms},
        "pairs": pairs,
    }


def _points(value: float, sign: str = "") -> str:
    return f"{100 * value:{sign}.1f}"


def _counts(by_arm: Mapping[str, Mapping[int, int]]) -> str:
    total = sum(n for seeds in by_arm.values() for n in seeds.values())
    return str(total)


def format_comparison_table(
    comparison: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of :func:`compare_arms` for ``benchmarks._common.print_table``, in points.

    Returns:
        ``(arm_rows, pair_rows)``: per arm its accuracy in every seed (``-`` where it
        has none), mean, median and seed count; per pair the paired seeds, the mean
        difference, the sign-flip p (the decided test), the sign and Wilcoxon p, the
        interval, the missing and aborted samples, whether it is void and the verdict
        (``secondary`` outside the claim).
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
        met = pair["verdict"]["met"]
        pair_rows.append(
            {
                "pair": f"{pair['treatment']} - {pair['other']}",
                "seeds": len(pair["seeds"]),
                "diff": _points(interval["estimate"], "+"),
                "sign-flip p": f"{pair['test']['p']:.4g}",
                "sign p": f"{pair['tests']['sign_p']:.4g}",
                "wilcoxon p": f"{pair['tests']['wilcoxon_p']:.4g}",
                f"{interval['confidence']:.0%} interval": (
                    f"[{_points(interval['low'], '+')}, {_points(interval['high'], '+')}]"
                ),
                "missing": _counts(pair["missing_samples"]),
                "aborted": _counts(pair["aborted_samples"]),
                "void": "yes" if pair["void"] else "no",
                "goal": "secondary" if met is None else ("met" if met else "not met"),
            }
        )
    return arm_rows, pair_rows
