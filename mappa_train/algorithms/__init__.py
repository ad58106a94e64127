"""Policy-gradient pieces: credit assignment and advantage estimators (a registry of them).

``reinforce_pp`` (:mod:`.reinforce_pp`, the paper), ``grpo`` (:mod:`.grpo`) and ``rloo``
(:mod:`.rloo`) are registered by name; :func:`register_estimator` adds your own. Importing
this package does not import torch (the built-ins load on first use).
"""

from mappa_train.algorithms.registry import (
    AdvantageEstimator,
    AgentAdvantages,
    AgentBatch,
    EstimateFn,
    estimator_names,
    get_estimator,
    register_estimator,
    unregister_estimator,
)

__all__ = [
    "AdvantageEstimator",
    "AgentAdvantages",
    "AgentBatch",
    "EstimateFn",
    "estimator_names",
    "get_estimator",
    "register_estimator",
    "unregister_estimator",
]
