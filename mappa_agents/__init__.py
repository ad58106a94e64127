"""mappa_agents: policies, multiagent systems, the batched rollout runner and trajectories.

Importing this package loads no torch, transformers, litellm or vllm: backends import
them when a policy is built.
"""

from mappa_agents.api import LiteLLMPolicy
from mappa_agents.hf import HFPolicy
from mappa_agents.models import load_policy, resolve_model
from mappa_agents.policy import Generation, GenerationError, Policy, SamplingParams
from mappa_agents.runner import RolloutRunner
from mappa_agents.scripted import ScriptedPolicy
from mappa_agents.system import AgentSystem
from mappa_agents.trajectory import ActionSample, EpisodeResult, load_jsonl, save_jsonl
from mappa_agents.vllm_policy import VLLMPolicy

__all__ = [
    "ActionSample",
    "AgentSystem",
    "EpisodeResult",
    "Generation",
    "GenerationError",
    "HFPolicy",
    "LiteLLMPolicy",
    "Policy",
    "RolloutRunner",
    "SamplingParams",
    "ScriptedPolicy",
    "VLLMPolicy",
    "load_jsonl",
    "load_policy",
    "resolve_model",
    "save_jsonl",
]
