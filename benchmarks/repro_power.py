"""Power of the reproduction's decided test, simulated before any run.

The decided test (``configs/mathchat-credit-test.yaml``, applied by
:mod:`benchmarks.repro_report`) meets its goal when the one-sided exact sign-flip test on
the per-seed differences gives ``p < alpha`` and the mean difference is at least
``min_difference``. This script simulates that rule on synthetic experiments shaped like
the decided one (its problems x samples per evaluation) and prints, per seed spread and
number of seeds, the smallest gain detected with the target power, and the power at the
gain the test is meant to detect.

The model, in logits: problem ``t`` has difficulty ``c + tau * z_t`` shared by every seed
and both arms; each run (arm, seed) adds its own ``sigma * w`` (the seed spread; the two
arms of a seed draw theirs apart, the harder case for a paired test); the treatment adds
``delta``. A sample is right with chance ``sigmoid(...)``. ``c`` is set so that the
baseline's expected accuracy is ``--base-accuracy``, ``delta`` so that the treatment's
is higher by the gain. The same random numbers serve every gain (common random numbers),
so power grows smoothly with the gain and the bisection for the detectable gain is
stable.

    python -m benchmarks.repro_power                       # the decided test's settings
    python -m benchmarks.repro_power --datasets 500 --seeds 6,10 --spreads 0,1
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit

from benchmarks._common import RESULTS_DIR, print_table, write_results
from benchmarks.repro_stats import sign_flip_pvalues

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mathchat-credit-test.yaml"
#: The untrained system's rate on the recipe's training family: 4 of 128 episodes
#: (docs/base-rates.md); what the baseline arm starts from.
BASE_ACCURACY = 0.031
#: Spread of problem difficulty, in logits (shared by seeds and arms, so it mostly
#: cancels in a paired difference).
PROBLEM_SPREAD = 1.0
CALIBRATION_DRAWS = 400_000
"""Normal draws that set ``c`` and ``delta`` (their expectation's error is ~0.05 points)."""
BISECTIONS = 10
"""Halvings of the gain's range when looking for the detectable gain (~0.1 points)."""


def decided_settings(path: Path) -> dict[str, Any]:
    """Problems, samples, seeds, alpha and minimum difference of a decided test file.

    Raises:
        ValueError: As :func:`benchmarks.repro_mathchat.load_recipe`, or when the main
            held-out set is not a generated set with ``n`` problems.
    """
    from benchmarks.repro_mathchat import load_recipe

    recipe, test = load_recipe(path)
    tasks = (recipe.get("eval_env_options") or recipe.get("env_options") or {}).get("tasks")
    if not isinstance(tasks, Mapping) or "n" not in tasks:
        raise ValueError(f"{path}: the main held-out set must be a generated set with 'n'")
    problems = int(tasks["n"])
    goal = dict(test.get("goal") or {})
    return {
        "problems": problems,
        "samples": max(1, int(recipe.get("eval_episodes") or problems) // problems),
        "seeds": len(test["seeds"]),
        "alpha": float(goal.get("alpha", 0.05)),
        "min_difference": float(goal.get("min_difference", 0.0)),
    }


def _calibrate(base: float, tau: float, sigma: float, rng: np.random.Generator) -> Any:
    """``(c, delta_of)``: the centre giving ``base``, and the shift giving a gain."""
    z, w = rng.standard_normal(CALIBRATION_DRAWS), rng.standard_normal(CALIBRATION_DRAWS)
    spread = tau * z + sigma * w

    def solve(target: float, shift: float) -> float:
        low, high = -20.0, 20.0
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (
                (middle, high) if expit(shift + middle + spread).mean() < target else (low, middle)
            )
        return (low + high) / 2

    centre = solve(base, 0.0)
    return centre, lambda gain: solve(base + gain, centre)


class Experiments:
    """``datasets`` synthetic experiments of one seed spread and seed count.

    Every draw is made once (problems, run effects, the uniforms that decide each
    sample), so :meth:`power` at any gain reuses them.
    """

    def __init__(
        self,
        *,
        seeds: int,
        spread: float,
        problems: int,
        samples: int,
        datasets: int,
        base: float = BASE_ACCURACY,
        problem_spread: float = PROBLEM_SPREAD,
        rng_seed: int = 0,
    ) -> None:
        rng = np.random.default_rng(rng_seed)
        self.base = base
        self.centre, self._delta = _calibrate(base, problem_spread, spread, rng)
        difficulty = problem_spread * rng.standard_normal((datasets, 1, problems))
        self.treated = self.centre + difficulty + spread * rng.standard_normal((datasets, seeds, 1))
        self.control = self.centre + difficulty + spread * rng.standard_normal((datasets, seeds, 1))
        self.u_treated = rng.random((datasets, seeds, problems, samples))
        self.u_control = rng.random((datasets, seeds, problems, samples))
        control = (self.u_control < expit(self.control)[..., None]).mean(axis=(2, 3))
        self._control_accuracy = control  # (datasets, seeds)

    def differences(self, gain: float) -> np.ndarray:
        """``[datasets, seeds]`` per-seed differences at a true gain (accuracy points)."""
        delta = self._delta(gain) if gain > 0 else 0.0
        treated = (self.u_treated < expit(self.treated + delta)[..., None]).mean(axis=(2, 3))
        return treated - self._control_accuracy

    def power(self, gain: float, alpha: float, min_difference: float) -> float:
        """Share of experiments where the decided rule meets its goal at ``gain``."""
        d = self.differences(gain)
        met = (sign_flip_pvalues(d) < alpha) & (np.round(d.mean(axis=1), 12) >= min_difference)
        return float(met.mean())


def detectable_gain(
    experiments: Experiments, target: float, alpha: float, min_difference: float
) -> float | None:
    """The smallest gain whose power reaches ``target`` (bisection); None if none does."""
    low, high = 0.0, 0.999 - experiments.base
    if experiments.power(high, alpha, min_difference) < target:
        return None
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        if experiments.power(middle, alpha, min_difference) >= target:
            high = middle
        else:
            low = middle
    return high


def simulate(
    *,
    seeds: Sequence[int],
    spreads: Sequence[float],
    problems: int,
    samples: int,
    alpha: float,
    min_difference: float,
    datasets: int,
    target_gain: float,
    target_power: float,
    base: float = BASE_ACCURACY,
    problem_spread: float = PROBLEM_SPREAD,
    rng_seed: int = 0,
) -> list[dict[str, Any]]:
    """Per (spread, seeds): the gain detected with ``target_power``, the power at
    ``target_gain`` and the rate of false positives (power at no gain)."""
    rows = []
    for spread in spreads:
        for n in seeds:
            experiments = Experiments(
                seeds=n,
                spread=spread,
                problems=problems,
                samples=samples,
                datasets=datasets,
                base=base,
                problem_spread=problem_spread,
                rng_seed=rng_seed,
            )
            gain = detectable_gain(experiments, target_power, alpha, min_difference)
            rows.append(
                {
                    "spread": spread,
                    "seeds": n,
                    "detectable_gain": gain,
                    "power_at_target_gain": experiments.power(target_gain, alpha, min_difference),
                    "false_positive_rate": experiments.power(0.0, alpha, min_difference),
                }
            )
    return rows


def _table(rows: Sequence[Mapping[str, Any]], key: str, fmt: Any) -> list[dict[str, Any]]:
    spreads = list(dict.fromkeys(r["spread"] for r in rows))
    seeds = list(dict.fromkeys(r["seeds"] for r in rows))
    by = {(r["spread"], r["seeds"]): r[key] for r in rows}
    return [
        {"seed spread (logits)": spread, **{f"{n} seeds": fmt(by[(spread, n)]) for n in seeds}}
        for spread in spreads
    ]


def _floats(parser: argparse.ArgumentParser, text: str, flag: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        parser.error(f"{flag} takes comma-separated numbers >= 0, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from benchmarks._common import parse_sizes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="the decided test file")
    parser.add_argument("--seeds", default="4,6,8,10,12,16", help="seed counts, comma-separated")
    parser.add_argument("--spreads", default="0,0.5,1,2", help="seed spreads in logits")
    parser.add_argument("--datasets", type=int, default=2000, help="experiments per cell")
    parser.add_argument("--target-gain", type=float, default=0.10, help="the gain to detect")
    parser.add_argument("--target-power", type=float, default=0.8)
    parser.add_argument("--base-accuracy", type=float, default=BASE_ACCURACY)
    parser.add_argument("--problem-spread", type=float, default=PROBLEM_SPREAD)
    parser.add_argument("--rng-seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS_DIR / "repro"), help="results folder")
    parser.add_argument("--name", default="repro_power", help="results file name")
    args = parser.parse_args(argv)
    args.seed_counts = parse_sizes(parser, args.seeds, "--seeds")
    args.spread_values = _floats(parser, args.spreads, "--spreads")
    if args.datasets < 1:
        parser.error(f"--datasets must be at least 1, got {args.datasets}")
    if not 0 < args.base_accuracy < 1 or not 0 < args.target_gain < 1 - args.base_accuracy:
        parser.error("--base-accuracy and --base-accuracy + --target-gain must be in (0, 1)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = decided_settings(Path(args.config))
    started = time.perf_counter()
    rows = simulate(
        seeds=args.seed_counts,
        spreads=args.spread_values,
        problems=settings["problems"],
        samples=settings["samples"],
        alpha=settings["alpha"],
        min_difference=settings["min_difference"],
        datasets=args.datasets,
        target_gain=args.target_gain,
        target_power=args.target_power,
        base=args.base_accuracy,
        problem_spread=args.problem_spread,
        rng_seed=args.rng_seed,
    )
    seconds = time.perf_counter() - started
    setting = (
        f"{settings['problems']} problems x {settings['samples']} samples, sign-flip p < "
        f"{settings['alpha']:g} and mean >= {100 * settings['min_difference']:g} points, "
        f"baseline {100 * args.base_accuracy:g}%, {args.datasets} experiments per cell"
    )
    print_table(
        _table(rows, "detectable_gain", lambda g: "none" if g is None else f"{100 * g:.1f}"),
        title=f"gain (points) detected with {args.target_power:.0%} power; {setting}",
    )
    print_table(
        _table(rows, "power_at_target_gain", lambda p: f"{p:.3f}"),
        title=f"power at a {100 * args.target_gain:g}-point gain",
    )
    print_table(
        _table(rows, "false_positive_rate", lambda p: f"{p:.3f}"),
        title="false positives (no gain)",
    )
    write_results(
        args.name,
        {
            "command": " ".join(["python -m benchmarks.repro_power", *sys.argv[1:]]),
            "config": Path(args.config).name,
            "decided": settings,
            "model": {
                "base_accuracy": args.base_accuracy,
                "problem_spread_logits": args.problem_spread,
                "arms_draw_seed_effects_apart": True,
            },
            "datasets": args.datasets,
            "target_gain": args.target_gain,
            "target_power": args.target_power,
            "rng_seed": args.rng_seed,
            "rows": rows,
            "seconds": seconds,
        },
        Path(args.out),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
