"""Distributed training on Ray: the trainer's loop in the driver, learners as actor groups.

:class:`RayTrainer` is :class:`~mappa_train.trainer.Trainer` with each trained agent's
learner moved out of the driver into a group of ``ranks_per_agent`` Ray actors (one
``torch.distributed`` group each: gloo on CPU, NCCL on GPU) that shard the agent's
model, frozen reference and AdamW with FSDP2 (:class:`~mappa_train.fsdp.ShardedLearner`).
What stays in the driver is everything that looks at more than one agent or at the
episodes: the schedule, rollouts (environments, coach, sandboxes, the agents' rollout
copies), credit assignment, advantages (so ``normalize_scope: all`` whitens across
agents as before), evaluation, logging and checkpoints.

A step: rollouts in the driver; per agent, its group scores the actions (old and
reference log-probs, each rank its share of the rows); advantages in the driver; per
agent, its group runs the PPO pass (the same functions as the single-process trainer,
:mod:`mappa_train.update`); then each agent's new weights reach its rollout copy: the
driver's through Ray's object store, engine actors' as ``weight_sync`` says (CUDA IPC,
a broadcast, or the object store; :mod:`mappa_train.weight_sync`), in
:meth:`RayTrainer.after_update`.

Checkpoints have the single-process layout (``agents/<agent>/`` with the weights, the
tokenizer and ``optimizer.pt``); the weights are the float32 masters and
``optimizer.pt`` holds the group's AdamW state as one full state dict, so a killed run
resumes exactly with the same number of ranks or any other.

Needs the ``distributed`` extra (``pip install 'mappa-rl[distributed]'``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mappa_agents.trajectory import ActionSample
from mappa_train import checkpoint as ckpt
from mappa_train import weight_sync
from mappa_train.resume import checkpoint_to_resume
from mappa_train.trainer import Trainer, _enable_checkpointing
from mappa_train.update import PreparedRows

logger = logging.getLogger(__name__)

#: How long a collective may wait for the other ranks before the group fails (a rank
#: that died would otherwise hang the others forever).
COLLECTIVE_TIMEOUT_S = 600.0


def _import_ray() -> Any:
    from mappa_env._optional import require

    return require("ray", "distributed", purpose="distributed: ray")


@dataclass
class TokenRow:
    """The ids of one action: all a learner needs of it (what travels to the actors)."""

    prompt_ids: list[int]
    response_ids: list[int]


def token_rows(samples: Sequence[ActionSample]) -> list[TokenRow]:
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
        ray = _import_ray()
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

        from mappa_agents.hf import resolve_dtype
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
            _enable_checkpointing(model)
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
        channel's engines, which :meth:`RolloutEngine.receive_broadcast` at once.
        """
        from torch.distributed.tensor import DTensor

        ray = _import_ray()
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
        return list(_import_ray().get_gpu_ids())

    def peak_memory(self) -> int:
        """Peak bytes of GPU memory this rank allocated (0 on CPU)."""
        return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0

    def close(self) -> None:
        """Leave the group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _acting_dtype(learner: Any) -> str:
    """The dtype an agent's rollout copy acts in: its engines' or the driver's model's."""
    if isinstance(learner.policy, EnginePolicy):
        return learner.policy.dtype
    return str(learner.model.dtype).removeprefix("torch.")


def _actor_options(placement: Any, bundle: int, gpus: float) -> dict[str, Any]:
    """Ray options of an actor placed in bundle ``bundle`` of ``placement``.

    On GPUs: its share ``gpus`` inside the bundle; without a placement (CPU), no
    resources at all (the ranks share the machine's CPUs).
    """
    if placement is None:
        return {"num_cpus": 0, "num_gpus": 0}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=placement, placement_group_bundle_index=bundle
    )
    return {"num_cpus": 0, "num_gpus": gpus, "scheduling_strategy": strategy}


def placement_bundles(config: Any, agents: int) -> list[dict[str, float]]:
    """GPUs of each bundle of the run's placement group.

    Bundle ``r < ranks_per_agent`` holds rank ``r`` of every agent's group (so the ranks
    of one group are in different bundles, on different GPUs, as NCCL needs). With
    ``colocate_engines`` it also holds engine ``e`` of every agent for ``e % ranks ==
    r``; without, engine ``e`` of every agent has bundle ``ranks + e`` of its own. A
    bundle has as many whole GPUs as its actors' shares add up to (rounded up), which
    Ray then shares out among them.
    """
    world = config.ranks_per_agent
    bundles = []
    for rank in range(world):
        engines = 0
        if config.colocate_engines:
            engines = sum(1 for e in range(config.engines_per_agent) if e % world == rank)
        need = agents * config.gpus_per_rank + agents * engines * config.gpus_per_engine
        bundles.append({"GPU": float(math.ceil(need - 1e-9))})
    if not config.colocate_engines:
        need = agents * config.gpus_per_engine
        bundles += [{"GPU": float(math.ceil(need - 1e-9))}] * config.engines_per_agent
    return bundles


def engine_bundle(config: Any, index: int) -> int:
    """The placement bundle of each agent's engine ``index`` (see :func:`placement_bundles`)."""
    if config.colocate_engines:
        return index % config.ranks_per_agent
    return config.ranks_per_agent + index


