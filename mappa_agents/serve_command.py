"""``mappa serve``: any registered environment as an OpenEnv server, from the command line.

The server itself is :mod:`mappa_agents.openenv_server`; its limits and token are
:mod:`mappa_agents.serving`. This module turns the command's arguments into them and
refuses, with one line, a start that would expose agents' code (unconfined) or an open
port without a token.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from mappa_agents.cli import add_env_arguments, add_sampling_arguments, env_options_from_args

logger = logging.getLogger("mappa")


def add_serve_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command (an OpenEnv server) to ``commands``."""
    parser = commands.add_parser(
        "serve",
        help="serve an environment over OpenEnv (HTTP and WebSocket; the openenv extra)",
        description="Serve a registered environment as an OpenEnv server: in ego mode the "
        "client plays one agent and the server plays the others with the policies of "
        "--others; in multiplexed mode the client plays every agent, naming it in each "
        "action. Each WebSocket session has its own environment, workspace and sandbox.",
    )
    add_env_arguments(
        parser,
        isolation_help="confine clients' code in Linux namespaces (bubblewrap): auto "
        "(default) = confined, or refuse to start; none = UNSAFE: every client's code runs "
        "as this server's user, sees its files and network",
    )
    add_sampling_arguments(parser)
    parser.add_argument(
        "--mode",
        default="ego",
        choices=["ego", "multiplexed"],
        help="ego: the client plays --ego, the server the others; multiplexed: the client "
        "plays every agent",
    )
    parser.add_argument(
        "--ego", default=None, help="ego mode: the agent the client plays (default: the first)"
    )
    parser.add_argument(
        "--others",
        default=None,
        help="ego mode: the policies of the other agents, one spec for all or "
        "'agent=spec,agent=spec'; specs as for `mappa eval --system` (smollm2-135m, an HF id "
        "or path, api:<litellm model>, vllm:<model>, script:<module>:<function>)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=4,
        help="most concurrent sessions (each holds an environment and its sandbox; "
        "default: %(default)s)",
    )
    add_serve_guard_arguments(parser)
    parser.set_defaults(handler=_serve_handler)
    return parser


def add_serve_guard_arguments(parser: argparse.ArgumentParser) -> None:
    """``mappa serve``'s token, limits and what clients may see and replay."""
    from mappa_agents.serving import TOKEN_ENV, ServeLimits

    limits = ServeLimits()
    parser.add_argument(
        "--token",
        default=None,
        help=f"the token every request must carry (header 'Authorization: Bearer <token>', "
        f"or ?token=<token>); default: ${TOKEN_ENV}, else a fresh one printed at start. "
        "Required with a --host other than a loopback address",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=limits.idle_timeout_s,
        metavar="SECONDS",
        help="close a session whose client sends nothing this long, freeing its slot "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=limits.max_connections,
        help="most open connections; more are closed on arrival (default: %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=limits.max_body_bytes,
        help="largest request body and WebSocket message (default: %(default)s)",
    )
    parser.add_argument(
        "--keep-alive",
        type=float,
        default=limits.keep_alive_s,
        metavar="SECONDS",
        help="close an idle HTTP connection, or one that sends no whole request, after "
        "this long (default: %(default)s)",
    )
    parser.add_argument(
        "--resets-per-minute",
        type=int,
        default=limits.resets_per_minute,
        help="ego mode: most resets per token in a minute, each making the server's "
        "policies generate; 0: no limit (default: %(default)s)",
    )
    parser.add_argument(
        "--reveal-answers",
        action="store_true",
        help="send the task's answer in the outcome (default: withheld, so clients "
        "cannot harvest answers)",
    )
    parser.add_argument(
        "--allow-task-ids",
        action="store_true",
        help="let a reset name a task id or a seed, which replays a task (default: refused)",
    )


