"""Reading the reproduction's runs back: metrics, held-out episodes, provenance.

Every figure of the report is computed from what a run leaves in its directory:
``metrics.jsonl`` (per-step training metrics and evaluation summaries), ``eval/`` (every
held-out episode of the main set, ``eval/<set>/`` of the others), ``provenance.jsonl``
(the commit and machine of each launch) and the launcher's pause log. Per-episode
evaluation records (:class:`benchmarks.repro_stats.EvalRecord` rows) are rebuilt from the
saved episodes, never stored alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

AGENTS = ("problem_solver", "code_executor", "verifier")
CODE_AGENT = "code_executor"
PAUSES_FILE = "lockstep_pauses.jsonl"
"""Where the launcher logs each ``--lockstep`` pause of a run: the step it fell in and
its seconds."""
PROVENANCE_FILE = "provenance.jsonl"
"""One line per launch of a run: the commit, the time and the machine."""
BASE_ARM = "base"
"""The arm name of the untrained system's evaluations (step 0) in the records."""


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file a run writes; [] when it does not exist.

    A line torn by a kill (or anything not an object) is skipped.
    """
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metric records (a torn last line is skipped)."""
    return json_lines(run_dir / "metrics.jsonl")


def steps_done(run_dir: Path) -> int:
    """Training steps logged so far in ``run_dir``'s metrics."""
    done = 0
    for record in read_metrics(run_dir):
        try:
            done = max(done, int(record.get("step", 0)))
        except (TypeError, ValueError):
            continue
    return done


def read_pauses(run_dir: Path) -> dict[int, float]:
    """Seconds a run was paused during each step (steps without a pause are absent)."""
    held: dict[int, float] = {}
    for record in json_lines(run_dir / PAUSES_FILE):
        try:
            step, seconds = int(record["step"]), float(record["seconds"])
        except (KeyError, TypeError, ValueError):
            continue
        held[step] = held.get(step, 0.0) + seconds
    return held


def read_provenance(run_dir: Path) -> list[dict[str, Any]]:
    """Every launch of a run (a resumed run has several), oldest first."""
    return json_lines(run_dir / PROVENANCE_FILE)


def metric_prefix(task_set: str, main_set: str) -> str:
    """The trainer's metric prefix of a held-out set: ``eval`` or ``eval/<set>``."""
    return "eval" if task_set == main_set else f"eval/{task_set}"


def eval_points(
    records: Sequence[Mapping[str, Any]], task_sets: Sequence[str], main_set: str
) -> dict[str, list[dict[str, Any]]]:
    """Held-out evaluation summaries of a run, per task set, by step."""
    points: dict[str, list[dict[str, Any]]] = {name: [] for name in task_sets}
    for name in task_sets:
        prefix = metric_prefix(name, main_set)
        for record in records:
            if f"{prefix}/success_rate" not in record:
                continue
            point: dict[str, Any] = {
                "step": record["step"],
                "accuracy": record[f"{prefix}/success_rate"],
                "seconds": record.get(f"{prefix}/seconds"),
            }
            for agent in AGENTS:
                for key in ("tool_call_rate", "mean_response_tokens", "mean_coach_score"):
                    point[f"{agent}/{key}"] = record.get(f"{prefix}/{agent}/{key}")
            points[name].append(point)
    return points


TRAIN_KEYS = ("tool_call_rate", "mean_response_tokens", "mean_reward", "masked_length", "kl")
TRAIN_KEYS += ("grad_norm", "clip_fraction", "actions", "reward_std")