def agents_at_once(setting: bool | str, group_gpus: Sequence[Sequence[str | None]]) -> bool:
    """Whether the agents' groups should run their log-prob passes and updates at once.

    Args:
        setting: The config's ``agents_in_parallel`` (``True``, ``False`` or ``"auto"``).
        group_gpus: Per agent, the GPUs of its group's ranks (``None`` on CPU); a group of
            one rank may be given as ``[]`` (it runs no collectives).

    ``"auto"`` is ``True`` unless two groups of several ranks share a GPU: one group's
    collectives would spin there while the other's kernels hold the GPU.
    """
    if setting != "auto":
        return bool(setting)
    taken: set[str] = set()
    for gpus in group_gpus:
        mine = {g for g in gpus if g is not None} if len(gpus) > 1 else set()
        if mine & taken:
            return False
        taken |= mine
    return True


class LearnerGroup:
    """The driver's handle of one agent's ranks: calls every rank, returns rank 0's answer.

    Args:
        agent: The agent's id.
        weights: Where the trained model's weights are (a checkpoint or the source).
        reference: The agent's source model (its frozen reference and tokenizer).
        config: The run's settings.
        optimizer_state: An ``optimizer.pt`` to resume from, or ``None``.
    """

    def __init__(
        self,
        agent: str,
        weights: str,
        reference: str,
        config: Any,
        optimizer_state: str | None = None,
        placement: Any = None,
    ) -> None:
        ray = _import_ray()
        self.agent = agent
        self.world = config.ranks_per_agent
        self.ranks = [
            ray.remote(LearnerRank)
            .options(**_actor_options(placement, rank, config.gpus_per_rank))
            .remote()
            for rank in range(self.world)
        ]
        try:
            init_method = ray.get(self.ranks[0].address.remote())
            settings = ray.put(config.to_dict())
            ray.get(
                [
                    handle.setup.remote(
                        init_method,
                        rank,
                        self.world,
                        agent,
                        weights,
                        reference,
                        settings,
                        optimizer_state,
                    )
                    for rank, handle in enumerate(self.ranks)
                ]
            )
        except Exception:
            self._kill()  # a group that cannot start holds no GPUs
            raise

    def _call(self, method: str, *args: Any) -> Any:
        """Call ``method`` on every rank at once; rank 0's result.

        A rank's failure is raised here (with its traceback). No timeout of its own: a
        rank that dies fails the call at once, and the others' collectives fail after
        ``COLLECTIVE_TIMEOUT_S`` instead of hanging.
        """
        return _import_ray().get(self.start(method, *args))[0]

    def start(self, method: str, *args: Any) -> list[Any]:
        """Start ``method`` on every rank; their references, rank 0's first. No wait."""
        ray = _import_ray()
        # Put once, read by every rank (instead of one copy per call).
        shared = [ray.put(a) if isinstance(a, (list, dict, PreparedRows)) else a for a in args]
        return [getattr(handle, method).remote(*shared) for handle in self.ranks]

    def gpu_ids(self) -> list[list[Any]]:
        """The GPUs Ray gave each rank."""
        ray = _import_ray()
        return ray.get([handle.gpu_ids.remote() for handle in self.ranks])

    def logprobs(self, rows: list[TokenRow], *, reference: bool) -> torch.Tensor:
        """``[N, T]`` log-probs of ``rows`` under the model (or its reference)."""
        return self._call("logprobs", rows, reference)

    def update(self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool) -> Any:
        """One PPO-clipped pass on the group; its statistics."""
        return self._call("update", prep, step, lr, kl_in_loss)

    def weights(self) -> dict[str, torch.Tensor]:
        """The whole float32 weights (gathered by the ranks, sent by rank 0)."""
        return self._call("weights")

    def weight_refs(self, dtype: str | None = None) -> list[Any]:
        """Start gathering the whole weights; every rank's object-store reference.

        Does not wait: the first reference is rank 0's, which holds the weights (in
        ``dtype``, see :meth:`LearnerRank.weights`); the others hold ``None`` once their
        part of the gather is done, or raise their rank's error when read.
        """
        return [handle.weights.remote(dtype) for handle in self.ranks]

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW's whole state (gathered by the ranks, sent by rank 0)."""
        return self._call("optimizer_state")

    def gpus(self) -> list[str | None]:
        """The UUID of each rank's GPU (``None`` on CPU)."""
        ray = _import_ray()
        return ray.get([handle.gpu.remote() for handle in self.ranks])

    def plan_sync(self, dtype: str, bucket_bytes: int) -> list[list[weight_sync.Slot]]:
        """Every rank's bucket plan for sending the weights in ``dtype`` (rank 0's)."""
        return self._call("plan_sync", dtype, bucket_bytes)

    def start_push(self, engines_by_rank: list[list[Any]], broadcast: bool) -> list[Any]:
        """Start sending the weights (see :meth:`LearnerRank.push_weights`); no wait.

        Args:
            engines_by_rank: Per rank, the engines it feeds through CUDA IPC.
            broadcast: Rank 0 broadcasts to the engines of the group's channel.

        Returns:
            One reference per rank, ready when its part is done (or raising its error).
        """
        return [
            handle.push_weights.remote(engines, broadcast and rank == 0)
            for rank, (handle, engines) in enumerate(zip(self.ranks, engines_by_rank))
        ]

    def peak_memory(self) -> list[int]:
        """Peak GPU bytes of each rank."""
        ray = _import_ray()
        return ray.get([handle.peak_memory.remote() for handle in self.ranks])

    def close(self) -> None:
        """Leave the group and end the actors."""
        try:
            self._call("close")
        finally:
            self._kill()

    def _kill(self) -> None:
        ray = _import_ray()
        for handle in self.ranks:
            ray.kill(handle)
        self.ranks = []


