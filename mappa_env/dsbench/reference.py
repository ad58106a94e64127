"""DSBench reference actions: moved to :mod:`mappa_env.envs.dsbench.reference`.

Its names are re-exported here for one release.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.reference import (
    analyst_action,
    engineer_action,
    modeler_action,
    reference_script,
)

__all__ = [
    "analyst_action",
    "engineer_action",
    "modeler_action",
    "reference_script",
]
