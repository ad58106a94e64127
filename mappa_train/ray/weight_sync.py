"""Weight sync between a learner group and its rollout engines, in buckets.

After each update the engines of an agent must act with the group's new weights. The
Ray trainer has three ways to get them there (``weight_sync`` in the config):

- ``object_store``: rank 0 gathers the whole state dict on its CPU and every engine
  reads it from Ray's object store. Works everywhere; every byte goes through host
  memory and a pickle.
- ``cuda_ipc``: for an engine on the same GPU as one of the group's ranks (colocated
  placement). The rank packs the weights, in the engines' dtype, into a buffer on that
  GPU whose CUDA IPC handle the engine opened once; per bucket the engine copies from
  it. Nothing leaves the GPU.
- ``broadcast``: rank 0 and the engines form a separate process group (NCCL on GPUs,
  gloo on CPU) and rank 0 broadcasts each packed bucket. For engines on other GPUs
  (split placement), where NCCL cannot have two ranks on one device.

Whichever way, the weights travel as *buckets*: the state dict's tensors laid out back
to back (each at a 64-byte aligned offset) in one flat byte buffer of at most
``weight_sync_bucket_mb``, so a sending rank and an HF engine need one bucket of extra
memory, not a whole model, and each bucket is one copy or one collective. (A vLLM
engine keeps copies of a sync's buckets before the last one in host memory until it
reloads: with a model larger than a bucket, up to one more copy of the model.) The
layout is computed once (the names, shapes and dtypes do not change during a run) and
shared by both sides.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mappa_train.config import WEIGHT_SYNC_MODES

T = TypeVar("T")

#: Byte alignment of every tensor in a bucket (any dtype's element size divides it).
ALIGNMENT = 64


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in a bucket."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    """Byte offset in the bucket (a multiple of :data:`ALIGNMENT`)."""

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes."""
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def plan_buckets(
    tensors: Iterable[tuple[str, Sequence[int], torch.dtype]], bucket_bytes: int
) -> list[list[Slot]]:
    """Lay tensors out in buckets of at most ``bucket_bytes`` each, in the given order.

    Greedy: a tensor goes into the current bucket if it fits, else starts the next one.
    A tensor larger than ``bucket_bytes`` gets a bucket of its own (of its size).

    Args:
        tensors: ``(name, shape, dtype)`` of every tensor to send, in sending order.
        bucket_bytes: The most bytes a bucket holds (> 0).

    Returns:
        The buckets, each a list of slots with offsets from the bucket's start.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[Slot]] = []
    current: list[Slot] = []
    used = 0
    for name, shape, dtype in tensors:
        slot = Slot(name, tuple(int(d) for d in shape), dtype, 0)
        offset = _aligned(used)
        if current and offset + slot.nbytes > bucket_bytes:
            buckets.append(current)
            current, offset = [], 0
        current.append(Slot(slot.name, slot.shape, slot.dtype, offset))
        used = offset + slot.nbytes
    if current:
        buckets.append(current)
    return buckets


def without_tied_copies(state: Mapping[str, T], model: torch.nn.Module) -> dict[str, T]:
    """``state`` without the second names of tied weights, in its order.

    A model whose output head reuses its input embedding lists that one tensor under
    both names in its state dict; sending it once is enough, since every engine builds
    the same model and ties it the same way. Which names are copies is read from the
    model's structure (the names ``named_parameters`` lists only when asked to keep
    duplicates), so every rank of a group drops the same ones, and a name that is no
    such copy is always kept.
    """
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    copies = every - {name for name, _ in model.named_parameters()}
    return {name: value for name, value in state.items() if name not in copies}


def bucket_size(slots: Sequence[Slot]) -> int:
    """Bytes a bucket's tensors span (its last slot's end)."""
    return max((s.offset + s.nbytes for s in slots), default=0)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def slot_view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The tensor of ``slot`` as a view into a flat ``uint8`` ``buffer`` (no copy)."""
    return buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)


