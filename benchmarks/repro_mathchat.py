"""Does MAPPA learn? Process rewards against outcome-only rewards on MathChat-v0.

Trains the same base system under each credit mode (``process``: the coach's score of
every action, the paper; ``outcome``: the episode's rule-graded correctness given to every
action), several seeds each, at equal rollouts (same episodes per step, same steps), and
evaluates every run on held-out problems it never trained on: rule-graded accuracy with
several samples per problem at temperature 0.6 (the paper: 4), the code executor's
tool-call rate, response lengths and coach scores per agent.

    python -m benchmarks.repro_mathchat                  # the recipe, 3 seeds x 2 modes (GPU)
    python -m benchmarks.repro_mathchat --smoke          # CPU check with a tiny model, < 3 min
    python -m benchmarks.repro_mathchat --report-only    # rebuild results from the run dirs
    python -m benchmarks.repro_mathchat --modes outcome --include <process results>.json

Each run is a ``mappa train --config`` subprocess (so runs share one GPU side by side and a
killed run resumes from its checkpoints when the command is repeated). The results file
(``benchmarks/results/repro/<name>.json``) holds every run, every evaluation point, the base
system's accuracy, the exact config and the commit; two plots go beside it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, machine_info, print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "mathchat-smollm2.yaml"
REPRO_DIR = RESULTS_DIR / "repro"
AGENTS = ("problem_solver", "code_executor", "verifier")
CODE_AGENT = "code_executor"
EMA_ALPHA = 1 / 3


# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------


def mean_ci95(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% Student-t interval half-width over ``values`` (seeds).

    ``half_width = t_{0.975, n-1} * s / sqrt(n)``; ``None`` with fewer than 2 values.
    """
    clean = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return {"mean": None, "ci95": None, "n": 0, "values": []}
    mean = statistics.fmean(clean)
    if len(clean) < 2:
        return {"mean": mean, "ci95": None, "n": 1, "values": clean}
    from scipy import stats

    half = (
        float(stats.t.ppf(0.975, len(clean) - 1)) * statistics.stdev(clean) / math.sqrt(len(clean))
    )
    return {"mean": mean, "ci95": half, "n": len(clean), "values": clean}


def ema(values: Sequence[float | None], alpha: float = EMA_ALPHA) -> list[float]:
    """Exponential moving average ``m_t = alpha * x_t + (1 - alpha) * m_{t-1}``; gaps carry."""
    out: list[float] = []
    current: float | None = None
    for value in values:
        if value is not None and not math.isnan(value):
            current = value if current is None else alpha * value + (1 - alpha) * current
        out.append(math.nan if current is None else current)
    return out


# --------------------------------------------------------------------------------------
# Configs and task sets
# --------------------------------------------------------------------------------------


def load_recipe(path: Path) -> dict[str, Any]:
    """The recipe file's fields (YAML), checked against ``TrainConfig``."""
    import yaml

    from mappa_train.config import TrainConfig

    data = yaml.safe_load(path.read_text()) or {}
    TrainConfig.from_dict(data)  # unknown or invalid fields fail here, before any run
    return data


def task_prompts(env_options: Mapping[str, Any], env_id: str) -> list[str]:
    """The prompts of an environment's task set (built without starting anything)."""
    import mappa_env

    env = mappa_env.make(
        env_id, **{**env_options, "sandbox": None, "coach": None, "credit_mode": "outcome"}
    )
    try:
        return [task.prompt for task in env.tasks]
    finally:
        env.close()


def check_disjoint(recipe: Mapping[str, Any]) -> dict[str, int]:
    """Sizes of the training and held-out task sets; raises when they share a problem."""
    env_id = recipe.get("env", "MathChat-v0")
    train = task_prompts(recipe.get("env_options", {}), env_id)
    heldout = task_prompts(recipe.get("eval_env_options") or recipe.get("env_options", {}), env_id)
    shared = set(train) & set(heldout)
    if shared:
        raise SystemExit(
            f"{len(shared)} held-out problems are also training problems (e.g. "
            f"{sorted(shared)[0]!r}): use another seed or kind for eval_env_options.tasks"
        )
    return {"train_tasks": len(set(train)), "heldout_tasks": len(set(heldout))}


