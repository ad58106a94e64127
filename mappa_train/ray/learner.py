"""An agent's learner on Ray: a group of FSDP2 ranks, driven from the trainer's process.

:class:`RayLearner` is the :class:`~mappa_train.learner.Learner` the trainer holds: the
agent's :class:`~mappa_train.ray.group.LearnerGroup` (the driver's handle of its ranks,
importable from here too), the agent's rollout copy (a model in the driver, or engine
actors) and how that copy gets new weights.

Checkpoints have the single-process layout (``agents/<agent>/`` with the weights, the
tokenizer and ``optimizer.pt``); the weights are the float32 masters and
``optimizer.pt`` holds the group's AdamW state as one full state dict, so a killed run
resumes exactly with the same number of ranks or any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mappa_train.learner import Done, TokenRows
from mappa_train.ray.group import LearnerGroup
from mappa_train.ray.learner_rank import TokenRow, token_rows
from mappa_train.ray.rollout_engines import EnginePolicy
from mappa_train.ray.support import import_ray
from mappa_train.ray.sync_modes import WeightSync
from mappa_train.update import PreparedRows

__all__ = ["LearnerGroup", "RayLearner", "RayPending", "TokenRow"]


@dataclass
class RayPending:
    """Work started on actors: ``result`` waits for every reference, then ``finish``."""

    refs: list[Any]
    """Object-store references to wait for."""
    finish: Callable[[list[Any]], Any] = lambda values: values[0]
    """Turns the references' values into the result (default: the first, rank 0's)."""

    def result(self) -> Any:
        """The result, once every reference is ready."""
        return self.finish(import_ray().get(self.refs))


@dataclass
class RayLearner:
    """A trained agent in the driver: its group, rollout copy and weight sync (a Learner)."""

    agent: str
    """The agent's id."""
    model: Any
    """The driver's rollout copy its policy acts with (``None`` when engines act)."""
    tokenizer: Any
    """The agent's tokenizer."""
    policy: Any
    """The policy the agent acts through: an HF policy over ``model``, or an
    :class:`~mappa_train.ray.rollout_engines.EnginePolicy`."""
    source: str
    """The agent's source model (its architecture, for saving the group's weights)."""
    group: LearnerGroup
    """The ranks that train it."""
    sync: WeightSync
    """How its rollout copy gets new weights (chosen once, :mod:`mappa_train.ray.sync_modes`)."""
    at_once: Callable[[], bool] = lambda: True
    """Whether agents' groups work at once (else each call waits before it returns)."""

    @property
    def rollout_policy(self) -> Any:
        """The policy the agent acts through."""
        return self.policy

    @property
    def weight_sync(self) -> str:
        """The name of the agent's weight sync (``object_store``, ``cuda_ipc``, ``broadcast``)."""
        return self.sync.name

    def _started(self, pending: RayPending) -> RayPending | Done[Any]:
        """``pending``, or its result already when the groups work one after another."""
        return pending if self.at_once() else Done(pending.result())

    def start_logprobs(self, rows: Sequence[TokenRows], *, old: bool = True) -> Any:
        """Start the group's old (unless ``old`` is false) and reference log-prob passes."""
        light = token_rows(rows)
        if not old:
            ref = RayPending(self.group.start_logprobs(light, reference=True))
            return self._started(RayPending(ref.refs, lambda values: (None, values[0])))
        policy = RayPending(self.group.start_logprobs(light, reference=False))
        if not self.at_once():
            policy_value = policy.result()
            ref_value = self.group.logprobs(light, reference=True)
            return Done((policy_value, ref_value))
        ref = RayPending(self.group.start_logprobs(light, reference=True))
        count = len(policy.refs)
        return RayPending(policy.refs + ref.refs, lambda values: (values[0], values[count]))

    def start_update(self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool) -> Any:
        """Start the group's PPO-clipped pass (rows travel as token ids only)."""
        light = dataclasses.replace(prep, samples=token_rows(prep.samples))
        refs = self.group.start_update(light, step=step, lr=lr, kl_in_loss=kl_in_loss)
        return self._started(RayPending(refs))

    def start_sync(self) -> Any:
        """Start sending the group's new weights to the rollout copy (see :attr:`sync`)."""
        return self.sync.start()

    def save(self, directory: Path) -> None:
        """The group's float32 weights, the tokenizer and the group's AdamW state."""
        from transformers import AutoConfig, AutoModelForCausalLM

        # Fetched here, not before: the driver holds one agent's weights at a time.
        weights = self.group.weights()
        # An empty model of the agent's architecture writes the weights in the layout
        # transformers loads (tied weights, shards); it holds none of its own.
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.source))
        model.save_pretrained(directory, state_dict=weights, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        torch.save(self.group.optimizer_state(), directory / "optimizer.pt")

    def close(self) -> None:
        """End the engines (if any) and the group."""
        try:
            if isinstance(self.policy, EnginePolicy):
                self.policy.close()
        finally:
            self.group.close()
