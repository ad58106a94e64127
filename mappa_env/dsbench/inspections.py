"""DSBench's inspection cache: moved to :mod:`mappa_env.envs.dsbench.inspections`.

Its names are re-exported here for one release.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.inspections import (
    MAX_HASHED_BYTES,
    SHARED_INSPECTIONS,
    InspectionCache,
    inspection_key,
)

__all__ = [
    "MAX_HASHED_BYTES",
    "SHARED_INSPECTIONS",
    "InspectionCache",
    "inspection_key",
]