def run_config(
    recipe: Mapping[str, Any], mode: str, seed: int, run_dir: Path, *, base_eval: bool
) -> dict[str, Any]:
    """The full config of one run: the recipe with its mode, seed and directory."""
    config = dict(recipe)
    config.update(
        credit_mode=mode,
        seed=seed,
        output_dir=str(run_dir),
        eval_at_start=base_eval,
        progress=False,
    )
    return config


def base_point(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """A collected run's evaluation of the untrained system (step 0), if it has one."""
    evals = run.get("evals") or []
    return evals[0] if evals and evals[0]["step"] == 0 else None


def plan_runs(
    recipe: Mapping[str, Any],
    modes: Sequence[str],
    seeds: Sequence[int],
    runs_dir: Path,
    included: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> list[tuple[str, int, Path, dict[str, Any]]]:
    """``(mode, seed, run_dir, config)`` of every run, in launch order.

    One base evaluation per seed: the first mode of a seed evaluates before training
    unless a run of that seed in ``runs_dir`` or in ``included`` (runs of an earlier
    results file, :func:`load_included`) already did (:func:`has_base_eval`). The runs
    of ``included`` are results already: they are not planned again.
    """
    included = included or {}
    runs = []
    for seed in seeds:
        base_done = has_base_eval(runs_dir, seed) or any(
            s == seed and base_point(run) for (_, s), run in included.items()
        )
        planned = [mode for mode in modes if (mode, seed) not in included]
        for index, mode in enumerate(planned):
            run_dir = runs_dir / f"{mode}-s{seed}"
            base_eval = index == 0 and not base_done
            runs.append(
                (mode, seed, run_dir, run_config(recipe, mode, seed, run_dir, base_eval=base_eval))
            )
    return runs


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------


def has_base_eval(runs_dir: Path, seed: int) -> bool:
    """Whether a run of ``seed`` in ``runs_dir`` already evaluated the untrained system.

    Every credit mode of a seed starts from the same weights and evaluates with the same
    seeds, so one base evaluation per seed serves them all, also when the modes run at
    different times (``--modes process`` now, ``--modes outcome`` later, one runs dir).
    """
    return any(
        point["step"] == 0
        for run_dir in sorted(runs_dir.glob(f"*-s{seed}"))
        for point in eval_points(read_metrics(run_dir))
    )


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


def steps_done(run_dir: Path) -> int:
    """Training steps logged so far in ``run_dir``'s metrics."""
    done = 0
    for record in json_lines(run_dir / "metrics.jsonl"):
        try:
            done = max(done, int(record.get("step", 0)))
        except (TypeError, ValueError):
            continue
    return done


def lockstep_moves(
    steps: Mapping[str, int], paused: set[str], finished: set[str], lead: int = 1
) -> tuple[set[str], set[str]]:
    """Which runs to pause and which to resume so that none gets ``lead`` steps ahead.

    Runs sharing a GPU progress unevenly (one ran twice as far as others in the same
    time, docs/results.md run 3); when time runs out, runs held together have all
    reached the same evaluations. A run ``lead`` or more steps ahead of the slowest
    unfinished run waits; it goes on once the slowest has caught up.

    Returns:
        ``(to_pause, to_resume)``: run names not yet paused, and paused ones to go on.
    """
    active = {name: done for name, done in steps.items() if name not in finished}
    if not active:
        return set(), set(paused)
    slowest = min(active.values())
    ahead = {name for name, done in active.items() if done >= slowest + lead}
    return ahead - paused, (paused - ahead)


def launch_runs(
    runs: Sequence[tuple[str, int, Path, dict[str, Any]]],
    parallel: int,
    total_steps: int,
    lockstep: bool = False,
) -> dict[str, int]:
    """Run ``mappa train`` for each run, ``parallel`` at a time; returns exit codes by run.

    With ``lockstep``, a run a step ahead of the slowest is paused (``SIGSTOP``, right
    after it logs its step) until the others catch up (:func:`lockstep_moves`).
    """
    import signal

    from tqdm.auto import tqdm

    pending = list(runs)
    active: dict[str, tuple[subprocess.Popen, Path, Any]] = {}
    codes: dict[str, int] = {}
    paused: set[str] = set()
    paused_at: dict[str, tuple[float, int]] = {}  # when, and in which step
    active_dirs = {r[2].name: r[2] for r in runs}
    bar = tqdm(total=total_steps * len(runs), desc="repro steps", unit="step")
    try:
        while pending or active:
            while pending and len(active) < parallel:
                _, _, run_dir, config = pending.pop(0)
                run_dir.mkdir(parents=True, exist_ok=True)
                config_path = run_dir / "run_config.json"
                config_path.write_text(json.dumps(config, indent=2) + "\n")
                started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                provenance = {
                    "commit": git_commit(),
                    "started": started,
                    "machine": {**machine_info(), "gpus": gpu_names()},
                }
                (run_dir / "provenance.json").write_text(json.dumps(provenance) + "\n")
                log = (run_dir / "train.log").open("a")
                command = [
                    sys.executable,
                    "-m",
                    "mappa_train",
                    "train",
                    "--config",
                    str(config_path),
                ]
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
                )
                active[run_dir.name] = (process, run_dir, log)
            time.sleep(2.0)
            for name, (process, run_dir, log) in list(active.items()):
                if process.poll() is not None:
                    log.close()
                    codes[name] = process.returncode
                    del active[name]
                    if process.returncode != 0:
                        tail = (run_dir / "train.log").read_text(errors="replace")[-2000:]
                        print(
                            f"run {name} failed (exit {process.returncode}):\n{tail}",
                            file=sys.stderr,
                        )
            progress = {r[2].name: steps_done(r[2]) for r in runs}
            if lockstep and not pending:
                # A run past its last step is only closing: it is not held.
                done = set(codes) | {n for n, d in progress.items() if d >= total_steps}
                to_pause, to_resume = lockstep_moves(progress, paused, done)
                for name in to_pause & set(active):
                    active[name][0].send_signal(signal.SIGSTOP)
                    paused.add(name)
                    paused_at[name] = (time.monotonic(), progress[name] + 1)
                for name in to_resume:
                    if name in active:
                        active[name][0].send_signal(signal.SIGCONT)
                    paused.discard(name)
                    since, step = paused_at.pop(name, (time.monotonic(), 0))
                    record = {"step": step, "seconds": round(time.monotonic() - since, 3)}
                    with (active_dirs[name] / PAUSES_FILE).open("a") as handle:
                        handle.write(json.dumps(record) + "\n")
            bar.n = min(sum(progress.values()), bar.total)
            bar.set_postfix(paused=len(paused), refresh=False)
            bar.refresh()
    finally:
        for name, (process, _, log) in active.items():
            if name in paused:
                process.send_signal(signal.SIGCONT)  # a stopped process cannot exit
            process.terminate()
            log.close()
        bar.close()
    return codes


# --------------------------------------------------------------------------------------
# Collecting results
# --------------------------------------------------------------------------------------


PAUSES_FILE = "lockstep_pauses.jsonl"
"""Where the launcher logs each ``--lockstep`` pause of a run: the step it fell in and
its seconds."""


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


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metric records (a torn last line is skipped)."""
    return json_lines(run_dir / "metrics.jsonl")


def eval_points(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Held-out evaluations of a run, by step."""
    points = []
    for record in records:
        if "eval/success_rate" not in record:
            continue
        point: dict[str, Any] = {
            "step": record["step"],
            "accuracy": record["eval/success_rate"],
            "seconds": record.get("eval/seconds"),
        }
        for agent in AGENTS:
            for key in ("tool_call_rate", "mean_response_tokens", "mean_coach_score"):
                point[f"{agent}/{key}"] = record.get(f"eval/{agent}/{key}")
        points.append(point)
    return points


def train_points(
    records: Sequence[Mapping[str, Any]], paused: Mapping[int, float] | None = None
) -> list[dict[str, Any]]:
    """Per-step rollout behaviour of a run (the paper's behaviour figure).

    ``paused``: seconds the run was held by ``--lockstep`` during each step (the pause
    falls in the step's rollout), taken out of its rollout seconds.
    """
    keys = ("tool_call_rate", "mean_response_tokens", "mean_reward", "masked_length")
    points = []
    for record in records:
        if "rollout/episodes" not in record:
            continue
        held = (paused or {}).get(int(record["step"]), 0.0)
        rollout = record.get("rollout/seconds")
        rollout = None if rollout is None else max(0.0, rollout - held)
        point: dict[str, Any] = {
            "step": record["step"],
            "success_rate": record.get("rollout/success_rate"),
            "mean_reward": record.get("rollout/mean_reward"),
            "seconds": (rollout or 0) + (record.get("train/seconds") or 0),
            "paused_seconds": held,
            "rollout_seconds": rollout,
            "update_seconds": record.get("train/seconds"),
        }
        for agent in AGENTS:
            for key in keys:
                point[f"{agent}/{key}"] = record.get(f"{agent}/{key}")
        points.append(point)
    return points


def regrade(run_dir: Path) -> list[dict[str, Any]]:
    """Every saved episode of a run graded again by the current grader.

    One row per file of ``rollouts/`` (training, ``step-00000k`` is step k + 1) and of
    ``eval/`` (held-out, named by its step): the episodes, how many the run counted as
    solved, and how many :func:`~mappa_env.grading.math.answers_match_any` counts now
    (against the outcome's ``accepted_answers`` where it lists several). The
    two differ when the grader changed after the run, e.g. when a way to the reward
    without the task was closed.
    """
    from mappa_env.grading.math import answers_match_any

    rows = []
    for kind, offset in (("rollouts", 1), ("eval", 0)):
        for path in sorted((run_dir / kind).glob("step-*.jsonl")):
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


def common_eval_step(runs: Sequence[Mapping[str, Any]]) -> int | None:
    """The last evaluation step after training that every run reached.

    Runs are compared there, at equal rollouts: a run cut short (out of time) is not
    compared at a later step than the others reached.
    """
    reached = [{p["step"] for p in run["evals"] if p["step"] > 0} for run in runs]
    if not reached or not all(reached):
        return None
    shared = set.intersection(*reached)
    return max(shared) if shared else None


def _figures(points: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Held-out figures over seeds of one evaluation point per seed."""
    seeds = sorted(points)
    return {
        "accuracy": mean_ci95([points[s]["accuracy"] for s in seeds]),
        "tool_call_rate": mean_ci95([points[s][f"{CODE_AGENT}/tool_call_rate"] for s in seeds]),
        "response_tokens": {
            agent: mean_ci95([points[s][f"{agent}/mean_response_tokens"] for s in seeds])
            for agent in AGENTS
        },
        "coach_score": {
            agent: mean_ci95([points[s][f"{agent}/mean_coach_score"] for s in seeds])
            for agent in AGENTS
        },
    }


def _rollout_tool_calls(mine: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The code executor's tool-call rate in training rollouts: step 1 and the last step
    every run of the mode reached (the paper's behaviour figure is over rollouts)."""
    key = f"{CODE_AGENT}/tool_call_rate"
    with_train = [r for r in mine if r["train"]]
    if not with_train:
        return {}
    last = min(max(p["step"] for p in r["train"]) for r in with_train)
    first = mean_ci95([r["train"][0][key] for r in with_train])
    final = mean_ci95([p[key] for r in with_train for p in r["train"] if p["step"] == last])
    ratio = final["mean"] / first["mean"] if first["mean"] and final["mean"] is not None else None
    return {"step_1": first, "last_step": last, "at_last_step": final, "ratio": ratio}


def summarise(runs: Sequence[Mapping[str, Any]], modes: Sequence[str]) -> dict[str, Any]:
    """Base and trained held-out figures per mode, over seeds, with 95% intervals.

    Every mode is judged at :func:`common_eval_step`; gains and the process-minus-outcome
    difference are paired by seed (the same base weights and evaluation seeds).
    """
    base_by_seed: dict[int, dict[str, Any]] = {}
    for run in runs:
        first = base_point(run)
        if first is not None:
            base_by_seed.setdefault(run["seed"], first)
    step = common_eval_step(runs)
    summary: dict[str, Any] = {
        "compared_at_step": step,
        "base": _figures(base_by_seed),
        "modes": {},
    }
    at_step: dict[str, dict[int, dict[str, Any]]] = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        at_step[mode] = {
            r["seed"]: p for r in mine for p in r["evals"] if step is not None and p["step"] == step
        }
        points = at_step[mode]
        figures = _figures(points)
        base_tool = summary["base"]["tool_call_rate"]["mean"]
        tool = figures["tool_call_rate"]["mean"]
        summary["modes"][mode] = {
            "step": step,
            "seeds": sorted(points),
            **figures,
            "gain_over_base": mean_ci95(
                [
                    points[s]["accuracy"] - base_by_seed[s]["accuracy"]
                    for s in points
                    if s in base_by_seed
                ]
            ),
            "tool_call_ratio_over_base": tool / base_tool
            if base_tool and tool is not None
            else None,
            "rollout_tool_call_rate": _rollout_tool_calls(mine),
            "last_evaluation": {
                str(r["seed"]): {
                    "step": r["evals"][-1]["step"],
                    "accuracy": r["evals"][-1]["accuracy"],
                }
                for r in mine
                if r["evals"]
            },
        }
    if "process" in at_step and "outcome" in at_step:
        both = sorted(set(at_step["process"]) & set(at_step["outcome"]))
        summary["process_minus_outcome"] = mean_ci95(
            [at_step["process"][s]["accuracy"] - at_step["outcome"][s]["accuracy"] for s in both]
        )
    return summary


def goal_checks(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The reproduction's targets, each with the figure it was judged on."""
    process = summary["modes"].get("process")
    if process is None:
        return {}
    gain = process["gain_over_base"]
    versus = summary.get("process_minus_outcome") or {}
    ratio = process["tool_call_ratio_over_base"]
    return {
        "process_gain_at_least_10_points": gain["mean"] is not None and gain["mean"] >= 0.10,
        "process_gain_interval_excludes_0": (
            gain["ci95"] is not None and gain["mean"] - gain["ci95"] > 0
        ),
        "process_beats_outcome_by_5_points": (
            versus.get("mean") is not None and versus["mean"] >= 0.05
        ),
        "tool_call_rate_at_least_3x": ratio is not None and ratio >= 3.0,
    }


def load_included(paths: Sequence[Path], recipe: Mapping[str, Any]) -> dict[tuple[str, int], Any]:
    """The runs of earlier results files, by ``(mode, seed)``, to report beside new ones.

    A session's device time fits one credit mode (``--modes process`` in one session,
    ``--modes outcome`` in the next), and a GPU machine's run directories do not
    outlast it; the results file does. Runs compare at equal rollouts only under the
    same recipe, so a file trained with another one is refused, naming the fields that
    differ. A run keeps the episodes' grading it was reported with (its episodes are
    not in the file); one without a recorded commit gets its file's ``runs_commit``.

    Raises:
        SystemExit: A file is missing, is not a results file, or used another recipe.
    """
    included: dict[tuple[str, int], Any] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise SystemExit(f"--include {path}: cannot read a results file ({error})") from None
        if not isinstance(data, Mapping) or "runs" not in data or "recipe" not in data:
            raise SystemExit(f"--include {path}: not a results file of this script")
        theirs = data["recipe"]
        differ = sorted(k for k in set(theirs) | set(recipe) if theirs.get(k) != recipe.get(k))
        if differ:
            raise SystemExit(
                f"--include {path}: its runs used another recipe (fields {', '.join(differ)} "
                "differ), so they are not at equal rollouts with these; report them apart"
            )
        commits = data.get("runs_commit")
        commit = commits if isinstance(commits, str) else None
        if isinstance(commits, list) and len(commits) == 1:
            commit = commits[0]
        for run in data["runs"]:
            included[(run["mode"], int(run["seed"]))] = {
                **run,
                "commit": run.get("commit") or commit,
                "included_from": Path(path).name,
            }
    return included


def collect(
    runs_dir: Path,
    modes: Sequence[str],
    seeds: Sequence[int],
    included: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
    runs_commit: str | None = None,
) -> list[dict[str, Any]]:
    """Every run's evaluations and per-step behaviour, read from its directory.

    A run whose directory holds no metrics is taken from ``included``
    (:func:`load_included`) when it is there. ``runs_commit`` is the commit of runs whose
    directory recorded none (made from a copy without git).
    """
    included = included or {}
    runs = []
    for mode in modes:
        for seed in seeds:
            run_dir = runs_dir / f"{mode}-s{seed}"
            records = read_metrics(run_dir)
            if not records and (mode, seed) in included:
                runs.append(copy.deepcopy(dict(included[(mode, seed)])))
                continue
            provenance_file = run_dir / "provenance.json"
            provenance = json.loads(provenance_file.read_text()) if provenance_file.exists() else {}
            commit = provenance.get("commit") or runs_commit
            runs.append(
                {
                    "mode": mode,
                    "seed": seed,
                    "dir": run_dir.name,
                    "commit": commit,
                    # Where it trained (recorded at launch; the report may be built elsewhere).
                    "machine": provenance.get("machine"),
                    "steps_done": max((r.get("step", 0) for r in records), default=0),
                    "evals": eval_points(records),
                    "train": train_points(records, read_pauses(run_dir)),
                    "regraded": regrade(run_dir),
                }
            )
    # Runs that did not evaluate at the start share the base of their seed (same weights
    # and the same evaluation seeds, so the same episodes).
    # A run's own base first; an included run's copy of one where no run has its own.
    base: dict[int, dict[str, Any]] = {}
    for run in runs:
        point = base_point(run)
        if point is not None and (run["seed"] not in base or base[run["seed"]].get("shared_base")):
            base[run["seed"]] = point
    for run in runs:
        if run["seed"] in base and base_point(run) is None:
            run["evals"].insert(0, {**base[run["seed"]], "shared_base": True})
    return runs


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------

COLOURS = {
    "process": "tab:blue",
    "outcome": "tab:orange",
    "mixed": "tab:green",
    "backprop": "tab:purple",
}


def plot_accuracy(runs: Sequence[Mapping[str, Any]], modes: Sequence[str], path: Path) -> Path:
    """Held-out accuracy vs step per mode: mean over seeds, band = min..max of seeds, and
    each seed as a thin dashed line (seeds that part widely hide behind a mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode and r["evals"]]
        steps = sorted({p["step"] for r in mine for p in r["evals"]})
        per_step = [
            [p["accuracy"] for r in mine for p in r["evals"] if p["step"] == s] for s in steps
        ]
        if not steps:
            continue
        colour = COLOURS.get(mode)
        for run in mine:
            points = sorted((p["step"], 100 * p["accuracy"]) for p in run["evals"])
            ax.plot(*zip(*points), color=colour, alpha=0.45, linewidth=0.9, linestyle="--")
            ax.annotate(
                f"s{run['seed']}",
                points[-1],
                textcoords="offset points",
                xytext=(4, -3),
                fontsize=7,
                color=colour,
            )
        means = [100 * statistics.fmean(v) for v in per_step]
        ax.plot(steps, means, marker="o", color=colour, label=f"{mode} ({len(mine)} seeds)")
        for step, values, mean in zip(steps, per_step, means):
            if len(values) < len(mine):  # a run that did not reach this evaluation
                ax.annotate(
                    f"n={len(values)}",
                    (step, mean),
                    textcoords="offset points",
                    xytext=(4, 6),
                    fontsize=7,
                    color=colour,
                )
        ax.fill_between(
            steps,
            [100 * min(v) for v in per_step],
            [100 * max(v) for v in per_step],
            color=colour,
            alpha=0.2,
        )
    # Accuracy starts at 0; runs that stay there get a readable 0-10% axis, not +-0.05.
    ax.set_ylim(0, max(10.0, ax.get_ylim()[1]))
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title("MathChat-v0 held-out accuracy (mean; band: range; dashed: each seed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_behaviour(runs: Sequence[Mapping[str, Any]], modes: Sequence[str], path: Path) -> Path:
    """The paper's behaviour figure: tool-call rate and response length per agent vs step.

    Raw per-step values of every run are drawn faint, their EMA (alpha = 1/3) solid.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"{CODE_AGENT}/tool_call_rate", "code executor tool-call rate (%)", 100.0)]
    panels += [
        (f"{agent}/mean_response_tokens", f"{agent} response tokens", 1.0) for agent in AGENTS
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, title, scale) in zip(axes, panels):
        for mode in modes:
            colour = COLOURS.get(mode)
            for index, run in enumerate(r for r in runs if r["mode"] == mode):
                steps = [p["step"] for p in run["train"]]
                raw = [None if p.get(key) is None else scale * p[key] for p in run["train"]]
                if not steps:
                    continue
                ax.plot(
                    steps,
                    [math.nan if v is None else v for v in raw],
                    color=colour,
                    alpha=0.2,
                    linewidth=0.8,
                )
                ax.plot(
                    steps, ema(raw), color=colour, linewidth=1.6, label=mode if index == 0 else None
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Training rollouts: raw per step (faint), EMA 1/3 (solid)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _pct(stat: Mapping[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "n/a"
    text = f"{100 * stat['mean']:.1f}"
    return text + (f" ± {100 * stat['ci95']:.1f}" if stat.get("ci95") is not None else "")


def _score(stat: Mapping[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "n/a"
    return f"{stat['mean']:.2f}"


def _num(stat: Mapping[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "n/a"
    return f"{stat['mean']:.0f}"


def table_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row for the base system and one per mode, at the compared step."""

    def row(name: str, step: Any, stats: Mapping[str, Any], gain: str) -> dict[str, Any]:
        return {
            "system": name,
            "step": step,
            "accuracy %": _pct(stats["accuracy"]),
            "gain (pp)": gain,
            "tool calls %": _pct(stats["tool_call_rate"]),
            "executor score": _score(stats["coach_score"][CODE_AGENT]),
            "verifier score": _score(stats["coach_score"]["verifier"]),
            **{f"{a} tokens": _num(stats["response_tokens"][a]) for a in AGENTS},
        }

    rows = [row("base (untrained)", 0, summary["base"], "")]
    for mode, stats in summary["modes"].items():
        rows.append(row(mode, stats["step"], stats, _pct(stats["gain_over_base"])))
    return rows


def gpu_names() -> list[str]:
    """The GPUs of this machine by ``nvidia-smi`` (none where it is missing).

    Asked of the driver's tool rather than torch: the launcher must not take a CUDA
    context on the GPU its runs share.
    """
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listed.splitlines() if line.strip()]


def git_commit() -> str | None:
    """The commit the runs were made with (with ``+dirty`` for uncommitted changes)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty.strip() else "")


def build_report(
    args: argparse.Namespace,
    recipe: Mapping[str, Any],
    modes: Sequence[str],
    seeds: Sequence[int],
    included: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Collect the runs, write the results file and plots, print the table."""
    runs = collect(Path(args.runs_dir), modes, seeds, included, args.runs_commit)
    summary = summarise(runs, modes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_accuracy(runs, modes, out / f"{args.name}_accuracy.png"),
        plot_behaviour(runs, modes, out / f"{args.name}_behaviour.png"),
    ]
    payload = {
        "command": " ".join(["python -m benchmarks.repro_mathchat", *sys.argv[1:]]),
        "commit": git_commit(),
        # The code the runs were trained with (recorded at launch, given by --runs-commit,
        # or from the results files of --include).
        "runs_commit": sorted({r["commit"] for r in runs if r["commit"]}),
        "included": list(args.include),
        "recipe": dict(recipe),
        "modes": list(modes),
        "seeds": list(seeds),
        "eval_protocol": {
            "episodes_per_eval": recipe.get("eval_episodes"),
            "temperature": recipe.get("eval_temperature", 0.6),
            "tasks": (recipe.get("eval_env_options") or {}).get("tasks"),
        },
        **dict(extra or {}),
        "summary": summary,
        "goals": goal_checks(summary),
        "runs": runs,
        "plots": [p.name for p in plots],
    }
    write_results(args.name, payload, out)
    print_table(table_rows(summary), title="held-out accuracy, mean ± 95% interval over seeds")
    for name, passed in payload["goals"].items():
        print(f"  {name}: {'yes' if passed else 'no'}")
    for run in runs:
        logged = sum(row["solved_logged"] for row in run.get("regraded", []))
        now = sum(row["solved_now"] for row in run.get("regraded", []))
        if logged != now:
            print(
                f"  {run['dir']}: {logged} saved episodes were graded solved during the run, "
                f"{now} by the current grader (its figures predate a grading change)",
                file=sys.stderr,
            )
    return payload


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="the recipe (YAML)")
    parser.add_argument(
        "--modes",
        default="process,outcome",
        help="credit modes, comma-separated (process, outcome, mixed, backprop)",
    )
    parser.add_argument("--seeds", default="0,1,2", help="run seeds, comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's steps")
    parser.add_argument(
        "--eval-every", type=int, default=None, help="override the recipe's eval_every"
    )
    parser.add_argument("--model", default=None, help="override the recipe's system")
    parser.add_argument(
        "--parallel", type=int, default=None, help="runs side by side (default: all of them)"
    )
    parser.add_argument(
        "--lockstep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pause a run a step ahead of the slowest until it catches up, so runs cut "
        "short by time have reached the same evaluations (POSIX signals)",
    )
    parser.add_argument("--runs-dir", default="runs/repro", help="where the runs are written")
    parser.add_argument("--out", default=str(REPRO_DIR), help="where results and plots go")
    parser.add_argument("--name", default="mathchat_smollm2", help="results file name")
    parser.add_argument(
        "--runs-commit",
        default=None,
        help="with --report-only: the commit the runs were made with, where the run "
        "directories did not record one (runs made from a copy without git)",
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="RESULTS_JSON",
        help="an earlier results file of the same recipe whose runs are reported with "
        "these (one credit mode per session); repeatable; its runs are not trained again",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="do not train: rebuild results and plots from the run dirs",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU check: a tiny model in the real MathChat-v0 (see repro_smoke)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from benchmarks.repro_smoke import run_smoke

        return run_smoke(Path(args.out) if args.out != str(REPRO_DIR) else None)
    modes = [m for m in args.modes.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    recipe = load_recipe(Path(args.config))
    overrides = {"steps": args.steps, "eval_every": args.eval_every, "system": args.model}
    recipe.update({k: v for k, v in overrides.items() if v is not None})
    sizes = check_disjoint(recipe)
    print(f"tasks: {sizes['train_tasks']} training, {sizes['heldout_tasks']} held-out, disjoint")
    included = load_included([Path(p) for p in args.include], recipe)
    if not args.report_only:
        runs = plan_runs(recipe, modes, seeds, Path(args.runs_dir), included)
        codes = launch_runs(
            runs,
            args.parallel or len(runs),
            int(recipe.get("steps", 128)),
            lockstep=args.lockstep,
        )
        failed = {name: code for name, code in codes.items() if code != 0}
        if failed:
            print(f"failed runs: {failed}; their logs are in {args.runs_dir}", file=sys.stderr)
    # The modes of included runs are reported too (``--modes outcome --include`` of a
    # process-credit results file compares both).
    only_included = {mode for mode, _ in included} - set(modes)
    report_modes = modes + [m for m in COLOURS if m in only_included]
    left_out = sorted(key for key in included if key[1] not in seeds or key[0] not in report_modes)
    if left_out:
        print(
            f"included runs outside --seeds / the credit modes, left out: {left_out}",
            file=sys.stderr,
        )
    payload = build_report(args, recipe, report_modes, seeds, included, extra=sizes)
    missing = [r["dir"] for r in payload["runs"] if r["steps_done"] < int(recipe.get("steps", 0))]
    if missing:
        print(f"incomplete runs (a missing run is not a result): {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
