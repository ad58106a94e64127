"""The seam between the training loop and whatever trains the agents' weights.

The loop (:class:`~mappa_train.trainer.Trainer`) holds one :class:`Learner` per trained
agent and only ever calls the methods below; it never asks which kind it holds. A
:class:`Backend` builds those learners once per run. Two backends ship:

- :class:`~mappa_train.local_backend.LocalBackend` (``distributed: none``): every agent's
  model, frozen reference and AdamW in this process
  (:class:`~mappa_train.local_learner.LocalLearner`).
- :class:`~mappa_train.ray.backend.RayBackend` (``distributed: ray``): every agent's
  learner is a group of Ray actors sharding it with FSDP2, its rollout copy in the driver
  or on engine actors (:class:`~mappa_train.ray.learner.RayLearner`).

A new backend (several nodes, LoRA on Ray, an asynchronous pipeline) is one module with
a learner class and a backend class, given to the trainer as ``Trainer(config,
backend=MyBackend())``; the loop does not change.

The learner's methods that do work *start* it and return a :class:`Pending`: the loop
starts every agent's work before it waits for any, so learners that live in other
processes work at once, while a learner in this process simply finishes before it
returns (:class:`Done`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from mappa_train.rows import TokenRows

if TYPE_CHECKING:
    import torch

    from mappa_train.config import TrainConfig
    from mappa_train.update import PreparedRows

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

__all__ = ["Backend", "Done", "Learner", "Pending", "RunSpec", "Started", "TokenRows"]


class Pending(Protocol[T_co]):
    """Work a learner has started; :meth:`result` waits for it."""

    def result(self) -> T_co:
        """The work's result, once it is done (raising the work's error, if any)."""
        ...


@dataclass
class Done(Generic[T]):
    """Work that was finished before it was handed back (a learner in this process)."""

    value: T
    """The result."""

    def result(self) -> T:
        """The result (nothing to wait for)."""
        return self.value


class Learner(Protocol):
    """Everything that trains one agent, wherever its weights live."""

    agent: str
    """The agent's id."""

    tokenizer: Any
    """The agent's tokenizer (saved beside its checkpointed weights)."""

    @property
    def rollout_policy(self) -> Any:
        """The :class:`~mappa_agents.policy.Policy` the agent acts through in rollouts."""
        ...

    def start_logprobs(
        self, rows: Sequence[TokenRows], *, old: bool = True
    ) -> Pending[tuple[torch.Tensor | None, torch.Tensor]]:
        """Start scoring ``rows``: log-probs ``[N, T]`` (CPU) under the policy and the reference.

        Args:
            rows: The agent's usable actions of the step.
            old: Score under the policy too; ``False`` skips that pass and answers
                ``None`` in its place (the trainer decides, with
                :func:`~mappa_train.update.needs_old_logprobs`).
        """
        ...

    def start_update(
        self, prep: PreparedRows, *, step: int, lr: float, kl_in_loss: bool
    ) -> Pending[dict[str, float]]:
        """Start one PPO-clipped pass on prepared rows; its statistics.

        See :func:`mappa_train.update.update_agent` for the pass and the statistics.

        Args:
            prep: The agent's rows with old (or ``None``: see
                :func:`~mappa_train.update.update_agent`) and reference log-probs and
                advantages.
            step: The step being trained (seeds the mini-batch shuffle).
            lr: The step's learning rate.
            kl_in_loss: Add the KL penalty to the loss (estimators that keep it out of
                the reward).
        """
        ...

    def start_sync(self) -> Pending[None]:
        """Start giving the agent's rollout engines its current weights (if it has any)."""
        ...

    def save(self, directory: Path) -> None:
        """Write the agent's checkpoint state into ``directory`` (``agents/<agent>/``).

        Weights loadable by transformers (or the agent's LoRA adapter, loadable by peft),
        the tokenizer, and ``optimizer.pt`` (see :mod:`mappa_train.checkpoint`).
        """
        ...

    def close(self) -> None:
        """Release what the learner holds outside the driver's memory (engines, actors)."""
        ...


@dataclass(frozen=True)
class RunSpec:
    """What a backend is told about the run when it builds the learners."""

    config: TrainConfig
    """The run's settings."""
    agents: list[str]
    """Every agent of the environment, in its order."""
    trained_agents: list[str]
    """The agents to build learners for (the others are frozen)."""
    specs: dict[str, str]
    """Each agent's model spec (``system``)."""
    device: str
    """The driver's device (``"cpu"``, ``"cuda:0"``)."""
    dtype: torch.dtype
    """The compute dtype."""
    master_weights: bool
    """Whether optimizers keep float32 master weights of bf16 models."""
    compiles_decoding: bool
    """Whether HF policies in the driver decode with CUDA graphs."""
    resume_from: Path | None = None
    """The checkpoint to resume from (``None``: a fresh run)."""


@dataclass
class Started:
    """What a backend built: the learners, and any frozen policies it made on the way."""

    learners: dict[str, Learner]
    """Per trained agent, its learner."""
    frozen: dict[str, Any] = field(default_factory=dict)
    """Policies of frozen agents the backend made itself (e.g. LoRA adapters of the
    shared base); the trainer loads the other frozen agents."""


class Backend(Protocol):
    """Builds a run's learners and owns what they share (a cluster, a placement)."""

    def start(self, run: RunSpec) -> Started:
        """Build every trained agent's learner, restoring its optimizer when resuming."""
        ...

    def open_engines(self) -> None:
        """Start rollout engines that must start after the run's generators are restored."""
        ...

    def close(self) -> None:
        """Release what the learners share (after each learner's :meth:`Learner.close`)."""
        ...
