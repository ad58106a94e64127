"""``mappa train``: every :class:`~mappa_train.config.TrainConfig` field is a flag."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
import json
import os
import re
import shlex
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa_agents.cli import add_require_isolation_argument
from mappa_env.errors import SettingsError
from mappa_env.typecheck import check_env_options
from mappa_train.config import TrainConfig


def _field_docs() -> dict[str, str]:
    """Field docstrings (the string literal under each field) from the class source."""
    import inspect

    source = inspect.getsource(TrainConfig)
    tree = ast.parse(source)
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`\"])")


def plain_text(doc: str) -> str:
    """A reST docstring as plain text for ``--help``: no double backticks, no roles.

    ``:mod:`mappa_train.resume``` reads ``mappa_train.resume``, ``:func:`~a.b.c``` reads
    ``c``, and a literal in double backticks reads as itself.
    """

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        return target.rsplit(".", 1)[-1] if match.group(0).count("~") else target

    text = _ROLE.sub(role, doc)
    return text.replace("``", "").replace("`", "")


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (the whole text when it has one)."""
    return _SENTENCE_END.split(text, maxsplit=1)[0]


def _parse_value(text: str) -> Any:
    """JSON when it parses (numbers, lists, dicts, null, booleans), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_switch(text: str) -> bool | str:
    """A switch's value on the command line: ``true``, ``false`` or ``auto``."""
    value = text.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    if value == "auto":
        return value
    raise argparse.ArgumentTypeError(f"expected true, false or auto, got {text!r}")


def add_train_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``train`` sub-command to ``commands`` (an argparse sub-parsers object)."""
    parser = commands.add_parser(
        "train",
        help="train a multiagent system with per-action coach rewards (REINFORCE++)",
        usage="mappa train [--config FILE | --sweep FILE] [--FIELD VALUE ...]",
        description="Fields of TrainConfig as flags; --config reads a YAML/JSON file first.",
        epilog="Each flag shows the first sentence of its field's description; "
        "docs/training.md and help(mappa_train.TrainConfig) have the whole of each.",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="YAML or JSON file of config fields, or the name of a bundled recipe such as "
        "mathchat-smollm2 (python -m mappa_train.bundled lists them)",
    )
    parser.add_argument(
        "--sweep",
        default=None,
        metavar="FILE",
        help="train several runs in one process, round-robin by step: a YAML/JSON file of "
        "recipe (a --config file), arms (name: fields over it) and seeds; flags apply to "
        "every run, each writes to <output-dir>/<arm>-s<seed> (docs/training.md)",
    )
    # The same task and sandbox flags as `mappa eval`: shorthands for env_options entries.
    parser.add_argument(
        "--tasks",
        dest="env_tasks",
        default=None,
        help="the environment's tasks option, as for mappa eval (MathChat: a task file, a "
        "name such as aime_2025, or gen:N); the same as env_options {'tasks': ...}",
    )
    parser.add_argument(
        "--sandbox",
        dest="env_sandbox",
        default=None,
        choices=["jupyter", "none"],
        help="where agents' code runs, as for mappa eval; the same as env_options "
        "{'sandbox': ...} (none: no code runs)",
    )
    add_require_isolation_argument(parser)
    docs = _field_docs()
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        default = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        )
        # One sentence per flag keeps --help short; the docs hold every field's full text.
        help_text = f"{first_sentence(plain_text(docs.get(field.name, '')))} (default: {default!r})"
        if hints[field.name] is bool:
            parser.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        elif bool in typing.get_args(hints[field.name]):
            # A switch with a third value (gradient_checkpointing: true, false, "auto"):
            # --flag alone is true, --flag VALUE gives the value, --no-flag false.
            parser.add_argument(
                flag,
                dest=field.name,
                nargs="?",
                const=True,
                type=_parse_switch,
                default=None,
                help=help_text,
            )
            parser.add_argument(
                "--no-" + flag[2:],
                dest=field.name,
                action="store_const",
                const=False,
                help=f"the same as {flag} false",
            )
        else:
            parser.add_argument(
                flag, dest=field.name, type=_parse_value, default=None, help=help_text
            )
    parser.set_defaults(handler=run_train)
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config of a ``mappa train`` invocation: file values, then flags."""
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name, None) is not None
    }
    if "system" in overrides and not isinstance(overrides["system"], (str, dict)):
        overrides["system"] = str(overrides["system"])
    if args.config:
        from mappa_train.bundled import resolve_config

        config = TrainConfig.from_file(resolve_config(args.config), **overrides)
    else:
        config = TrainConfig.from_dict(overrides)
    shorthands = {}
    if getattr(args, "env_tasks", None) is not None:
        shorthands["tasks"] = args.env_tasks
    if getattr(args, "env_sandbox", None) is not None:
        shorthands["sandbox"] = None if args.env_sandbox == "none" else args.env_sandbox
    for key, value in shorthands.items():
        if key in config.env_options and config.env_options[key] != value:
            raise SettingsError(
                f"--{key} {value!r} and env_options {key}={config.env_options[key]!r} "
                "disagree: give one of them"
            )
    config.env_options = {**config.env_options, **shorthands}
    check_config_env_options(config)
    return config


