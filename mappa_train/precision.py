"""Float32 master weights for models that compute in bf16.

A bf16 weight has 8 bits of mantissa: an Adam step of about ``lr`` = 1e-6 on a weight of
magnitude 0.02 is ~100 times smaller than the weight's rounding step, so updating bf16
weights in place loses almost every step. :class:`MasterWeightAdamW` keeps a float32
copy of the trainable weights (with float32 gradients and Adam states) inside the
optimizer, while the model itself stays bf16: forward and backward passes, rollouts and
the frozen reference all run in plain bf16, with the same numerics and speed as a bf16
model, and a step's change accumulates in the master copy until it shows in bf16.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class MasterWeightAdamW:
    """AdamW on float32 master copies of a 16-bit model's trainable weights.

    Use it like a torch optimizer, calling :meth:`accumulate_grads` after each
    backward pass: the model's 16-bit gradients are added into float32 master
    gradients and freed, so micro-batches accumulate in float32. Clip after that, on
    the masters of :attr:`param_groups`: before it they have no gradients, and a clip
    would see a norm of 0. :meth:`step` updates the masters and rounds them into the
    model's weights.

    Memory per trainable parameter: 4 bytes (master) + 8 (Adam states) on top of the
    model's own 2, and 4 + 2 for gradients while an update runs.

    Args:
        params: The model's trainable parameters (16-bit).
        lr: Learning rate.
        betas: Adam betas.
        weight_decay: Decoupled weight decay.
        fused: Use torch's fused AdamW kernel (CUDA).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        fused: bool = False,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(
            self.master, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused
        )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The float32 optimizer's groups (their ``params`` are the master weights)."""
        return self.optimizer.param_groups

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Add the model's gradients into the float32 master gradients; free the former."""
        for param, master in zip(self.params, self.master):
            if param.grad is None:
                continue
            if master.grad is None:
                master.grad = param.grad.float()
            else:
                master.grad.add_(param.grad)
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step on the masters, then round them into the model's weights."""
        self.accumulate_grads()
        self.optimizer.step()
        self._copy_to_model()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the model's and the masters' gradients."""
        for param in self.params:
            param.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """Adam's state plus the master weights, so a resumed run continues exactly."""
        return {"optimizer": self.optimizer.state_dict(), "master": list(self.master)}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore Adam's state and the master weights (and round them into the model).

        Raises:
            ValueError: If the state has no master weights or their shapes differ.
        """
        saved = state.get("master")
        if saved is None or len(saved) != len(self.master):
            raise ValueError(
                "the optimizer state holds no float32 master weights for this model: it was "
                "saved by a run without them (mixed_precision=False, float32, LoRA, or an "
                "older version of mappa) or for another model; resume with the settings "
                "it was saved with, dtype included"
            )
        for master, value in zip(self.master, saved):
            if master.shape != value.shape:
                raise ValueError(
                    f"master weight shape {tuple(value.shape)} != {tuple(master.shape)}"
                )
            master.copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self._copy_to_model()

    def _copy_to_model(self) -> None:
        for param, master in zip(self.params, self.master):
            param.copy_(master)
