"""How much accelerator memory a run's weights and optimizer states hold, before loading.

Activations, logits and rollout KV caches come on top; they depend on batch sizes and
lengths. The estimate is there to catch a run that cannot fit before minutes are spent
loading models, and to name what to change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

GIB = 2**30


def static_memory_bytes(
    params_per_agent: Sequence[int],
    *,
    weight_bytes: int,
    master_weights: bool = False,
    shared_base: bool = False,
) -> int:
    """Bytes that stay on the device for a whole run: weights, optimizer, references.

    Full fine-tuning, per agent with ``N_a`` parameters in ``w`` bytes each: the weights
    ``w N_a``, a frozen reference ``w N_a``, Adam's two states (float32 with master
    weights, else in the weights' dtype) and, with master weights, a float32 copy;
    gradients of one agent at a time (each agent's are freed after its update)::

        sum_a (2 w + 2 s + m) N_a  +  (w + m) max_a N_a,   s = 4 if m else w, m = 4 or 0

    With LoRA on a shared base: the frozen base, ``w N``; the adapters are left out
    (well under 1% of the base at the usual ranks).

    Args:
        params_per_agent: Parameter count of each agent's model.
        weight_bytes: Bytes per weight of the models (2 for bf16, 4 for float32).
        master_weights: The optimizer keeps float32 master weights (mixed precision).
        shared_base: Agents train LoRA adapters on one shared frozen base.

    Returns:
        The estimate in bytes (0 for no agents).
    """
    if not params_per_agent:
        return 0
    if shared_base:
        return weight_bytes * max(params_per_agent)
    master = 4 if master_weights else 0
    state = 4 if master_weights else weight_bytes
    total = sum((2 * weight_bytes + 2 * state + master) * n for n in params_per_agent)
    return total + (weight_bytes + master) * max(params_per_agent)


def count_parameters(source: str) -> int:
    """Parameters of the model in ``source`` (a directory or id), without allocating it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_fits(estimate: int, available: int, *, lora: bool, master_weights: bool) -> str | None:
    """A warning when the static estimate leaves under 15% of ``available`` for the rest.

    Args:
        estimate: Bytes from :func:`static_memory_bytes`.
        available: Free device memory in bytes.
        lora: The run trains LoRA adapters (the advice then leaves LoRA out).
        master_weights: The run keeps float32 master weights.

    Returns:
        The warning text (also logged), or ``None`` when the run looks like it fits.
    """
    if estimate <= 0.85 * available:
        return None
    advice = [
        "set gradient_checkpointing=True and a smaller micro_batch_size",
        "" if lora else "train LoRA adapters on one shared base (lora_rank=16)",
        "drop the float32 master weights (mixed_precision=False; only with learning rates "
        "well above 1e-4, since smaller Adam steps are rounded away in bf16)"
        if master_weights
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


def check_memory(
    sources: Sequence[str],
    available: int,
    *,
    weight_bytes: int,
    master_weights: bool,
    lora: bool,
) -> str | None:
    """Warn when weights, optimizer states and references would fill most of memory.

    Args:
        sources: Each trained agent's model directory or id (counted without loading).
        available: Free device memory in bytes.
        weight_bytes: Bytes per weight of the models.
        master_weights: The optimizers keep float32 master weights.
        lora: Agents train LoRA adapters on one shared base.

    Returns:
        The warning of :func:`check_fits` (also logged), or ``None`` when the run looks
        like it fits or a model cannot be sized (the load then reports the problem).
    """
    counts: dict[str, int] = {}
    for source in sources:
        if source not in counts:
            try:
                counts[source] = count_parameters(source)
            except (OSError, ValueError, ImportError) as error:
                # Only a pre-flight check: the load itself reports real problems.
                logger.info("memory check skipped: cannot size %s (%s)", source, error)
                return None
    estimate = static_memory_bytes(
        [counts[s] for s in sources],
        weight_bytes=weight_bytes,
        master_weights=master_weights,
        shared_base=lora,
    )
    return check_fits(estimate, available, lora=lora, master_weights=master_weights)


def activation_bytes(
    tokens: int, model_config: Any, dtype_bytes: int, checkpointing: bool = False
) -> int:
    """Activations a decoder keeps for its backward pass over ``tokens`` tokens (an estimate).

    Per token and layer of a Llama-style block (fused attention, a gated MLP), about
    ``10 h + 4 i`` values: the two norms' inputs and outputs, q/k/v before and after
    the rotary embedding, the attention output (``10 h``), and the MLP's gate, up, its
    activation and their product (``4 i``)::

        tokens * layers * (10 h + 4 i) * dtype_bytes

    With activation checkpointing a layer keeps only its input, ``h`` values, and one
    layer at a time holds its whole activations again while it is recomputed::

        tokens * (layers * h + 10 h + 4 i) * dtype_bytes

    Args:
        tokens: Padded tokens of the micro-batch (rows x longest row).
        model_config: The model's transformers config (``hidden_size``,
            ``num_hidden_layers``; ``intermediate_size``, else ``4 h``).
        dtype_bytes: Bytes per activation value (2 for bf16).
        checkpointing: The model recomputes its activations in the backward pass.

    Returns:
        The estimate in bytes.
    """
    hidden = int(model_config.hidden_size)
    layers = int(model_config.num_hidden_layers)
    intermediate = int(getattr(model_config, "intermediate_size", None) or 4 * hidden)
    layer = 10 * hidden + 4 * intermediate
    if checkpointing:
        return tokens * (layers * hidden + layer) * dtype_bytes
    return tokens * layers * layer * dtype_bytes


CHECKPOINTING_MEMORY_SHARE = 0.5
"""``gradient_checkpointing="auto"`` keeps activations only when they fit in this share of
the free memory: the rest is for the logits' chunks, gradients and the allocator's slack."""


def needs_checkpointing(activations: int, free: int) -> bool:
    """Whether to recompute activations: they would take over half the free memory.

    Args:
        activations: Bytes from :func:`activation_bytes` for the largest micro-batch.
        free: Free bytes on the device the model trains on.
    """
    return activations > CHECKPOINTING_MEMORY_SHARE * free


def free_memory_bytes(device: str) -> int:
    """Free bytes where a model on ``device`` allocates: the GPU's, else the host's RAM.

    On a GPU what torch's allocator caches but no tensor uses counts as free.
    """
    if device.startswith("cuda"):
        import torch

        where = torch.device(device)
        free, _ = torch.cuda.mem_get_info(where)
        # What torch's allocator holds but no tensor uses is free to this process too.
        cached = torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where)
        return int(free + cached)
    import psutil

    return int(psutil.virtual_memory().available)
