"""mappa_env: multiagent LLM systems as PettingZoo text environments with coach rewards.

``import mappa_env`` is light: it imports no torch, transformers, litellm, vllm or ray,
and the names below load their modules (PettingZoo with the environments) on first use,
so a module that needs only, say, :mod:`mappa_env.credit` does not load the environments.

Example:
    >>> import mappa_env
    >>> env = mappa_env.make("MathChat-v0", seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa_env.envs.pipeline import ActionRecord, AgentSpec, PipelineEnv, ToolOutcome
    from mappa_env.registry import (
        ENV_ENTRY_POINTS,
        EnvSpec,
        env_class,
        is_registered,
        make,
        make_parallel,
        register,
        registered_ids,
    )

__version__ = "0.1.0.dev0"

_EXPORTS = {
    "ActionRecord": "mappa_env.envs.pipeline",
    "AgentSpec": "mappa_env.envs.pipeline",
    "PipelineEnv": "mappa_env.envs.pipeline",
    "ToolOutcome": "mappa_env.envs.pipeline",
    "ENV_ENTRY_POINTS": "mappa_env.registry",
    "EnvSpec": "mappa_env.registry",
    "env_class": "mappa_env.registry",
    "is_registered": "mappa_env.registry",
    "make": "mappa_env.registry",
    "make_parallel": "mappa_env.registry",
    "register": "mappa_env.registry",
    "registered_ids": "mappa_env.registry",
}

__all__ = [
    "ENV_ENTRY_POINTS",
    "ActionRecord",
    "AgentSpec",
    "EnvSpec",
    "PipelineEnv",
    "ToolOutcome",
    "__version__",
    "env_class",
    "is_registered",
    "make",
    "make_parallel",
    "register",
    "registered_ids",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
