"""Is the coach fair and calibrated? Score distributions, agreement, drift and bias.

The paper's data-science coach scored regression actions 0.5-1.8 points higher than similar
classification actions; the agents learned to favour regression and classification got
worse. :func:`coach_report` makes that kind of failure visible from recorded actions:

- score distribution per agent, per task type, and per (agent, task type);
- agreement of scores with the ground-truth outcome (AUROC, per agent and overall);
- drift of scores over training steps (mean per step bucket, least-squares slope);
- bias: for each agent, the score gap between task types, tested with Welch's t-test
  and a bootstrap interval, and *matched on outcome* when outcomes are recorded
  (successful actions compared with successful ones, failed with failed), so a gap that
  only reflects real quality differences is not flagged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score

from mappa_env.plotting import new_figure

#: Group name for records without a ``task_type``.
UNSPECIFIED = "unspecified"
#: Key of the all-agents entry in per-agent results.
OVERALL = "overall"


@dataclass(frozen=True)
class ScoreStats:
    """Distribution of scores in one group of records.

    Attributes:
        count: Records in the group (valid or not).
        n_valid: Records with a valid score.
        invalid_rate: Share of records without a valid score.
        mean: Mean valid score (``None`` when there is none; so are the rest).
        std: Sample standard deviation (``None`` below two scores).
        min: Smallest score.
        q25: First quartile.
        median: Median.
        q75: Third quartile.
        max: Largest score.
    """

    count: int
    n_valid: int
    invalid_rate: float
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    q25: float | None = None
    median: float | None = None
    q75: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class DriftSummary:
    """How one agent's scores move over training steps.

    Attributes:
        buckets: Equal-width step buckets: ``start``, ``end`` (step range), ``count``,
            ``mean`` (mean score).
        slope: Least-squares slope of score against step (points per step); ``None``
            with fewer than three scored steps or a single step value.
        slope_p_value: Two-sided p-value of the slope being zero.
    """

    buckets: list[dict[str, float]]
    slope: float | None
    slope_p_value: float | None


@dataclass(frozen=True)
class BiasFinding:
    """The score gap between two task types for one agent.

    Attributes:
        agent: Agent id.
        task_type_a: First task type (alphabetical order).
        task_type_b: Second task type.
        n_a: Valid scores of type a.
        n_b: Valid scores of type b.
        mean_a: Mean score of type a.
        mean_b: Mean score of type b.
        gap: ``mean_a - mean_b``.
        p_value: Welch's t-test of the raw gap (``None`` when undefined).
        matched_gap: Gap within equal outcomes (success vs success, failure vs failure),
            weighted by outcome frequency; ``None`` without shared outcome classes.
        tested_gap: The gap the flag is based on: ``matched_gap`` when available,
            else ``gap``.
        ci_low: Lower bound of the bootstrap interval of ``tested_gap``.
        ci_high: Upper bound.
        flagged: ``|tested_gap| >= threshold`` and the interval excludes 0.
    """

    agent: str
    task_type_a: str
    task_type_b: str
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    gap: float
    p_value: float | None
    matched_gap: float | None
    tested_gap: float
    ci_low: float
    ci_high: float
    flagged: bool


@dataclass(frozen=True)
class CoachReport:
    """Bias and calibration of a coach over recorded actions (see :func:`coach_report`).

    Attributes:
        n_records: Records read.
        n_valid: Records with a valid score.
        per_agent: Score statistics per agent, plus :data:`OVERALL`.
        per_task_type: Score statistics per task type.
        per_agent_task_type: ``{agent: {task_type: stats}}``.
        auroc: AUROC of scores against the binary outcome per agent and
            :data:`OVERALL` (``None`` when only one outcome class is present).
        drift: Drift per agent and :data:`OVERALL` (records with a ``step``).
        bias: Task-type gaps per agent (every pair of task types with enough scores).
        bias_threshold: Smallest gap, in score points, that is flagged.
        scores: Valid scores by agent and task type (for plots).
    """

    n_records: int
    n_valid: int
    per_agent: dict[str, ScoreStats]
    per_task_type: dict[str, ScoreStats]
    per_agent_task_type: dict[str, dict[str, ScoreStats]]
    auroc: dict[str, float | None]
    drift: dict[str, DriftSummary]
    bias: list[BiasFinding]
    bias_threshold: float
    scores: dict[str, dict[str, list[float]]] = field(default_factory=dict, repr=False)

    @property
    def flagged_bias(self) -> list[BiasFinding]:
        """The bias findings over the threshold."""
        return [finding for finding in self.bias if finding.flagged]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-serialisable); raw scores are left out."""
        data = asdict(self)
        data.pop("scores")
        data["flagged_bias"] = [asdict(f) for f in self.flagged_bias]
        return data

    def to_markdown(self) -> str:
        """The report as Markdown tables."""
        lines = [
            "# Coach report",
            "",
            f"{self.n_records} recorded actions, {self.n_valid} with a valid score.",
            "",
            "## Scores per agent",
            "",
            *_stats_table("agent", self.per_agent),
            "",
            "## Scores per agent and task type",
            "",
            "| agent | task type | n | invalid | mean | std | median |",
            "|---|---|---|---|---|---|---|",
        ]
        for agent, groups in self.per_agent_task_type.items():
            for task_type, s in groups.items():
                lines.append(
                    f"| {agent} | {task_type} | {s.count} | {_pct(s.invalid_rate)} | "
                    f"{_num(s.mean)} | {_num(s.std)} | {_num(s.median)} |"
                )
        lines += ["", "## Agreement with the outcome (AUROC)", ""]
        lines += ["| agent | AUROC |", "|---|---|"]
        lines += [f"| {agent} | {_num(value, 3)} |" for agent, value in self.auroc.items()]
        lines += ["", "## Drift over steps", "", "| agent | slope (points/step) | p |"]
        lines += ["|---|---|---|"]
        for agent, drift in self.drift.items():
            lines.append(f"| {agent} | {_num(drift.slope, 4)} | {_num(drift.slope_p_value, 3)} |")
        lines += [
            "",
            f"## Task-type bias (flagged when |gap| >= {self.bias_threshold:g} and the "
            "interval excludes 0)",
            "",
            "| agent | a | b | mean a | mean b | gap | matched gap | 95% CI | Welch p | flag |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for f in self.bias:
            lines.append(
                f"| {f.agent} | {f.task_type_a} | {f.task_type_b} | {_num(f.mean_a)} | "
                f"{_num(f.mean_b)} | {_num(f.gap)} | {_num(f.matched_gap)} | "
                f"[{_num(f.ci_low)}, {_num(f.ci_high)}] | {_num(f.p_value, 3)} | "
                f"{'**BIASED**' if f.flagged else ''} |"
            )
        if not self.bias:
            lines.append("| (no agent has two task types with enough scores) |||||||||")
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path) -> Path:
        """Draw score distributions (per agent and task type) and drift to an image.

        Args:
            path: Output file; the format follows its suffix (``.png``, ``.pdf``, ...).

        Returns:
            The path written.

        Raises:
            MissingExtraError: When matplotlib is not installed.
        """
        # Drawn outside pyplot: a notebook user's matplotlib backend stays as it is.
        figure, (box_axes, drift_axes) = new_figure(2, 1, figsize=(10, 8), purpose="plots")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)

        labels: list[str] = []
        data: list[list[float]] = []
        for agent, groups in self.scores.items():
            for task_type, values in groups.items():
                if values:
                    labels.append(f"{agent}\n{task_type}")
                    data.append(values)
        if data:
            box_axes.boxplot(data, showmeans=True)
            box_axes.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        box_axes.set_ylabel("coach score")
        box_axes.set_title("Score distribution per agent and task type")

        for agent, drift in self.drift.items():
            if drift.buckets:
                middles = [(b["start"] + b["end"]) / 2 for b in drift.buckets]
                means = [b["mean"] for b in drift.buckets]
                style = "k--" if agent == OVERALL else "-o"
                drift_axes.plot(middles, means, style, label=agent)
        drift_axes.set_xlabel("step")
        drift_axes.set_ylabel("mean coach score")
        drift_axes.set_title("Score drift over steps")
        if self.drift:
            drift_axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path)
        return path


