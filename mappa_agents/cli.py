"""``mappa eval`` (benchmark a multiagent system) and ``mappa coach audit``.

``mappa serve`` (an OpenEnv server) is :mod:`mappa_agents.serve_command`.

The ``mappa`` command itself is :mod:`mappa_train.command`, the one package that may
import every other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mappa_env.credit import CREDIT_MODES
from mappa_env.typecheck import check_env_options

logger = logging.getLogger("mappa")


def env_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The environment's options from the flags of :func:`add_env_arguments`.

    Common flags first, then the environment's own task flags (its ``cli_options``),
    then ``--env-option KEY=VALUE`` pairs over both.
    """
    from mappa_env.registry import env_class

    cls = env_class(args.env)
    options: dict[str, Any] = {
        "sandbox": None if args.sandbox == "none" else args.sandbox,
        "isolation": args.isolation,
    }
    # A command that scores under one fixed credit (a coach audit) has no --credit-mode.
    if getattr(args, "credit_mode", None) is not None:
        options["credit_mode"] = args.credit_mode
    # The token budget the prompts state comes from the sampling flags, which commands
    # that generate nothing (a coach audit) do not take.
    if getattr(args, "max_new_tokens", None) is not None:
        options["max_new_tokens"] = args.max_new_tokens
    flags = {
        "tasks": args.tasks,
        "num_tasks": args.num_tasks,
        "task_seed": args.task_seed,
        "task_secret": args.task_secret,
        "data_dir": args.data_dir,
        "task_ids": args.task_ids.split(",") if args.task_ids else None,
    }
    # Each environment reads its own task flags: no environment ids are known here.
    cli_options = getattr(cls, "cli_options", None)
    if callable(cli_options):
        options.update(cli_options(flags))
    elif args.tasks is not None:
        options["tasks"] = args.tasks
    as_json = getattr(args, "env_options", None)
    if as_json is not None:
        check_env_options(args.env, as_json, setting="--env-options")
        options.update(as_json)
    given = _parse_env_options(args.env_option or [])
    check_env_options(args.env, given, setting="--env-option")
    options.update(given)
    return options


