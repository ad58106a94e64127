"""Seeds derived from names: stable across processes and Python's hash randomisation."""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from ``parts`` (independent of Python's hash randomisation).

    ``int.from_bytes(sha256(repr(parts))[:4], "little") & 0x7FFFFFFF``.
    """
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
