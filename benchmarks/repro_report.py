"""The reproduction's report: comparisons decided before the runs, tables and plots.

The test is written in its own file (``configs/mathchat-credit-test.yaml``) before any
run (the arms, the seeds, the step compared, the task sets, the thresholds, the void
floors); this module applies it to the records :mod:`benchmarks.repro_collect` rebuilds,
with the statistics of :mod:`benchmarks.repro_stats`: for every held-out set, every arm's
accuracy in every seed (mean and median beside it), the decided pair (treatment minus
baseline) with its verdict - a one-sided exact sign-flip test on the per-seed differences
and the smallest difference - and every other arm against the baseline as a secondary
figure, each with the crossed bootstrap interval and the missing and aborted samples
(counted wrong). A comparison is void when an arm had no learning signal of its own, or
when the runs were not made by one commit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import repro_stats
from benchmarks.repro_collect import AGENTS, BASE_ARM, CODE_AGENT

EMA_ALPHA = 1 / 3
COLOURS = {
    "process_blind": "tab:red",
    "process": "tab:blue",
    "outcome": "tab:orange",
    "agent_oracle": "tab:green",
    "process_last_agent_truth": "tab:purple",
    "mixed": "tab:olive",
    "backprop": "tab:brown",
    BASE_ARM: "tab:gray",
}


def ema(values: Sequence[float | None], alpha: float = EMA_ALPHA) -> list[float]:
    """Exponential moving average ``m_t = alpha * x_t + (1 - alpha) * m_{t-1}``; gaps carry."""
    out: list[float] = []
    current: float | None = None
    for value in values:
        if value is not None and not math.isnan(value):
            current = value if current is None else alpha * value + (1 - alpha) * current
        out.append(math.nan if current is None else current)
    return out


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Every value with its mean, median, min and max (``None`` entries left out)."""
    clean = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return {"values": [], "mean": None, "median": None, "min": None, "max": None}
    return {
        "values": clean,
        "mean": statistics.fmean(clean),
        "median": statistics.median(clean),
        "min": min(clean),
        "max": max(clean),
    }


def common_step(runs: Sequence[Mapping[str, Any]], task_set: str) -> int | None:
    """The last evaluation step after training that every run reached on ``task_set``."""
    reached = [{p["step"] for p in run["evals"].get(task_set, []) if p["step"] > 0} for run in runs]
    if not reached or not all(reached):
        return None
    shared = set.intersection(*reached)
    return max(shared) if shared else None


