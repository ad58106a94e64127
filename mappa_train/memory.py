"""How much accelerator memory a run's weights and optimizer states hold, before loading.

Activations, logits and rollout KV caches come on top; they depend on batch sizes and
lengths. The estimate is there to catch a run that cannot fit before minutes are spent
loading models, and to name what to change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)

GIB = 2**30


def static_memory_bytes(
    params_per_agent: Sequence[int],
    *,
    weight_bytes: int,
    reference_bytes: int,
    shared_base: bool = False,
) -> int:
    """Bytes that stay on the device for a whole run: weights, optimizer, references.

    Full fine-tuning, per agent with ``N_a`` parameters: trainable weights ``w N_a``,
    Adam's two states ``2 w N_a`` (torch keeps them in the weights' dtype) and a frozen
    reference ``r N_a``; gradients ``w N_a`` of one agent at a time (each agent's are
    freed after its update)::

        sum_a (3 w + r) N_a  +  w max_a N_a

    With LoRA on a shared base: the frozen base, ``r N``; the adapters are left out
    (well under 1% of the base at the usual ranks).

    Args:
        params_per_agent: Parameter count of each agent's model.
        weight_bytes: Bytes per trainable weight (4 under mixed precision, else 2).
        reference_bytes: Bytes per weight in the compute dtype (frozen copies).
        shared_base: Agents train LoRA adapters on one shared frozen base.

    Returns:
        The estimate in bytes (0 for no agents).
    """
    if not params_per_agent:
        return 0
    if shared_base:
        return reference_bytes * max(params_per_agent)
    total = sum((3 * weight_bytes + reference_bytes) * n for n in params_per_agent)
    return total + weight_bytes * max(params_per_agent)


def count_parameters(source: str) -> int:
    """Parameters of the model in ``source`` (a directory or id), without allocating it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_fits(estimate: int, available: int, *, lora: bool, mixed_precision: bool) -> str | None:
    """A warning when the static estimate leaves under 15% of ``available`` for the rest.

    Returns:
        The warning text (also logged), or ``None`` when the run looks like it fits.
    """
    if estimate <= 0.85 * available:
        return None
    advice = [
        "set gradient_checkpointing=True and a smaller micro_batch_size",
        "train LoRA adapters on one shared base (lora_rank=16)" if not lora else "",
        "store weights in 16 bits (mixed_precision=False; only with learning rates "
        "well above 1e-4, since smaller Adam steps are rounded away)"
        if mixed_precision
        else "",
        "use a smaller model for some agents, or a device with more memory",
    ]
    message = (
        f"weights, optimizer states and references alone need about {estimate / GIB:.1f} GiB "
        f"of the {available / GIB:.1f} GiB free on the device, leaving too little for "
        "activations and rollouts; to fit: " + "; ".join(a for a in advice if a)
    )
    logger.warning(message)
    return message
