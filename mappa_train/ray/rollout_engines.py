"""Rollout engines on Ray: an agent's acting copies in actors, and their driver-side policy.

With ``engines_per_agent > 0`` each trained agent acts through engine actors (an HF
model, or a vLLM engine with ``rollout_engine: vllm``) instead of a copy in the driver;
:class:`EnginePolicy` is the :class:`~mappa_agents.policy.Policy` the driver's rollouts
call, spreading batches over the agent's engines. The engines receive new weights as the
agent's weight sync says (:mod:`mappa_train.ray.sync_modes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mappa_train.ray import weight_sync
from mappa_train.ray.placement import actor_options, engine_bundle
from mappa_train.ray.support import COLLECTIVE_TIMEOUT_S, import_ray

__all__ = ["EnginePolicy", "RolloutEngine", "start_engines"]


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
            self._dtype = str(import_ray().get(self.engines[0].dtype.remote()))
        return self._dtype

    def _engine(self) -> Any:
        engine = self.engines[self._next % len(self.engines)]
        self._next += 1
        return engine

    def generate(self, batch: Sequence[Any], params: Any) -> list[Any]:
        """Generate on the next engine (blocking)."""
        ray = import_ray()
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
        import_ray().get(self.start_loading(weights_ref))

    def close(self) -> None:
        """End the engine actors."""
        ray = import_ray()
        for engine in self.engines:
            ray.kill(engine)
        self.engines = []


def start_engines(
    weights: str, source: str, name: str, tokenizer: Any, config: Any, placement: Any
) -> EnginePolicy:
    """Start ``config.engines_per_agent`` engine actors of one agent; their policy.

    Args:
        weights: Where the weights to act with are (a checkpoint or the source).
        source: The agent's source model (its tokenizer).
        name: The policy's name.
        tokenizer: The agent's tokenizer (its padding id).
        config: The run's settings.
        placement: The run's placement group (``None`` on CPU).
    """
    ray = import_ray()
    settings = ray.put(config.to_dict())
    engines = []
    for index in range(config.engines_per_agent):
        bundle = engine_bundle(config, index)
        engine = (
            ray.remote(RolloutEngine)
            .options(**actor_options(placement, bundle, config.gpus_per_engine))
            .remote(weights, source, name, settings)
        )
        engines.append(engine)
        if config.rollout_engine == "vllm" and placement is not None:
            # vLLM sizes its KV cache from the GPU memory it finds free while it
            # starts: on a shared GPU nothing else may start beside it meanwhile.
            ray.get(engine.dtype.remote())
    pad = tokenizer.pad_token_id
    return EnginePolicy(engines, name, pad if pad is not None else tokenizer.eos_token_id)
