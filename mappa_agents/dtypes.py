"""Model dtypes by name: ``"auto"``, torch's names and a few short ones."""

from __future__ import annotations

from typing import Any

__all__ = ["DTYPE_ALIASES", "resolve_dtype"]

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
"""Short dtype names accepted besides torch's own names."""


def resolve_dtype(dtype: Any, device: str) -> Any:
    """``"auto"`` becomes bfloat16 on CUDA and float32 elsewhere; names become dtypes.

    Args:
        dtype: ``"auto"``, a name such as ``"bfloat16"``/``"bf16"``, or a ``torch.dtype``.
        device: The device the model runs on.

    Returns:
        A ``torch.dtype``.

    Raises:
        ValueError: For an unknown dtype name.
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    name = DTYPE_ALIASES.get(dtype, dtype)
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value
