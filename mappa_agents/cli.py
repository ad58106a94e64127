"""The ``mappa`` command line: benchmark a multiagent system (``eval``) or train it (``train``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("mappa")


def _env_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "sandbox": None if args.sandbox == "none" else args.sandbox,
        "isolation": args.isolation,
        "reward_mode": args.reward_mode,
        "max_new_tokens": args.max_new_tokens,
    }
    if args.env.endswith("MathChat-v0"):
        if args.tasks:
            options["tasks"] = args.tasks
        elif args.num_tasks:
            from mappa_env.tasks import generate_math_tasks

            options["tasks"] = generate_math_tasks(
                args.num_tasks, seed=args.task_seed, secret=args.task_secret
            )
    else:
        task_ids = args.task_ids.split(",") if args.task_ids else None
        if args.data_dir:
            options["data_dir"] = args.data_dir
            options["task_ids"] = task_ids
        else:
            from mappa_env.dsbench import BuiltinTaskSet

            # Built once and shared by every environment of the run.
            options["tasks"] = BuiltinTaskSet(names=task_ids, secret=args.task_secret)
    return options


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``mappa eval`` (shared with ``mappa train`` where they apply)."""
    parser.add_argument("--env", default="MathChat-v0", help="MathChat-v0 or DSBench-v0")
    parser.add_argument(
        "--system",
        default="smollm2-135m",
        help="one model for every agent (smollm2-135m, an HF id or path, api:<litellm model>, "
        "vllm:<model>) or per agent: 'problem_solver=a,code_executor=b,verifier=c'",
    )
    parser.add_argument(
        "--coach", default="rules", help="rules, or llm:<litellm model>[?api_base=...]"
    )
    parser.add_argument("--episodes", type=int, default=8, help="episodes to run")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="tokens per action")
    parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="run seed")
    parser.add_argument("--tasks", default=None, help="MathChat task file or name (aime_2025)")
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
        help="confine agents' code in Linux namespaces (bubblewrap): auto = where it works",
    )
    parser.add_argument("--reward-mode", default="process", choices=["process", "outcome", "mixed"])
    parser.add_argument("--device", default="auto", help="torch device for local models")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float32, float16")
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="local models on CUDA: decode with a static KV cache and CUDA graphs "
        "(the first batches compile; see HFPolicy)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``mappa eval``: episodes, report.json, transcripts.jsonl, plots, a printed table."""
    import mappa_env
    from mappa_agents.policy import SamplingParams
    from mappa_agents.report import format_table, plot_report, summarize
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.system import AgentSystem
    from mappa_agents.trajectory import save_jsonl
    from mappa_env.coach import make_coach

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env_options = _env_options(args)
    # One coach for every environment, so its concurrency limit, cache and ledger are shared.
    coach = make_coach(args.coach)
    env_options["coach"] = coach
    probe = mappa_env.make(args.env, **env_options)
    try:
        agents = list(probe.possible_agents)
        # Before loading models: a sandbox that cannot run code stops here, with the cause.
        probe.check_sandbox()
    finally:
        probe.close()
    logger.info("loading system %s for agents %s", args.system, agents)
    load_start = time.perf_counter()
    system = AgentSystem.from_spec(
        args.system,
        agents,
        device=args.device,
        dtype=args.dtype,
        **({"compile_decode": True} if args.compile_decode else {}),
    )
    load_s = time.perf_counter() - load_start
    sampling = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
    )
    runner = RolloutRunner(
        lambda: mappa_env.make(args.env, **env_options),
        system,
        sampling,
        concurrency=args.concurrency,
        seed=args.seed,
        progress=not args.no_progress,
    )
    start = time.perf_counter()
    try:
        episodes = runner.run(args.episodes)
    finally:
        shared_tasks = env_options.get("tasks")
        if hasattr(shared_tasks, "close"):
            shared_tasks.close()
        system.close()
        close_coach = getattr(coach, "close", None)
        if callable(close_coach):
            close_coach()
    wall = time.perf_counter() - start

    report = summarize(episodes, wall_time_s=wall)
    report["system"] = args.system
    report["coach"] = args.coach
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
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    save_jsonl(out / "transcripts.jsonl", [a for e in episodes for a in e.actions])
    plots = plot_report(episodes, out)
    print(format_table(report))
    written = [out / "report.json", out / "transcripts.jsonl", *plots]
    if (out / "coach_report.md").exists():
        written.append(out / "coach_report.md")
    print("wrote " + ", ".join(map(str, written)))
    return report


def build_parser() -> argparse.ArgumentParser:
    """The ``mappa`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="mappa",
        description="Multiagent LLM systems with per-action coach rewards: evaluate and train.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser("eval", help="benchmark a system on an environment")
    add_eval_arguments(evaluate)
    evaluate.add_argument("--out", default="runs/eval", help="output directory")
    try:
        from mappa_train.cli import add_train_parser
    except ImportError:
        logger.debug("mappa_train is not available: no train command")
    else:
        add_train_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mappa`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "eval":
        run_eval(args)
        return 0
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
