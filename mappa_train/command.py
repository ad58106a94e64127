"""The ``mappa`` command: ``eval``, ``serve``, ``coach audit``, ``compare`` and ``train``.

It lives here because ``mappa_train`` is the one package allowed to import all the
others (``mappa_env`` <- ``mappa_agents`` <- ``mappa_train``); ``python -m mappa_train``
runs it too.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from mappa_agents.cli import add_coach_parser, add_eval_parser
from mappa_agents.compare import add_compare_parser
from mappa_agents.serve_command import add_serve_parser
from mappa_train.cli import add_train_parser, resume_command


def build_parser() -> argparse.ArgumentParser:
    """The ``mappa`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="mappa",
        description="Multiagent LLM systems with per-action coach rewards: evaluate, train, serve.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    add_eval_parser(commands)
    add_train_parser(commands)
    add_compare_parser(commands)
    add_serve_parser(commands)
    add_coach_parser(commands, read_run=_audited_run)
    return parser


def _audited_run(value: str) -> Any:
    """``mappa coach audit --config``: the run's settings (read when the flag is given)."""
    from mappa_train.audit_run import audited_run

    return audited_run(value)


GLOBAL_FLAGS = ("-v", "--verbose")
"""Flags of the ``mappa`` command itself, accepted before or after the sub-command."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a ``mappa`` command line; :data:`GLOBAL_FLAGS` may follow the sub-command.

    ``mappa eval -v ...`` is read as ``mappa -v eval ...`` (arguments after ``--`` are
    left as they are).
    """
    tokens = list(sys.argv[1:] if argv is None else argv)
    end = tokens.index("--") if "--" in tokens else len(tokens)
    hoisted = [t for t in tokens[:end] if t in GLOBAL_FLAGS]
    rest = [t for t in tokens[:end] if t not in GLOBAL_FLAGS] + tokens[end:]
    return build_parser().parse_args(hoisted + rest)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mappa`` command; returns its exit status."""
    args = parse_args(argv)
    # What a run stopped by Ctrl-C says to run again (mappa_train.cli.interrupted_hint).
    args.command_line = resume_command(None if argv is None else ["mappa", *argv])
    # As ``python -m`` does: ``--env my_envs:MyEnv`` finds a module in the working
    # directory (a console script's sys.path starts with its bin directory instead).
    # Only this process sees it; kernels get PYTHONPATH, not this.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from mappa_env.errors import RunStoppedError, SettingsError
    from mappa_env.sandbox.isolation import REQUIRE_ISOLATION_ENV, IsolationUnavailableError
    from mappa_env.tempdirs import remove_stale

    # Kernel folders, workspaces and filter files of runs that were killed (by owner
    # pid on this machine: never those of a run still going).
    remove_stale()
    required_before = os.environ.get(REQUIRE_ISOLATION_ENV)
    if getattr(args, "require_isolation", False):
        # One switch for the library, the processes it starts and its workers alike.
        os.environ[REQUIRE_ISOLATION_ENV] = "1"
    try:
        return int(args.handler(args) or 0)
    except IsolationUnavailableError as exc:
        # A setup problem with a known fix, not a crash: one line, no traceback.
        print(f"mappa {args.command}: {isolation_hint(exc)}", file=sys.stderr)
        return 2
    except SettingsError as exc:
        # A setting that cannot work: its message says what to pass instead.
        print(f"mappa {args.command}: {exc}", file=sys.stderr)
        return 2
    except RunStoppedError as exc:
        # The run stopped itself (e.g. nothing could be scored): the cause and the fix.
        print(f"mappa {args.command}: stopped: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in FULL_DISK_ERRNOS:
            raise
        # Wherever the write was (a checkpoint, a plot, a report), the fix is the same.
        print(f"mappa {args.command}: {full_disk_hint(args.command, exc)}", file=sys.stderr)
        return 1
    finally:
        # main() may be called again in this process (tests, notebooks).
        if required_before is None:
            os.environ.pop(REQUIRE_ISOLATION_ENV, None)
        else:
            os.environ[REQUIRE_ISOLATION_ENV] = required_before


# No space left on the device, or the user's disk quota spent.
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def full_disk_hint(command: str, exc: OSError) -> str:
    """One line for a write that found the disk full: what was written, and what to do.

    Args:
        command: The sub-command that was writing (``train`` resumes, others rerun).
        exc: The error, with the file name where the operating system gave one.

    Returns:
        The cause and the fix, without a traceback.
    """
    where = f" writing {exc.filename}" if exc.filename else ""
    cause = f"the disk is full{where} ({exc.strerror or exc})"
    if command == "train":
        return (
            f"{cause}. Free space and run the same command again: it resumes from the "
            "newest checkpoint (--resume-intact skips one the full disk cut short)"
        )
    return f"{cause}. Free space and run the command again, or pass another --out"


def isolation_hint(exc: Exception) -> str:
    """One line for an isolation error: its cause and the command-line fix."""
    from mappa_env.sandbox.isolation import REQUIRE_ISOLATION_ENV, isolation_required

    cause = " ".join(str(exc).split())
    if isolation_required():
        return (
            f"{cause} (every run must be confined: --require-isolation or "
            f"{REQUIRE_ISOLATION_ENV} is set)"
        )
    return f"{cause}. To run agents' code unconfined instead, pass --isolation none"
