"""Sharded learners: one agent's model, reference and optimizer over a group of ranks.

A :class:`ShardedLearner` is one rank of an agent's learner group. Its trainable model
and its frozen reference are sharded with torch's FSDP2 (``fully_shard``: each decoder
layer is one unit, the embeddings, final norm and output head the root), its weights
are float32 masters and its passes run in the run's ``dtype`` (FSDP's mixed-precision
policy, gradients reduced in float32). It trains with the very functions of the
single-process trainer (:mod:`mappa_train.update`), on its share of each batch, so a
group of ``W`` ranks gives the single process's losses, gradient norms and weights.

Every rank of a group must call :meth:`ShardedLearner.logprobs` and
:meth:`ShardedLearner.update` with the same rows: a sharded pass is collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mappa_train.config import TrainConfig
from mappa_train.learner import TokenRows
from mappa_train.logprobs import PackedBatch, response_logprobs
from mappa_train.update import PreparedRows, Shard, shard_logprobs, update_agent


class ResponseScorer(torch.nn.Module):
    """A causal LM whose forward pass is :func:`~mappa_train.logprobs.response_logprobs`.

    The sharded model is called through this module, so that its root (the embeddings,
    final norm and output head, which ``response_logprobs`` reaches without calling the
    model's own forward) is gathered before the pass and its gradients reduced after it.

    Args:
        model: A transformers causal LM.
        chunk_size: Response positions per output-head chunk.
        temperature: Divide logits by this (1.0 = the model).
        recompute_logits: Recompute each chunk's logits in the backward pass.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        chunk_size: int = 1024,
        temperature: float = 1.0,
        recompute_logits: bool = True,
    ) -> None:
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size
        self.temperature = temperature
        self.recompute_logits = recompute_logits

    def forward(self, batch: PackedBatch) -> Tensor:
        """``[B, T]`` log-probs of the batch's response tokens."""
        return response_logprobs(
            self.model,
            batch,
            chunk_size=self.chunk_size,
            temperature=self.temperature,
            recompute_logits=self.recompute_logits,
        )


def shard_scorer(
    scorer: ResponseScorer, mesh: Any, *, compute_dtype: torch.dtype | None = None
) -> ResponseScorer:
    """Shard ``scorer``'s model in place with FSDP2 over ``mesh``; returns the scorer.

    Each decoder layer is one FSDP unit (gathered for its own pass only), the rest of
    the model is the root's. Gradients are summed over ranks, not averaged: the update's
    micro-batch weights already divide by the whole batch's tokens.

    Args:
        scorer: The model to shard, wrapped; its parameters stay in their dtype (float32
            masters for a trained model).
        mesh: A one-dimensional device mesh of the group's ranks.
        compute_dtype: dtype of the passes (``None``: the parameters' own); gradients
            are reduced in float32.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=compute_dtype,
        reduce_dtype=torch.float32 if compute_dtype is not None else None,
    )
    for layer in _decoder_layers(scorer.model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(scorer, mesh=mesh, mp_policy=policy)
    for unit in scorer.modules():
        if isinstance(unit, FSDPModule):
            # Per unit (the setting is not inherited); plain sums, which every backend
            # has (gloo lacks the pre-multiplied sum a custom factor would use).
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return scorer


def _decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    layers = getattr(model.get_decoder(), "layers", None)  # type: ignore[operator]
    if layers is None:
        raise TypeError(
            f"cannot shard {type(model).__name__}: its decoder has no `layers` list "
            "(FSDP units are the decoder layers of a transformers causal LM)"
        )
    return list(layers)


class ProcessGroupReducer:
    """Sums and maxima over the ranks of a ``torch.distributed`` process group.

    Args:
        group: The group (``None``: the default group).
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def sum(self, values: Tensor) -> Tensor:
        """Elementwise sum over ranks (a copy; ``values`` is left as it is)."""
        total = values.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return total

    def max(self, value: int) -> int:
        """Largest ``value`` over ranks."""
        largest = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.group)
        return int(largest.item())


