"""What ``mappa serve`` bounds, without the ``openenv`` extra (its flags' defaults).

:mod:`mappa_agents.openenv_server` serves with these; the command line reads their
defaults before that module (and openenv-core) is imported.
"""

from __future__ import annotations

import dataclasses

TOKEN_ENV = "MAPPA_SERVE_TOKEN"
"""Where ``mappa serve`` and
:class:`~mappa_agents.openenv_server.MappaEnvClient` read the token from."""


@dataclasses.dataclass(frozen=True)
class ServeLimits:
    """What clients can hold of a server: bounds that keep one client from starving others.

    Attributes:
        idle_timeout_s: A session whose client sends nothing for this long is closed
            (its environment and sandbox with it) and its slot freed.
        max_connections: Most open connections, HTTP and WebSocket; a connection over it
            is closed on arrival.
        max_body_bytes: Largest HTTP request body and WebSocket message; larger ones are
            refused (HTTP 413, WebSocket close 1009).
        keep_alive_s: An idle HTTP keep-alive connection is closed after this long, and
            so is one that has not sent a whole request head within it.
        resets_per_minute: Ego mode: most resets per token in any 60 seconds (each one
            makes the server's policies generate); 0 for no limit. A server without a
            token (one for its own process) has none.
    """

    idle_timeout_s: float = 300.0
    max_connections: int = 64
    max_body_bytes: int = 1 << 20
    keep_alive_s: float = 5.0
    resets_per_minute: int = 60

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "max_connections", "max_body_bytes", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.resets_per_minute < 0:
            raise ValueError(
                f"resets_per_minute must be >= 0 (0: no limit), got {self.resets_per_minute}"
            )