def train_points(
    records: Sequence[Mapping[str, Any]], paused: Mapping[int, float] | None = None
) -> list[dict[str, Any]]:
    """Per-step training metrics of a run (the behaviour figure and the void checks).

    ``paused``: seconds the run was held by ``--lockstep`` during each step (the pause
    falls in the step's rollout), taken out of its rollout seconds.
    """
    points = []
    for record in records:
        if "rollout/episodes" not in record:
            continue
        held = (paused or {}).get(int(record["step"]), 0.0)
        rollout = record.get("rollout/seconds")
        rollout = None if rollout is None else max(0.0, rollout - held)
        point: dict[str, Any] = {
            "step": record["step"],
            "rollout/episodes": record.get("rollout/episodes"),
            "rollout/success_rate": record.get("rollout/success_rate"),
            "rollout/mean_reward": record.get("rollout/mean_reward"),
            "seconds": (rollout or 0) + (record.get("train/seconds") or 0),
            "paused_seconds": held,
            "rollout_seconds": rollout,
            "update_seconds": record.get("train/seconds"),
        }
        for agent in AGENTS:
            for key in TRAIN_KEYS:
                point[f"{agent}/{key}"] = record.get(f"{agent}/{key}")
        points.append(point)
    return points


def _episode_index(episode_id: str) -> int:
    """``"ep-00012"`` -> 12 (the runner's episode order)."""
    return int(str(episode_id).rsplit("-", 1)[-1])


def episode_records(
    path: Path, arm: str, seed: int, step: int, task_set: str
) -> list[dict[str, Any]]:
    """The per-episode records of one saved evaluation (``eval/.../step-N.jsonl``).

    One :class:`~benchmarks.repro_stats.EvalRecord` per episode: ``correct`` from its
    outcome, ``scores`` each agent's mean valid coach score over its actions (``None``
    when the coach gave it none), ``sample`` the episode's rank among the episodes of
    the same problem (the trainer cycles through the set's problems), ``aborted`` when
    it could not be finished (then ``correct`` is False: it counts as wrong, and stays
    paired with the other arms' samples of the problem); plus the kind of problem, each
    agent's own correctness and the rubric versions that scored it.
    """
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for row in json_lines(path):
        by_episode.setdefault(str(row.get("episode_id")), []).append(row)
    records = []
    seen: dict[str, int] = {}
    for episode_id in sorted(by_episode, key=_episode_index):
        rows = by_episode[episode_id]
        outcome = next((r["outcome"] for r in rows if isinstance(r.get("outcome"), dict)), {})
        aborted = bool(outcome.get("aborted"))
        task_id = str(rows[0].get("task_id"))
        sample = seen.get(task_id, 0)
        seen[task_id] = sample + 1
        scores: dict[str, float | None] = {}
        for agent in dict.fromkeys(r["agent"] for r in rows):
            valid = [
                float(r["coach"]["score"])
                for r in rows
                if r["agent"] == agent and (r.get("coach") or {}).get("valid")
            ]
            scores[agent] = sum(valid) / len(valid) if valid else None
        rubrics = sorted(
            {
                str((r.get("coach") or {}).get("rubric_version"))
                for r in rows
                if (r.get("coach") or {}).get("rubric_version")
            }
        )
        records.append(
            {
                "arm": arm,
                "seed": seed,
                "step": step,
                "task_set": task_set,
                "task_id": task_id,
                "sample": sample,
                "correct": bool(outcome.get("correct", False)) and not aborted,
                "aborted": aborted,
                "scores": scores,
                "kind": outcome.get("task_type"),
                "agent_correct": outcome.get("agent_correct"),
                "rubric_versions": rubrics,
            }
        )
    return records


def aborted_episodes(path: Path) -> int:
    """Episodes of one saved evaluation that could not be finished."""
    outcomes = {
        str(r.get("episode_id")): r.get("outcome") or {}
        for r in json_lines(path)
        if isinstance(r.get("outcome"), dict)
    }
    return sum(bool(o.get("aborted")) for o in outcomes.values())


def eval_files(run_dir: Path, task_set: str, main_set: str) -> dict[int, Path]:
    """A run's saved evaluations of one task set, by step."""
    folder = run_dir / metric_prefix(task_set, main_set)
    return {int(p.stem.split("-")[1]): p for p in sorted(folder.glob("step-*.jsonl"))}


