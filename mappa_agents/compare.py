"""``mappa compare``: evaluation runs side by side, each against the first (the baseline).

Each directory holds a ``report.json`` written by ``mappa eval``. The comparison lists,
per run: success rate (and the environment's accuracy), mean@k and pass@k when present,
mean outcome reward, per agent the mean step reward, tool-call rate and mean response
tokens, the invalid-coach rate and the coach's cost. Against the baseline it gives the
difference of each; for the task-level metrics (success, accuracy, mean@k, pass@k,
outcome reward) the difference comes with a 95% paired bootstrap interval over the task
ids both reports share (their ``per_task`` rows; see
:func:`mappa_agents.metrics.paired_difference`), and the table says over how many tasks.
pass@k is compared at one k: when the runs sampled different K per task, every run's
pass@k is recomputed from its ``per_task`` rows at the smallest K, with a warning. It
writes ``compare.json`` and ``compare.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mappa_agents.metrics import estimate, mean_at_k, paired_difference, pass_at_k
from mappa_env.errors import SettingsError

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
        SettingsError: When the directory has no report (saying how to make one), or
            the report is not a JSON object (cut short, or another file), naming the
            file and what is wrong.
    """
    path = Path(run_dir)
    file = path if path.is_file() else path / REPORT_FILE
    if not file.is_file():
        raise SettingsError(
            f"{path} has no {REPORT_FILE}: pass output directories of `mappa eval --out DIR`"
        )
    try:
        report = json.loads(file.read_text())
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{file} is not a text file ({exc.reason}); {_RERUN}") from None
    except json.JSONDecodeError as exc:
        # A report is one JSON object: one that does not end with its brace was cut.
        cut = "" if exc.doc.rstrip().endswith("}") else " (cut short?)"
        raise SettingsError(
            f"{file} is not valid JSON{cut}: {exc.msg} (line {exc.lineno}, column "
            f"{exc.colno}); {_RERUN}"
        ) from None
    if not isinstance(report, dict) or not isinstance(report.get("per_agent", {}), dict):
        raise SettingsError(f"{file} is JSON but not a mappa eval report; {_RERUN}")
    return report


_RERUN = "run `mappa eval --out DIR` again to write it, or pass another run's directory"


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


def samples_per_task(report: Mapping[str, Any]) -> int:
    """The K of a report: its samples per task (1 for reports that do not say)."""
    return int(report.get("samples_per_task") or 1)


def per_task_values(
    report: Mapping[str, Any], metric: str, k: int | None = None
) -> dict[str, float] | None:
    """Task id -> the task's value of ``metric``, from the report's ``per_task`` rows.

    Args:
        report: A ``report.json``.
        metric: A task-level metric name (``success_rate``, ``pass_at_k``, ...).
        k: The k of pass@k (default: the report's own samples per task).

    Returns:
        None for a metric without a per-task form or a report without ``per_task``.
    """
    rows = report.get("per_task")
    value_of = _PER_TASK_METRICS.get(metric)
    if not rows or value_of is None:
        return None
    k = samples_per_task(report) if k is None else k
    values = {}
    for row in rows:
        if row.get("samples", 0) < 1:
            continue
        value = value_of(row, k)
        if value is not None:
            values[str(row["task_id"])] = float(value)
    return values


def _task_ids(report: Mapping[str, Any]) -> set[str] | None:
    """Ids of the tasks a report has finished samples of (None without ``per_task``)."""
    rows = report.get("per_task")
    if not rows:
        return None
    return {str(row["task_id"]) for row in rows if row.get("samples", 0) >= 1}


def _pass_at(report: Mapping[str, Any], k: int) -> float | None:
    """The report's pass@k at ``k``: its own number at its K, else from ``per_task``."""
    if samples_per_task(report) == k:
        stored = report.get("pass_at_k")
        return stored.get("value") if isinstance(stored, Mapping) else None
    values = per_task_values(report, "pass_at_k", k)
    return estimate(list(values.values()))["value"] if values else None