@dataclass(frozen=True)
class _Record:
    agent: str
    score: float | None
    task_type: str
    outcome: float | None
    step: float | None


def coach_report(
    records: Iterable[Mapping[str, Any]],
    *,
    bias_threshold: float = 0.5,
    min_group_size: int = 5,
    n_bootstrap: int = 2000,
    confidence: float = 0.95,
    n_step_buckets: int = 10,
    seed: int = 0,
) -> CoachReport:
    """Summarise how a coach scored recorded actions.

    Args:
        records: Mappings with ``agent`` (str), ``score`` (0-10, or ``None`` when
            invalid) and optionally ``valid`` (bool; default: score is not None),
            ``task_type``, ``outcome`` (bool, or float in [0, 1]; >= 0.5 counts as
            success) and ``step`` (training step or episode index). Other keys (such as
            ``task_id``) are ignored. :func:`records_from_actions` turns recorded
            actions (trajectory rows) into such records.
        bias_threshold: Smallest gap (score points) between task types to flag; the
            default 0.5 is the lower end of the gap the paper observed.
        min_group_size: Fewest valid scores per task type for a bias test.
        n_bootstrap: Bootstrap resamples for the gap interval.
        confidence: Coverage of the bootstrap interval.
        n_step_buckets: Step buckets for drift.
        seed: Seed of the bootstrap.

    Returns:
        The :class:`CoachReport`.

    Raises:
        ValueError: When a record has no ``agent``.
    """
    rows = [_read(record) for record in records]
    valid = [r for r in rows if r.score is not None]

    per_agent = {agent: _stats(group) for agent, group in _group(rows, "agent").items()}
    per_agent[OVERALL] = _stats(rows)
    per_task_type = {t: _stats(group) for t, group in _group(rows, "task_type").items()}
    per_agent_task_type = {
        agent: {t: _stats(g) for t, g in _group(group, "task_type").items()}
        for agent, group in _group(rows, "agent").items()
    }

    by_agent_valid = _group(valid, "agent")
    auroc = {agent: _auroc(group) for agent, group in by_agent_valid.items()}
    auroc[OVERALL] = _auroc(valid)
    drift = {agent: _drift(group, n_step_buckets) for agent, group in by_agent_valid.items()}
    drift[OVERALL] = _drift(valid, n_step_buckets)
    drift = {agent: d for agent, d in drift.items() if d.buckets}

    rng = np.random.default_rng(seed)
    bias: list[BiasFinding] = []
    for agent, group in by_agent_valid.items():
        by_type = {t: g for t, g in _group(group, "task_type").items() if len(g) >= min_group_size}
        for type_a, type_b in itertools.combinations(sorted(by_type), 2):
            bias.append(
                _bias(
                    agent,
                    type_a,
                    by_type[type_a],
                    type_b,
                    by_type[type_b],
                    threshold=bias_threshold,
                    n_bootstrap=n_bootstrap,
                    confidence=confidence,
                    rng=rng,
                )
            )

    scores = {
        agent: {t: [float(r.score) for r in g] for t, g in _group(group, "task_type").items()}
        for agent, group in by_agent_valid.items()
    }
    return CoachReport(
        n_records=len(rows),
        n_valid=len(valid),
        per_agent=per_agent,
        per_task_type=per_task_type,
        per_agent_task_type=per_agent_task_type,
        auroc=auroc,
        drift=drift,
        bias=bias,
        bias_threshold=bias_threshold,
        scores=scores,  # type: ignore[arg-type]
    )


