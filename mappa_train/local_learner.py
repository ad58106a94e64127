"""An agent's learner in the trainer's own process: model, frozen reference, AdamW.

The agent's policy acts with the very module being trained (or, with
``rollout_engine="vllm"``, an in-process vLLM engine that gets the new weights after each
update). With LoRA every agent's learner shares one base model and trains its own adapter;
its reference is that base with adapters disabled.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mappa_train.activations import disable_checkpointing, enable_checkpointing, is_checkpointing
from mappa_train.config import TrainConfig
from mappa_train.learner import Done, TokenRows
from mappa_train.logprobs import response_logprobs
from mappa_train.memory import GIB, activation_bytes, free_memory_bytes, needs_checkpointing
from mappa_train.precision import MasterWeightAdamW
from mappa_train.update import (
    PreparedRows,
    largest_micro_batch_tokens,
    shard_logprobs,
    update_agent,
)

logger = logging.getLogger(__name__)

__all__ = ["LocalLearner"]


@dataclass
class LocalLearner:
    """One agent's trainer in this process (a :class:`~mappa_train.learner.Learner`)."""

    agent: str
    """The agent's id."""
    model: Any
    """The trainable model (with LoRA: the shared base holding every agent's adapter)."""
    ref_model: Any
    """The frozen initial weights (``None`` with LoRA: the base without adapters)."""
    tokenizer: Any
    """The agent's tokenizer."""
    optimizer: torch.optim.Optimizer | MasterWeightAdamW
    """AdamW over what the agent trains."""
    policy: Any
    """The HF policy over ``model`` (its padding id; it acts when there is no engine)."""
    source: str
    """The agent's source model (its architecture, tokenizer and reference)."""
    config: TrainConfig
    """The run's settings."""
    device: str = "cpu"
    """Where ``model`` is."""
    adapter: str | None = None
    """Name of the agent's LoRA adapter when agents share one base model."""
    engine: Any = None
    """The policy the agent acts through when it is not ``policy`` (``rollout_engine="vllm"``:
    an in-process vLLM engine that gets the new weights after each update)."""
    checkpointing: bool | None = None
    """Whether ``gradient_checkpointing="auto"`` last chose to recompute activations
    (``None``: not chosen yet; the model is loaded without)."""

    @property
    def rollout_policy(self) -> Any:
        """The engine when there is one, else the policy over the trained module."""
        return self.engine or self.policy

    def _logprobs(self, model: Any, rows: Sequence[TokenRows]) -> torch.Tensor:
        config = self.config

        def score(batch: Any) -> torch.Tensor:
            return response_logprobs(
                model, batch, chunk_size=config.logprob_chunk_size, temperature=config.temperature
            )

        return shard_logprobs(
            score, rows, config, pad_id=self.policy.pad_token_id, device=self.device
        )

    def logprobs(
        self, rows: Sequence[TokenRows], *, old: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Old (``None`` without ``old``) and reference log-probs ``[N, T]`` (CPU)."""
        self.model.eval()
        if self.adapter is None:
            policy = self._logprobs(self.model, rows) if old else None
            return policy, self._logprobs(self.ref_model, rows)
        self.model.set_adapter(self.adapter)
        policy = self._logprobs(self.model, rows) if old else None
        with self.model.disable_adapter():
            ref = self._logprobs(self.model, rows)
        return policy, ref

    def start_logprobs(
        self, rows: Sequence[TokenRows], *, old: bool = True
    ) -> Done[tuple[torch.Tensor | None, torch.Tensor]]:
        """:meth:`logprobs`, finished before it returns."""
        return Done(self.logprobs(rows, old=old))

    def update(
        self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool
    ) -> dict[str, float]:
        """One PPO-clipped pass at learning rate ``lr``; its statistics.

        See :func:`mappa_train.update.update_agent`.
        """
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        model = self.model
        model.train()
        if self.adapter is not None:
            model.set_adapter(self.adapter)  # also makes only this adapter trainable
        if config.gradient_checkpointing == "auto":
            self._choose_checkpointing(prep)

        def score(batch: Any) -> torch.Tensor:
            return response_logprobs(
                model,
                batch,
                chunk_size=config.logprob_chunk_size,
                temperature=config.temperature,
                recompute_logits=config.recompute_logits,
            )

        try:
            return update_agent(
                score,
                self.optimizer,
                prep,
                config,
                step=step,
                agent=self.agent,
                pad_id=self.policy.pad_token_id,
                device=self.device,
                kl_in_loss=kl_in_loss,
            )
        finally:
            model.eval()

    def start_update(
        self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool
    ) -> Done[dict[str, float]]:
        """:meth:`update`, finished before it returns."""
        return Done(self.update(prep, step=step, lr=lr, kl_in_loss=kl_in_loss))

    def start_sync(self) -> Done[None]:
        """Load the current weights into the engine, if the agent acts through one."""
        if self.engine is not None:
            self.engine.load_weights(
                (name, param.detach()) for name, param in self.model.named_parameters()
            )
        return Done(None)

    def save(self, directory: Path) -> None:
        """Weights (or the agent's adapter), tokenizer and ``optimizer.pt`` into ``directory``."""
        if self.adapter:
            # Only the agent's adapter: peft writes it to <agents dir>/<adapter name>/.
            self.model.save_pretrained(directory.parent, selected_adapters=[self.adapter])
        else:
            self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def close(self) -> None:
        """Close the engine (the models stay, as a notebook may still read them)."""
        if self.engine is not None:
            self.engine.close()

    def _choose_checkpointing(self, prep: PreparedRows) -> None:
        """Choose activation checkpointing for one update (``gradient_checkpointing="auto"``).

        On only where the largest micro-batch's activations would not fit
        (:func:`mappa_train.memory.needs_checkpointing`); logged when the choice changes.
        """
        model = self.model
        tokens = largest_micro_batch_tokens(prep.samples, self.config)
        value_bytes = torch.finfo(next(model.parameters()).dtype).bits // 8
        activations = activation_bytes(tokens, model.config, value_bytes)
        free = free_memory_bytes(self.device)
        wanted = needs_checkpointing(activations, free)
        # Asked of the model: agents on one LoRA base share its setting.
        if wanted != is_checkpointing(model):
            (enable_checkpointing if wanted else disable_checkpointing)(model)
        if wanted == self.checkpointing:
            return
        self.checkpointing = wanted
        logger.info(
            "%s: activation checkpointing %s: micro-batches of up to %d tokens keep about "
            "%.1f GiB of activations without it, %.1f GiB free",
            self.agent,
            "on" if wanted else "off",
            tokens,
            activations / GIB,
            free / GIB,
        )
