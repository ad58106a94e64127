"""mappa_train: policy-gradient algorithms and the per-agent trainer.

``Trainer`` is imported on first use (it pulls in torch and transformers); the config
and the advantage-estimator registry are light.
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
    from mappa_train.trainer import Trainer

__all__ = [
    "AdvantageEstimator",
    "AgentAdvantages",
    "AgentBatch",
    "TrainConfig",
    "Trainer",
    "estimator_names",
    "get_estimator",
    "register_estimator",
    "unregister_estimator",
]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from mappa_train.trainer import Trainer

        return Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