def check_config_env_options(config: TrainConfig) -> None:
    """Check every environment option set of ``config`` against the environment's constructor.

    Raises:
        mappa_env.errors.SettingsError: Naming the option, its value and what it must be.
    """
    check_env_options(config.env, config.env_options, setting="env_options")
    if config.eval_env_options is not None:
        check_env_options(config.env, config.eval_env_options, setting="eval_env_options")
    for name, options in config.eval_sets.items():
        check_env_options(config.env, options, setting=f"eval_sets.{name}")


def run_train(args: argparse.Namespace) -> int:
    """Run ``mappa train`` and print where the results are."""
    from mappa_agents.cli import announce_unconfined
    from mappa_agents.progress import library_progress_bars
    from mappa_agents.report import describe_isolation
    from mappa_train.interrupts import ctrl_c_guard
    from mappa_train.trainer import make_trainer

    if getattr(args, "sweep", None):
        return run_sweep(args)
    config = config_from_args(args)
    announce_unconfined(
        "train", config.isolation, code_runs=config.env_options.get("sandbox", "") is not None
    )
    trainer = None
    try:
        # --no-progress hides the model libraries' bars too (loading, saving checkpoints).
        with library_progress_bars(config.progress), ctrl_c_guard():
            trainer = make_trainer(config)
            trainer.setup()
            if trainer.resumed_from is not None:
                print(
                    f"mappa train: resumed from step {trainer.start_step} "
                    f"(checkpoint {trainer.resumed_from})",
                    flush=True,
                )
            history = trainer.train()
    except KeyboardInterrupt:
        # Ctrl-C: the run's state is its checkpoints; what to do next fits in one line.
        print(f"mappa train: {interrupted_hint(trainer, args)}", file=sys.stderr)
        return INTERRUPTED
    last = history[-1] if history else {}
    print(
        f"{trained_steps(trainer.start_step, trainer.step)}; metrics: {trainer.metrics_path}; "
        f"checkpoints: {trainer.checkpoint_root}; last success rate "
        f"{last.get('rollout/success_rate')}"
    )
    print(describe_isolation(trainer.isolation))
    nothing = nothing_trained(history)
    if nothing:
        print(f"mappa train: warning: {nothing}", file=sys.stderr)
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    """Run ``mappa train --sweep``: every run of the file in this process; 1 if any failed."""
    from mappa_agents.progress import library_progress_bars
    from mappa_train.interrupts import ctrl_c_guard
    from mappa_train.sweep import Sweep, read_sweep_file, sweep_configs

    if args.config:
        raise SettingsError(
            "--sweep names its recipe in the sweep file: leave out --config (or use --config "
            "alone for one run)"
        )
    if getattr(args, "env_tasks", None) is not None or getattr(args, "env_sandbox", None):
        raise SettingsError(
            "--tasks and --sandbox are not read with --sweep: set env_options in the recipe "
            "or in an arm"
        )
    sweep_file = read_sweep_file(args.sweep)
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name, None) is not None
    }
    recipe = TrainConfig.from_file(sweep_file["recipe"]).to_dict()
    root = overrides.pop("output_dir", None) or recipe["output_dir"]
    configs = sweep_configs(
        recipe, sweep_file["arms"], sweep_file["seeds"], root, overrides=overrides
    )
    for config in configs.values():
        check_config_env_options(config)
    progress = all(c.progress for c in configs.values())
    print(
        f"mappa train: a sweep of {len(configs)} runs in {root}: {', '.join(configs)}", flush=True
    )
    with library_progress_bars(progress), ctrl_c_guard():
        sweep = Sweep.from_configs(configs, progress=progress)
        try:
            outcomes = sweep.run()
        except KeyboardInterrupt:
            command = getattr(args, "command_line", None) or resume_command()
            print(
                f"mappa train: sweep interrupted; `{command}` resumes every run from its "
                "newest checkpoint",
                file=sys.stderr,
            )
            return INTERRUPTED
    summary = {name: dataclasses.asdict(o) | {"ok": o.ok} for name, o in outcomes.items()}
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    for outcome in outcomes.values():
        print(outcome.describe())
    if sweep.failed:
        print(
            f"mappa train: {len(sweep.failed)} of {len(outcomes)} runs failed: "
            f"{', '.join(sweep.failed)} (the others trained; {Path(root) / 'sweep.json'})",
            file=sys.stderr,
        )
        return 1
    return 0


