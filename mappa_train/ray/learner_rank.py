"""One rank of an agent's learner group: the Ray actor that trains a shard of its weights.

Each trained agent's learner on Ray is a group of ``ranks_per_agent`` of these actors
(one ``torch.distributed`` group each: gloo on CPU, NCCL on GPU) that shard the agent's
model, frozen reference and AdamW with FSDP2 (:class:`~mappa_train.fsdp.ShardedLearner`).
The driver reaches them through :class:`~mappa_train.ray.learner.LearnerGroup`.

This module is what a rank's process imports: it reads token ids and prepared rows, and
imports no environment code.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mappa_train import checkpoint as ckpt
from mappa_train.activations import enable_checkpointing
from mappa_train.learner import TokenRows
from mappa_train.ray import weight_sync
from mappa_train.ray.support import COLLECTIVE_TIMEOUT_S
from mappa_train.update import PreparedRows

__all__ = ["LearnerRank", "TokenRow", "token_rows"]


@dataclass
class TokenRow:
    """The ids of one action: all a learner needs of it (what travels to the actors)."""

    prompt_ids: list[int]
    """The prompt's token ids."""
    response_ids: list[int]
    """The sampled response's token ids."""


def token_rows(samples: Sequence[TokenRows]) -> list[TokenRow]:
    """The actions' exact ids, without their messages, texts and verdicts."""
    return [TokenRow(list(s.prompt_ids), list(s.response_ids)) for s in samples]


