"""``mappa compare``: evaluation runs side by side, each against the first (the baseline).

Each directory holds a ``report.json`` written by ``mappa eval``. The comparison lists,
per run: success rate (and the environment's accuracy), mean@k and pass@k when present,
mean outcome reward, per agent the mean step reward, tool-call rate and mean response
tokens, the invalid-coach rate and the coach's cost. Against the baseline it gives the
difference of each; for the task-level metrics (success, accuracy, mean@k, pass@k,
outcome reward) the difference comes with a 95% paired bootstrap interval over the task
ids both reports share (their ``per_task`` rows; see
:func:`mappa_agents.metrics.paired_difference`). It writes ``compare.json`` and
``compare.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mappa_agents.metrics import mean_at_k, paired_difference, pass_at_k

logger = logging.getLogger(__name__)

REPORT_FILE = "report.json"

#: Task-level metrics: name -> per-task value from a ``per_task`` row and the report's k.
_PER_TASK_METRICS: dict[str, Any] = {
    "success_rate": lambda row, k: mean_at_k(row["samples"], row["correct"]),
    "accuracy": lambda row, k: mean_at_k(row["samples"], row["correct"]),
    "mean_at_k": lambda row, k: mean_at_k(row["samples"], row["correct"]),
    "pass_at_k": lambda row, k: pass_at_k(row["samples"], row["correct"], min(k, row["samples"])),
    "mean_outcome_reward": lambda row, k: row.get("mean_outcome_reward"),
}


def load_report(run_dir: str | Path) -> dict[str, Any]:
    """The ``report.json`` of a ``mappa eval`` output directory (or the file itself).

    Raises:
        FileNotFoundError: When the directory has no report, saying how to make one.
    """
    path = Path(run_dir)
    file = path if path.is_file() else path / REPORT_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} has no {REPORT_FILE}: pass output directories of `mappa eval --out DIR`"
        )
    return json.loads(file.read_text())


def run_metrics(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The compared numbers of one report, flat: ``{"success_rate": 0.5, ...}``.

    Per-agent numbers are named ``<agent>/mean_reward``, ``<agent>/tool_call_rate`` and
    ``<agent>/mean_response_tokens``.
    """
    metrics: dict[str, float | None] = {"success_rate": report.get("success_rate")}
    if "accuracy" in report:
        metrics["accuracy"] = report["accuracy"]
    for key in ("mean_at_k", "pass_at_k"):
        if isinstance(report.get(key), Mapping):
            metrics[key] = report[key].get("value")
    metrics["mean_outcome_reward"] = report.get("mean_outcome_reward")
    for agent, stats in (report.get("per_agent") or {}).items():
        for key in ("mean_reward", "tool_call_rate", "mean_response_tokens"):
            metrics[f"{agent}/{key}"] = stats.get(key)
    metrics["invalid_coach_rate"] = report.get("invalid_coach_rate")
    metrics["coach_cost_usd"] = report.get("coach_cost_usd")
    return metrics


def per_task_values(report: Mapping[str, Any], metric: str) -> dict[str, float] | None:
    """Task id -> the task's value of ``metric``, from the report's ``per_task`` rows.

    Returns:
        None for a metric without a per-task form or a report without ``per_task``.
    """
    rows = report.get("per_task")
    value_of = _PER_TASK_METRICS.get(metric)
    if not rows or value_of is None:
        return None
    k = int(report.get("samples_per_task") or 1)
    values = {}
    for row in rows:
        if row.get("samples", 0) < 1:
            continue
        value = value_of(row, k)
        if value is not None:
            values[str(row["task_id"])] = float(value)
    return values


