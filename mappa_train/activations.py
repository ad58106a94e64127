"""Activation checkpointing on a transformers model, by whichever name its version uses.

Recent transformers call it *activation* checkpointing and deprecate the *gradient*
checkpointing names; older ones have only those. Every switch here uses the new name
where the model has it. Checkpointing recomputes each decoder layer's activations in the
backward pass instead of keeping them: less memory for about one more forward pass.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "disable_checkpointing",
    "draws_random_numbers",
    "enable_checkpointing",
    "is_checkpointing",
]


def enable_checkpointing(model: Any) -> None:
    """Recompute activations in the backward pass (non-reentrant checkpoints).

    The random generator's state is kept for the recomputation only where the forward
    draws random numbers (:func:`draws_random_numbers`): keeping it means setting the
    process-global generator in the backward pass, which changes what another thread
    is sampling at that moment (a sweep's rollouts beside an update).
    """
    kwargs = {"use_reentrant": False, "preserve_rng_state": draws_random_numbers(model)}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def draws_random_numbers(model: Any) -> bool:
    """Whether ``model``'s training forward draws random numbers (dropout of any kind)."""
    import torch

    config = getattr(model, "config", None)
    rates = [
        getattr(config, name, 0.0) or 0.0
        for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop")
    ]
    nn = torch.nn
    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
    dropouts = (m.p for m in model.modules() if isinstance(m, kinds))
    return any(float(rate) > 0 for rate in rates) or any(p > 0 for p in dropouts)


def is_checkpointing(model: Any) -> bool:
    """Whether ``model`` recomputes activations."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def disable_checkpointing(model: Any) -> None:
    """The counterpart of :func:`enable_checkpointing`."""
    if hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()
