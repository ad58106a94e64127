"""Activation checkpointing on a transformers model, by whichever name its version uses.

Recent transformers call it *activation* checkpointing and deprecate the *gradient*
checkpointing names; older ones have only those. Every switch here uses the new name
where the model has it. Checkpointing recomputes each decoder layer's activations in the
backward pass instead of keeping them: less memory for about one more forward pass.
"""

from __future__ import annotations

from typing import Any

__all__ = ["disable_checkpointing", "enable_checkpointing", "is_checkpointing"]


def enable_checkpointing(model: Any) -> None:
    """Recompute activations in the backward pass (non-reentrant checkpoints)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


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