def compare_reports(reports: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Side-by-side numbers and differences against ``reports[0]``.

    pass@k is compared at ``k`` = the smallest samples per task of the runs: a run with
    more samples gets its pass@k recomputed from its ``per_task`` rows at that ``k``
    (None where it has no rows), and ``warnings`` says so.

    Returns:
        ``{"baseline": name, "pass_k": k, "runs": [...], "metrics": {metric: {"label",
        "values": {run: v}, "diff": {run: {"value", "ci95", "tasks"}}}}, "warnings":
        [...]}``: ``ci95`` is a paired bootstrap interval over shared task ids where
        both reports carry ``per_task`` rows, else None (the difference of the two
        numbers alone); ``tasks`` counts those shared tasks. ``label`` is the row's
        name in the table (``pass@4``); ``warnings`` lines say where the numbers do not
        compare like with like (pass@k at other K, differences over fewer tasks than
        the runs have).
    """
    if len(reports) != len(names) or not reports:
        raise ValueError("need one name per report, and at least one report")
    flat = [run_metrics(r) for r in reports]
    metric_names = list(dict.fromkeys(m for f in flat for m in f))
    baseline = names[0]
    # K of the runs that report pass@k (older reports without it do not count).
    ks = {
        name: samples_per_task(r)
        for name, r in zip(names, reports)
        if isinstance(r.get("pass_at_k"), Mapping)
    }
    k = min(ks.values(), default=1)
    same_k = len(set(ks.values())) <= 1
    warnings: list[str] = []
    if not same_k:
        runs_k = ", ".join(f"{name} K={run_k}" for name, run_k in ks.items())
        warnings.append(
            f"runs sampled different K per task ({runs_k}): pass@k of every run is "
            f"pass@{k}, recomputed from its per_task rows; mean@k is each run's mean "
            "accuracy over its own samples"
        )
        for name, report, f in zip(names, reports, flat):
            if name in ks:
                f["pass_at_k"] = _pass_at(report, k)
                if f["pass_at_k"] is None:
                    warnings.append(f"{name} has no per_task rows: no pass@{k} for it")
    labels = {"pass_at_k": f"pass@{k}", "mean_at_k": f"mean@{k}" if same_k else "mean@k"}
    base_ids = _task_ids(reports[0])
    for name, report in zip(names[1:], reports[1:]):
        ids = _task_ids(report)
        if base_ids is None or ids is None:
            continue
        shared = len(base_ids & ids)
        if shared < len(base_ids) or shared < len(ids):
            warnings.append(
                f"diff {name}: over the {shared} tasks both runs share, of {baseline}'s "
                f"{len(base_ids)} and {name}'s {len(ids)}; the value columns cover each "
                "run's own tasks"
            )
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
        "pass_k": k,
        "metrics": {},
        "warnings": warnings,
    }
    for metric in metric_names:
        values = {name: f.get(metric) for name, f in zip(names, flat)}
        diffs: dict[str, Any] = {}
        base_tasks = per_task_values(reports[0], metric, k)
        for name, report in zip(names[1:], reports[1:]):
            diffs[name] = _difference(
                values[baseline], values[name], base_tasks, per_task_values(report, metric, k)
            )
        comparison["metrics"][metric] = {
            "label": labels.get(metric, metric),
            "values": values,
            "diff": diffs,
        }
    return comparison


def _difference(
    base: float | None,
    other: float | None,
    base_tasks: Mapping[str, float] | None,
    other_tasks: Mapping[str, float] | None,
) -> dict[str, Any] | None:
    if base_tasks is not None and other_tasks is not None:
        paired = paired_difference(base_tasks, other_tasks)
        if paired is not None:
            paired["paired"] = True
            return paired
    if base is None or other is None:
        return None
    return {"value": other - base, "ci95": None, "tasks": None, "paired": False}


def format_comparison(comparison: Mapping[str, Any]) -> str:
    """The comparison as a text table: one row per metric, a value and diff per run.

    A paired difference shows the number of shared tasks it covers; the comparison's
    warnings follow the table.
    """
    names = [run["name"] for run in comparison["runs"]]
    header = ["metric", *names, *(f"diff {n}" for n in names[1:])]
    rows = [header]
    for metric, entry in comparison["metrics"].items():
        row = [entry.get("label", metric)]
        row += [_fmt(entry["values"].get(n)) for n in names]
        for name in names[1:]:
            diff = entry["diff"].get(name)
            if diff is None or diff.get("value") is None:
                row.append("-")
            elif diff.get("ci95"):
                low, high = diff["ci95"]
                row.append(
                    f"{diff['value']:+.3f} [{low:+.3f}, {high:+.3f}] ({diff.get('tasks')} tasks)"
                )
            else:
                row.append(f"{diff['value']:+.3f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"baseline: {comparison['baseline']}"]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    lines.append(
        "diff: run - baseline; [95% paired bootstrap interval] (over n tasks both runs share)"
    )
    lines += [f"warning: {warning}" for warning in comparison.get("warnings", [])]
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
    labels = [comparison["metrics"][m].get("label", m) for m in shown]
    left.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(shown))], labels)
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
    right.set_xticks(
        [j + rwidth * (max(len(others), 1) - 1) / 2 for j in range(len(shown))], labels
    )
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
        SystemExit: When a directory has no ``report.json`` or an unreadable one.
    """
    dirs = [Path(d) for d in args.runs]
    names = _unique_names(dirs)
    try:
        reports = [load_report(d) for d in dirs]
    except SettingsError as exc:
        raise SystemExit(f"mappa compare: {exc}") from None
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
        "baseline); task-level differences come with a 95% paired bootstrap interval "
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