class RolloutEngine:
    """An agent's rollout copy in a Ray actor.

    An :class:`~mappa_agents.hf.HFPolicy`, or a
    :class:`~mappa_agents.vllm_policy.VLLMPolicy` with ``rollout_engine: vllm``.

    Args:
        weights: Where the weights to act with are (a checkpoint or the source).
        source: The agent's source model (its tokenizer).
        name: The policy's name.
        config: The run's settings (device, dtype, batch size, compiled decoding,
            vLLM options).
    """

    def __init__(self, weights: str, source: str, name: str, config: dict[str, Any]) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mappa_agents.hf import HFPolicy, resolve_dtype
        from mappa_train.config import TrainConfig

        settings = TrainConfig.from_dict(config)
        device = "cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu"
        dtype = resolve_dtype(settings.dtype, device)
        self._dtype = str(dtype).removeprefix("torch.")
        self._device = device
        self._buckets: list[list[weight_sync.Slot]] = []
        self._shared: torch.Tensor | None = None  # its rank's send buffer (CUDA IPC)
        self._channel: Any = None  # the broadcast group with its rank 0
        self._receive_buffer: torch.Tensor | None = None
        self._received: list[tuple[str, torch.Tensor]] = []  # a vLLM engine's buckets so far
        self.policy: Any
        self._vllm = settings.rollout_engine == "vllm"
        if self._vllm:
            self.policy = self._vllm_policy(weights, name, settings)
            return
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype).to(device)
        model.eval()
        model.requires_grad_(False)
        # Its weights by name, once: each sync copies into these in place.
        self._named = model.state_dict()
        self.policy = HFPolicy(
            model,
            AutoTokenizer.from_pretrained(source),
            name=name,
            max_batch_size=settings.rollout_batch_size,
            compile_decode=settings.compile_decode and device == "cuda",
        )

    def _vllm_policy(self, weights: str, name: str, settings: Any) -> Any:
        """A vLLM engine in this actor's process, built from ``weights``.

        ``weights`` is the agent's source or a checkpoint (which holds its tokenizer too).
        """
        import os

        # In this process, so the weights the actor receives reach the engine as tensors.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from mappa_agents.vllm_policy import VLLMPolicy

        options = {
            "dtype": self._dtype,
            # Ray gives the actor a share of a GPU; vLLM's own share is of the whole GPU.
            "gpu_memory_utilization": 0.9 * min(1.0, settings.gpus_per_engine),
            "seed": settings.seed,
            **settings.vllm_options,
        }
        return VLLMPolicy(weights, name=name, **options)

    def generate(self, batch: list[Any], params: Any) -> list[Any]:
        """The policy's generations for ``batch``."""
        return self.policy.generate(batch, params)

    @torch.no_grad()
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Act with ``weights`` from now on (copied in place into the model or engine)."""
        if self._vllm:  # the engine maps transformers' names to its fused layout
            self.policy.load_weights(weights.items())
            return
        for name, tensor in self._named.items():
            tensor.copy_(weights[name])

    def gpu(self) -> str | None:
        """The UUID of this engine's GPU (``None`` on CPU)."""
        return weight_sync.gpu_uuid() if self._device == "cuda" else None

    def prepare_sync(
        self,
        buckets: list[list[weight_sync.Slot]],
        shared: dict[str, Any] | None = None,
        channel: tuple[str, int, int, str] | None = None,
    ) -> None:
        """Get ready to receive weights in ``buckets`` (once per run).

        Args:
            buckets: The group's bucket plan.
            shared: The CUDA IPC handle of its rank's send buffer (``cuda_ipc``).
            channel: ``(address, rank, world, backend)`` of the broadcast group to join
                (``broadcast``).
        """
        self._buckets = buckets
        if shared is not None:
            self._shared = weight_sync.open_cuda_buffer(shared)
        if channel is not None:
            address, rank, world, backend = channel
            self._channel = weight_sync.open_channel(
                address, rank, world, backend, COLLECTIVE_TIMEOUT_S
            )

    @torch.no_grad()
    def load_shared_bucket(self, index: int) -> None:
        """Copy bucket ``index`` out of its rank's buffer (CUDA IPC); done when it returns."""
        if self._shared is None:
            raise RuntimeError("this engine has no rank's buffer: prepare_sync was not given one")
        self._take(index, weight_sync.unpack_bucket(self._shared, self._buckets[index]))
        torch.cuda.synchronize()  # read before the rank packs its next bucket over it

    @torch.no_grad()
    def receive_broadcast(self) -> None:
        """Receive every bucket of a sync from rank 0's broadcasts, and act with them."""
        if self._channel is None:
            raise RuntimeError("this engine is in no broadcast group: prepare_sync joins one")
        if self._receive_buffer is None:
            size = max(weight_sync.bucket_size(b) for b in self._buckets)
            self._receive_buffer = torch.empty(size, dtype=torch.uint8, device=self._device)
        received = self._receive_buffer
        for index, slots in enumerate(self._buckets):
            part = received[: weight_sync.bucket_size(slots)]
            weight_sync.broadcast(self._channel, part)
            self._take(index, weight_sync.unpack_bucket(received, slots))
        if received.is_cuda:  # as on rank 0: done when it returns
            torch.cuda.current_stream().synchronize()

    def _take(self, index: int, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Act with a bucket's tensors (views into a buffer that is reused after this).

        An HF model copies them into its weights at once. A vLLM engine reloads once
        per sync, with every bucket (its in-place reload processes the whole model), so
        it keeps copies of the buckets before the last one, in host memory: on its GPU
        they would take up to one more copy of the model beside the engine's weights and
        KV cache. vLLM's weight loaders copy host tensors in, as when loading a checkpoint.
        """
        if not self._vllm:
            for name, tensor in tensors:
                self._named[name].copy_(tensor)
            return
        last = index == len(self._buckets) - 1
        if not last:
            self._received += [(name, tensor.to("cpu", copy=True)) for name, tensor in tensors]
            return
        received, self._received = self._received, []
        self.policy.load_weights(received + tensors)

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights it acts with (CPU; an HF engine only: vLLM fuses some tensors)."""
        if self._vllm:
            raise TypeError("a vLLM engine keeps its weights fused, not by transformers' names")
        return {k: v.detach().cpu() for k, v in self.policy.model.state_dict().items()}

    def dtype(self) -> str:
        """The dtype it acts in (``"bfloat16"``, say)."""
        return self._dtype

    def peak_memory(self) -> int:
        """Peak bytes of GPU memory this engine allocated (0 on CPU)."""
        return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0

    def close(self) -> None:
        """Release the policy."""
        self.policy.close()


class EnginePolicy:
    """A :class:`~mappa_agents.policy.Policy` in the driver that generates on engine actors.

    Calls go to the engines in turn (each call is one batch, kept whole on one engine).

    Args:
        engines: Handles of :class:`RolloutEngine` actors of one agent.
        name: The policy's name.
        pad_token_id: The tokenizer's padding id.
    """

    def __init__(self, engines: list[Any], name: str, pad_token_id: int) -> None:
        if not engines:
            raise ValueError("an EnginePolicy needs at least one engine")
        self.engines = engines
        self.name = name
        self.pad_token_id = pad_token_id
        self._next = 0
        self._dtype: str | None = None

    @property
    def dtype(self) -> str:
        """The dtype the engines act in (asked of the first engine once)."""
        if self._dtype is None:
            self._dtype = str(_import_ray().get(self.engines[0].dtype.remote()))
        return self._dtype

    def _engine(self) -> Any:
        engine = self.engines[self._next % len(self.engines)]
        self._next += 1
        return engine

    def generate(self, batch: Sequence[Any], params: Any) -> list[Any]:
        """Generate on the next engine (blocking)."""
        ray = _import_ray()
        return ray.get(self._engine().generate.remote(list(batch), params))

    async def agenerate(self, batch: Sequence[Any], params: Any) -> list[Any]:
        """Generate on the next engine (awaiting Ray's reference)."""
        return await self._engine().generate.remote(list(batch), params)

    def start_loading(self, weights_ref: Any) -> list[Any]:
        """Have every engine load the weights behind an object-store reference.

        Does not wait: each engine starts once the reference is ready (it may still be
        being gathered). Returns:
            One reference per engine, ready when that engine acts with the weights.
        """
        return [engine.load_weights.remote(weights_ref) for engine in self.engines]

    def load_weights(self, weights_ref: Any) -> None:
        """Send every engine the weights behind an object-store reference (blocking)."""
        _import_ray().get(self.start_loading(weights_ref))

    def close(self) -> None:
        """End the engine actors."""
        ray = _import_ray()
        for engine in self.engines:
            ray.kill(engine)
        self.engines = []


@dataclass
class RemoteAgentLearner:
    """A trained agent in the driver: its rollout copy and the handle of its group."""

    agent: str
    model: Any
    """The driver's rollout copy its policy acts with (``None`` when engines act)."""
    tokenizer: Any
    policy: Any
    source: str
    group: LearnerGroup
    adapter: str | None = None
    engine: Any = None
    """Unused here (``policy`` is what acts): the single-process trainer's vLLM seam."""
    weight_sync: str = "object_store"
    """How its engines get new weights (:func:`mappa_train.weight_sync.choose_mode`)."""
    engines_by_rank: list[list[Any]] = dataclasses.field(default_factory=list)
    """Per rank of its group, the engines that rank feeds through CUDA IPC."""


@dataclass
class _CheckpointView:
    """A remote learner as :func:`mappa_train.checkpoint.save_checkpoint` reads one."""

    model: Any
    tokenizer: Any
    optimizer: Any
    adapter: str | None = None


@dataclass
class _SavedModel:
    """What :func:`mappa_train.checkpoint.save_checkpoint` writes for a remote learner."""

    source: str
    group: LearnerGroup

    def save_pretrained(self, directory: Path, **options: Any) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        # Fetched here, not before: the driver holds one agent's weights at a time.
        weights = self.group.weights()
        # An empty model of the agent's architecture writes the weights in the layout
        # transformers loads (tied weights, shards); it holds none of its own.
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.source))
        model.save_pretrained(directory, state_dict=weights, **options)