def _json_object(text: str) -> dict[str, Any]:
    """``--env-options``: one JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'expected a JSON object such as {{"turns": ...}}, got {text!r}'
        )
    return value


def _parse_env_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON is used as JSON, else as text."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"--env-option takes KEY=VALUE (e.g. code_timeout_s=60), got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def add_env_arguments(
    parser: argparse.ArgumentParser, *, credit: bool = True, isolation_help: str | None = None
) -> None:
    """The environment's arguments (eval and serve): its id, tasks, coach, sandbox, credit.

    Args:
        parser: The sub-command's parser.
        credit: Whether the command takes ``--credit-mode``; a coach audit scores every
            action under process credit, so a flag it would ignore is not offered.
        isolation_help: The help of ``--isolation``, where the command gives it its own
            meaning (``mappa serve``'s ``auto`` confines or refuses to start).
    """
    parser.add_argument(
        "--env",
        default="MathChat-v0",
        help="a registered id (MathChat-v0, DSBench-v0, or one registered with "
        "mappa_env.register) or the import path of an environment class, module:Class",
    )
    parser.add_argument(
        "--env-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="the environment's constructor options as one JSON object, as mappa train "
        'takes them (e.g. \'{"tasks": "gen:64", "sandbox": null}\'); it goes over '
        "--tasks, --sandbox and the other task flags; --env-option pairs go over it",
    )
    parser.add_argument(
        "--env-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="an option of the environment's constructor (VALUE as JSON where it parses); "
        "repeatable",
    )
    parser.add_argument(
        "--coach",
        default="rules",
        help="rules, or llm:<litellm model>[?api_base=URL&max_tokens=N&timeout=S&...]. "
        "Size the reply budget max_tokens (default 2048) to the judge: ~512 covers a plain "
        "model's analysis and score, reasoning models need 2048+ (their thinking counts); a "
        "reply cut at max_tokens is an invalid verdict. timeout (seconds per call, default "
        "120) should exceed max_tokens / the judge's tokens per second plus the time to "
        "first token, e.g. 512 tokens at 50 tok/s -> timeout=30. Timeouts and invalid "
        "verdicts show in the progress line",
    )
    parser.add_argument(
        "--tasks",
        default=None,
        help="the environment's tasks option (MathChat: a task file, a name such as "
        "aime_2025, or gen:N)",
    )
    parser.add_argument(
        "--num-tasks", type=int, default=None, help="MathChat: use this many generated problems"
    )
    parser.add_argument("--task-seed", type=int, default=0, help="seed of generated problems")
    parser.add_argument(
        "--task-secret",
        default=None,
        help="pin the secret generated tasks are drawn with, for a reproducible run "
        "(default: the user's secret for MathChat problems, a fresh one per run for "
        "built-in DSBench tasks); agents never see it",
    )
    parser.add_argument("--data-dir", default=None, help="DSBench data directory")
    parser.add_argument("--task-ids", default=None, help="DSBench task ids, comma-separated")
    parser.add_argument("--sandbox", default="jupyter", choices=["jupyter", "none"])
    parser.add_argument(
        "--isolation",
        default="auto",
        choices=["auto", "namespaces", "none"],
        help=isolation_help
        or "confine agents' code in Linux namespaces (bubblewrap): auto = where it works",
    )
    add_require_isolation_argument(parser)
    if not credit:
        return
    parser.add_argument(
        "--credit-mode",
        "--reward-mode",  # its former name
        dest="credit_mode",
        default="process",
        choices=CREDIT_MODES,
        help="how each action's reward is made (mappa_env.credit): the coach's score "
        "(process), the episode's outcome, the acting agent's own correctness "
        "(agent_oracle), or a mix",
    )


def add_require_isolation_argument(parser: argparse.ArgumentParser) -> None:
    """``--require-isolation``: the command line's way to set ``MAPPA_REQUIRE_ISOLATION``."""
    parser.add_argument(
        "--require-isolation",
        action="store_true",
        help="refuse to start unless agents' code can be confined in namespaces (as "
        "MAPPA_REQUIRE_ISOLATION=1 does): --isolation auto then acts as namespaces, and "
        "none is refused",
    )


def announce_unconfined(command: str, isolation: str, code_runs: bool = True) -> str | None:
    """Say first, in one line on stderr, that ``isolation`` runs agents' code unconfined.

    Args:
        command: The sub-command, for the line's prefix.
        isolation: The isolation mode the run asked for.
        code_runs: Whether the run executes agents' code at all (not ``--sandbox none``).

    Returns:
        The reason said, or ``None`` when nothing was said.
    """
    from mappa_env.sandbox.isolation import unconfined_reason

    reason = unconfined_reason(isolation) if code_runs else None
    if reason is not None:
        cause = " ".join(reason.split()).rstrip(".")
        print(
            f"mappa {command}: agents' code runs UNCONFINED (isolation auto: {cause}); "
            "pass --require-isolation to refuse such a run, or --isolation none to accept it",
            file=sys.stderr,
            flush=True,
        )
    return reason


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """How local and API models generate (``mappa eval`` and ``mappa serve``)."""
    parser.add_argument("--max-new-tokens", type=int, default=512, help="tokens per action")
    parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--device", default="auto", help="torch device for local models")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float32, float16")
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="local models on CUDA: decode with a static KV cache and CUDA graphs "
        "(recorded at each new batch shape; see HFPolicy)",
    )


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``mappa eval``: the environment's, the system, sampling, the run."""
    add_env_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="run seed")
    parser.add_argument(
        "--system",
        default="smollm2-135m",
        help="one model for every agent (smollm2-135m, an HF id or path, "
        "api:<litellm model>[?api_base=URL&api_key=KEY&timeout_s=S], vllm:<model>, "
        "script:<module>:<function> (a function messages -> reply, no model), or a "
        "`mappa train` run dir / checkpoint: runs/x means its newest checkpoint, each agent "
        "with its own weights) or per agent: 'problem_solver=a,code_executor=b,verifier=c'",
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes to run (default 8), cycling through the environment's tasks in "
        "order; not with --samples-per-task/--num-eval-tasks, which set the episodes to "
        "tasks x samples",
    )
    parser.add_argument(
        "--samples-per-task",
        type=int,
        default=None,
        metavar="K",
        help="run K episodes of each task (e.g. 4 at --temperature 0.6, as papers report "
        "mean accuracy of 4 samples) and report mean@K and pass@K with 95%% intervals; "
        "the tasks are the first --num-eval-tasks of the environment's task list (default: "
        "all of them), so the run has tasks x K episodes",
    )
    parser.add_argument(
        "--num-eval-tasks",
        type=int,
        default=None,
        metavar="N",
        help="evaluate the first N tasks of the environment's task list, each "
        "--samples-per-task times (default 1)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    parser.add_argument(
        "--schedule",
        default="ticks",
        choices=["ticks", "continuous", "episodes"],
        help="how generation is batched: ticks (deterministic: a seed repeats a run), "
        "continuous (each policy serves requests as they arrive: faster when steps take "
        "uneven time, not reproducible) or episodes (one unseeded request per turn, for "
        "engines that batch continuously)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="hide the progress bar, and the model libraries' bars (loading weights)",
    )