def records_from_actions(actions: Iterable[Any], step: int | None = None) -> list[dict[str, Any]]:
    """Records for :func:`coach_report` from recorded actions.

    Args:
        actions: Trajectory rows: ``mappa_agents.trajectory.ActionSample`` objects or
            their dicts (with ``agent``, ``task_id``, ``coach`` (the verdict dict) and
            ``outcome`` (the episode outcome dict, whose ``reward`` and ``task_type`` are
            used)).
        step: Training step to attach to every record (e.g. the rollout step).

    Returns:
        One record per action that was judged by a coach.
    """
    records = []
    for action in actions:

        def field(name: str, action: Any = action) -> Any:
            if isinstance(action, Mapping):
                return action.get(name)
            return getattr(action, name, None)

        coach = field("coach")
        if not coach:
            continue
        outcome = field("outcome") or {}
        reward = None if outcome.get("aborted") else outcome.get("reward")
        records.append(
            {
                "agent": field("agent"),
                "score": coach.get("score") if coach.get("valid") else None,
                "valid": bool(coach.get("valid")),
                "task_id": field("task_id"),
                "task_type": outcome.get("task_type"),
                "outcome": None if reward is None else float(reward),
                "step": step,
            }
        )
    return records


def _read(record: Mapping[str, Any]) -> _Record:
    agent = record.get("agent")
    if not agent:
        raise ValueError(f"record without an 'agent': {dict(record)!r}")
    score = record.get("score")
    score = None if score is None else float(score)
    if score is not None and not math.isfinite(score):
        score = None
    if not record.get("valid", score is not None):
        score = None
    outcome = record.get("outcome")
    outcome = None if outcome is None else float(outcome)
    step = record.get("step")
    return _Record(
        agent=str(agent),
        score=score,
        task_type=str(record.get("task_type") or UNSPECIFIED),
        outcome=outcome,
        step=None if step is None else float(step),
    )


