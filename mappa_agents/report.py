"""Benchmark reports: what a run of a system on an environment achieved, as numbers and plots."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa_agents.metrics import sample_metrics
from mappa_agents.trajectory import EpisodeResult
from mappa_env.registry import registered_env_attribute

UNKNOWN_TASK_TYPE = "unknown"
"""Task type of episodes whose outcome has no ``task_type``."""


class AllEpisodesFailedError(RuntimeError):
    """Every episode of a run aborted: there is nothing to report."""


def check_some_finished(episodes: Sequence[EpisodeResult]) -> None:
    """Stop when no episode finished, with the first episode's error.

    Raises:
        AllEpisodesFailedError: When ``episodes`` is empty or every one aborted; the
            message gives the first error (as the trainer stops on the first error).
    """
    if not episodes:
        raise AllEpisodesFailedError("no episodes ran")
    if all(e.aborted for e in episodes):
        first = next((e for e in episodes if e.outcome.error), episodes[0])
        error = str(first.outcome.error or "unknown error").rstrip(".")
        raise AllEpisodesFailedError(
            f"all {len(episodes)} episodes failed; the first error ({first.episode_id}): "
            f"{error}. Fix that cause (a model or API that cannot answer, an unreachable "
            "server, a broken environment) and run again."
        )


def isolation_of(env: Any) -> dict[str, Any]:
    """What isolation an environment's agents' code runs under, for reports and configs.

    Args:
        env: An environment; pipeline environments answer ``isolation_report()``.

    Returns:
        Its isolation report (``{"isolation": "namespaces" | "none", ...}``, see
        :meth:`mappa_env.PipelineEnv.isolation_report`), or ``{"isolation": "unknown"}``
        with the reason for an environment that gives none.
    """
    report = getattr(env, "isolation_report", None)
    if not callable(report):
        return {"isolation": "unknown", "reason": f"{type(env).__name__} reports no isolation"}
    return dict(report())


def describe_isolation(isolation: dict[str, Any] | None) -> str:
    """One line for printed summaries: what confined agents' code, or that nothing did."""
    if not isolation:
        return "isolation: unknown"
    if isolation.get("code_execution") is False:
        return "isolation: no code execution"
    mode = isolation.get("isolation")
    if mode == "namespaces":
        parts = [
            f"user {isolation.get('user')}",
            f"memory cgroup {isolation.get('memory_cgroup') or 'none'}",
            f"pids cgroup {isolation.get('pids_cgroup') or 'none'}",
        ]
        return "isolation: namespaces (" + ", ".join(parts) + ")"
    reason = isolation.get("reason") or "no reason given"
    return f"isolation: {str(mode).upper()}: agents' code ran unconfined ({reason})"


def per_task_results(episodes: Sequence[EpisodeResult]) -> list[dict[str, Any]]:
    """One row per task: its samples and how many were correct, in first-seen order.

    Returns:
        Rows ``{"task_id", "task_type", "samples", "correct", "aborted",
        "mean_outcome_reward"}``: ``samples`` counts the finished episodes of the task
        (aborted ones are counted in ``aborted`` only, as they have no graded outcome).
        ``report.json`` stores them so that ``mappa compare`` can pair runs by task.
    """
    rows: dict[str, dict[str, Any]] = {}
    rewards: dict[str, list[float]] = {}
    for episode in episodes:
        task_id = episode.task_id or str(episode.outcome.task_id or "")
        if not task_id:
            continue  # an episode whose reset failed: it belongs to no task
        row = rows.setdefault(
            task_id,
            {"task_id": task_id, "task_type": None, "samples": 0, "correct": 0, "aborted": 0},
        )
        if episode.aborted:
            row["aborted"] += 1
            continue
        row["samples"] += 1
        row["correct"] += int(episode.succeeded)
        if row["task_type"] is None and episode.outcome.task_type is not None:
            row["task_type"] = str(episode.outcome.task_type)
        rewards.setdefault(task_id, []).append(_outcome_reward(episode))
    for task_id, row in rows.items():
        row["task_type"] = row["task_type"] or UNKNOWN_TASK_TYPE
        row["mean_outcome_reward"] = _mean(rewards.get(task_id, []))
    return list(rows.values())