class ShardedLearner:
    """One rank of one agent's learner group: sharded model, reference and AdamW.

    Args:
        agent: The agent's id (seeds its mini-batch shuffle, as in the trainer).
        model: The agent's trainable model on this rank's device (every rank loads the
            same weights); converted to float32 masters when ``compute_dtype`` is set.
        ref_model: Its frozen reference (the initial weights).
        config: The run's settings (optimizer, batching, PPO and KL settings).
        mesh: A one-dimensional device mesh of the group.
        pad_id: The tokenizer's padding id.
        compute_dtype: dtype of forward and backward passes (``None``: the weights').
        group: The group's process group for reductions (``None``: the mesh's).
    """

    def __init__(
        self,
        agent: str,
        model: torch.nn.Module,
        ref_model: torch.nn.Module,
        config: TrainConfig,
        *,
        mesh: Any,
        pad_id: int,
        compute_dtype: torch.dtype | None = None,
        group: Any = None,
    ) -> None:
        self.agent = agent
        self.config = config
        self.pad_id = pad_id
        self.device = (
            mesh.device_type
            if mesh.device_type != "cuda"
            else torch.device("cuda", torch.cuda.current_device())
        )
        group = group if group is not None else mesh.get_group()
        self.shard = Shard(dist.get_rank(group), dist.get_world_size(group))
        self.reducer = ProcessGroupReducer(group)
        if compute_dtype is not None:
            model.float()  # the sharded parameters are the float32 masters
        ref_model.requires_grad_(False)
        options = {
            "chunk_size": config.logprob_chunk_size,
            "temperature": config.temperature,
        }
        self.scorer = shard_scorer(
            ResponseScorer(model, recompute_logits=config.recompute_logits, **options),
            mesh,
            compute_dtype=compute_dtype,
        )
        self.ref_scorer = shard_scorer(
            ResponseScorer(ref_model, **options), mesh, compute_dtype=compute_dtype
        )
        self.ref_scorer.eval()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.scorer.parameters() if p.requires_grad],
            lr=config.lr,
            betas=tuple(config.adam_betas),  # type: ignore[arg-type]
            weight_decay=config.weight_decay,
        )

    @property
    def model(self) -> torch.nn.Module:
        """The sharded trainable model (its parameters are this rank's shards)."""
        return self.scorer.model

    def logprobs(self, samples: Sequence[TokenRows], *, reference: bool = False) -> Tensor:
        """``[N, T]`` log-probs of every sample's response (the whole table, CPU).

        Args:
            samples: The rows, the same on every rank.
            reference: Score under the frozen reference instead of the trained model.
        """
        scorer = self.ref_scorer if reference else self.scorer
        scorer.eval()
        return shard_logprobs(
            scorer,
            samples,
            self.config,
            pad_id=self.pad_id,
            device=self.device,
            shard=self.shard,
            reducer=self.reducer,
        )

    def update(
        self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool
    ) -> dict[str, float]:
        """One PPO-clipped pass over ``prep`` (the same on every rank); the group's stats.

        Args:
            prep: The agent's rows with advantages.
            step: The step being trained (seeds the shuffle).
            lr: The learning rate of this step.
            kl_in_loss: Add the KL penalty to the loss.
        """
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scorer.train()
        try:
            return update_agent(
                self.scorer,
                self.optimizer,
                prep,
                self.config,
                step=step,
                agent=self.agent,
                pad_id=self.pad_id,
                device=self.device,
                kl_in_loss=kl_in_loss,
                shard=self.shard,
                reducer=self.reducer,
            )
        finally:
            self.scorer.eval()

    def full_state_dict(self) -> dict[str, Tensor]:
        """The trained model's whole weights on the CPU of rank 0 (a collective).

        The other ranks get an empty dict: only one whole copy is made per group.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)
