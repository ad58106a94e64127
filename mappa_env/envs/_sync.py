"""The loop behind the environments' synchronous API (``reset``, ``step``, ``close``).

Each environment owns one :class:`SyncRunner`: a :class:`~mappa_env._async.BackgroundLoop`
whose single loop keeps the episode's loop-bound state between calls, whether the caller
runs an event loop (a notebook cell) or not. It is kept as a name of its own only for the
environments that import it.
"""

from __future__ import annotations

from mappa_env._async import BackgroundLoop


class SyncRunner(BackgroundLoop):
    """A :class:`~mappa_env._async.BackgroundLoop` whose thread is named for environments."""

    def __init__(self) -> None:
        super().__init__(name="mappa-env-sync")