def compare_reports(reports: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Side-by-side numbers and differences against ``reports[0]``.

    Returns:
        ``{"baseline": name, "runs": [...], "metrics": {metric: {"values": {run: v},
        "diff": {run: {"value", "ci95", "tasks"}}}}}``: ``ci95`` is a paired bootstrap
        interval over shared task ids where both reports carry ``per_task`` rows, else
        None (the difference of the two numbers alone).
    """
    if len(reports) != len(names) or not reports:
        raise ValueError("need one name per report, and at least one report")
    flat = [run_metrics(r) for r in reports]
    metric_names = list(dict.fromkeys(m for f in flat for m in f))
    baseline = names[0]
    comparison: dict[str, Any] = {
        "baseline": baseline,
        "runs": [
            {
                "name": name,
                "system": report.get("system"),
                "env_id": report.get("env_id"),
                "episodes": report.get("episodes"),
                "samples_per_task": report.get("samples_per_task"),
                "tasks": len(report.get("per_task") or []) or None,
            }
            for name, report in zip(names, reports)
        ],
        "metrics": {},
    }
    for metric in metric_names:
        values = {name: f.get(metric) for name, f in zip(names, flat)}
        diffs: dict[str, Any] = {}
        base_tasks = per_task_values(reports[0], metric)
        for name, report in zip(names[1:], reports[1:]):
            diffs[name] = _difference(values[baseline], values[name], base_tasks, report, metric)
        comparison["metrics"][metric] = {"values": values, "diff": diffs}
    return comparison


def _difference(
    base: float | None,
    other: float | None,
    base_tasks: Mapping[str, float] | None,
    report: Mapping[str, Any],
    metric: str,
) -> dict[str, Any] | None:
    other_tasks = per_task_values(report, metric)
    if base_tasks is not None and other_tasks is not None:
        paired = paired_difference(base_tasks, other_tasks)
        if paired is not None:
            paired["paired"] = True
            return paired
    if base is None or other is None:
        return None
    return {"value": other - base, "ci95": None, "tasks": None, "paired": False}


def format_comparison(comparison: Mapping[str, Any]) -> str:
    """The comparison as a text table: one row per metric, a value and diff per run."""
    names = [run["name"] for run in comparison["runs"]]
    header = ["metric", *names, *(f"diff {n}" for n in names[1:])]
    rows = [header]
    for metric, entry in comparison["metrics"].items():
        row = [metric]
        row += [_fmt(entry["values"].get(n)) for n in names]
        for name in names[1:]:
            diff = entry["diff"].get(name)
            if diff is None or diff.get("value") is None:
                row.append("-")
            elif diff.get("ci95"):
                low, high = diff["ci95"]
                row.append(f"{diff['value']:+.3f} [{low:+.3f}, {high:+.3f}]")
            else:
                row.append(f"{diff['value']:+.3f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"baseline: {comparison['baseline']}"]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    lines.append("diff: run - baseline; [95% paired bootstrap interval over shared tasks]")
    return "\n".join(lines)


def plot_comparison(comparison: Mapping[str, Any], path: str | Path) -> Path:
    """Bar charts of the task-level metrics per run, and their differences, as a PNG.

    Left: success rate, mean@k and pass@k (those present) per run. Right: each run's
    difference from the baseline with its 95% interval as error bars.
    """
    from mappa_env.plotting import new_figure

    names = [run["name"] for run in comparison["runs"]]
    shown = [m for m in ("success_rate", "mean_at_k", "pass_at_k") if m in comparison["metrics"]]
    fig, (left, right) = new_figure(1, 2, figsize=(11, 4), purpose="compare plots")
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        heights = [comparison["metrics"][m]["values"].get(name) or 0.0 for m in shown]
        left.bar([j + i * width for j in range(len(shown))], heights, width, label=name)
    left.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(shown))], shown)
    left.set_ylim(0, 1)
    left.set_title("Per run")
    left.legend(fontsize="small")
    others = names[1:]
    rwidth = 0.8 / max(len(others), 1)
    for i, name in enumerate(others):
        xs, ys, errors = [], [], [[], []]
        for j, metric in enumerate(shown):
            diff = comparison["metrics"][metric]["diff"].get(name) or {}
            value = diff.get("value")
            if value is None:
                continue
            low, high = diff.get("ci95") or (value, value)
            xs.append(j + i * rwidth)
            ys.append(value)
            errors[0].append(max(value - low, 0.0))
            errors[1].append(max(high - value, 0.0))
        right.bar(xs, ys, rwidth, yerr=errors, capsize=4, label=name)
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set_xticks([j + rwidth * (max(len(others), 1) - 1) / 2 for j in range(len(shown))], shown)
    right.set_title(f"Difference from {comparison['baseline']} (95% interval)")
    if others:
        right.legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``mappa compare``: read the reports, print the table, write compare.json/png.

    Raises:
        SystemExit: When a directory has no ``report.json``.
    """
    dirs = [Path(d) for d in args.runs]
    names = _unique_names(dirs)
    try:
        reports = [load_report(d) for d in dirs]
    except FileNotFoundError as exc:
        raise SystemExit(f"mappa compare: {exc}") from exc
    envs = {r.get("env_id") for r in reports}
    if len(envs) > 1:
        logger.warning("comparing reports of different environments: %s", sorted(map(str, envs)))
    comparison = compare_reports(reports, names)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(comparison, indent=2) + "\n")
    plot = plot_comparison(comparison, out / "compare.png")
    print(format_comparison(comparison))
    print(f"wrote {out / 'compare.json'}, {plot}")
    return comparison


def _unique_names(dirs: Sequence[Path]) -> list[str]:
    """Short run names: the directory names, or their paths where names repeat."""
    names = [d.name or str(d) for d in dirs]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return names


def add_compare_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``compare`` sub-command to ``commands`` (an argparse sub-parsers object)."""
    parser = commands.add_parser(
        "compare",
        help="compare mappa eval runs side by side, against the first",
        description="Read report.json of each `mappa eval` output directory and print "
        "their numbers side by side with each run's difference from the first (the "
        "baseline); task-level differences come with a 95%% paired bootstrap interval "
        "over shared task ids. Writes compare.json and compare.png.",
    )
    parser.add_argument("runs", nargs="+", help="output directories of `mappa eval`")
    parser.add_argument(
        "--out", default="runs/compare", help="directory for compare.json and compare.png"
    )
    parser.set_defaults(handler=_compare_handler)
    return parser


def _compare_handler(args: argparse.Namespace) -> int:
    run_compare(args)
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
