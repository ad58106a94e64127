"""``"module:attribute"`` paths, resolved in one place.

The registries of coaches, credit modes and advantage estimators accept such a path to
name a thing without importing it until it is used.
"""

from __future__ import annotations

import importlib
from typing import Any


def split_import_path(path: str, what: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``path``.

    Args:
        path: ``"module:attribute"``.
        what: What the path names, as the error says it (e.g. ``"a coach"``).

    Raises:
        ValueError: When ``path`` is not of that form.
    """
    module_name, separator, attribute = path.partition(":")
    if not separator or not module_name or not attribute:
        raise ValueError(f"{what} path is 'module:attribute', got {path!r}")
    return module_name, attribute


def load_import_path(path: str, what: str) -> Any:
    """Import ``path``'s module and return its attribute (see :func:`split_import_path`)."""
    module_name, attribute = split_import_path(path, what)
    return getattr(importlib.import_module(module_name), attribute)
