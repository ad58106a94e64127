"""How an agent's rollout copy gets its learner group's new weights: one object per mode.

The mode is chosen once per run and agent (:func:`connect`, from ``weight_sync`` and where
the ranks and engines are, :func:`mappa_train.ray.weight_sync.choose_mode`); each step the
learner calls its mode's :meth:`WeightSync.start`. Every mode sends the weights in the
dtype the copy acts in: rounding on the rank gives the values the copy's own cast would.

- :class:`DriverCopySync`: the copy is a model in the driver; rank 0 sends one whole
  state dict through the object store and the driver copies it in place.
- :class:`ObjectStoreSync`: engine actors read rank 0's whole state dict from the
  object store, without it passing through the driver.
- :class:`CudaIpcSync`: engines on a rank's GPU copy each bucket out of that rank's
  send buffer (:mod:`mappa_train.ray.weight_sync`).
- :class:`BroadcastSync`: rank 0 broadcasts each bucket to the engines of a separate
  process group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from mappa_train.ray import weight_sync
from mappa_train.ray.rollout_engines import EnginePolicy
from mappa_train.ray.support import import_ray

if TYPE_CHECKING:
    from mappa_train.ray.group import LearnerGroup

logger = logging.getLogger(__name__)

__all__ = [
    "BroadcastSync",
    "CudaIpcSync",
    "DriverCopySync",
    "ObjectStoreSync",
    "SyncPending",
    "WeightSync",
    "acting_dtype",
    "connect",
]


def acting_dtype(policy: Any, model: Any) -> str:
    """The dtype an agent's rollout copy acts in: its engines' or the driver's model's."""
    if isinstance(policy, EnginePolicy):
        return policy.dtype
    return str(model.dtype).removeprefix("torch.")


@dataclass
class SyncPending:
    """A sync under way: ``result`` waits for every actor's part, then runs ``finish``."""

    refs: list[Any]
    """Object-store references to wait for."""
    finish: Callable[[], None] = lambda: None
    """Work in the driver once the references are ready (or before, see the mode)."""

    def result(self) -> None:
        """Wait until the rollout copy acts with the new weights."""
        self.finish()
        import_ray().get(self.refs)


class WeightSync(Protocol):
    """One way of getting a learner group's weights to its rollout copy."""

    name: str
    """The mode's name, as ``weight_sync`` spells it."""

    def start(self) -> SyncPending:
        """Start one sync; the returned work is done when the copy acts with the weights."""
        ...


@dataclass
class DriverCopySync:
    """Rank 0's whole state dict, through the object store, copied into the driver's model."""

    group: LearnerGroup
    model: Any
    """The driver's rollout copy."""
    name: str = "object_store"

    def start(self) -> SyncPending:
        """Start the gather; the copy into the model happens when the result is waited for."""
        weights_ref, *others = self.group.weight_refs(acting_dtype(None, self.model))

        def copy() -> None:
            weights = import_ray().get(weights_ref)
            with torch.no_grad():
                for name, tensor in self.model.state_dict().items():
                    tensor.copy_(weights[name])

        # The other ranks' part of the gather, or their error.
        return SyncPending(others, copy)


@dataclass
class ObjectStoreSync:
    """Rank 0's whole state dict, read by every engine from the object store."""

    group: LearnerGroup
    policy: EnginePolicy
    name: str = "object_store"

    def start(self) -> SyncPending:
        """Start the gather and every engine's load of its result (no wait)."""
        weights_ref, *others = self.group.weight_refs(self.policy.dtype)
        # Rank 0's object goes to the engines without passing through the driver.
        return SyncPending(others + self.policy.start_loading(weights_ref))


@dataclass
class CudaIpcSync:
    """Buckets packed by each rank into its GPU buffer, copied out by the engines there."""

    group: LearnerGroup
    engines_by_rank: list[list[Any]] = field(default_factory=list)
    """Per rank of the group, the engines it feeds."""
    name: str = "cuda_ipc"

    def start(self) -> SyncPending:
        """Start every rank's push (collective: every rank gathers each bucket)."""
        return SyncPending(self.group.start_push(self.engines_by_rank, broadcast=False))


@dataclass
class BroadcastSync:
    """Buckets broadcast by rank 0 to the engines of a separate process group."""

    group: LearnerGroup
    engines: list[Any]
    name: str = "broadcast"

    def start(self) -> SyncPending:
        """Start the ranks' push and every engine's receive (they meet in the broadcasts)."""
        no_ipc: list[list[Any]] = [[] for _ in self.group.ranks]
        refs = self.group.start_push(no_ipc, broadcast=True)
        return SyncPending(refs + [engine.receive_broadcast.remote() for engine in self.engines])


def connect(group: LearnerGroup, policy: Any, model: Any, config: Any) -> WeightSync:
    """Choose how an agent's rollout copy gets new weights, and connect the two sides.

    Args:
        group: The agent's learner group.
        policy: The agent's policy (an :class:`EnginePolicy`, or an HF policy over ``model``).
        model: The driver's rollout copy (``None`` when engines act).
        config: The run's settings (``weight_sync``, ``weight_sync_bucket_mb``).
    """
    if not isinstance(policy, EnginePolicy):
        return DriverCopySync(group, model)
    ray = import_ray()
    engines = policy.engines
    rank_gpus = group.gpus()
    mode, homes = weight_sync.choose_mode(
        config.weight_sync, rank_gpus, ray.get([engine.gpu.remote() for engine in engines])
    )
    logger.info("agent %s: weights reach its engines by %s", group.agent, mode)
    if mode == "object_store":
        return ObjectStoreSync(group, policy)
    bucket_bytes = int(config.weight_sync_bucket_mb * 2**20)
    buckets = group.plan_sync(policy.dtype, bucket_bytes)
    if mode == "cuda_ipc":
        sync = CudaIpcSync(group, [[] for _ in group.ranks])
        handles = {rank: group.share_buffer(rank) for rank in set(homes)}
        for engine, rank in zip(engines, homes):
            sync.engines_by_rank[rank].append(engine)
        ray.get(
            [
                engine.prepare_sync.remote(buckets, handles[rank])
                for engine, rank in zip(engines, homes)
            ]
        )
        return sync
    address = group.channel_address()
    world = 1 + len(engines)
    backend = "nccl" if rank_gpus[0] is not None else "gloo"
    # Every member joins at once: the group forms when all are there.
    ray.get(
        [group.start_join_channel(address, world, backend)]
        + [
            engine.prepare_sync.remote(buckets, None, (address, 1 + index, world, backend))
            for index, engine in enumerate(engines)
        ]
    )
    return BroadcastSync(group, engines)