def pack_bucket(
    buffer: torch.Tensor, slots: Sequence[Slot], tensors: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """Copy ``tensors`` (by name, cast to each slot's dtype) into ``buffer``.

    Returns:
        The part of ``buffer`` the bucket spans.
    """
    for slot in slots:
        slot_view(buffer, slot).copy_(tensors[slot.name])
    return buffer[: bucket_size(slots)]


def unpack_bucket(buffer: torch.Tensor, slots: Sequence[Slot]) -> list[tuple[str, torch.Tensor]]:
    """``(name, view)`` of every tensor of a bucket in ``buffer`` (views, not copies)."""
    return [(slot.name, slot_view(buffer, slot)) for slot in slots]


def choose_mode(
    mode: str, rank_gpus: Sequence[str | None], engine_gpus: Sequence[str | None]
) -> tuple[str, list[int]]:
    """How a group sends weights to its engines, and which rank serves each engine.

    Args:
        mode: The config's ``weight_sync`` (one of :data:`WEIGHT_SYNC_MODES`).
        rank_gpus: The GPU (a UUID) of each rank of the group, ``None`` on CPU.
        engine_gpus: The GPU of each engine of the agent, ``None`` on CPU.

    Returns:
        The mode used, and per engine the rank that sends to it (for ``cuda_ipc`` the
        rank on its GPU; otherwise rank 0).

    ``auto`` takes ``cuda_ipc`` when every engine shares a GPU with a rank of the group,
    ``broadcast`` when no engine does and no two engines share one (NCCL cannot join
    two members on one device), else and on CPU ``object_store``.

    Raises:
        ValueError: ``cuda_ipc`` asked for where an engine shares no GPU with a rank,
            or the learners or engines are not on GPUs.
    """
    if mode not in WEIGHT_SYNC_MODES:
        raise ValueError(f"weight_sync must be one of {WEIGHT_SYNC_MODES}, got {mode!r}")
    on_gpus = all(g is not None for g in (*rank_gpus, *engine_gpus))
    home = [rank_gpus.index(g) if g in rank_gpus else None for g in engine_gpus]
    # NCCL refuses two members on one GPU: no engine on rank 0's, no two on one.
    nccl_clash = rank_gpus[0] in engine_gpus or len(set(engine_gpus)) < len(engine_gpus)
    if mode == "auto":
        if not on_gpus or not engine_gpus:
            mode = "object_store"
        elif all(r is not None for r in home):
            mode = "cuda_ipc"
        elif all(r is None for r in home) and not nccl_clash:
            mode = "broadcast"
        else:
            mode = "object_store"
    if mode == "cuda_ipc":
        if not on_gpus:
            raise ValueError(
                "weight_sync: cuda_ipc needs the learners and engines on GPUs; use "
                "object_store or broadcast on CPU"
            )
        apart = [e for e, r in enumerate(home) if r is None]
        if apart:
            raise ValueError(
                f"weight_sync: cuda_ipc, but engines {apart} share no GPU with a rank of "
                "their group: colocate them (gpus_per_engine and gpus_per_rank that fit "
                "one GPU) or use weight_sync: broadcast or auto"
            )
        return mode, [int(r) for r in home]  # type: ignore[arg-type]
    on_cpus = all(g is None for g in (*rank_gpus, *engine_gpus))
    if mode == "broadcast" and not (on_gpus or on_cpus):
        raise ValueError(
            "weight_sync: broadcast needs the learners and engines all on GPUs (NCCL) or "
            "all on CPUs (gloo), and some are on each: use object_store or auto"
        )
    if mode == "broadcast" and on_gpus and nccl_clash:
        raise ValueError(
            "weight_sync: broadcast over NCCL, but an engine shares a GPU with its group's "
            "rank 0 or with another engine (NCCL refuses two members on one device): use "
            "cuda_ipc, object_store or auto"
        )
    return mode, [0] * len(engine_gpus)


def open_channel(address: str, rank: int, world: int, backend: str, timeout_s: float) -> Any:
    """A process group of its own between a group's rank 0 and engines (for broadcasts).

    Apart from torch's default group (a rank's default group is its learner group):
    built from a ``TCPStore`` that rank 0 hosts at ``address`` (``tcp://host:port``).

    Args:
        address: Rank 0's ``tcp://host:port``.
        rank: 0 for the learner rank, 1.. for the engines.
        world: 1 + the number of engines.
        backend: ``"nccl"`` (CUDA tensors) or ``"gloo"`` (CPU tensors).
        timeout_s: How long a member waits for the others (a dead one fails the rest).
    """
    import torch.distributed as dist

    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout)
    store = dist.PrefixStore("mappa-weight-sync", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, options)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")


def broadcast(channel: Any, tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from the channel's rank 0 into every member's.

    Returns once what follows on this device is ordered after it: gloo blocks the
    host, NCCL the current CUDA stream (synchronize it to wait for the data itself).
    """
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    channel.broadcast([tensor], options).wait()


def share_cuda_buffer(buffer: torch.Tensor) -> dict[str, Any]:
    """A picklable handle another process on the same GPU opens with :func:`open_cuda_buffer`.

    Through torch's own CUDA IPC reduction (what ``torch.multiprocessing`` sends); the
    GPU is named by its UUID, since device indices differ between processes.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(buffer)
    return {
        "rebuild": rebuild,
        "args": args,
        "gpu": str(torch.cuda.get_device_properties(buffer.device).uuid),
    }


#: Where torch's CUDA tensor rebuild takes the sender's device index.
_DEVICE_ARG = 6


def open_cuda_buffer(handle: Mapping[str, Any]) -> torch.Tensor:
    """The buffer behind a :func:`share_cuda_buffer` handle, mapped into this process.

    Raises:
        ValueError: This process sees no GPU with the buffer's UUID.
    """
    count = torch.cuda.device_count()
    uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
    if handle["gpu"] not in uuids:
        raise ValueError(
            f"the weights' buffer is on GPU {handle['gpu']}, which this process does not "
            f"see (it sees {uuids}): CUDA IPC needs the engine on its rank's GPU"
        )
    args = list(handle["args"])
    args[_DEVICE_ARG] = uuids.index(handle["gpu"])
    return handle["rebuild"](*args)


def gpu_uuid() -> str | None:
    """This process's current GPU as a UUID, or ``None`` without CUDA."""
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
