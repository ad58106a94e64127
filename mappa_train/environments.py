"""The run's environments: factories made from the config, and the credit they pay under.

The environment owns each action's reward (:mod:`mappa_env.credit`); the config names the
credit it asks its environments for, and the isolation their agents' code runs under.
This module builds the training, held-out and further evaluation factories from the
config (one coach object shared by all of them), refuses options that disagree with the
config, and checks that episodes made elsewhere were paid under the config's credit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mappa_env.errors import SettingsError
from mappa_train.config import TrainConfig

__all__ = [
    "EnvFactories",
    "EnvFactory",
    "EnvFacts",
    "check_credit",
    "check_sandboxes",
    "env_agents",
    "env_class",
    "make_env_factories",
    "read_env",
]

EnvFactory = Callable[[], Any]
"""Makes one environment (a PettingZoo ``AECEnv``)."""


@dataclass
class EnvFactories:
    """The environments of one run."""

    train: EnvFactory
    """Makes a training environment."""
    eval: EnvFactory
    """Makes a held-out evaluation environment (the main set)."""
    eval_sets: dict[str, EnvFactory] = field(default_factory=dict)
    """The further held-out sets of ``config.eval_sets``, by name."""
    coach: Any = None
    """The coach shared by the config's environments (``None`` when both factories are
    the caller's own)."""


def make_env_factories(
    config: TrainConfig,
    env_factory: EnvFactory | None = None,
    eval_env_factory: EnvFactory | None = None,
) -> EnvFactories:
    """The run's environment factories: the caller's, else ``mappa_env.make`` of the config.

    Raises:
        ValueError: When env options disagree with the config's isolation or credit, or
            ``eval_sets`` are asked for beside an ``eval_env_factory`` of the caller's.
    """
    import mappa_env

    # One coach object for every environment: its concurrency and rate limits, cache
    # and cost ledger are then shared by the whole run.
    coach: Any = None
    if env_factory is None or eval_env_factory is None:
        from mappa_env.coach import make_coach

        coach = make_coach(config.coach)
    # Only a non-default isolation is passed: an environment of the user's own may
    # not take the option, and "auto" is every pipeline environment's default.
    isolation = {} if config.isolation == "auto" else {"isolation": config.isolation}
    for options in (config.env_options, config.eval_env_options or {}):
        given = options.get("isolation", config.isolation)
        if isolation and given != config.isolation:
            raise SettingsError(
                f"isolation={config.isolation!r} and env options with isolation="
                f"{given!r} disagree: set one of them"
            )
    # The environment owns each action's reward: it is asked for the config's credit.
    credit = config.credit.env_options()
    given_options = (
        config.env_options,
        config.eval_env_options or {},
        *config.eval_sets.values(),
    )
    for options in given_options:
        clash = {k: v for k, v in options.items() if k in credit and v != credit[k]}
        if clash:
            raise SettingsError(
                f"env options {clash} disagree with the config's "
                f"{ {k: credit[k] for k in clash} }: set credit in the config's "
                "credit_mode / outcome_weight / backprop_decay only"
            )
    common = {**credit, **isolation}
    train_options = {**common, **config.env_options}
    eval_options = {
        **common,
        **(config.env_options if config.eval_env_options is None else config.eval_env_options),
    }
    if config.eval_sets and eval_env_factory is not None:
        raise SettingsError(
            "eval_sets are made from the config's environment and options; with an "
            "eval_env_factory of your own, evaluate further sets yourself (or drop "
            "eval_env_factory and give their options in eval_sets)"
        )
    return EnvFactories(
        train=env_factory
        or functools.partial(mappa_env.make, config.env, coach=coach, **train_options),
        eval=eval_env_factory
        or functools.partial(mappa_env.make, config.env, coach=coach, **eval_options),
        eval_sets={
            name: functools.partial(
                mappa_env.make, config.env, coach=coach, **{**eval_options, **options}
            )
            for name, options in config.eval_sets.items()
        },
        coach=coach,
    )


def env_class(factory: EnvFactory) -> type | None:
    """The environment class ``factory`` makes, when that can be read without calling it.

    A class, a :func:`functools.partial` of one, or a partial of ``mappa_env.make`` with a
    registered id; ``None`` for anything else (a lambda, a function of the caller's).
    """
    from mappa_env import registry

    while isinstance(factory, functools.partial):
        if factory.func is registry.make:
            return registry.env_class(factory.args[0]) if factory.args else None
        factory = factory.func
    return factory if isinstance(factory, type) else None


def env_agents(factory: EnvFactory) -> list[str] | None:
    """The agents the environment class declares (its ``roles``), or ``None`` if unknown."""
    cls = env_class(factory)
    roles = getattr(cls, "roles", None) if cls is not None else None
    if not roles:
        return None
    return [role.name for role in roles]


@dataclass
class EnvFacts:
    """What the trainer reads of an environment before training."""

    agents: list[str]
    """Its agents, in order (from the class's ``roles`` where it declares them)."""
    task_ids: list[str]
    """The ids of the tasks it samples from (an option of the instance)."""
    isolation: dict[str, Any]
    """What its agents' code runs under (:func:`mappa_agents.report.isolation_of`)."""


def read_env(factory: EnvFactory) -> EnvFacts:
    """The agents, task ids and isolation of the environments ``factory`` makes.

    Task lists and isolation are options of an instance: one environment is made and
    closed. The agents are read from the class when it declares its roles.
    """
    from mappa_agents.report import isolation_of

    env = factory()
    try:
        return EnvFacts(
            agents=env_agents(factory) or list(env.possible_agents),
            task_ids=[t.id for t in getattr(env, "tasks", [])],
            isolation=isolation_of(env),
        )
    finally:
        env.close()


def check_sandboxes(factories: Sequence[EnvFactory]) -> None:
    """Stop before loading anything when an environment's sandbox cannot run code.

    One environment of each factory is made, asked ``check_sandbox()`` (when it has
    one) and closed.

    Raises:
        SandboxUnavailableError: With the cause and the fix (see
            :func:`mappa_env.sandbox.check_sandbox`).
    """
    for factory in factories:
        env = factory()
        try:
            check = getattr(env, "check_sandbox", None)
            if callable(check):
                check()
        finally:
            env.close()


def check_credit(episodes: Sequence[Any], config: TrainConfig) -> None:
    """Refuse to train on rewards paid under other credit settings than the config's.

    Episodes from an environment made otherwise (an ``env_factory`` of the caller's,
    saved trajectories) must agree with the config. The weight a mode does not use
    cannot disagree.

    Raises:
        ValueError: Naming the settings that differ and how to make them agree.
    """
    wanted = config.credit.to_dict()
    keys = config.credit.compared_keys()
    for episode in episodes:
        for sample in episode.actions:
            credit = sample.credit
            if credit is None:
                if config.credit_mode == "process":
                    continue  # rows from before credit was recorded held process rewards
                raise SettingsError(
                    f"an action of episode {episode.episode_id} does not say under which "
                    f"credit its reward was paid, and credit_mode={config.credit_mode!r} "
                    "cannot be taken on trust: roll it out again with this version"
                )
            differ = {k: credit.get(k) for k in keys if credit.get(k) != wanted[k]}
            if differ:
                raise SettingsError(
                    f"episode {episode.episode_id} was paid under credit {differ}, but the "
                    f"config asks for { ({k: wanted[k] for k in differ}) }: the environment "
                    "owns the reward, so make the env_factory's environments with "
                    f"credit_mode={config.credit_mode!r} (and its weights), or change "
                    "the config"
                )
