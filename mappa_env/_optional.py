"""Lazy imports of optional extras with an error that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

DISTRIBUTION = "mappa-rl"
"""The name mappa is installed under (``pip install mappa-rl``); the import names are
``mappa_env``, ``mappa_agents`` and ``mappa_train``."""


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message names the extra that provides it."""


def require(module: str, extra: str, *, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise an error naming the ``mappa`` extra that installs it.

    Args:
        module: Importable module name, e.g. ``"litellm"``.
        extra: Name of the ``mappa`` extra that provides it, e.g. ``"llm"``.
        purpose: What the caller needed it for, shown in the error.

    Returns:
        The imported module.

    Raises:
        MissingExtraError: If the module cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f" for {purpose}" if purpose else ""
        raise MissingExtraError(
            f"{module!r} is needed{why} but is not installed. "
            f"Install it with: pip install '{DISTRIBUTION}[{extra}]'"
        ) from exc
