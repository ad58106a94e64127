"""mappa_env: multiagent LLM systems as PettingZoo text environments with coach rewards.

``import mappa_env`` is light: it imports no torch, transformers, litellm, vllm or ray,
and the names below load their modules (PettingZoo with the environments) on first use,
so a module that needs only, say, :mod:`mappa_env.credit` does not load the environments.
The built-in ids (``MathChat-v0``, ``DSBench-v0``) are in PettingZoo's registries as
``mappa/<id>`` whichever of ``mappa_env`` and ``pettingzoo`` is imported first: if
PettingZoo is not loaded yet, they are registered the moment it is.

Example:
    >>> import mappa_env
    >>> env = mappa_env.make("MathChat-v0", seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa_env.envs.outcome import EpisodeOutcome
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
    "EpisodeOutcome": "mappa_env.envs.outcome",
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
    "EpisodeOutcome",
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


class _RegisterWithPettingZoo(importlib.abc.MetaPathFinder):
    """Imports :mod:`mappa_env.registry` (which registers the ids) right after PettingZoo.

    Importing PettingZoo here would load Gymnasium and NumPy into every process that
    only needs a light module (a learner rank reads :mod:`mappa_env.credit`); without
    this hook, ``pettingzoo.make("aec", "mappa/MathChat-v0")`` failed unless something
    had imported the registry first.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pettingzoo":
            return None
        # One shot: the real finders locate PettingZoo, and later imports skip this.
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            run_module(module)
            importlib.import_module("mappa_env.registry")

        # The loader was made for this one spec, so the wrapper touches no other import.
        loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


if "pettingzoo" in sys.modules:
    importlib.import_module("mappa_env.registry")
elif not any(isinstance(f, _RegisterWithPettingZoo) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWithPettingZoo())