def commit_voids(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the runs are not comparable by provenance: more than one commit, or none."""
    commits = sorted({c for run in runs for c in run["commits"]})
    if not commits:
        return ["no run recorded the commit it was made with"]
    if len(commits) > 1:
        return [f"the runs were made by {len(commits)} commits ({', '.join(commits)}), not one"]
    if commits[0] in ("None", "") or commits[0].endswith("+dirty"):
        return [f"the runs' code is not a commit ({commits[0]})"]
    return []


def compare(
    runs: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
    test: Mapping[str, Any],
    arms: Sequence[str],
    task_sets: Sequence[str],
) -> dict[str, Any]:
    """The decided test on every held-out set, and the base system's accuracy.

    Args:
        runs: :func:`~benchmarks.repro_collect.collect`'s runs.
        records: Its per-episode records.
        test: The decided test (the test file's ``treatment``, ``baseline``,
            ``compare_step``, ``goal``, ``void``).
        arms: The arms reported (the treatment among them).
        task_sets: The held-out sets, the main one first.

    Returns:
        Per task set: the step compared (the decided one when every run reached it,
        else the last they all reached, flagged), the base's accuracy per seed, and
        :func:`~benchmarks.repro_stats.compare_arms` with void reasons that include the
        runs' provenance; plus ``provenance_void``.
    """
    decided = int(test["compare_step"])
    goal = dict(test.get("goal") or {})
    rule = repro_stats.VoidRule.from_mapping(test.get("void"))
    metrics = {
        arm: {run["seed"]: run["train"] for run in runs if run["arm"] == arm} for arm in arms
    }
    provenance = commit_voids(runs)
    by_set: dict[str, Any] = {}
    for task_set in task_sets:
        reached = common_step([r for r in runs if r["arm"] in arms], task_set)
        step = decided if reached is not None and reached >= decided else reached
        mine = [r for r in records if r["task_set"] == task_set]
        entry: dict[str, Any] = {
            "step": step,
            "decided_step": decided,
            "at_decided_step": step == decided,
            "base": _base(mine),
        }
        if step is not None and any(r["step"] == step for r in mine):
            comparison = repro_stats.compare_arms(
                [r for r in mine if r["arm"] in arms],
                metrics,
                arms,
                step,
                task_set,
                treatment=test["treatment"],
                baseline=test.get("baseline"),
                min_difference=goal.get("min_difference", 0.05),
                alpha=goal.get("alpha", 0.05),
                min_seeds=goal.get("min_seeds", 10),
                resamples=goal.get("resamples", 10_000),
                confidence=goal.get("confidence", 0.95),
                void_rule=rule,
            )
            for pair in comparison["pairs"]:
                extra = list(provenance)
                if step != decided:
                    extra.append(f"compared at step {step}, not the decided step {decided}")
                pair["void_reasons"] = pair["void_reasons"] + provenance
                pair["void"] = bool(pair["void_reasons"])
                if extra and pair["decided"]:
                    pair["verdict"]["met"] = False
                    pair["verdict"]["why"] = [*pair["verdict"]["why"], *extra]
            entry["comparison"] = comparison
        by_set[task_set] = entry
    return {"task_sets": by_set, "provenance_void": provenance}


def _base(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The untrained system's accuracy per seed (problems as the unit), if evaluated."""
    base = [r for r in records if r["arm"] == BASE_ARM]
    if not base:
        return {"seeds": {}, "mean": None, "median": None}
    by_seed = {
        key[1]: value
        for key, value in repro_stats.seed_accuracy(base).items()
        if key[0] == BASE_ARM
    }
    summary = spread(list(by_seed.values()))
    return {"seeds": by_seed, "mean": summary["mean"], "median": summary["median"]}


def behaviour(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Per arm: training success and rewards over all steps, and the code executor's
    tool-call rate and each agent's response length at the first and last common step."""
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm and r["train"]]
        if not mine:
            continue
        last = min(max(p["step"] for p in r["train"]) for r in mine)

        def at(step: int, key: str, runs_: Sequence[Mapping[str, Any]] = mine) -> dict[str, Any]:
            return spread([p.get(key) for r in runs_ for p in r["train"] if p["step"] == step])

        successes = [
            round(float(p.get("rollout/success_rate") or 0) * int(p.get("rollout/episodes") or 0))
            for r in mine
            for p in r["train"]
        ]
        episodes = sum(int(p.get("rollout/episodes") or 0) for r in mine for p in r["train"])
        out[arm] = {
            "training_episodes": episodes,
            "training_successes": sum(successes),
            "last_common_step": last,
            "tool_call_rate": {
                "step_1": at(1, f"{CODE_AGENT}/tool_call_rate"),
                "last": at(last, f"{CODE_AGENT}/tool_call_rate"),
            },
            "response_tokens": {
                agent: {
                    "step_1": at(1, f"{agent}/mean_response_tokens"),
                    "last": at(last, f"{agent}/mean_response_tokens"),
                }
                for agent in AGENTS
            },
        }
    return out


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------


def table_rows(summary: Mapping[str, Any], task_set: str) -> tuple[list[dict], list[dict]]:
    """Arm rows (base first) and pair rows of one task set, in points."""
    entry = summary["task_sets"][task_set]
    comparison = entry.get("comparison")
    if comparison is None:
        return [], []
    arm_rows, pair_rows = repro_stats.format_comparison_table(comparison)
    base = entry["base"]
    if base["seeds"]:
        seeds = [k for k in arm_rows[0] if k.startswith("seed ")] if arm_rows else []
        row: dict[str, Any] = {"arm": "base (step 0)"}
        for key in seeds:
            seed = int(key.split()[1])
            value = base["seeds"].get(seed)
            row[key] = "-" if value is None else f"{100 * value:.1f}"
        row.update(
            mean=f"{100 * base['mean']:.1f}", median=f"{100 * base['median']:.1f}", n=len(seeds)
        )
        arm_rows.insert(0, row)
    return arm_rows, pair_rows


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------


def plot_accuracy(
    runs: Sequence[Mapping[str, Any]], arms: Sequence[str], task_sets: Sequence[str], path: Path
) -> Path:
    """Held-out accuracy vs step, a panel per task set: every seed thin, the mean thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(task_sets), figsize=(6.2 * len(task_sets), 4.2), squeeze=False)
    for ax, task_set in zip(axes[0], task_sets):
        for arm in arms:
            mine = [r for r in runs if r["arm"] == arm and r["evals"].get(task_set)]
            colour = COLOURS.get(arm)
            by_step: dict[int, list[float]] = {}
            for run in mine:
                points = sorted((p["step"], 100 * p["accuracy"]) for p in run["evals"][task_set])
                for step, value in points:
                    by_step.setdefault(step, []).append(value)
                ax.plot(*zip(*points), color=colour, alpha=0.35, linewidth=0.8)
            if not by_step:
                continue
            steps = sorted(by_step)
            means = [statistics.fmean(by_step[s]) for s in steps]
            ax.plot(
                steps, means, color=colour, linewidth=2.2, marker="o",
                label=f"{arm} ({len(mine)} seeds)",
            )  # fmt: skip
        ax.set_ylim(0, max(10.0, ax.get_ylim()[1]))
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out accuracy (%)")
        ax.set_title(f"{task_set}: every seed (thin), mean (thick)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_behaviour(runs: Sequence[Mapping[str, Any]], arms: Sequence[str], path: Path) -> Path:
    """The paper's behaviour figure over training rollouts, and each arm's mean reward.

    Panels: the code executor's tool-call rate, each agent's response length and the
    rollouts' mean reward (what the arm trains on); raw per-step values of every run
    faint, their EMA (alpha = 1/3) solid.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"{CODE_AGENT}/tool_call_rate", "code executor tool-call rate (%)", 100.0)]
    panels += [(f"{a}/mean_response_tokens", f"{a} response tokens", 1.0) for a in AGENTS]
    panels += [("rollout/mean_reward", "mean reward trained on", 1.0)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.6))
    for ax, (key, title, scale) in zip(axes, panels):
        for arm in arms:
            colour = COLOURS.get(arm)
            for index, run in enumerate(r for r in runs if r["arm"] == arm and r["train"]):
                steps = [p["step"] for p in run["train"]]
                raw = [None if p.get(key) is None else scale * p[key] for p in run["train"]]
                ax.plot(
                    steps,
                    [math.nan if v is None else v for v in raw],
                    color=colour,
                    alpha=0.2,
                    linewidth=0.8,
                )
                ax.plot(
                    steps, ema(raw), color=colour, linewidth=1.4, label=arm if index == 0 else None
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Training rollouts: raw per step (faint), EMA 1/3 (solid)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