def regrade(run_dir: Path) -> list[dict[str, Any]]:
    """Every saved episode of a run graded again by the current grader.

    One row per file of ``rollouts/`` (training, ``step-00000k`` is step k + 1) and of
    ``eval/`` and its sets (held-out, named by its step): the episodes, how many the run
    counted as solved, and how many :func:`~mappa_env.grading.math.answers_match_any`
    counts now (against the outcome's ``accepted_answers`` where it lists several). The
    two differ when the grader changed after the run, e.g. when a way to the reward
    without the task was closed.
    """
    from mappa_env.grading.math import answers_match_any

    folders = [("rollouts", run_dir / "rollouts", 1), ("eval", run_dir / "eval", 0)]
    if (run_dir / "eval").is_dir():
        folders += [
            (f"eval/{sub.name}", sub, 0)
            for sub in sorted((run_dir / "eval").iterdir())
            if sub.is_dir()
        ]
    rows = []
    for kind, folder, offset in folders:
        for path in sorted(folder.glob("step-*.jsonl")):
            # Every action of an episode carries its outcome: one per episode.
            outcomes = {
                str(r.get("episode_id")): r["outcome"]
                for r in json_lines(path)
                if isinstance(r.get("outcome"), Mapping)
            }
            solved_now = 0
            for outcome in outcomes.values():
                predicted = outcome.get("predicted")
                truths = outcome.get("accepted_answers") or [outcome.get("answer")]
                truths = [str(t) for t in truths if t is not None]
                solved_now += isinstance(predicted, str) and answers_match_any(predicted, truths)
            rows.append(
                {
                    "kind": kind,
                    "step": int(path.stem.split("-")[1]) + offset,
                    "episodes": len(outcomes),
                    "solved_logged": sum(bool(o.get("correct")) for o in outcomes.values()),
                    "solved_now": solved_now,
                }
            )
    return rows


def collect(
    runs_dir: Path,
    arms: Sequence[str],
    seeds: Sequence[int],
    task_sets: Sequence[str],
    main_set: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every run's figures, and every held-out episode of every run as a record.

    The untrained system's evaluations (step 0, made by the first arm of each seed to
    run; every arm of a seed starts from the same weights and evaluates with the same
    seeds) are recorded once per seed and task set, under the arm ``"base"``.

    Returns:
        ``(runs, records)``: per run its arm, seed, directory, launches (commit,
        machine), steps done, evaluation summaries per set, per-step training metrics
        and regrading; and the :class:`~benchmarks.repro_stats.EvalRecord` rows.
    """
    runs: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    based: set[tuple[int, str]] = set()
    for arm in arms:
        for seed in seeds:
            run_dir = runs_dir / f"{arm}-s{seed}"
            metrics = read_metrics(run_dir)
            launches = read_provenance(run_dir)
            aborted: dict[str, int] = {}
            for task_set in task_sets:
                for step, path in eval_files(run_dir, task_set, main_set).items():
                    aborted[f"{task_set}@{step}"] = aborted_episodes(path)
                    if step == 0:
                        if (seed, task_set) in based:
                            continue
                        based.add((seed, task_set))
                        records += episode_records(path, BASE_ARM, seed, 0, task_set)
                    else:
                        records += episode_records(path, arm, seed, step, task_set)
            runs.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "dir": run_dir.name,
                    "launches": launches,
                    "commits": sorted({str(launch.get("commit")) for launch in launches}),
                    "steps_done": max((int(r.get("step", 0)) for r in metrics), default=0),
                    "evals": eval_points(metrics, task_sets, main_set),
                    "train": train_points(metrics, read_pauses(run_dir)),
                    "aborted_eval_episodes": {k: v for k, v in aborted.items() if v},
                    "regraded": regrade(run_dir),
                }
            )
    return runs, records