def serve_limits_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~mappa_agents.serving.ServeLimits` of ``mappa serve``'s flags.

    Raises:
        SettingsError: For a limit out of range, naming its flag.
    """
    from mappa_agents.serving import ServeLimits
    from mappa_env.errors import SettingsError

    flags = {
        "idle_timeout_s": ("--idle-timeout", args.idle_timeout),
        "max_connections": ("--max-connections", args.max_connections),
        "max_body_bytes": ("--max-body-bytes", args.max_body_bytes),
        "keep_alive_s": ("--keep-alive", args.keep_alive),
        "resets_per_minute": ("--resets-per-minute", args.resets_per_minute),
    }
    for name, (flag, value) in flags.items():
        least = 0 if name == "resets_per_minute" else 1e-9
        if not value >= least:
            bound = ">= 0 (0: no limit)" if least == 0 else "> 0"
            raise SettingsError(f"{flag} must be {bound}, got {value}")
    return ServeLimits(**{name: value for name, (_, value) in flags.items()})


def serve_token_from_args(args: argparse.Namespace) -> tuple[str, bool]:
    """The token ``mappa serve`` checks, and whether it was made here (not given).

    Raises:
        SettingsError: For a ``--host`` other than a loopback address without a token.
    """
    import ipaddress
    import os
    import secrets

    from mappa_agents.serving import TOKEN_ENV
    from mappa_env.errors import SettingsError

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is not None:
        return token, False
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        raise SettingsError(
            f"--host {args.host} lets other machines connect: give the token they must send "
            f"(--token or ${TOKEN_ENV}, e.g. from `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`), or serve on 127.0.0.1"
        )
    return secrets.token_urlsafe(32), True


def serve_config_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~mappa_agents.openenv_server.ServeConfig` of ``mappa serve``'s flags.

    Loads the other agents' policies (ego mode).

    Raises:
        SystemExit: When ego mode lacks ``--others`` or multiplexed mode is given them.
        mappa_env._optional.MissingExtraError: Without the ``openenv`` extra.
    """
    import mappa_env
    from mappa_agents.openenv_server import ServeConfig
    from mappa_agents.policy import SamplingParams
    from mappa_agents.system import AgentSystem

    options = env_options_from_args(args)
    options["coach"] = args.coach  # a spec: each session builds its own and closes it
    shown = {
        "max_sessions": args.max_sessions,
        "reveal_answers": args.reveal_answers,
        "allow_task_ids": args.allow_task_ids,
    }
    probe = mappa_env.make(args.env, **options)
    try:
        agents = list(probe.possible_agents)
        probe.check_sandbox()
    finally:
        probe.close()
    sampling = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
    )
    others: dict[str, Any] = {}
    if args.mode == "ego":
        ego = args.ego or agents[0]
        rest = [a for a in agents if a != ego]
        if rest and not args.others:
            raise SystemExit(
                f"mappa serve: ego mode needs --others, the policies of {rest} "
                "(e.g. --others api:openai/gpt-4.1-mini or 'agent=script:my_mod:reply,...')"
            )
        if rest:
            system = AgentSystem.from_spec(args.others, rest, device=args.device, dtype=args.dtype)
            others = dict(system.policies)
        return ServeConfig(args.env, options, "ego", ego, others, sampling, **shown)
    if args.others or args.ego:
        raise SystemExit("mappa serve: --ego and --others are for ego mode (--mode ego)")
    return ServeConfig(args.env, options, "multiplexed", **shown)


def _serve_handler(args: argparse.Namespace) -> int:
    import os

    from mappa_agents.openenv_server import serve
    from mappa_env.errors import SettingsError
    from mappa_env.sandbox.isolation import REQUIRE_ISOLATION_ENV, unconfined_reason

    code_runs = args.sandbox != "none"
    if code_runs and args.isolation == "none":
        logger.warning(
            "mappa serve: --isolation none is UNSAFE: every client's code runs unconfined, as "
            "this server's user, with its files, processes and network"
        )
    elif code_runs and args.isolation == "auto":
        # A server runs whoever connects' code: auto confines it or does not start.
        reason = unconfined_reason("auto")
        if reason is not None:
            cause = " ".join(reason.split()).rstrip(".")
            raise SettingsError(
                f"clients' code cannot be confined here ({cause}): install bubblewrap, or "
                "pass --isolation none to serve it unconfined (unsafe)"
            )
        # Every session's sandbox then refuses to run unconfined too (main() restores it).
        os.environ[REQUIRE_ISOLATION_ENV] = "1"
    limits = serve_limits_from_args(args)
    token, made = serve_token_from_args(args)
    config = serve_config_from_args(args)
    who = f"ego {config.ego_agent or '(first agent)'}" if config.mode == "ego" else "every agent"
    logger.warning(
        "serving %s over OpenEnv on http://%s:%d (%s mode, the client plays %s)",
        args.env,
        args.host,
        args.port,
        config.mode,
        who,
    )
    if made:
        logger.warning(
            "token (made for this run; clients send 'Authorization: Bearer <token>'): %s", token
        )
    serve(config, host=args.host, port=args.port, token=token, limits=limits)
    return 0
