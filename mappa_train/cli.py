"""``mappa train``: every :class:`~mappa_train.config.TrainConfig` field is a flag."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
import json
import sys
import typing
from typing import Any

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
        description="Fields of TrainConfig as flags; --config reads a YAML/JSON file first.",
    )
    parser.add_argument("--config", default=None, help="YAML or JSON file of config fields")
    docs = _field_docs()
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        default = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        )
        help_text = f"{docs.get(field.name, '')} (default: {default!r})"
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
        config = TrainConfig.from_file(args.config, **overrides)
    else:
        config = TrainConfig.from_dict(overrides)
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
    from mappa_agents.report import describe_isolation
    from mappa_train.trainer import make_trainer

    config = config_from_args(args)
    trainer = make_trainer(config)
    history = trainer.train()
    last = history[-1] if history else {}
    print(
        f"trained {trainer.step} steps; metrics: {trainer.metrics_path}; "
        f"checkpoints: {trainer.checkpoint_root}; last success rate "
        f"{last.get('rollout/success_rate')}"
    )
    print(describe_isolation(trainer.isolation))
    nothing = nothing_trained(history)
    if nothing:
        print(f"mappa train: warning: {nothing}", file=sys.stderr)
    return 0


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
