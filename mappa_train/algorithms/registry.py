r"""Advantage estimators as plug-ins: a name -> estimator registry the trainer looks up.

An estimator turns every agent's prepared actions of a step into per-token advantages,
all agents at once (REINFORCE++ may whiten across agents). The trainer then runs the
same PPO-clipped update on them whatever the estimator. Write one as a function::

    @register_estimator("my_estimator")
    def my_estimator(batches, config):
        return {agent: AgentAdvantages(...) for agent, batch in batches.items()}

and select it with ``TrainConfig(advantage_estimator="my_estimator")``. The built-in
estimators (``reinforce_pp``, ``grpo``, ``rloo``) are registered by import path and
loaded on first use, so listing names and validating a config import no torch.

This module imports nothing heavy: ``Tensor`` appears in annotations only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

from mappa_env.errors import SettingsError

if TYPE_CHECKING:
    from torch import Tensor

    from mappa_train.config import TrainConfig


@dataclass(frozen=True)
class AgentBatch:
    """One agent's usable actions of a step, as an estimator receives them (CPU tensors).

    Rows are actions, columns response tokens, right-padded to the longest response of
    the agent's batch (``T`` differs between agents).

    Attributes:
        rewards: ``[N]`` scalar reward of each action (after credit assignment).
        old_logprobs: ``[N, T]`` log-probs of the sampled tokens under the policy that
            sampled them (at the rollout temperature); ``None`` for an estimator
            registered with ``uses_old_logprobs=False``, whatever
            ``TrainConfig.old_logprob_pass`` says (the trainer may then skip the pass
            that computes them, and never fills them with anything else).
        ref_logprobs: ``[N, T]`` the same under the frozen reference model.
        mask: ``[N, T]`` 1.0 on valid response tokens, 0.0 on padding.
        group_keys: ``N`` hashable keys, equal for actions of the same prompt (the
            prompt's token ids as a tuple): what group baselines compare within.
    """

    rewards: Tensor
    old_logprobs: Tensor | None
    ref_logprobs: Tensor
    mask: Tensor
    group_keys: Sequence[Hashable]


@dataclass
class AgentAdvantages:
    """An estimator's answer for one agent.

    Attributes:
        advantages: ``[N, T]`` per-token advantages, the shape of the agent's ``mask``
            (padding positions are ignored by the loss).
        stats: Diagnostics logged as ``<agent>/<key>`` (e.g. ``group_singletons``).
    """

    advantages: Tensor
    stats: dict[str, float] = field(default_factory=dict)


EstimateFn = Callable[[Mapping[str, AgentBatch], "TrainConfig"], Mapping[str, AgentAdvantages]]
"""``(batches, config) -> advantages``: agent -> batch in, agent -> advantages out."""


@dataclass(frozen=True)
class AdvantageEstimator:
    """An advantage estimator: the function, where it wants the KL penalty, what it reads.

    Attributes:
        estimate: ``(batches, config) -> {agent: AgentAdvantages}``. ``batches`` holds
            every agent with at least one usable action this step; the answer must have
            an entry for each of them. ``config`` is the run's
            :class:`~mappa_train.config.TrainConfig` (``kl_coef``, ``kl_estimator``,
            ``gamma``, ``normalize_scope``, ...).
        kl_in_reward: ``True`` when ``estimate`` folds the KL penalty to the reference
            into the advantages itself (REINFORCE++'s token rewards); ``False`` makes
            the trainer add ``kl_coef * KL`` to the loss instead (GRPO, RLOO).
        name: The name it was registered under (set by :func:`register_estimator`).
        uses_old_logprobs: Whether ``estimate`` reads :attr:`AgentBatch.old_logprobs`
            (``True``, the safe default: REINFORCE++ folds ``KL(old, ref)`` into its
            token rewards). ``False`` promises it does not (GRPO and RLOO read rewards,
            mask and group keys only): it then gets ``old_logprobs=None``, and when an
            agent's batch is one optimizer step the trainer skips the no-grad pass that
            computes them (see ``TrainConfig.old_logprob_pass``).
    """

    estimate: EstimateFn
    kl_in_reward: bool = False
    name: str = ""
    uses_old_logprobs: bool = True

    def __call__(
        self, batches: Mapping[str, AgentBatch], config: TrainConfig
    ) -> Mapping[str, AgentAdvantages]:
        """Run :attr:`estimate`."""
        return self.estimate(batches, config)


_Entry = AdvantageEstimator | str

# The registry itself (like Gymnasium's): name -> estimator, or "module:attribute" of one
# that is imported on first use.
_ESTIMATORS: dict[str, _Entry] = {
    "reinforce_pp": "mappa_train.algorithms.reinforce_pp:REINFORCE_PP",
    "grpo": "mappa_train.algorithms.grpo:GRPO",
    "rloo": "mappa_train.algorithms.rloo:RLOO",
}


@overload
def register_estimator(
    name: str,
    estimator: None = None,
    *,
    kl_in_reward: bool | None = None,
    uses_old_logprobs: bool | None = None,
    replace: bool = False,
) -> Callable[[EstimateFn], AdvantageEstimator]: ...


@overload
def register_estimator(
    name: str,
    estimator: AdvantageEstimator | EstimateFn | str,
    *,
    kl_in_reward: bool | None = None,
    uses_old_logprobs: bool | None = None,
    replace: bool = False,
) -> AdvantageEstimator | str: ...


def register_estimator(
    name: str,
    estimator: AdvantageEstimator | EstimateFn | str | None = None,
    *,
    kl_in_reward: bool | None = None,
    uses_old_logprobs: bool | None = None,
    replace: bool = False,
) -> AdvantageEstimator | str | Callable[[EstimateFn], AdvantageEstimator]:
    """Register an advantage estimator under ``name``; also usable as a decorator.

    Examples:
        ``register_estimator("mine", my_fn)``, ``register_estimator("mine",
        AdvantageEstimator(my_fn, kl_in_reward=True))``, ``register_estimator("mine",
        "my_package.estimators:MINE")`` (imported on first use), or::

            @register_estimator("mine")
            def my_fn(batches, config): ...

    Args:
        name: What ``TrainConfig.advantage_estimator`` (``--advantage-estimator``) selects.
        estimator: An :class:`AdvantageEstimator`, a plain ``estimate`` function, or the
            ``"module:attribute"`` path of an :class:`AdvantageEstimator`. ``None``
            returns a decorator for a function.
        kl_in_reward: For a function: whether it folds the KL penalty into its
            advantages (default ``False``: the trainer adds ``kl_coef * KL`` to the
            loss). Not allowed with an :class:`AdvantageEstimator` or a path, which
            carry their own.
        uses_old_logprobs: For a function: whether it reads ``batch.old_logprobs``
            (default ``True``; ``False`` lets the trainer skip the old-log-prob pass,
            see :attr:`AdvantageEstimator.uses_old_logprobs`). Not allowed with an
            :class:`AdvantageEstimator` or a path either.
        replace: Allow replacing an estimator already registered under ``name``.

    Returns:
        The registered estimator (the path for a path); the decorator form returns the
        :class:`AdvantageEstimator` wrapping the decorated function.

    Raises:
        ValueError: When ``name`` is taken (and ``replace`` is false), empty, or a path
            is malformed, or ``kl_in_reward`` or ``uses_old_logprobs`` is given with an
            :class:`AdvantageEstimator` or a path.
        TypeError: When ``estimator`` is none of the accepted kinds.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"an estimator name must be a non-empty string, got {name!r}")
    if name in _ESTIMATORS and not replace:
        raise ValueError(
            f"an advantage estimator named {name!r} is already registered: pick another "
            "name, or pass replace=True to override it"
        )
    if estimator is None:

        def decorator(function: EstimateFn) -> AdvantageEstimator:
            return register_estimator(  # type: ignore[return-value]
                name,
                function,
                kl_in_reward=kl_in_reward,
                uses_old_logprobs=uses_old_logprobs,
                replace=replace,
            )

        return decorator
    entry: _Entry
    given = [
        option
        for option, value in (
            ("kl_in_reward", kl_in_reward),
            ("uses_old_logprobs", uses_old_logprobs),
        )
        if value is not None
    ]
    if isinstance(estimator, AdvantageEstimator):
        if given:
            raise ValueError(
                f"{given[0]} is set on the AdvantageEstimator itself; do not pass it again"
            )
        entry = dataclasses.replace(estimator, name=name)
    elif isinstance(estimator, str):
        if given:
            raise ValueError(f"{given[0]} is set on the AdvantageEstimator the path names")
        from mappa_env.import_paths import split_import_path

        split_import_path(estimator, "an estimator")
        entry = estimator
    elif callable(estimator):
        entry = AdvantageEstimator(
            estimator,
            bool(kl_in_reward),
            name,
            uses_old_logprobs=True if uses_old_logprobs is None else uses_old_logprobs,
        )
    else:
        raise TypeError(
            "an estimator is an AdvantageEstimator, a function (batches, config) -> "
            f"advantages, or a 'module:attribute' path; got {type(estimator).__name__}"
        )
    _ESTIMATORS[name] = entry
    return entry


def unregister_estimator(name: str) -> None:
    """Remove ``name`` from the registry (e.g. a test's estimator after the test).

    Raises:
        KeyError: When no estimator has that name.
    """
    if name not in _ESTIMATORS:
        raise KeyError(f"no advantage estimator named {name!r}; registered: {estimator_names()}")
    del _ESTIMATORS[name]


def estimator_names() -> tuple[str, ...]:
    """Names of the registered advantage estimators, sorted."""
    return tuple(sorted(_ESTIMATORS))


def get_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered under ``name`` (importing it on first use).

    Raises:
        ValueError: For an unknown name, listing the registered ones and how to add one.
        TypeError: When a registered path does not name an :class:`AdvantageEstimator`.
    """
    entry = _ESTIMATORS.get(name)
    if entry is None:
        raise SettingsError(
            f"unknown advantage estimator {name!r}; registered: {list(estimator_names())}. "
            "Register your own with mappa_train.register_estimator(name, fn) (or the "
            "@register_estimator(name) decorator) before building the TrainConfig."
        )
    if isinstance(entry, AdvantageEstimator):
        return entry
    # Imported here: a learner rank reads this registry's names and never a path.
    from mappa_env.import_paths import load_import_path

    loaded = load_import_path(entry, "an estimator")
    if not isinstance(loaded, AdvantageEstimator):
        raise TypeError(f"{entry!r} (estimator {name!r}) is not an AdvantageEstimator")
    estimator = dataclasses.replace(loaded, name=name)
    _ESTIMATORS[name] = estimator
    return estimator