@dataclass
class _SavedOptimizer:
    group: LearnerGroup

    def state_dict(self) -> dict[str, Any]:
        return self.group.optimizer_state()


class RayTrainer(Trainer):
    """:class:`~mappa_train.trainer.Trainer` with every trained agent's learner on Ray.

    Takes the same arguments; ``config.ranks_per_agent``, ``gpus_per_rank`` and
    ``ray_address`` place the learners. Ray is started (or joined) by :meth:`setup`.
    """

    distributed = "ray"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sync_seconds: list[float] = []
        """Seconds of each step's weight sync (:meth:`after_update`)."""
        self._started: list[Any] = []  # groups and engine policies, to stop on close
        self._placement: Any = None
        self._agents_at_once: bool | None = None  # agents_in_parallel "auto", once decided

    def setup(self) -> None:
        """Start or join Ray, start each trained agent's group, load the rollout copies."""
        config = self.config
        if config.lora_rank > 0:
            raise ValueError("RayTrainer trains full weights: set lora_rank: 0")
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=True)
        self.check_sandboxes()
        torch.manual_seed(config.seed)
        np.random.seed(config.seed % (2**32))
        # Resume only a whole checkpoint of this run's settings (mappa_train.resume).
        resume_from = checkpoint_to_resume(
            self.checkpoint_root, self.config, self.specs, self.trained_agents
        )
        try:
            self._placement = self._reserve_gpus(ray)
            self._start_agents(resume_from)
            for learner in self.learners.values():
                self._prepare_sync(learner)  # type: ignore[arg-type]
        except BaseException:
            self._stop_actors()  # nothing started is left holding GPUs
            raise
        self._setup_frozen(self.specs)
        if resume_from is not None:
            # The groups restored their optimizers; the driver's generators are here.
            ckpt.set_rng_state(torch.load(resume_from / "rng.pt", weights_only=False))
        self._start_run(resume_from)

    def _reserve_gpus(self, ray: Any) -> Any:
        """The run's placement group on GPUs (see :func:`placement_bundles`), or ``None``.

        Raises:
            ValueError: When the config asks for CUDA and the cluster has no GPU, or the
                cluster has fewer GPUs than the placement needs.
        """
        config = self.config
        available = float(ray.cluster_resources().get("GPU", 0))
        if config.device.startswith("cuda") and available == 0:
            raise ValueError(
                f"device {config.device!r}, but the Ray cluster has no GPU: start Ray "
                "where the GPUs are (or join that cluster with ray_address), or use "
                "device: cpu"
            )
        if config.device == "cpu" or available == 0:
            return None
        from ray.util.placement_group import placement_group

        bundles = placement_bundles(config, len(self.trained_agents))
        needed = sum(b["GPU"] for b in bundles)
        if needed > available:
            raise ValueError(
                f"{len(self.trained_agents)} agents x {config.ranks_per_agent} ranks at "
                f"gpus_per_rank={config.gpus_per_rank} (and {config.engines_per_agent} "
                f"engines per agent at gpus_per_engine={config.gpus_per_engine}) need "
                f"{needed:g} GPUs, the cluster has {available:g}: lower ranks_per_agent or "
                "the GPU shares (ranks of one agent need a GPU each)"
            )
        group = placement_group(bundles, strategy="PACK")
        ray.get(group.ready())
        return group

    def _start_agents(self, resume_from: Path | None) -> None:
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.models import resolve_model

        config = self.config
        for agent in self.trained_agents:
            source = str(resolve_model(self.specs[agent]))
            saved = resume_from / "agents" / agent if resume_from else None
            weights = str(saved) if saved else source
            started = time.perf_counter()
            group = LearnerGroup(
                agent,
                weights,
                source,
                config,
                optimizer_state=str(saved / "optimizer.pt") if saved else None,
                placement=self._placement,
            )
            self._started.append(group)
            logger.info(
                "agent %s: %d learner ranks ready in %.1f s",
                agent,
                group.world,
                time.perf_counter() - started,
            )
            tokenizer = AutoTokenizer.from_pretrained(source)
            name = f"{agent}:{Path(source).name}"
            model: Any = None
            if config.engines_per_agent > 0:
                policy: Any = self._start_engines(weights, source, name, tokenizer)
                self._started.append(policy)
            else:
                model = self._load_model(weights, self.dtype)
                model.eval()
                model.requires_grad_(False)  # trained by the group; the driver only acts
                model.config.use_cache = True
                policy = HFPolicy(
                    model,
                    tokenizer,
                    name=name,
                    max_batch_size=config.rollout_batch_size,
                    compile_decode=self.compiles_decoding,
                )
            self.learners[agent] = RemoteAgentLearner(  # type: ignore[assignment]
                agent, model, tokenizer, policy, source, group
            )

    def _start_engines(self, weights: str, source: str, name: str, tokenizer: Any) -> Any:
        ray = _import_ray()
        config = self.config
        settings = ray.put(config.to_dict())
        engines = []
        for index in range(config.engines_per_agent):
            bundle = engine_bundle(config, index)
            engine = (
                ray.remote(RolloutEngine)
                .options(**_actor_options(self._placement, bundle, config.gpus_per_engine))
                .remote(weights, source, name, settings)
            )
            engines.append(engine)
            if config.rollout_engine == "vllm" and self._placement is not None:
                # vLLM sizes its KV cache from the GPU memory it finds free while it
                # starts: on a shared GPU nothing else may start beside it meanwhile.
                ray.get(engine.dtype.remote())
        pad = tokenizer.pad_token_id
        return EnginePolicy(engines, name, pad if pad is not None else tokenizer.eos_token_id)

    def _prepare_sync(self, learner: RemoteAgentLearner) -> None:
        """Choose how the agent's engines get new weights and connect them to its group."""
        if not isinstance(learner.policy, EnginePolicy):
            return  # the driver's own copy: through the object store
        ray = _import_ray()
        group, engines = learner.group, learner.policy.engines
        rank_gpus = group.gpus()
        mode, homes = weight_sync.choose_mode(
            self.config.weight_sync,
            rank_gpus,
            ray.get([engine.gpu.remote() for engine in engines]),
        )
        learner.weight_sync = mode
        logger.info("agent %s: weights reach its engines by %s", learner.agent, mode)
        if mode == "object_store":
            return
        bucket_bytes = int(self.config.weight_sync_bucket_mb * 2**20)
        buckets = group.plan_sync(_acting_dtype(learner), bucket_bytes)
        if mode == "cuda_ipc":
            learner.engines_by_rank = [[] for _ in group.ranks]
            handles = {
                rank: ray.get(group.ranks[rank].share_buffer.remote()) for rank in set(homes)
            }
            for engine, rank in zip(engines, homes):
                learner.engines_by_rank[rank].append(engine)
            ray.get(
                [
                    engine.prepare_sync.remote(buckets, handles[rank])
                    for engine, rank in zip(engines, homes)
                ]
            )
            return
        learner.engines_by_rank = [[] for _ in group.ranks]
        address = ray.get(group.ranks[0].address.remote())
        world = 1 + len(engines)
        backend = "nccl" if rank_gpus[0] is not None else "gloo"
        # Every member joins at once: the group forms when all are there.
        ray.get(
            [group.ranks[0].join_channel.remote(address, world, backend)]
            + [
                engine.prepare_sync.remote(buckets, None, (address, 1 + index, world, backend))
                for index, engine in enumerate(engines)
            ]
        )

    def score_actions(
        self, learner: Any, samples: Sequence[ActionSample]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Old and reference log-probs, from the agent's group."""
        rows = token_rows(samples)
        old = learner.group.logprobs(rows, reference=False)
        ref = learner.group.logprobs(rows, reference=True)
        return old, ref

    def score_agents(
        self, work: dict[str, tuple[Any, list[ActionSample]]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Every agent's log-prob passes, the groups at once when :meth:`agents_at_once`."""
        if not self.agents_at_once():
            return super().score_agents(work)
        started = {}
        for agent, (learner, samples) in work.items():
            rows = token_rows(samples)
            started[agent] = (
                learner.group.start("logprobs", rows, False),
                learner.group.start("logprobs", rows, True),
            )
        ray = _import_ray()
        return {agent: (ray.get(old)[0], ray.get(ref)[0]) for agent, (old, ref) in started.items()}

    def update_agent(self, learner: Any, prep: PreparedRows, lr: float) -> dict[str, float]:
        """The agent's PPO pass, on its group."""
        light = dataclasses.replace(prep, samples=token_rows(prep.samples))
        return learner.group.update(
            light, step=self.step, lr=lr, kl_in_loss=not self.estimator.kl_in_reward
        )

    def update_agents(
        self, work: dict[str, tuple[Any, PreparedRows]], lr: float
    ) -> dict[str, dict[str, float]]:
        """Every agent's PPO pass, the groups at once when :meth:`agents_at_once`."""
        if not self.agents_at_once():
            return super().update_agents(work, lr)
        ray = _import_ray()
        started = {a: self._start_update(learner, prep, lr) for a, (learner, prep) in work.items()}
        return {agent: ray.get(refs)[0] for agent, refs in started.items()}

    def _start_update(self, learner: Any, prep: PreparedRows, lr: float) -> list[Any]:
        light = dataclasses.replace(prep, samples=token_rows(prep.samples))
        return learner.group.start("update", light, self.step, lr, not self.estimator.kl_in_reward)

    def agents_at_once(self) -> bool:
        """Whether the groups work at once (:func:`agents_at_once`, decided once per run)."""
        if self._agents_at_once is None:
            learners: dict[str, RemoteAgentLearner] = self.learners  # type: ignore[assignment]
            groups = [learner.group for learner in learners.values()]
            gpus = [group.gpus() if group.world > 1 else [] for group in groups]
            self._agents_at_once = agents_at_once(self.config.agents_in_parallel, gpus)
            logger.info(
                "agents' log-prob passes and updates: %s",
                "at once" if self._agents_at_once else "one agent after another",
            )
        return self._agents_at_once

    def after_update(self) -> None:
        """Load each agent's new weights into its rollout copy, as its ``weight_sync`` says.

        Every agent's sync starts before any is waited for, so the groups (and their
        engines) of different agents sync at once. The weights travel in the dtype the
        copy acts in: rounding on the rank gives the values the copy's own cast would.
        Through the object store rank 0 sends one whole state dict; by ``cuda_ipc`` and
        ``broadcast`` the ranks send buckets (:meth:`LearnerRank.push_weights`).
        """
        ray = _import_ray()
        started = time.perf_counter()
        learners: dict[str, RemoteAgentLearner] = self.learners  # type: ignore[assignment]
        waits: list[Any] = []
        for learner in learners.values():
            if learner.weight_sync not in ("cuda_ipc", "broadcast", "object_store"):
                raise ValueError(f"agent {learner.agent}: no weight sync {learner.weight_sync!r}")
            if learner.weight_sync in ("cuda_ipc", "broadcast"):
                broadcast = learner.weight_sync == "broadcast"
                waits += learner.group.start_push(learner.engines_by_rank, broadcast)
                if broadcast:
                    engines = learner.policy.engines
                    waits += [engine.receive_broadcast.remote() for engine in engines]
        gathers = {
            agent: learner.group.weight_refs(_acting_dtype(learner))
            for agent, learner in learners.items()
            if learner.weight_sync == "object_store"
        }
        for agent, (weights_ref, *others) in gathers.items():
            waits += others  # the other ranks' part of the gather, or their error
            policy = learners[agent].policy
            if isinstance(policy, EnginePolicy):
                # Rank 0's object goes to the engines without passing through the driver.
                waits += policy.start_loading(weights_ref)
        for agent, (weights_ref, *_) in gathers.items():
            learner = learners[agent]
            if not isinstance(learner.policy, EnginePolicy):
                weights = ray.get(weights_ref)
                with torch.no_grad():
                    for name, tensor in learner.model.state_dict().items():
                        tensor.copy_(weights[name])
        ray.get(waits)
        self.sync_seconds.append(time.perf_counter() - started)
        logger.debug("weights synced in %.2f s", self.sync_seconds[-1])

    def save(self) -> Path:
        """A checkpoint in the single-process layout, with the groups' float32 weights."""
        views = {
            agent: _CheckpointView(
                _SavedModel(learner.source, learner.group),
                learner.tokenizer,
                _SavedOptimizer(learner.group),
            )
            for agent, learner in self.learners.items()
        }
        return ckpt.save_checkpoint(
            self.checkpoint_root,
            self.step,
            views,
            {"step": self.step, "config": self.config.to_dict()},
            keep=self.config.keep_checkpoints,
        )

    def close(self) -> None:
        """Close what the trainer holds and end the learner groups and engines."""
        try:
            super().close()
        finally:
            self._stop_actors()

    def _stop_actors(self) -> None:
        """End every group and engine started, then release the GPUs reserved for them.

        Each is stopped on its own: one that fails to stop leaves none of the others.
        """
        started, self._started = self._started, []
        for actors in started:
            try:
                actors.close()
            except Exception:  # the others must be stopped all the same
                logger.exception("stopping %s failed; its actors were killed", actors)
                if isinstance(actors, LearnerGroup):
                    actors._kill()
        if self._placement is not None:
            _import_ray().util.remove_placement_group(self._placement)
            self._placement = None
