"""mappa_env: multiagent LLM systems as PettingZoo text environments with coach rewards.

``import mappa_env`` is light: it imports no torch, transformers, litellm, vllm or ray.

Example:
    >>> import mappa_env
    >>> env = mappa_env.make("MathChat-v0", seed=0)  # doctest: +SKIP
"""

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