class LearnerRank:
    """One rank of an agent's learner group (run as a Ray actor).

    Every method but :meth:`address` is collective: the driver calls it on every rank
    of the group at once, with the same arguments.
    """

    def __init__(self) -> None:
        self.learner: Any = None
        self._buckets: list[list[weight_sync.Slot]] = []
        self._send_buffer: torch.Tensor | None = None
        self._channel: Any = None  # the broadcast group with the engines (rank 0)

    def address(self) -> str:
        """A ``tcp://host:port`` where this rank (rank 0) can host the group's rendezvous."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"tcp://{host}:{port}"

    def setup(
        self,
        init_method: str,
        rank: int,
        world: int,
        agent: str,
        weights: str,
        reference: str,
        config: dict[str, Any],
        optimizer_state: str | None,
    ) -> None:
        """Join the group, load and shard the models, restore the optimizer if resuming."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mappa_agents.dtypes import resolve_dtype
        from mappa_train.config import TrainConfig
        from mappa_train.fsdp import ShardedLearner

        settings = TrainConfig.from_dict(config)
        device = "cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu"
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray shows each actor only its own GPUs
        dist.init_process_group(
            # NCCL reduces CUDA tensors only; the update's statistics and log-prob tables
            # are reduced on the CPU, through gloo.
            "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        mesh = init_device_mesh(device, (world,))
        dtype = resolve_dtype(settings.dtype, device)
        torch.manual_seed(settings.seed)
        # Loaded on the CPU: fully_shard moves each rank's shards to its device, so no
        # rank holds a whole model on its GPU. A fresh run's masters are the weights
        # rounded to the run's dtype, as one process's are (a checkpoint's are float32).
        model = AutoModelForCausalLM.from_pretrained(
            weights, dtype=torch.float32 if optimizer_state else dtype
        ).float()
        ref = AutoModelForCausalLM.from_pretrained(reference, dtype=dtype)
        # A sharded learner does not size its activations per update: "auto" keeps
        # checkpointing on, as the setting's True did before "auto" existed.
        if settings.gradient_checkpointing in (True, "auto"):
            enable_checkpointing(model)
        tokenizer = AutoTokenizer.from_pretrained(reference)
        pad_id = tokenizer.pad_token_id
        if pad_id is None:
            pad_id = tokenizer.eos_token_id
        saved, has_state = None, False
        if optimizer_state:
            # Only rank 0 reads optimizer.pt (a whole AdamW state is 8 bytes per
            # parameter, too much to load once per rank); the others get its shards
            # through set_optimizer_state_dict and, for a one-process checkpoint, the
            # masters it held as their weights.
            flags: list[Any] = [None, None]
            if rank == 0:
                saved, masters_loaded = self._read_optimizer(optimizer_state, model)
                flags = [bool(saved["state"]), masters_loaded]
            dist.broadcast_object_list(flags, src=0)
            has_state, masters_loaded = flags
            if masters_loaded:
                with torch.no_grad():
                    for param in model.parameters():
                        dist.broadcast(param.data, src=0)
        self.learner = ShardedLearner(
            agent,
            model,
            ref,
            settings,
            mesh=mesh,
            pad_id=int(pad_id),
            compute_dtype=None if dtype == torch.float32 else dtype,
        )
        if has_state:
            # An empty state (an optimizer that never stepped) is left alone: torch
            # would take a zero step to build one, and Adam would count it.
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_optimizer_state_dict(
                self.learner.scorer,
                self.learner.optimizer,
                optim_state_dict=saved if rank == 0 else {},
                options=options,
            )

    @staticmethod
    @torch.no_grad()
    def _read_optimizer(path: str, model: torch.nn.Module) -> tuple[dict[str, Any], bool]:
        """A checkpoint's optimizer state keyed by name, and whether it held masters.

        A one-process state (by position) is converted. A one-process bf16 run keeps
        its float32 masters in the optimizer state (its saved weights are bf16): they
        become this model's weights here.
        """
        state = torch.load(path, map_location="cpu", weights_only=False)
        if ckpt.is_named_optimizer_state(state):
            return state, False
        names = [name for name, _ in model.named_parameters()]
        masters = "master" in state
        if masters:
            for param, master in zip(model.parameters(), state["master"]):
                param.copy_(master)
            state = state["optimizer"]
        return ckpt.named_optimizer_state(state, names, prefix=ckpt.NAMED_PREFIX), masters

    def logprobs(self, rows: list[TokenRow], reference: bool) -> torch.Tensor:
        """Log-probs ``[N, T]`` of every row (every rank returns the whole table)."""
        return self.learner.logprobs(rows, reference=reference)

    def update(
        self, prep: PreparedRows, step: int, lr: float, kl_in_loss: bool
    ) -> dict[str, float]:
        """One PPO-clipped pass; the group's statistics."""
        return self.learner.update(prep, step=step, lr=lr, kl_in_loss=kl_in_loss)

    def weights(self, dtype: str | None = None) -> dict[str, torch.Tensor] | None:
        """The model's whole weights (rank 0; the other ranks return ``None``).

        Args:
            dtype: Round the float32 masters to this dtype (``"bfloat16"``, say) before
                they leave the rank: a copy that acts in that dtype gets the same
                values from half the bytes. ``None`` keeps float32 (checkpoints).
        """
        import torch.distributed as dist

        state = self.learner.full_state_dict()
        if dist.get_rank() != 0:
            return None  # the others' are empty
        if dtype is not None:
            target = getattr(torch, dtype)
            state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
        return state

    def _sharded_state(self) -> dict[str, torch.Tensor]:
        """The model's state dict as this rank holds it (DTensor shards), on its device."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=False)
        return get_model_state_dict(self.learner.model, options=options)

    def gpu(self) -> str | None:
        """The UUID of this rank's GPU (``None`` when it trains on the CPU)."""
        on_gpu = next(iter(self._sharded_state().values())).device.type == "cuda"
        return weight_sync.gpu_uuid() if on_gpu else None

    def plan_sync(self, dtype: str, bucket_bytes: int) -> list[list[weight_sync.Slot]]:
        """Lay the weights out in buckets, in ``dtype`` (floating tensors); keep the plan.

        Every rank computes the same plan from its model (shapes are the whole
        tensors'), so none has to wait for rank 0's.
        """
        target = getattr(torch, dtype)
        # A tied head is the embedding under a second name: the engines tie it too.
        state = weight_sync.without_tied_copies(self._sharded_state(), self.learner.model)
        self._buckets = weight_sync.plan_buckets(
            (
                (name, tuple(t.shape), target if t.is_floating_point() else t.dtype)
                for name, t in state.items()
            ),
            bucket_bytes,
        )
        return self._buckets

    def _buffer(self) -> torch.Tensor:
        """The send buffer: one bucket's bytes on this rank's device (made once)."""
        if self._send_buffer is None:
            device = next(iter(self._sharded_state().values())).device
            size = max(weight_sync.bucket_size(b) for b in self._buckets)
            self._send_buffer = torch.empty(size, dtype=torch.uint8, device=device)
        return self._send_buffer

    def share_buffer(self) -> dict[str, Any]:
        """A CUDA IPC handle of the send buffer, for the engines on this rank's GPU."""
        return weight_sync.share_cuda_buffer(self._buffer())

    def join_channel(self, address: str, world: int, backend: str) -> None:
        """Host the broadcast group with the engines (rank 0; the engines join it)."""
        self._channel = weight_sync.open_channel(address, 0, world, backend, COLLECTIVE_TIMEOUT_S)

    @torch.no_grad()
    def push_weights(self, engines: list[Any], broadcast: bool) -> None:
        """Send the weights to engines bucket by bucket (collective: every rank calls it).

        Each bucket's tensors are rounded to the engines' dtype on the shards, then
        gathered whole (every rank takes part). A rank with ``engines`` (on its GPU,
        holding its buffer's IPC handle) packs the bucket into its buffer and waits
        until each has copied it; rank 0 with ``broadcast`` broadcasts it to the
        channel's engines, which
        :meth:`~mappa_train.ray.rollout_engines.RolloutEngine.receive_broadcast` at once.
        """
        import ray
        from torch.distributed.tensor import DTensor

        state = self._sharded_state()
        for index, slots in enumerate(self._buckets):
            whole = {}
            for slot in slots:
                tensor = state[slot.name].to(slot.dtype)
                whole[slot.name] = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if not engines and not broadcast:
                continue  # this rank only helped gather
            packed = weight_sync.pack_bucket(self._buffer(), slots, whole)
            if engines:
                if packed.is_cuda:  # the copies must be done before another process reads
                    torch.cuda.current_stream().synchronize()
                ray.get([engine.load_shared_bucket.remote(index) for engine in engines])
            if broadcast:
                weight_sync.broadcast(self._channel, packed)
        if broadcast and self._buffer().is_cuda:
            # NCCL's wait orders the stream, not the host: return once the last bucket
            # is out, so the sync's seconds are its own and a failed one fails here.
            torch.cuda.current_stream().synchronize()

    def optimizer_state(self) -> dict[str, Any] | None:
        """AdamW's whole state, keyed by parameter name (rank 0; others ``None``)."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        optimizer = self.learner.optimizer
        if not optimizer.state:
            # Never stepped (the agent had no usable rows yet): torch would build the
            # state with a zero step, which Adam would count. Its groups are all there is.
            names = [name for name, _ in self.learner.model.named_parameters()]
            positional = {"state": {}, "param_groups": optimizer.state_dict()["param_groups"]}
            named = ckpt.named_optimizer_state(positional, names, prefix=ckpt.NAMED_PREFIX)
            return named if dist.get_rank() == 0 else None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_optimizer_state_dict(self.learner.scorer, optimizer, options=options)
        return state if dist.get_rank() == 0 else None

    def gpu_ids(self) -> list[Any]:
        """The GPUs Ray gave this rank."""
        import ray

        return list(ray.get_gpu_ids())

    def peak_memory(self) -> int:
        """Peak bytes of GPU memory this rank allocated (0 on CPU)."""
        return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0

    def close(self) -> None:
        """Leave the group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
