"""An on-disk cache of coach verdicts (sqlite), for free reruns and exact replays.

Keys are hashes of everything that determines a coach's reply: the model, the rendered
messages, the sampling parameters and the template version (see :func:`cache_key`).
Only valid verdicts are stored, so a failure is retried on the next run rather than
frozen in.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mappa_env.coach.base import CoachStop


class CoachCacheMiss(CoachStop, LookupError):
    """A replaying coach met an action whose verdict is not in the cache.

    Replay exists for reproducible ablations, where a silently re-judged action would
    change the experiment; the miss is therefore an error, not an invalid verdict.
    """


@dataclass(frozen=True)
class CachedVerdict:
    """A stored verdict.

    Attributes:
        score: The score the coach gave.
        analysis: The coach's analysis.
        reply: The model's full last reply.
        coach: Name of the coach that produced it.
        prompt_tokens: Tokens the original calls sent.
        completion_tokens: Tokens the original calls generated.
        cost_usd: What the original calls cost.
        attempts: Calls the original verdict took.
        created_at: Unix time it was stored.
    """

    score: float
    analysis: str
    reply: str
    coach: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    attempts: int = 1
    created_at: float = 0.0


def cache_key(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    template_version: str,
) -> str:
    """A stable hash of everything that determines a coach's reply.

    Args:
        model: The model name as given to litellm.
        messages: The rendered chat messages.
        params: Sampling and request parameters (temperature, max_tokens, response
            format, extra litellm options); values must be JSON-serialisable or have a
            stable ``str``.
        template_version: Version of the templates that rendered the messages.

    Returns:
        A hex SHA-256 digest.
    """
    blob = json.dumps(
        {
            "model": model,
            "messages": list(messages),
            "params": dict(params),
            "template_version": template_version,
        },
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY,
    score REAL NOT NULL,
    analysis TEXT NOT NULL,
    reply TEXT NOT NULL,
    coach TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    attempts INTEGER NOT NULL,
    created_at REAL NOT NULL
)
"""
_COLUMNS = (
    "score, analysis, reply, coach, prompt_tokens, completion_tokens, cost_usd, attempts, "
    "created_at"
)


class CoachCache:
    """A sqlite file of verdicts keyed by :func:`cache_key`.

    One connection is shared by all threads behind a lock; the database runs in WAL
    mode so several processes (e.g. rollout workers) can share one file.

    Args:
        path: Database file (parent directories are created), or ``":memory:"``.
        timeout_s: How long sqlite waits for a lock held by another process.
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 30.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._connection = self._connect()

    def _db(self) -> sqlite3.Connection:
        # A connection must not cross a fork: a child process opens its own.
        if self._pid != os.getpid():
            self._connection = self._connect()
        return self._connection

    def _connect(self) -> sqlite3.Connection:
        self._pid = os.getpid()
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            self.path, timeout=self.timeout_s, check_same_thread=False, isolation_level=None
        )
        if self.path != ":memory:":
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(_SCHEMA)
        return connection

    def get(self, key: str) -> CachedVerdict | None:
        """The stored verdict for ``key``, or ``None``."""
        with self._lock:
            row = (
                self._db()
                .execute(f"SELECT {_COLUMNS} FROM verdicts WHERE key = ?", (key,))
                .fetchone()
            )
        return None if row is None else CachedVerdict(*row)

    def put(self, key: str, verdict: CachedVerdict) -> None:
        """Store ``verdict`` under ``key`` (replacing any previous entry)."""
        created_at = verdict.created_at or time.time()
        with self._lock:
            self._db().execute(
                f"INSERT OR REPLACE INTO verdicts (key, {_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    verdict.score,
                    verdict.analysis,
                    verdict.reply,
                    verdict.coach,
                    verdict.prompt_tokens,
                    verdict.completion_tokens,
                    verdict.cost_usd,
                    verdict.attempts,
                    created_at,
                ),
            )

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._db().execute("SELECT COUNT(*) FROM verdicts").fetchone()
        return int(count)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._connection.close()

    def __enter__(self) -> CoachCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled as its path (e.g. to ship a coach to worker processes); each process
        # opens its own connection to the shared file.
        if self.path == ":memory:":
            raise TypeError("an in-memory CoachCache cannot be pickled; use a file path")
        return {"path": self.path, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], timeout_s=state["timeout_s"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"CoachCache({self.path!r})"
