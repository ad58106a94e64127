"""Sample-based accuracy estimators (mean@k, pass@k) and their 95% intervals over tasks.

With ``n`` samples of a task of which ``c`` are correct:

- mean@k: the mean accuracy of the samples, ``c / n`` per task, averaged over tasks
  (what papers report as "mean accuracy of k samples per problem");
- pass@k: the chance that at least one of ``k`` samples is correct, estimated without
  bias from ``n >= k`` samples (Chen et al. 2021, "Evaluating Large Language Models
  Trained on Code"): ``pass@k = E_tasks[1 - C(n - c, k) / C(n, k)]``.

Intervals are percentile bootstrap intervals over tasks: tasks are resampled with
replacement (``n_resamples`` times, a fixed seed, so a report is reproducible) and the
2.5% and 97.5% quantiles of the resampled means are the 95% interval. Samples of one
task are correlated; resampling whole tasks keeps that correlation in the interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
"""Bootstrap resamples behind every interval."""

BOOTSTRAP_SEED = 0
"""Seed of the bootstrap, fixed so the same results give the same interval."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: ``1 - C(n - c, k) / C(n, k)``.

    Args:
        n: Samples drawn.
        c: Correct samples among them (``0 <= c <= n``).
        k: Samples allowed (``1 <= k <= n``).

    Returns:
        The probability that ``k`` samples drawn without replacement from the ``n``
        contain a correct one; 1.0 when ``n - c < k`` (every draw of ``k`` holds one).

    Raises:
        ValueError: When the counts are inconsistent.

    Example:
        ``pass_at_k(4, 1, 2) = 1 - C(3, 2) / C(4, 2) = 1 - 3 / 6 = 0.5``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_at_k(n: int, c: int) -> float:
    """Mean accuracy of one task's samples: ``c / n``.

    Raises:
        ValueError: When ``n < 1`` or ``c`` is outside ``[0, n]``.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    return c / n


def bootstrap_interval(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``values`` (one value per task).

    The tasks are resampled with replacement ``n_resamples`` times; the interval is the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the resampled
    means.

    Returns:
        ``(low, high)``, ``(v, v)`` for a single task, or ``None`` without values.
    """
    data = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if data.size == 0:
        return None
    if data.size == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(n_resamples, data.size))
    means = data[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def estimate(values: Sequence[float], **bootstrap: Any) -> dict[str, Any]:
    """Mean over tasks with its 95% bootstrap interval.

    Returns:
        ``{"value": mean, "ci95": [low, high], "tasks": count}`` (``value`` and
        ``ci95`` are None without values).
    """
    clean = [float(v) for v in values if v is not None and not math.isnan(v)]
    interval = bootstrap_interval(clean, **bootstrap)
    return {
        "value": float(np.mean(clean)) if clean else None,
        "ci95": list(interval) if interval is not None else None,
        "tasks": len(clean),
    }


def sample_metrics(counts: Sequence[tuple[int, int]], k: int) -> dict[str, Any]:
    """mean@k and pass@k over tasks, each with its 95% bootstrap interval.

    Args:
        counts: ``(n, c)`` per task: samples and correct samples. Tasks with ``n == 0``
            (every sample aborted) are left out.
        k: The ``k`` of pass@k; a task with fewer than ``k`` samples uses ``k = n``.

    Returns:
        ``{"k": k, "mean_at_k": estimate, "pass_at_k": estimate}`` (see :func:`estimate`).
    """
    kept = [(n, c) for n, c in counts if n > 0]
    return {
        "k": k,
        "mean_at_k": estimate([mean_at_k(n, c) for n, c in kept]),
        "pass_at_k": estimate([pass_at_k(n, c, min(k, n)) for n, c in kept]),
    }


def paired_difference(
    baseline: Mapping[str, float], other: Mapping[str, float], **bootstrap: Any
) -> dict[str, Any] | None:
    """Mean of ``other - baseline`` over the tasks both have, with a 95% interval.

    Pairing by task removes the spread of task difficulty from the interval: it is the
    bootstrap interval (see :func:`bootstrap_interval`) of the per-task differences
    ``other[t] - baseline[t]`` over shared task ids ``t``.

    Returns:
        ``{"value": mean difference, "ci95": [low, high], "tasks": shared count}``, or
        None when no task is shared.
    """
    shared = [t for t in baseline if t in other]
    if not shared:
        return None
    return estimate([float(other[t]) - float(baseline[t]) for t in shared], **bootstrap)
