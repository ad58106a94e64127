"""mappa_env: multiagent LLM systems as PettingZoo text environments with coach rewards.

``import mappa_env`` is light: it imports no torch, transformers, litellm, vllm or ray.

Example:
    >>> import mappa_env
    >>> env = mappa_env.make("MathChat-v0", seed=0)  # doctest: +SKIP
"""

from mappa_env.registry import ENV_ENTRY_POINTS, env_class, make, make_parallel
from mappa_env.registry import register_with_pettingzoo as _register

__version__ = "0.1.0.dev0"

_register()

__all__ = ["ENV_ENTRY_POINTS", "__version__", "env_class", "make", "make_parallel"]