def summarize_samples(per_task: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """mean@k and pass@k, overall and per task type, from :func:`per_task_results` rows.

    See :mod:`mappa_agents.metrics` for the estimators and their bootstrap intervals.

    Returns:
        ``{"samples_per_task": k, "mean_at_k": ..., "pass_at_k": ...,
        "per_task_type": {type: {"mean_at_k": ..., "pass_at_k": ...}}}``, each metric
        ``{"value", "ci95", "tasks"}``.
    """
    overall = sample_metrics([(r["samples"], r["correct"]) for r in per_task], k)
    by_type: dict[str, list[tuple[int, int]]] = {}
    for row in per_task:
        by_type.setdefault(row["task_type"], []).append((row["samples"], row["correct"]))
    return {
        "samples_per_task": k,
        "mean_at_k": overall["mean_at_k"],
        "pass_at_k": overall["pass_at_k"],
        "per_task_type": {
            task_type: {
                key: value for key, value in sample_metrics(counts, k).items() if key != "k"
            }
            for task_type, counts in sorted(by_type.items())
        },
    }


def _mean(values: Sequence[float]) -> float | None:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(clean) if clean else None


def _outcome_reward(episode: EpisodeResult) -> float:
    """A finished episode's outcome reward; one that reported none counts as 0.0."""
    reward = episode.outcome.reward
    return 0.0 if reward is None else float(reward)


def summarize(
    episodes: Sequence[EpisodeResult],
    wall_time_s: float | None = None,
    *,
    samples_per_task: int = 1,
) -> dict[str, Any]:
    """Aggregate a run into the numbers of ``report.json``.

    Args:
        episodes: Finished episodes of one environment.
        wall_time_s: Wall-clock time of the whole run, if measured.
        samples_per_task: The ``k`` of mean@k and pass@k (``mappa eval
            --samples-per-task``).

    Returns:
        A JSON-serialisable dict: episode count, success rate, mean outcome reward, and
        per agent: actions, mean step reward, mean coach score, invalid-coach rate,
        tool-call rate, mean response tokens, share of responses cut by the length
        limit; coach cost and tokens where the coach reports them; the environment's
        own numbers (its class's ``summarize_outcomes``, e.g. MathChat's accuracy) and
        the tool-call rate of its ``tool_agent``; mean@k and pass@k overall and per
        task type with 95% intervals (:func:`summarize_samples`) and the per-task rows
        they come from (``per_task``, :func:`per_task_results`).
    """
    if not episodes:
        raise ValueError("no episodes to summarise")
    env_id = episodes[0].env_id
    aborted = sum(e.aborted for e in episodes)
    # Aborted episodes have no graded outcome: rates are over the finished ones.
    finished = [e for e in episodes if not e.aborted]
    actions = [a for e in episodes for a in e.actions]
    agents = list(dict.fromkeys(a.agent for a in actions))
    per_agent: dict[str, dict[str, Any]] = {}
    for agent in agents:
        mine = [a for a in actions if a.agent == agent]
        verdicts = [a.coach for a in mine if a.coach is not None]
        invalid = sum(1 for v in verdicts if not v.get("valid", False))
        per_agent[agent] = {
            "actions": len(mine),
            "mean_reward": _mean([a.reward for a in mine]),
            "mean_coach_score": _mean([v["score"] for v in verdicts if v.get("valid")]),
            "invalid_coach_rate": invalid / len(verdicts) if verdicts else None,
            "tool_call_rate": sum(a.used_tool for a in mine) / len(mine),
            "mean_response_tokens": _mean([float(len(a.response_ids)) for a in mine]),
            "length_cut_rate": sum(a.finish_reason == "length" for a in mine) / len(mine),
        }
    verdicts = [a.coach for a in actions if a.coach is not None]
    report: dict[str, Any] = {
        "env_id": env_id,
        "episodes": len(episodes),
        "aborted_episodes": aborted,
        "actions": len(actions),
        "success_rate": sum(e.succeeded for e in finished) / len(finished) if finished else 0.0,
        "mean_outcome_reward": _mean([_outcome_reward(e) for e in finished]),
        "invalid_coach_rate": (
            sum(1 for v in verdicts if not v.get("valid", False)) / len(verdicts)
            if verdicts
            else None
        ),
        "per_agent": per_agent,
        "coach_cost_usd": sum(float(v.get("cost_usd") or 0.0) for v in verdicts),
        "coach_prompt_tokens": sum(int(v.get("prompt_tokens") or 0) for v in verdicts),
        "coach_completion_tokens": sum(int(v.get("completion_tokens") or 0) for v in verdicts),
        "policy_prompt_tokens": sum(len(a.prompt_ids) for a in actions),
        "policy_response_tokens": sum(len(a.response_ids) for a in actions),
    }
    # What is particular to an environment comes from its class (none: not registered).
    tool_agent = registered_env_attribute(env_id, "tool_agent")
    if tool_agent is not None and tool_agent in per_agent:
        report["code_agent"] = tool_agent
        report["code_agent_tool_call_rate"] = per_agent[tool_agent]["tool_call_rate"]
    summarize_outcomes = registered_env_attribute(env_id, "summarize_outcomes")
    if callable(summarize_outcomes):
        report.update(summarize_outcomes([e.outcome for e in finished]))
    per_task = per_task_results(episodes)
    report.update(summarize_samples(per_task, samples_per_task))
    report["per_task"] = per_task
    if wall_time_s is not None:
        report["wall_time_s"] = wall_time_s
        report["episodes_per_s"] = len(episodes) / wall_time_s if wall_time_s > 0 else None
    return report


def format_table(report: dict[str, Any]) -> str:
    """A short text table of a report (what ``mappa eval`` prints)."""
    lines = [
        f"{report['env_id']}: {report['episodes']} episodes, "
        f"success {report['success_rate']:.1%}, mean outcome reward "
        f"{_fmt(report['mean_outcome_reward'])}, invalid coach verdicts "
        f"{_fmt_rate(report['invalid_coach_rate'])}"
    ]
    failures = report.get("coach_failures") or {}
    if failures:
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(failures.items()))
        lines[0] += f" (by cause: {causes})"
    if report.get("mean_at_k") is not None:
        k = report.get("samples_per_task", 1)
        lines.append(
            f"over {report['mean_at_k']['tasks']} tasks x {k} samples: "
            f"mean@{k} {_fmt_estimate(report['mean_at_k'])}, "
            f"pass@{k} {_fmt_estimate(report['pass_at_k'])} (95% bootstrap intervals)"
        )
        by_type = report.get("per_task_type") or {}
        # With one sample per task the per-type lines are single tasks' outcomes: they
        # stay in report.json, and the table shows them for K > 1 only.
        if len(by_type) > 1 and k > 1:
            for task_type, stats in by_type.items():
                lines.append(
                    f"  {task_type}: mean@{k} {_fmt_estimate(stats['mean_at_k'])}, "
                    f"pass@{k} {_fmt_estimate(stats['pass_at_k'])}, "
                    f"{stats['mean_at_k']['tasks']} tasks"
                )
    header = ("agent", "actions", "reward", "coach", "tool calls", "resp tokens", "cut")
    rows = [header]
    for agent, stats in report["per_agent"].items():
        rows.append(
            (
                agent,
                str(stats["actions"]),
                _fmt(stats["mean_reward"]),
                _fmt(stats["mean_coach_score"]),
                _fmt_rate(stats["tool_call_rate"]),
                _fmt(stats["mean_response_tokens"], ".0f"),
                _fmt_rate(stats["length_cut_rate"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if report.get("wall_time_s") is not None:
        lines.append(
            f"wall time {report['wall_time_s']:.1f} s "
            f"({_fmt(report.get('episodes_per_s'), '.3f')} episodes/s)"
        )
    if "isolation" in report:
        lines.append(describe_isolation(report["isolation"]))
    return "\n".join(lines)


def plot_report(episodes: Sequence[EpisodeResult], out_dir: str | Path) -> list[Path]:
    """Draw the run's plots as PNG files in ``out_dir`` and return their paths.

    ``rewards.png``: mean step reward and coach-score distribution per agent;
    ``lengths.png``: response-length distribution per agent, with tool-call rates.
    """
    # Drawn outside pyplot: a notebook user's matplotlib backend stays as it is.
    from mappa_env.plotting import new_figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    actions = [a for e in episodes for a in e.actions]
    agents = list(dict.fromkeys(a.agent for a in actions))
    paths: list[Path] = []
    if not agents:  # no action at all (every episode failed at reset): nothing to draw
        return paths

    fig, (left, right) = new_figure(1, 2, figsize=(10, 4), purpose="report plots")
    means = [_mean([a.reward for a in actions if a.agent == g]) or 0.0 for g in agents]
    left.bar(agents, means, color="tab:blue")
    left.set_ylim(0, 1)
    left.set_ylabel("mean step reward")
    left.set_title("Reward per agent")
    scores = [
        [a.coach["score"] for a in actions if a.agent == g and a.coach and a.coach.get("valid")]
        for g in agents
    ]
    if any(scores):
        right.boxplot([s or [math.nan] for s in scores], tick_labels=agents)
    right.set_ylim(-0.5, 10.5)
    right.set_ylabel("coach score (0-10)")
    right.set_title("Coach scores")
    fig.suptitle(f"{episodes[0].env_id}: {len(episodes)} episodes")
    fig.tight_layout()
    paths.append(out / "rewards.png")
    fig.savefig(paths[-1], dpi=110)

    fig, ax = new_figure(figsize=(6, 4), purpose="report plots")
    lengths = [[len(a.response_ids) for a in actions if a.agent == g] for g in agents]
    labels = []
    for agent in agents:
        mine = [a for a in actions if a.agent == agent]
        rate = sum(a.used_tool for a in mine) / len(mine) if mine else 0.0
        labels.append(f"{agent}\ntool calls {rate:.0%}")
    ax.boxplot([ls or [0] for ls in lengths], tick_labels=labels)
    ax.set_ylabel("response tokens")
    ax.set_title("Response length per agent")
    fig.tight_layout()
    paths.append(out / "lengths.png")
    fig.savefig(paths[-1], dpi=110)
    return paths


def _fmt_estimate(estimate: dict[str, Any] | None) -> str:
    """``0.500 [0.250, 0.750]`` for ``{"value": 0.5, "ci95": [0.25, 0.75]}``."""
    if not estimate or estimate.get("value") is None:
        return "-"
    interval = estimate.get("ci95")
    text = f"{estimate['value']:.3f}"
    if interval:
        text += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
    return text


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