def _group(rows: Iterable[_Record], attribute: str) -> dict[str, list[_Record]]:
    groups: dict[str, list[_Record]] = {}
    for row in rows:
        groups.setdefault(getattr(row, attribute), []).append(row)
    return dict(sorted(groups.items()))


def _stats(rows: list[_Record]) -> ScoreStats:
    values = np.array([r.score for r in rows if r.score is not None], dtype=float)
    count = len(rows)
    invalid_rate = (count - len(values)) / count if count else 0.0
    if not len(values):
        return ScoreStats(count=count, n_valid=0, invalid_rate=invalid_rate)
    q25, median, q75 = np.quantile(values, [0.25, 0.5, 0.75])
    return ScoreStats(
        count=count,
        n_valid=len(values),
        invalid_rate=invalid_rate,
        mean=float(values.mean()),
        std=float(values.std(ddof=1)) if len(values) > 1 else None,
        min=float(values.min()),
        q25=float(q25),
        median=float(median),
        q75=float(q75),
        max=float(values.max()),
    )


def _success(outcome: float) -> int:
    return int(outcome >= 0.5)


def _auroc(rows: list[_Record]) -> float | None:
    pairs = [(r.score, _success(r.outcome)) for r in rows if r.outcome is not None]
    labels = [label for _score, label in pairs]
    if len(set(labels)) < 2:
        return None
    return float(roc_auc_score(labels, [score for score, _label in pairs]))


