"""Models loaded in the driver, and the agents that act but are never trained.

An agent left out of ``train_agents`` acts with its ``system`` model as is: through its
API or vLLM server, or a local model loaded without gradients. Agents with the same
spec share one policy (one copy of the weights).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

__all__ = ["frozen_policies", "is_remote_spec", "load_causal_lm", "select_trained_agents"]


def is_remote_spec(spec: str) -> bool:
    """Whether a model spec names a model outside this process (no weights to train)."""
    return spec.strip().startswith(("api:", "vllm:"))


def select_trained_agents(
    wanted: Sequence[str] | None, agents: Sequence[str], specs: Mapping[str, str], *, env: str
) -> list[str]:
    """``train_agents`` checked against the environment's agents and the system spec.

    Args:
        wanted: The config's ``train_agents`` (``None``: every agent).
        agents: The environment's agents, in its order.
        specs: Each agent's model spec.
        env: The environment's name (for messages).

    Returns:
        The agents to train, in the environment's order.

    Raises:
        ValueError: For names the environment does not have, or agents whose model
            has no local weights to train (``api:``, ``vllm:``).
    """
    if wanted is None:
        trained = list(agents)
    else:
        unknown = [a for a in wanted if a not in agents]
        if unknown:
            raise SettingsError(
                f"train_agents names {unknown}, which environment {env!r} "
                f"does not have; its agents: {list(agents)}"
            )
        trained = [a for a in agents if a in wanted]
    remote = {a: specs[a] for a in trained if is_remote_spec(specs[a])}
    if remote:
        frozen_hint = [a for a in trained if a not in remote]
        raise SettingsError(
            f"cannot train {remote}: a model behind an API or a vLLM server has no "
            "local weights to update. Give these agents a local model (an HF id or "
            "path) in `system`, or train only the others "
            f"(train_agents={frozen_hint or '[...]'}): frozen agents may use any model"
        )
    return trained


def load_causal_lm(source: str, dtype: torch.dtype, device: str) -> Any:
    """A transformers causal LM from ``source`` in ``dtype``, on ``device``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return model.to(device)


def frozen_policy(
    spec: str, *, dtype: torch.dtype, device: str, batch_size: int, compile_decode: bool
) -> Any:
    """A frozen agent's policy: as is for API/vLLM, else loaded with no gradients."""
    from transformers import AutoTokenizer

    from mappa_agents.hf import HFPolicy
    from mappa_agents.models import load_policy, resolve_model

    if is_remote_spec(spec):
        return load_policy(spec)
    source = str(resolve_model(spec))
    model = load_causal_lm(source, dtype, device)
    model.requires_grad_(False)
    model.eval()
    model.config.use_cache = True
    return HFPolicy(
        model,
        AutoTokenizer.from_pretrained(source),
        name=f"{Path(source).name} (frozen)",
        max_batch_size=batch_size,
        compile_decode=compile_decode,
    )


def frozen_policies(
    agents: Sequence[str],
    specs: Mapping[str, str],
    *,
    dtype: torch.dtype,
    device: str,
    batch_size: int,
    compile_decode: bool,
) -> dict[str, Any]:
    """Policies of ``agents`` (the frozen ones); agents with the same spec share one."""
    shared: dict[str, Any] = {}
    policies: dict[str, Any] = {}
    for agent in agents:
        spec = specs[agent]
        if spec not in shared:
            shared[spec] = frozen_policy(
                spec,
                dtype=dtype,
                device=device,
                batch_size=batch_size,
                compile_decode=compile_decode,
            )
        policies[agent] = shared[spec]
        logger.info("agent %s is frozen: it acts with %s and is not trained", agent, spec)
    return policies