DEFAULT_EPISODES = 8
"""Episodes of ``mappa eval`` without ``--episodes`` or ``--samples-per-task``."""


def eval_plan(
    task_ids: Sequence[str],
    *,
    episodes: int | None = None,
    samples_per_task: int | None = None,
    num_eval_tasks: int | None = None,
) -> list[dict[str, Any]] | None:
    """The reset options of each episode of ``mappa eval`` (``None``: the runner's order).

    - ``samples_per_task`` or ``num_eval_tasks`` given: each of the first
      ``num_eval_tasks`` tasks (default: all) ``samples_per_task`` times (default 1),
      task by task: ``[t0, t0, ..., t1, t1, ...]``; ``episodes`` must not be given.
    - otherwise ``None``: ``episodes`` episodes cycle through the tasks in order.

    Raises:
        SystemExit: On conflicting or impossible settings, saying which to change.
    """
    if samples_per_task is None and num_eval_tasks is None:
        return None
    if episodes is not None:
        raise SystemExit(
            "--episodes conflicts with --samples-per-task/--num-eval-tasks (the run has "
            "tasks x samples episodes): drop --episodes, or set the tasks with --num-eval-tasks"
        )
    k = 1 if samples_per_task is None else samples_per_task
    if k < 1:
        raise SystemExit(f"--samples-per-task must be >= 1, got {k}")
    if not task_ids:
        raise SystemExit(
            "--samples-per-task/--num-eval-tasks need an environment with a task list "
            "(its `tasks` attribute); this one has none: use --episodes"
        )
    n = len(task_ids) if num_eval_tasks is None else num_eval_tasks
    if not 1 <= n <= len(task_ids):
        raise SystemExit(
            f"--num-eval-tasks must be between 1 and the {len(task_ids)} tasks of the "
            f"environment, got {n} (MathChat: raise --num-tasks, or choose --tasks)"
        )
    return [{"task_id": task_id} for task_id in task_ids[:n] for _ in range(k)]


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``mappa eval``: episodes, report.json, transcripts.jsonl, plots, a printed table.

    Raises:
        SystemExit: With :data:`NOTHING_MEASURED` when every episode failed (the first
            error on stderr), or on bad settings.
    """
    import mappa_env
    from mappa_agents.policy import SamplingParams
    from mappa_agents.report import format_table, isolation_of, plot_report, summarize
    from mappa_agents.runner import RolloutRunner, verdict_failure
    from mappa_agents.system import AgentSystem, parse_system_spec
    from mappa_agents.trajectory import EpisodeStream
    from mappa_env.coach import make_coach

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env_options = env_options_from_args(args)
    announce_unconfined("eval", args.isolation, code_runs=env_options.get("sandbox") is not None)
    # One coach for every environment, so its concurrency limit, cache and ledger are shared.
    coach = make_coach(args.coach)
    env_options["coach"] = coach
    probe = mappa_env.make(args.env, **env_options)
    try:
        isolation = isolation_of(probe)
        agents = list(probe.possible_agents)
        task_ids = [str(t.id) for t in getattr(probe, "tasks", None) or []]
        # Before loading models: a sandbox that cannot run code stops here, with the cause.
        probe.check_sandbox()
    finally:
        probe.close()
    samples_per_task = getattr(args, "samples_per_task", None)
    plan = eval_plan(
        task_ids,
        episodes=args.episodes,
        samples_per_task=samples_per_task,
        num_eval_tasks=getattr(args, "num_eval_tasks", None),
    )
    num_episodes = len(plan) if plan is not None else (args.episodes or DEFAULT_EPISODES)
    # Resolved once: the report records the very weights loaded, even while the run
    # named by --system is still saving newer checkpoints.
    system_per_agent = parse_system_spec(args.system, agents)
    logger.info("loading system %s for agents %s: %s", args.system, agents, system_per_agent)
    load_start = time.perf_counter()
    system = AgentSystem.from_spec(
        system_per_agent,
        agents,
        resolved=True,
        device=args.device,
        dtype=args.dtype,
        **({"compile_decode": True} if args.compile_decode else {}),
    )
    load_s = time.perf_counter() - load_start
    sampling = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
    )
    # Each episode goes to disk as it finishes: a run killed or out of disk keeps them.
    transcripts = EpisodeStream(out / "transcripts.jsonl")
    runner = RolloutRunner(
        lambda: mappa_env.make(args.env, **env_options),
        system,
        sampling,
        concurrency=args.concurrency,
        seed=args.seed,
        progress=not args.no_progress,
        schedule=args.schedule,
        on_episode=transcripts.write,
    )
    start = time.perf_counter()
    try:
        episodes = runner.run(num_episodes, plan)
    finally:
        transcripts.close()
        shared_tasks = env_options.get("tasks")
        if hasattr(shared_tasks, "close"):
            shared_tasks.close()
        system.close()
        close_coach = getattr(coach, "close", None)
        if callable(close_coach):
            close_coach()
    wall = time.perf_counter() - start

    from mappa_agents.report import AllEpisodesFailedError, check_some_finished

    try:
        check_some_finished(episodes)
    except AllEpisodesFailedError as exc:
        print(f"mappa eval: {exc} (transcripts in {transcripts.path})", file=sys.stderr)
        raise SystemExit(NOTHING_MEASURED) from exc
    report = summarize(episodes, wall_time_s=wall, samples_per_task=samples_per_task or 1)
    report["system"] = args.system
    report["coach"] = args.coach
    # What confined the agents' code, so a run that was not confined says so.
    report["isolation"] = isolation
    report["coach_verdicts"] = dict(runner.coach_verdict_counts)
    # Invalid verdicts by cause (timeout, connection, http_429, http_500, format, ...):
    # each has another fix.
    failures = Counter(verdict_failure(a.coach) for e in episodes for a in e.actions)
    failures.pop(None, None)
    report["coach_failures"] = dict(sorted(failures.items()))
    report["system_per_agent"] = system_per_agent
    report["model_load_s"] = load_s
    report["sampling"] = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
    }
    from mappa_env.coach import coach_report, records_from_actions

    records = records_from_actions(a for e in episodes for a in e.actions)
    if records:
        calibration = coach_report(records)
        report["coach_auroc"] = calibration.to_dict().get("auroc_overall")
        (out / "coach_report.md").write_text(calibration.to_markdown() + "\n")
    # How many episodes transcripts.jsonl holds (all, unless writing it failed).
    report["transcripts"] = {
        "path": str(transcripts.path),
        "episodes": transcripts.episodes,
        "error": transcripts.error,
    }
    try:
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    except OSError as exc:
        raise SystemExit(
            f"mappa eval: writing {out / 'report.json'} failed ({exc}); {transcripts.path} "
            f"holds {transcripts.episodes} of the {len(episodes)} episodes. Free space and "
            "rerun, or pass another --out"
        ) from exc
    if transcripts.error is not None:
        logger.error(
            "%s holds %d of the %d episodes: %s",
            transcripts.path,
            transcripts.episodes,
            len(episodes),
            transcripts.error,
        )
    plots = plot_report(episodes, out)
    print(format_table(report))
    written = [out / "report.json", out / "transcripts.jsonl", *plots]
    if (out / "coach_report.md").exists():
        written.append(out / "coach_report.md")
    print("wrote " + ", ".join(map(str, written)))
    return report


NOTHING_MEASURED = 3
"""Exit status of ``mappa eval`` when the run measured nothing: no episode finished, or
no coach verdict was valid (every reward came from a failed verdict). Distinct from 1 (a
crash, a full disk) and 2 (a setting that cannot work), so a script can tell them apart."""


def nothing_measured(report: dict[str, Any]) -> str | None:
    """Why ``report`` (of :func:`run_eval`) measured nothing, or ``None`` when it did.

    Args:
        report: The run's report, with ``coach_verdicts`` (counts by kind) and
            ``coach_failures`` (invalid verdicts by cause).
    """
    verdicts = report.get("coach_verdicts") or {}
    total = sum(verdicts.values())
    if not total or verdicts.get("valid", 0):
        return None
    causes = ", ".join(f"{k} {v}" for k, v in (report.get("coach_failures") or {}).items())
    return (
        f"none of the {total} coach verdicts was valid ({causes or 'no cause recorded'}), so "
        "no reward was measured: fix the --coach (report.json's coach_failures counts them "
        "by cause)"
    )


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that ends each option with its default, where it has one worth showing.

    Options without a default (``None``), switches off by default and help that already
    names its default value are left as they are.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS):
            return text
        if re.search(rf"\bdefault:? {re.escape(str(action.default))}\b", text):
            return text
        return super()._get_help_string(action)


def add_eval_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` sub-command to ``commands`` (an argparse sub-parsers object)."""
    parser = commands.add_parser(
        "eval",
        help="benchmark a system on an environment",
        epilog=f"Exit status: 0 when the run measured something; {NOTHING_MEASURED} when it "
        "measured nothing (no episode finished, or no coach verdict was valid), after "
        "writing what it could; 2 for a setting that cannot work; 1 for a crash or a full "
        "disk.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_eval_arguments(parser)
    parser.add_argument("--out", default="runs/eval", help="output directory")
    parser.set_defaults(handler=_eval_handler)
    return parser


def _eval_handler(args: argparse.Namespace) -> int:
    from mappa_agents.progress import library_progress_bars

    # --no-progress hides the model libraries' bars (loading weights) as well.
    with library_progress_bars(not args.no_progress):
        report = run_eval(args)
    why = nothing_measured(report)
    if why is not None:
        print(f"mappa eval: nothing was measured: {why}", file=sys.stderr)
        return NOTHING_MEASURED
    return 0


def add_coach_parser(
    commands: Any, read_run: Callable[[str], Any] | None = None
) -> argparse.ArgumentParser:
    """Add the ``coach`` sub-command (``mappa coach audit``) to ``commands``.

    Args:
        commands: The ``mappa`` command's sub-parsers.
        read_run: Reads a ``--config`` value into the run's audit settings (an object
            with ``name``, ``env``, ``coach``, ``env_options``, ``reveal``,
            ``credit_mode``, ``arm`` and ``notes``; ``mappa_train`` gives it, as it
            reads training configs); ``None``: ``--config`` is refused.
    """
    from mappa_env.audit import FAMILIES, PAYLOADS

    coach = commands.add_parser("coach", help="check a coach before training with it")
    actions = coach.add_subparsers(dest="coach_command", required=True)
    parser = actions.add_parser(
        "audit",
        help="score honest actions and attacks through an environment: can the coach be fooled?",
        description="For every agent, on real episode contexts built from the environment's "
        "tasks, score an honest action and a battery of attacks (null actions, master keys, "
        "injections in every channel the agents write, padding, confident wrong answers, "
        "placeholders, several answers) through the same path training uses, and report per "
        "family and agent how far the scores moved: audit.json, audit.md, audit.png.",
    )
    add_env_arguments(parser, credit=False)
    # --env and --coach come from --config when it is given, else MathChat-v0 and rules.
    parser.set_defaults(env=None, coach=None)
    parser.add_argument(
        "--config",
        default=None,
        metavar="CONFIG",
        help="a training config (a file, or a recipe name such as mathchat-smollm2; a "
        "credit test such as mathchat-credit-test audits its treatment arm): audit that "
        "run's environment, training tasks and options, coach and reveal policy. A --env, "
        "--reveal or tasks setting that differs from the run's is refused; another "
        "--coach is audited on the run's tasks, with a warning",
    )
    parser.add_argument("--out", default="runs/coach-audit", help="output directory")
    parser.add_argument(
        "--contexts",
        type=int,
        default=1,
        metavar="N",
        help="build contexts from the first N tasks (one context per agent and task)",
    )
    parser.add_argument(
        "--reveal",
        default=None,
        choices=["never", "last_agent", "always"],
        help="which actions the coach judges with the ground truth (default: the coach's "
        "own default, as training would use: rules always, LLM coaches last_agent)",
    )
    parser.add_argument("--agents", default=None, help="agents to audit, comma-separated")
    parser.add_argument(
        "--families",
        default=None,
        help=f"attack families, comma-separated (default all: {','.join(FAMILIES)})",
    )
    parser.add_argument(
        "--payloads",
        default=None,
        help="injection payloads, comma-separated (default all: "
        f"{','.join(p.name for p in PAYLOADS)})",
    )
    parser.add_argument(
        "--mutations",
        type=int,
        default=4,
        metavar="N",
        help="random mutants of each context's honest action (a number or operator changed, "
        "a line dropped, the boxed answer replaced by a near number): the mutation family",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the mutants")
    parser.add_argument("--concurrency", type=int, default=2, help="episodes in flight")
    parser.add_argument(
        "--moved-points",
        type=float,
        default=1.0,
        help="a payload or padding that raises the coach's own score by more than this is 'moved'",
    )
    parser.add_argument(
        "--fail-on",
        default="never",
        choices=["never", "moved", "taken"],
        help="exit with status 1 when a family's verdict is this bad or worse (for CI)",
    )
    parser.set_defaults(handler=run_coach_audit, read_run=read_run)
    return parser


# The options that pick an environment's tasks (MathChat's tasks, DSBench's folder or ids).
_TASK_OPTIONS = ("tasks", "data_dir", "task_ids")


def _close_tasks(options: dict[str, Any]) -> None:
    """Close a task set the flags built (DSBench's built-in tasks hold a folder)."""
    for key in _TASK_OPTIONS:
        close = getattr(options.get(key), "close", None)
        if callable(close):
            close()


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _audit_settings(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The audit's environment options and the run ``--config`` names (``None`` without).

    With ``--config``: the run's environment, coach, reveal policy and environment
    options, with the flags' options over them; a flag that picks other tasks (or
    another environment or reveal policy) than the run's is refused, so the audit
    cannot pass on tasks the run never trains on.
    """
    from mappa_env.errors import SettingsError

    run = None
    if args.config is not None:
        if args.read_run is None:
            raise SettingsError("--config is read by the mappa command: run mappa coach audit")
        run = args.read_run(args.config)
        if args.env is not None and args.env != run.env:
            raise SettingsError(
                f"--env {args.env} is not the environment of --config {run.name} ({run.env}): "
                "drop --env to audit the run, or drop --config to audit another environment"
            )
        if args.reveal is not None and args.reveal != run.reveal:
            raise SettingsError(
                f"--reveal {args.reveal} is not the reveal policy of --config {run.name} "
                f"({run.reveal or 'its coach default'}): drop --reveal to audit the run as "
                "it trains, or drop --config"
            )
        if args.coach is not None and args.coach != run.coach:
            # Trying another judge on the tasks of a run before training with it.
            logger.warning(
                "auditing coach %s on the tasks of --config %s, which trains with coach %s",
                args.coach,
                run.name,
                run.coach,
            )
        args.env = run.env
        args.coach = args.coach or run.coach
        args.reveal = run.reveal
    args.env = args.env or "MathChat-v0"
    args.coach = args.coach or "rules"
    flagged = any(
        getattr(args, name) is not None for name in ("tasks", "num_tasks", "data_dir", "task_ids")
    )
    options = env_options_from_args(args)
    if run is None:
        return options, None
    given = {*(args.env_options or {}), *_parse_env_options(args.env_option or [])}
    for key in _TASK_OPTIONS:
        if key not in options:
            continue
        if not (flagged or key in given):
            # The environment's default tasks (DSBench's built-in set), not the run's.
            _close_tasks({key: options.pop(key)})
        elif options[key] != run.env_options.get(key):
            theirs = run.env_options.get(key)
            _close_tasks(options)
            raise SettingsError(
                f"{key}={_shown(options[key])} is not the tasks setting of --config "
                f"{run.name} ({key}={_shown(theirs) if key in run.env_options else 'unset'}): "
                "drop it to audit the run's tasks, or drop --config to audit other tasks"
            )
    return {**run.env_options, **options}, run


def _split(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def run_coach_audit(args: argparse.Namespace) -> int:
    """Run ``mappa coach audit``: print the verdict per family; write the report.

    Returns:
        0, or 1 when ``--fail-on`` names a verdict a family reached.
    """
    from mappa_env.audit import VERDICTS, AuditConfig, audit_coach

    config = AuditConfig(
        tasks=args.contexts,
        agents=_split(args.agents),
        families=_split(args.families),
        payloads=_split(args.payloads),
        reveal=args.reveal,
        concurrency=args.concurrency,
        moved_points=args.moved_points,
        mutations=args.mutations,
        seed=args.seed,
    )
    env_options, run = _audit_settings(args)
    config = dataclasses.replace(config, reveal=args.reveal)
    done = {"shown": 0}

    def progress(finished: int, total: int) -> None:
        # About twenty lines per audit, whatever its size.
        if finished == total or finished - done["shown"] >= max(total // 20, 1):
            done["shown"] = finished
            print(f"  {finished}/{total} actions scored", flush=True)

    try:
        report = audit_coach(
            args.env,
            args.coach,
            env_options=env_options,
            config=config,
            on_case=progress,
            # A run that names no tasks trains on the environment's own default tasks.
            audit_defaults=run is None,
        )
    finally:
        shared_tasks = env_options.get("tasks")
        if hasattr(shared_tasks, "close"):
            shared_tasks.close()
    if run is not None:
        report.settings["config"] = run.name
        report.settings["arm"] = run.arm
        report.notes.insert(
            0,
            f"The tasks, options, coach and reveal policy of the training run --config "
            f"{run.name}"
            + (f" (its arm {run.arm})" if run.arm else "")
            + f", which trains under {run.credit_mode} credit with coach {run.coach}.",
        )
        report.notes[1:1] = run.notes
    written = report.write(args.out)
    print(f"coach {report.coach} on {report.env_id} (reveal={report.reveal}): {report.summary()}")
    # A verdict over some families is no full pass: those it does not cover are named.
    print(f"  {report.coverage_line()}")
    for line in report.family_lines():
        print(f"  {line}")
    print(
        f"{len(report.cases)} actions in {report.wall_time_s:.0f} s; wrote "
        + ", ".join(map(str, written))
    )
    if args.fail_on != "never" and VERDICTS.index(report.verdict) >= VERDICTS.index(args.fail_on):
        return 1
    return 0
