"""The driver's handle of one agent's ranks on Ray: :class:`LearnerGroup`.

Each method calls every rank (:class:`~mappa_train.ray.learner_rank.LearnerRank` actors)
at once and answers rank 0's result. :mod:`mappa_train.ray.learner` builds the trainer's
learner on it and :mod:`mappa_train.ray.sync_modes` sends its weights to the engines.
"""

from __future__ import annotations

from typing import Any

import torch

from mappa_train.ray import weight_sync
from mappa_train.ray.learner_rank import LearnerRank, TokenRow
from mappa_train.ray.placement import actor_options
from mappa_train.ray.support import import_ray
from mappa_train.update import PreparedRows

__all__ = ["LearnerGroup"]


class LearnerGroup:
    """The driver's handle of one agent's ranks: calls every rank, returns rank 0's answer.

    A rank's failure is raised by the call that waits for it (with its traceback). No
    timeout of its own: a rank that dies fails the call at once, and the others'
    collectives fail after ``COLLECTIVE_TIMEOUT_S`` instead of hanging.

    Args:
        agent: The agent's id.
        weights: Where the trained model's weights are (a checkpoint or the source).
        reference: The agent's source model (its frozen reference and tokenizer).
        config: The run's settings.
        optimizer_state: An ``optimizer.pt`` to resume from, or ``None``.
        placement: The run's placement group (``None`` on CPU).
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
        ray = import_ray()
        self.agent = agent
        self.world = config.ranks_per_agent
        self.ranks = [
            ray.remote(LearnerRank)
            .options(**actor_options(placement, rank, config.gpus_per_rank))
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
            self.kill()  # a group that cannot start holds no GPUs
            raise

    @staticmethod
    def _first(refs: list[Any]) -> Any:
        """Wait for every rank's part; rank 0's result."""
        return import_ray().get(refs)[0]

    def start_logprobs(self, rows: list[TokenRow], *, reference: bool) -> list[Any]:
        """Start scoring ``rows`` on every rank; their references, rank 0's first."""
        shared = import_ray().put(rows)  # put once, read by every rank
        return [handle.logprobs.remote(shared, reference) for handle in self.ranks]

    def logprobs(self, rows: list[TokenRow], *, reference: bool) -> torch.Tensor:
        """``[N, T]`` log-probs of ``rows`` under the model (or its reference)."""
        return self._first(self.start_logprobs(rows, reference=reference))

    def start_update(
        self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool
    ) -> list[Any]:
        """Start one PPO-clipped pass on every rank; their references, rank 0's first."""
        shared = import_ray().put(prep)
        return [handle.update.remote(shared, step, lr, kl_in_loss) for handle in self.ranks]

    def update(self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool) -> Any:
        """One PPO-clipped pass on the group; its statistics."""
        return self._first(self.start_update(prep, step=step, lr=lr, kl_in_loss=kl_in_loss))

    def gpu_ids(self) -> list[list[Any]]:
        """The GPUs Ray gave each rank."""
        return import_ray().get([handle.gpu_ids.remote() for handle in self.ranks])

    def weights(self) -> dict[str, torch.Tensor]:
        """The whole float32 weights (gathered by the ranks, sent by rank 0)."""
        return self._first([handle.weights.remote() for handle in self.ranks])

    def weight_refs(self, dtype: str | None = None) -> list[Any]:
        """Start gathering the whole weights; every rank's object-store reference.

        Does not wait: the first reference is rank 0's, which holds the weights (in
        ``dtype``, see :meth:`LearnerRank.weights`); the others hold ``None`` once their
        part of the gather is done, or raise their rank's error when read.
        """
        return [handle.weights.remote(dtype) for handle in self.ranks]

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW's whole state (gathered by the ranks, sent by rank 0)."""
        return self._first([handle.optimizer_state.remote() for handle in self.ranks])

    def gpus(self) -> list[str | None]:
        """The UUID of each rank's GPU (``None`` on CPU)."""
        return import_ray().get([handle.gpu.remote() for handle in self.ranks])

    def plan_sync(self, dtype: str, bucket_bytes: int) -> list[list[weight_sync.Slot]]:
        """Every rank's bucket plan for sending the weights in ``dtype`` (rank 0's)."""
        return self._first([handle.plan_sync.remote(dtype, bucket_bytes) for handle in self.ranks])

    def share_buffer(self, rank: int) -> dict[str, Any]:
        """The CUDA IPC handle of rank ``rank``'s send buffer."""
        return import_ray().get(self.ranks[rank].share_buffer.remote())

    def channel_address(self) -> str:
        """A ``tcp://host:port`` where rank 0 can host a broadcast group."""
        return import_ray().get(self.ranks[0].address.remote())

    def start_join_channel(self, address: str, world: int, backend: str) -> Any:
        """Start rank 0 hosting the broadcast group (it forms once the engines join too)."""
        return self.ranks[0].join_channel.remote(address, world, backend)

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
        return import_ray().get([handle.peak_memory.remote() for handle in self.ranks])

    def close(self) -> None:
        """Leave the group and end the actors (a second call does nothing)."""
        if not self.ranks:
            return
        try:
            self._first([handle.close.remote() for handle in self.ranks])
        finally:
            self.kill()

    def kill(self) -> None:
        """End the actors at once (no goodbye to the group)."""
        ray = import_ray()
        for handle in self.ranks:
            ray.kill(handle)
        self.ranks = []
