"""Does per-action credit beat a shared outcome? Arms on MathChat-v0, paired by seed.

Trains the same base system under each arm of the test in
``configs/mathchat-credit-test.yaml`` (its training recipe: ``configs/mathchat-smollm2.yaml``):
the decided pair ``process_blind`` (the coach's score of every action, the reference
answer shown only to the final agent's coach: the paper's information structure) and
``outcome`` (the episode's correctness to every action, the paper's baseline); beside
them, outside the claim, ``process`` (the coach sees the answer at every agent) and
``agent_oracle`` (each agent paid by whether its own final number is right). Every arm
of a seed runs from one command on one commit, side by side, at equal rollouts; then
each is evaluated on held-out problems of the training family (none restating a
training problem) and of families it never saw, and the test that file decided before
the runs is applied (see :mod:`benchmarks.repro_report`).

    python -m benchmarks.repro_mathchat                    # the recipe's arms and seeds (GPU)
    python -m benchmarks.repro_mathchat --smoke            # CPU check with a tiny model
    python -m benchmarks.repro_mathchat --report-only      # rebuild results from the run dirs
    python -m benchmarks.repro_mathchat --eval-tasks more.json   # one more held-out set

Each run is a ``mappa train --config`` subprocess (runs share one GPU side by side, and a
killed run resumes from its checkpoints when the command is repeated). The results file
(``benchmarks/results/repro/<name>.json``) holds every run, every evaluation point, the
comparisons, the recipe, the commit and the rubric versions;
``<name>_episodes.jsonl`` every held-out episode; two plots go beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import repro_report
from benchmarks._common import (
    RESULTS_DIR,
    git_commit,
    machine_info,
    print_table,
    write_results,
)
from benchmarks.repro_collect import (
    PAUSES_FILE,
    PROVENANCE_FILE,
    collect,
    eval_files,
    steps_done,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "mathchat-credit-test.yaml"
REPRO_DIR = RESULTS_DIR / "repro"

# --------------------------------------------------------------------------------------
# The recipe and its task sets
# --------------------------------------------------------------------------------------

TEST_FIELDS = ("arms", "seeds", "treatment", "baseline", "compare_step", "main_task_set")
TEST_FIELDS += ("goal", "void", "out_of_family_sets")


def load_recipe(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A test file's training recipe and its decided test.

    The test file (``configs/mathchat-credit-test.yaml``) names the training recipe
    (``recipe:``, a ``mappa train --config`` file, relative to the test file) and gives
    the test's fields (:data:`TEST_FIELDS`).

    Raises:
        ValueError: For a test file without a recipe, unknown or invalid training fields,
            or a test that lacks a field, names an unknown treatment, or has no arms.
    """
    import yaml

    from mappa_train.config import TrainConfig

    test = dict(yaml.safe_load(path.read_text()) or {})
    recipe_name = test.pop("recipe", None)
    if not recipe_name:
        raise ValueError(
            f"{path} must name its training recipe (recipe: a mappa train --config file)"
        )
    recipe_path = (path.parent / recipe_name).resolve()
    data = yaml.safe_load(recipe_path.read_text()) or {}
    TrainConfig.from_dict(data)  # unknown or invalid fields fail here, before any run
    missing = [name for name in TEST_FIELDS if name not in test]
    unknown = sorted(set(test) - set(TEST_FIELDS))
    if missing or unknown:
        raise ValueError(
            f"the test in {path} must give {list(TEST_FIELDS)} "
            f"(missing {missing}, unknown {unknown})"
        )
    if not test["arms"] or test["treatment"] not in test["arms"]:
        raise ValueError(f"treatment {test['treatment']!r} is not one of the arms {test['arms']}")
    if test["baseline"] not in test["arms"] or test["baseline"] == test["treatment"]:
        raise ValueError(
            f"baseline {test['baseline']!r} must be one of the arms {list(test['arms'])} "
            f"other than the treatment"
        )
    from benchmarks.repro_stats import VoidRule

    VoidRule.from_mapping(test["void"])  # an unknown floor fails here, before any run
    for arm, settings in test["arms"].items():
        extra = sorted(set(settings) - {"credit_mode", "env_options"})
        if "credit_mode" not in settings or extra:
            raise ValueError(
                f"arm {arm!r} must give credit_mode (and optionally env_options), got "
                f"{sorted(settings)}"
            )
    return data, test


