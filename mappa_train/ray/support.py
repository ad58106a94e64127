"""Ray for the driver: the import with the install hint, and the collective timeout.

Needs the ``distributed`` extra (``pip install 'mappa-rl[distributed]'``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["COLLECTIVE_TIMEOUT_S", "import_ray"]

#: How long a collective may wait for the other ranks before the group fails (a rank
#: that died would otherwise hang the others forever).
COLLECTIVE_TIMEOUT_S = 600.0


def import_ray() -> Any:
    """The ``ray`` module, or an error naming the extra to install."""
    from mappa_env._optional import require

    return require("ray", "distributed", purpose="distributed: ray")
