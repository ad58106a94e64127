"""Distributed training on Ray: :func:`RayTrainer` and the names it is made of.

Training on Ray is the same loop (:class:`~mappa_train.trainer.Trainer`) with the Ray
backend's learners (:class:`~mappa_train.ray.backend.RayBackend`): ``distributed: ray`` in
the config picks it, as ``make_trainer(config)`` or ``Trainer(config)`` do. The pieces
live in modules of their own, importable from here too: learner ranks
(:mod:`mappa_train.ray.learner_rank`), groups (:mod:`mappa_train.ray.group`), rollout
engines (:mod:`mappa_train.ray.rollout_engines`), placement (:mod:`mappa_train.ray.placement`)
and weight sync (:mod:`mappa_train.ray.sync_modes`, :mod:`mappa_train.ray.weight_sync`).
"""

from __future__ import annotations

from mappa_train.config import TrainConfig
from mappa_train.environments import EnvFactory
from mappa_train.ray.backend import RayBackend
from mappa_train.ray.group import LearnerGroup
from mappa_train.ray.learner import RayLearner
from mappa_train.ray.learner_rank import LearnerRank, TokenRow, token_rows
from mappa_train.ray.placement import agents_at_once, engine_bundle, placement_bundles
from mappa_train.ray.rollout_engines import EnginePolicy, RolloutEngine
from mappa_train.trainer import Trainer

__all__ = [
    "EnginePolicy",
    "LearnerGroup",
    "LearnerRank",
    "RayBackend",
    "RayLearner",
    "RayTrainer",
    "RolloutEngine",
    "TokenRow",
    "agents_at_once",
    "engine_bundle",
    "placement_bundles",
    "token_rows",
]


def RayTrainer(
    config: TrainConfig,
    env_factory: EnvFactory | None = None,
    eval_env_factory: EnvFactory | None = None,
) -> Trainer:
    """A :class:`~mappa_train.trainer.Trainer` whose learners are on Ray.

    Args:
        config: The run's settings, with ``distributed: ray``; ``ranks_per_agent``,
            ``gpus_per_rank`` and ``ray_address`` place the learners. Ray is started (or
            joined) by :meth:`~mappa_train.trainer.Trainer.setup`.
        env_factory: As for :class:`~mappa_train.trainer.Trainer`.
        eval_env_factory: As for :class:`~mappa_train.trainer.Trainer`.

    Raises:
        ValueError: When the config does not ask for ``distributed: ray``.
    """
    if config.distributed != "ray":
        raise ValueError(
            f"RayTrainer runs distributed: 'ray', but the config asks for "
            f"{config.distributed!r}: build the trainer with "
            "mappa_train.trainer.make_trainer(config), which picks the learners"
        )
    return Trainer(config, env_factory, eval_env_factory, backend=RayBackend())