def with_eval_tasks(recipe: Mapping[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """The recipe with each task file of ``--eval-tasks`` as one more held-out set.

    A file ``more.json`` becomes the set ``file_more``, evaluated at every evaluation and
    reported beside the recipe's own sets.
    """
    recipe = dict(recipe)
    sets = dict(recipe.get("eval_sets") or {})
    for path in paths:
        name = "file_" + Path(path).stem
        if name in sets:
            raise ValueError(f"--eval-tasks {path}: a held-out set named {name!r} exists already")
        sets[name] = {"tasks": str(Path(path).resolve())}
    recipe["eval_sets"] = sets
    return recipe


def task_sets(recipe: Mapping[str, Any], test: Mapping[str, Any]) -> list[str]:
    """The held-out sets' names, the main one (``eval_env_options``) first."""
    return [test["main_task_set"], *(recipe.get("eval_sets") or {})]


def _tasks(env_id: str, env_options: Mapping[str, Any]) -> list[Any]:
    """An environment's task objects (built without starting anything)."""
    import mappa_env

    env = mappa_env.make(
        env_id, **{**env_options, "sandbox": None, "coach": None, "credit_mode": "outcome"}
    )
    try:
        return list(env.tasks)
    finally:
        env.close()


def check_task_sets(recipe: Mapping[str, Any], test: Mapping[str, Any]) -> dict[str, Any]:
    """Sizes and kinds of every task set; refuses sets a held-out claim cannot rest on.

    A held-out set sharing a problem with training is refused: the same text, or for
    generated problems the same kind, template and numbers
    (:func:`mappa_env.tasks.problem_identity`: a paraphrase is not unseen); so is a
    held-out set stating one problem twice, and an out-of-family set sharing a kind
    with training. Each set's share of problems that are their own solution (the
    prompt, read as Python arithmetic, gives the answer:
    :func:`mappa_env.tasks.checks.is_own_solution`) is reported.

    Raises:
        SystemExit: Naming the set and what it shares with training.
    """
    from mappa_env.tasks import problem_identity
    from mappa_env.tasks.checks import is_own_solution

    def identity(task: Any) -> Any:
        # A task the generator did not make is known by its text alone.
        return problem_identity(task) or ("text", task.prompt)

    env_id = recipe.get("env", "MathChat-v0")
    train_options = recipe.get("env_options", {})
    heldout_options = recipe.get("eval_env_options") or train_options
    sets = {test["main_task_set"]: heldout_options}
    for name, options in (recipe.get("eval_sets") or {}).items():
        sets[name] = {**heldout_options, **options}

    def kind(task: Any) -> str:
        return str(task.metadata.get("kind") or task.metadata.get("source"))

    train = _tasks(env_id, train_options)
    train_prompts = {t.prompt for t in train}
    train_problems = {identity(t) for t in train}
    train_kinds = sorted({kind(t) for t in train})
    facts: dict[str, Any] = {
        "train": {
            "tasks": len(train),
            "kinds": train_kinds,
            "own_solution_share": sum(map(is_own_solution, train)) / len(train),
        }
    }
    for name, options in sets.items():
        tasks = _tasks(env_id, options)
        shared = sorted({t.prompt for t in tasks} & train_prompts)
        if shared:
            raise SystemExit(
                f"{len(shared)} problems of held-out set {name!r} are also training problems "
                f"(e.g. {shared[0]!r}): use another seed or other tasks"
            )
        same = [t for t in tasks if identity(t) in train_problems]
        if same:
            raise SystemExit(
                f"{len(same)} of the {len(tasks)} problems of held-out set {name!r} state the "
                f"template and numbers of a training problem (e.g. {same[0].id}: "
                f"{same[0].prompt!r}): leave them out with 'exclude' in its generated task "
                "set (the training set's options)"
            )
        repeated = len(tasks) - len({identity(t) for t in tasks})
        if repeated:
            raise SystemExit(
                f"held-out set {name!r} states {repeated} of its problems twice: a problem is "
                "the unit of measurement, so each must be there once ('exclude' keeps "
                "repeats out)"
            )
        kinds = sorted({kind(t) for t in tasks})
        if name in test["out_of_family_sets"] and set(kinds) & set(train_kinds):
            raise SystemExit(
                f"out-of-family set {name!r} has kinds the training set has too "
                f"({sorted(set(kinds) & set(train_kinds))}): it must hold only other kinds"
            )
        facts[name] = {
            "tasks": len(tasks),
            "kinds": kinds,
            "out_of_family": name in test["out_of_family_sets"],
            "own_solution_share": sum(map(is_own_solution, tasks)) / len(tasks),
        }
    return facts


# --------------------------------------------------------------------------------------
# Planning and running
# --------------------------------------------------------------------------------------


def run_config(
    recipe: Mapping[str, Any], arm: Mapping[str, Any], seed: int, run_dir: Path, base_eval: bool
) -> dict[str, Any]:
    """The full config of one run: the recipe with its arm's credit and options, its seed
    and directory. The arm's env options apply to training and every held-out set."""
    config = json.loads(json.dumps(recipe))  # a deep copy of plain data
    overlay = dict(arm.get("env_options") or {})
    config["env_options"] = {**config.get("env_options", {}), **overlay}
    if config.get("eval_env_options") is not None:
        config["eval_env_options"] = {**config["eval_env_options"], **overlay}
    config.update(
        credit_mode=arm["credit_mode"],
        seed=seed,
        output_dir=str(run_dir),
        eval_at_start=base_eval,
        progress=False,
    )
    return config


def has_base_eval(runs_dir: Path, seed: int, main_set: str) -> bool:
    """Whether a run of ``seed`` in ``runs_dir`` already evaluated the untrained system.

    Every arm of a seed starts from the same weights and evaluates with the same seeds,
    so one base evaluation per seed serves them all.
    """
    return any(
        0 in eval_files(run_dir, main_set, main_set)
        for run_dir in sorted(runs_dir.glob(f"*-s{seed}"))
    )


def plan_runs(
    recipe: Mapping[str, Any],
    test: Mapping[str, Any],
    arms: Sequence[str],
    seeds: Sequence[int],
    runs_dir: Path,
) -> list[tuple[str, int, Path, dict[str, Any]]]:
    """``(arm, seed, run_dir, config)`` of every run, in launch order (seed by seed).

    The first arm of a seed evaluates the untrained system before training unless a run
    of that seed in ``runs_dir`` already did.
    """
    runs = []
    for seed in seeds:
        base_done = has_base_eval(runs_dir, seed, test["main_task_set"])
        for index, arm in enumerate(arms):
            run_dir = runs_dir / f"{arm}-s{seed}"
            config = run_config(
                recipe, test["arms"][arm], seed, run_dir, base_eval=index == 0 and not base_done
            )
            runs.append((arm, seed, run_dir, config))
    return runs


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
                # One line per launch: a run resumed by a later command shows both commits.
                with (run_dir / PROVENANCE_FILE).open("a") as handle:
                    handle.write(json.dumps(provenance) + "\n")
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


def rubric_versions(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The versions of the rules coach's rubrics for the recipe's environment, if it is
    the coach (an LLM coach's verdicts name none)."""
    if recipe.get("coach", "rules") != "rules":
        return {}
    from mappa_env.coach.rules import RulesCoach

    return RulesCoach().rubric_versions(recipe.get("env", "MathChat-v0"))


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def build_report(
    args: argparse.Namespace,
    recipe: Mapping[str, Any],
    test: Mapping[str, Any],
    arms: Sequence[str],
    seeds: Sequence[int],
    facts: Mapping[str, Any],
) -> dict[str, Any]:
    """Collect the runs, apply the decided test, write the results, records and plots."""
    sets = task_sets(recipe, test)
    runs, records = collect(Path(args.runs_dir), arms, seeds, sets, test["main_task_set"])
    summary = repro_report.compare(runs, records, test, arms, sets) if records else {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    episodes_path = out / f"{args.name}_episodes.jsonl"
    episodes_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    plots = [
        repro_report.plot_accuracy(runs, arms, sets, out / f"{args.name}_accuracy.png"),
        repro_report.plot_behaviour(runs, arms, out / f"{args.name}_behaviour.png"),
    ]
    payload = {
        "command": " ".join(["python -m benchmarks.repro_mathchat", *sys.argv[1:]]),
        "commit": git_commit(),
        "runs_commits": sorted({c for run in runs for c in run["commits"]}),
        "recipe": dict(recipe),
        "test": dict(test),
        "arms": list(arms),
        "seeds": list(seeds),
        "task_sets": dict(facts),
        "coach": {"spec": recipe.get("coach", "rules"), "rubric_versions": rubric_versions(recipe)},
        "eval_protocol": {
            "episodes_per_eval": recipe.get("eval_episodes"),
            "temperature": recipe.get("eval_temperature", 0.6),
        },
        "summary": summary,
        "behaviour": repro_report.behaviour(runs, arms),
        "runs": runs,
        "episodes_file": episodes_path.name,
        "episodes": len(records),
        "plots": [p.name for p in plots],
    }
    write_results(args.name, payload, out)
    for name, entry in (summary.get("task_sets") or {}).items():
        arm_rows, pair_rows = repro_report.table_rows(summary, name)
        flag = (
            "" if entry["at_decided_step"] else f" (NOT the decided step {entry['decided_step']})"
        )
        print_table(arm_rows, title=f"{name}: held-out accuracy (%) at step {entry['step']}{flag}")
        print_table(pair_rows, title=f"{name}: {test['treatment']} against each arm")
        for pair in (entry.get("comparison") or {}).get("pairs", []):
            for reason in pair["verdict"]["why"]:
                print(f"  {pair['treatment']} - {pair['other']}: {reason}")
            for kind in ("missing_samples", "aborted_samples"):
                for arm, by_seed in pair[kind].items():
                    if by_seed:
                        what = kind.replace("_", " ")
                        print(f"  {arm}: {what} per seed, counted wrong: {by_seed}")
    for run in runs:
        logged = sum(row["solved_logged"] for row in run["regraded"])
        now = sum(row["solved_now"] for row in run["regraded"])
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
    parser.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="the test file (YAML) naming its recipe"
    )
    parser.add_argument(
        "--arms",
        default=None,
        help="arms of the test file to run, comma-separated (default: all)",
    )
    parser.add_argument(
        "--seeds", default=None, help="run seeds, comma-separated (default: the recipe's)"
    )
    parser.add_argument(
        "--eval-tasks",
        action="append",
        default=[],
        metavar="PATH",
        help="a task file evaluated as one more held-out set at every evaluation and "
        "reported beside the recipe's (repeatable)",
    )
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
    parser.add_argument("--name", default="mathchat_credit", help="results file name")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="do not train: rebuild results and plots from the run dirs",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU check: a tiny model in the real MathChat-v0, every arm (see repro_smoke)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from benchmarks.repro_smoke import run_smoke

        return run_smoke(Path(args.out) if args.out != str(REPRO_DIR) else None)
    recipe, test = load_recipe(Path(args.config))
    arms = [a for a in (args.arms or ",".join(test["arms"])).split(",") if a]
    unknown = [a for a in arms if a not in test["arms"]]
    decided = (test["treatment"], test["baseline"])
    if unknown or not set(decided) <= set(arms):
        raise SystemExit(
            f"--arms must name arms of the recipe ({list(test['arms'])}) and include the "
            f"decided pair {decided[0]!r} and {decided[1]!r}; got {arms}"
        )
    seeds = [int(s) for s in args.seeds.split(",") if s] if args.seeds else list(test["seeds"])
    overrides = {"steps": args.steps, "eval_every": args.eval_every, "system": args.model}
    recipe.update({k: v for k, v in overrides.items() if v is not None})
    if args.steps is not None and test["compare_step"] > args.steps:
        test["compare_step"] = args.steps  # a shortened run is compared at its end
        void = dict(test["void"] or {})
        void["through_step"] = min(int(void.get("through_step", args.steps)), args.steps)
        test["void"] = void
    recipe = with_eval_tasks(recipe, args.eval_tasks)
    facts = check_task_sets(recipe, test)
    for name, fact in facts.items():
        print(
            f"tasks {name}: {fact['tasks']} ({', '.join(fact['kinds'])}); "
            f"{fact['own_solution_share']:.0%} are their own solution"
        )
    if not args.report_only:
        runs = plan_runs(recipe, test, arms, seeds, Path(args.runs_dir))
        codes = launch_runs(
            runs,
            args.parallel or len(runs),
            int(recipe.get("steps", 128)),
            lockstep=args.lockstep,
        )
        failed = {name: code for name, code in codes.items() if code != 0}
        if failed:
            print(f"failed runs: {failed}; their logs are in {args.runs_dir}", file=sys.stderr)
    payload = build_report(args, recipe, test, arms, seeds, facts)
    missing = [r["dir"] for r in payload["runs"] if r["steps_done"] < int(recipe.get("steps", 0))]
    if missing:
        print(f"incomplete runs (a missing run is not a result): {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