INTERRUPTED = 130
"""Exit status of ``mappa train`` stopped by Ctrl-C (128 + SIGINT, as shells report it)."""


def trained_steps(start: int, end: int) -> str:
    """``trained K steps (N+1..M)``: the steps this invocation trained, not the run's total.

    Args:
        start: The step training started from (a resumed checkpoint's, else 0).
        end: The step it reached.
    """
    count = end - start
    if count <= 0:
        return f"trained 0 steps (the run was at step {end} already)"
    steps = f"step {end}" if count == 1 else f"steps {start + 1}..{end}"
    return f"trained {count} step{'s' if count != 1 else ''} ({steps})"


def resume_command(argv: Sequence[str] | None = None) -> str:
    """The command line that ran this process, to run again (shell-quoted).

    ``mappa ...`` where the ``mappa`` script ran, ``python -m mappa_train ...`` where
    the module did.

    Args:
        argv: The command line, its program first; default ``sys.argv``.
    """
    argv = list(sys.argv if argv is None else argv)
    program = os.path.basename(argv[0]) if argv else "mappa"
    head = [sys.executable, "-m", "mappa_train"] if program == "__main__.py" else [program]
    return shlex.join([*head, *argv[1:]])


def interrupted_hint(trainer: Any | None, args: argparse.Namespace) -> str:
    """One line for a run stopped by Ctrl-C: where it stopped and the command that resumes.

    Args:
        trainer: The run's trainer, or ``None`` when it was stopped while being made.
        args: The parsed command line (its ``command_line`` is the command to repeat).
    """
    from mappa_agents.checkpoints import latest_checkpoint

    command = getattr(args, "command_line", None) or resume_command()
    if trainer is None:
        return f"interrupted before training started; `{command}` starts it again"
    newest = latest_checkpoint(trainer.checkpoint_root)
    if newest is None:
        return (
            f"interrupted after {trainer.step} of {trainer.config.steps} steps, before any "
            "checkpoint was saved; "
            f"`{command}` starts the run again"
        )
    return (
        f"interrupted after {trainer.step} of {trainer.config.steps} steps; `{command}` "
        f"resumes it from its newest checkpoint ({newest})"
    )


def nothing_trained(history: list[dict[str, Any]]) -> str | None:
    """Why a run's steps trained no token at all, or ``None`` when some step trained.

    Args:
        history: The run's metric lines (``Trainer.history``).
    """
    steps = [m for m in history if m.get("step", 0) > 0 and "train/tokens" in m]
    if not steps or any(m["train/tokens"] for m in steps):
        return None
    cut = sum(v for m in steps for k, v in m.items() if k.endswith("/masked_length") and v)
    invalid = sum(v for m in steps for k, v in m.items() if k.endswith("/masked_invalid") and v)
    causes = []
    if cut:
        causes.append(
            f"{cut:.0f} actions were cut by max_new_tokens and masked (raise --max-new-tokens, "
            "or pass --no-mask-truncated)"
        )
    if invalid:
        causes.append(f"{invalid:.0f} actions had no usable coach verdict (fix the --coach)")
    return f"the {len(steps)} steps trained no token: " + ("; ".join(causes) or "no actions")
