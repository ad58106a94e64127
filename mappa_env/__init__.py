"""mappa_env: multiagent LLM systems as PettingZoo text environments with coach rewards.

Imports no torch, transformers, litellm, vllm or ray.
"""

__version__ = "0.1.0.dev0"
