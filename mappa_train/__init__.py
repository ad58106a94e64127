"""mappa_train: policy-gradient algorithms and the per-agent trainer.

``Trainer``, ``make_trainer`` and ``RayTrainer`` are imported on first use (they pull
in torch and transformers); the config and the advantage-estimator registry are light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mappa_train.algorithms.registry import (
    AdvantageEstimator,
    AgentAdvantages,
    AgentBatch,
    estimator_names,
    get_estimator,
    register_estimator,
    unregister_estimator,
)
from mappa_train.config import TrainConfig

if TYPE_CHECKING:
    from mappa_train.ray.trainer import RayTrainer
    from mappa_train.trainer import Trainer, make_trainer

__all__ = [
    "AdvantageEstimator",
    "AgentAdvantages",
    "AgentBatch",
    "RayTrainer",
    "TrainConfig",
    "Trainer",
    "estimator_names",
    "get_estimator",
    "make_trainer",
    "register_estimator",
    "unregister_estimator",
]


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "make_trainer"):
        from mappa_train import trainer

        return getattr(trainer, name)
    if name == "RayTrainer":
        from mappa_train.ray.trainer import RayTrainer

        return RayTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
