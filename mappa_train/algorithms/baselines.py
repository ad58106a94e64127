"""Former home of the group baselines, kept so existing imports keep working.

GRPO is in :mod:`mappa_train.algorithms.grpo`, RLOO in :mod:`mappa_train.algorithms.rloo`,
their shared pieces in :mod:`mappa_train.algorithms.groups`.
"""

from __future__ import annotations

from mappa_train.algorithms.groups import broadcast_to_tokens
from mappa_train.algorithms.grpo import grpo_advantages
from mappa_train.algorithms.rloo import rloo_advantages

__all__ = ["broadcast_to_tokens", "grpo_advantages", "rloo_advantages"]
