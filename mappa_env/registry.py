"""Environment ids, ``make`` and registration with PettingZoo's registry."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from pettingzoo import AECEnv, ParallelEnv

#: Environment id -> "module:Class" of its AEC implementation.
ENV_ENTRY_POINTS: dict[str, str] = {
    "MathChat-v0": "mappa_env.envs.mathchat:MathChatEnv",
    "DSBench-v0": "mappa_env.envs.dsbench:DSBenchEnv",
}
NAMESPACE = "mappa"


def _canonical(env_id: str) -> str:
    name = env_id.split("/", 1)[1] if env_id.startswith(f"{NAMESPACE}/") else env_id
    if name not in ENV_ENTRY_POINTS:
        raise ValueError(f"unknown environment {env_id!r}; available: {sorted(ENV_ENTRY_POINTS)}")
    return name


def env_class(env_id: str) -> type[AECEnv]:
    """The AEC environment class registered under ``env_id``."""
    module_name, attr = ENV_ENTRY_POINTS[_canonical(env_id)].split(":")
    return getattr(importlib.import_module(module_name), attr)


def make(env_id: str, **options: Any) -> AECEnv:
    """Create an environment by id.

    Args:
        env_id: ``"MathChat-v0"`` or ``"DSBench-v0"`` (a ``"mappa/"`` prefix is accepted).
        **options: Keyword arguments of the environment's constructor (``tasks``,
            ``coach``, ``sandbox``, ``seed``, ``reward_mode``, ...).

    Returns:
        A PettingZoo ``AECEnv``.

    Raises:
        ValueError: For an unknown id.
    """
    return env_class(env_id)(**options)


def make_parallel(env_id: str, **options: Any) -> ParallelEnv:
    """Create the parallel view of an environment (PettingZoo's turn-based conversion).

    Each parallel ``step`` acts for the one agent whose turn it is (the others' actions
    are ignored); ``infos[agent]["active_agent"]`` names who acts next.
    """
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    return turn_based_aec_to_parallel(make(env_id, **options))


def register_with_pettingzoo() -> None:
    """Register every environment as ``mappa/<id>`` in PettingZoo's AEC and parallel registries.

    Safe to call more than once.
    """
    from pettingzoo import aec_registry, parallel_registry, register

    for env_id in ENV_ENTRY_POINTS:
        full_id = f"{NAMESPACE}/{env_id}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # re-registration on reload is expected
            if full_id not in aec_registry:
                register("aec", full_id, entry_point=ENV_ENTRY_POINTS[env_id])
            if full_id not in parallel_registry:
                register("parallel", full_id, entry_point=_ParallelEntry(env_id))


class _ParallelEntry:
    """Picklable entry point that builds the parallel view of one environment."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self, **options: Any) -> ParallelEnv:
        return make_parallel(self.env_id, **options)
