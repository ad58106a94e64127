"""mappa_agents: policies, multiagent systems, the batched rollout runner and trajectories.

Importing this package loads no torch, transformers, litellm or vllm: backends import
them when a policy is built. The names below load their modules on first use, so a
module that needs only, say, :mod:`mappa_agents.trajectory` does not load the runner and
the environments.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa_agents.api import LiteLLMPolicy
    from mappa_agents.hf import HFPolicy
    from mappa_agents.models import load_policy, resolve_model
    from mappa_agents.policy import (
        Generation,
        GenerationError,
        Policy,
        RequestPolicy,
        SamplingParams,
    )
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.scripted import ScriptedPolicy
    from mappa_agents.standin import StandInEngine
    from mappa_agents.system import AgentSystem
    from mappa_agents.trajectory import ActionSample, EpisodeResult, load_jsonl, save_jsonl
    from mappa_agents.vllm_policy import VLLMPolicy

_EXPORTS = {
    "LiteLLMPolicy": "mappa_agents.api",
    "HFPolicy": "mappa_agents.hf",
    "load_policy": "mappa_agents.models",
    "resolve_model": "mappa_agents.models",
    "Generation": "mappa_agents.policy",
    "GenerationError": "mappa_agents.policy",
    "Policy": "mappa_agents.policy",
    "RequestPolicy": "mappa_agents.policy",
    "SamplingParams": "mappa_agents.policy",
    "RolloutRunner": "mappa_agents.runner",
    "ScriptedPolicy": "mappa_agents.scripted",
    "StandInEngine": "mappa_agents.standin",
    "AgentSystem": "mappa_agents.system",
    "ActionSample": "mappa_agents.trajectory",
    "EpisodeResult": "mappa_agents.trajectory",
    "load_jsonl": "mappa_agents.trajectory",
    "save_jsonl": "mappa_agents.trajectory",
    "VLLMPolicy": "mappa_agents.vllm_policy",
}

__all__ = [
    "ActionSample",
    "AgentSystem",
    "EpisodeResult",
    "Generation",
    "GenerationError",
    "HFPolicy",
    "LiteLLMPolicy",
    "Policy",
    "RequestPolicy",
    "RolloutRunner",
    "SamplingParams",
    "ScriptedPolicy",
    "StandInEngine",
    "VLLMPolicy",
    "load_jsonl",
    "load_policy",
    "resolve_model",
    "save_jsonl",
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
