"""DSBench's coach-audit actions: moved to :mod:`mappa_env.envs.dsbench.audit`.

Its names are re-exported here for one release.
"""

from __future__ import annotations

from mappa_env.envs.dsbench.audit import (
    audit_actions,
    junk_pickle_injector,
    submission_header_injector,
)

__all__ = [
    "audit_actions",
    "junk_pickle_injector",
    "submission_header_injector",
]