def _drift(rows: list[_Record], n_buckets: int) -> DriftSummary:
    stepped = [(r.step, r.score) for r in rows if r.step is not None]
    if not stepped:
        return DriftSummary(buckets=[], slope=None, slope_p_value=None)
    steps = np.array([s for s, _ in stepped], dtype=float)
    values = np.array([v for _, v in stepped], dtype=float)
    n_buckets = max(1, min(n_buckets, len(np.unique(steps))))
    edges = np.linspace(steps.min(), steps.max(), n_buckets + 1)
    # Each step falls in one bucket; the last bucket includes its right edge.
    index = np.clip(np.searchsorted(edges, steps, side="right") - 1, 0, n_buckets - 1)
    buckets = [
        {
            "start": float(edges[i]),
            "end": float(edges[i + 1]),
            "count": int((index == i).sum()),
            "mean": float(values[index == i].mean()),
        }
        for i in range(n_buckets)
        if (index == i).any()
    ]
    slope = p_value = None
    if len(steps) >= 3 and np.ptp(steps) > 0:
        fit = stats.linregress(steps, values)
        slope = float(fit.slope)
        p_value = float(fit.pvalue) if math.isfinite(fit.pvalue) else None
    return DriftSummary(buckets=buckets, slope=slope, slope_p_value=p_value)


def _bias(
    agent: str,
    type_a: str,
    rows_a: list[_Record],
    type_b: str,
    rows_b: list[_Record],
    *,
    threshold: float,
    n_bootstrap: int,
    confidence: float,
    rng: np.random.Generator,
) -> BiasFinding:
    a = np.array([r.score for r in rows_a], dtype=float)
    b = np.array([r.score for r in rows_b], dtype=float)
    gap = float(a.mean() - b.mean())
    p_value: float | None = None
    if a.std() > 0 or b.std() > 0:
        p_value = float(stats.ttest_ind(a, b, equal_var=False).pvalue)

    # Outcome-matched cells: compare like with like, weight by how common each outcome is.
    cells: list[tuple[np.ndarray, np.ndarray, float]] = []
    if all(r.outcome is not None for r in rows_a + rows_b):
        for label in (0, 1):
            in_a = np.array([r.score for r in rows_a if _success(r.outcome) == label])
            in_b = np.array([r.score for r in rows_b if _success(r.outcome) == label])
            if len(in_a) >= 2 and len(in_b) >= 2:
                cells.append((in_a, in_b, float(len(in_a) + len(in_b))))
    matched_gap: float | None = None
    if cells:
        total = sum(weight for _, _, weight in cells)
        cells = [(ca, cb, weight / total) for ca, cb, weight in cells]
        matched_gap = float(sum(w * (ca.mean() - cb.mean()) for ca, cb, w in cells))
    else:
        cells = [(a, b, 1.0)]
    tested_gap = gap if matched_gap is None else matched_gap

    boot = np.zeros(n_bootstrap)
    for cell_a, cell_b, weight in cells:
        mean_a = cell_a[rng.integers(0, len(cell_a), (n_bootstrap, len(cell_a)))].mean(axis=1)
        mean_b = cell_b[rng.integers(0, len(cell_b), (n_bootstrap, len(cell_b)))].mean(axis=1)
        boot += weight * (mean_a - mean_b)
    tail = (1.0 - confidence) / 2 * 100
    ci_low, ci_high = (float(v) for v in np.percentile(boot, [tail, 100 - tail]))
    flagged = abs(tested_gap) >= threshold and (ci_low > 0 or ci_high < 0)
    return BiasFinding(
        agent=agent,
        task_type_a=type_a,
        task_type_b=type_b,
        n_a=len(a),
        n_b=len(b),
        mean_a=float(a.mean()),
        mean_b=float(b.mean()),
        gap=gap,
        p_value=p_value,
        matched_gap=matched_gap,
        tested_gap=tested_gap,
        ci_low=ci_low,
        ci_high=ci_high,
        flagged=flagged,
    )


def _stats_table(label: str, groups: Mapping[str, ScoreStats]) -> list[str]:
    lines = [
        f"| {label} | n | invalid | mean | std | q25 | median | q75 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in groups.items():
        lines.append(
            f"| {name} | {s.count} | {_pct(s.invalid_rate)} | {_num(s.mean)} | {_num(s.std)} | "
            f"{_num(s.q25)} | {_num(s.median)} | {_num(s.q75)} |"
        )
    return lines


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"
