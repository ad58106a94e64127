"""A per-run record of coach calls: tokens, cost, latency, attempts, failures."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LedgerEntry:
    """One verdict's bill.

    Attributes:
        agent: Agent whose action was judged.
        env_id: Environment id.
        task_id: Task id.
        coach: Coach name, e.g. ``"llm:gemini/gemini-2.5-flash"``.
        valid: Whether the verdict carries a score.
        cached: Whether it came from the cache (then it cost nothing).
        attempts: API calls made for it (retries and format corrections included).
        prompt_tokens: Tokens sent.
        completion_tokens: Tokens generated.
        cost_usd: Money spent (0 when the provider's price is unknown).
        latency_s: Wall-clock seconds until the verdict was ready.
        error_kind: For invalid verdicts: ``"transient"`` (retries exhausted),
            ``"fatal"`` (non-retryable API error), ``"deadline"``, or ``"format"``
            (no usable score in the reply).
        error: The error message of an invalid verdict.
        timestamp: Unix time the entry was recorded.
    """

    agent: str
    env_id: str = ""
    task_id: str = ""
    coach: str = ""
    valid: bool = True
    cached: bool = False
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    error_kind: str | None = None
    error: str | None = None
    timestamp: float = field(default_factory=time.time)


def summarize(entries: Iterable[LedgerEntry]) -> dict[str, Any]:
    """Totals over ledger entries.

    Args:
        entries: The entries to sum.

    Returns:
        A dict with ``calls`` (verdicts), ``valid``, ``invalid``, ``invalid_rate``,
        ``cached``, ``api_calls`` (attempts), ``prompt_tokens``, ``completion_tokens``,
        ``cost_usd``, ``latency_s_total``, ``latency_s_mean`` and ``errors`` (count per
        error kind).
    """
    entries = list(entries)
    calls = len(entries)
    invalid = sum(not e.valid for e in entries)
    latency = sum(e.latency_s for e in entries)
    return {
        "calls": calls,
        "valid": calls - invalid,
        "invalid": invalid,
        "invalid_rate": invalid / calls if calls else 0.0,
        "cached": sum(e.cached for e in entries),
        "api_calls": sum(e.attempts for e in entries),
        "prompt_tokens": sum(e.prompt_tokens for e in entries),
        "completion_tokens": sum(e.completion_tokens for e in entries),
        "cost_usd": sum(e.cost_usd for e in entries),
        "latency_s_total": latency,
        "latency_s_mean": latency / calls if calls else 0.0,
        "errors": dict(Counter(e.error_kind for e in entries if e.error_kind)),
    }


class CoachLedger:
    """Thread-safe list of :class:`LedgerEntry` with per-run and per-agent totals.

    One ledger per run: pass the same object to every coach of the run (or read
    ``coach.ledger``) and export it at the end with :meth:`to_json`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[LedgerEntry] = []

    def record(self, entry: LedgerEntry) -> None:
        """Append one entry."""
        with self._lock:
            self._entries.append(entry)

    @property
    def entries(self) -> list[LedgerEntry]:
        """A snapshot of all entries, in recording order."""
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def summary(self) -> dict[str, Any]:
        """Totals over the whole run (see :func:`summarize`)."""
        return summarize(self.entries)

    def by_agent(self) -> dict[str, dict[str, Any]]:
        """Totals per agent id (see :func:`summarize`)."""
        groups: dict[str, list[LedgerEntry]] = {}
        for entry in self.entries:
            groups.setdefault(entry.agent, []).append(entry)
        return {agent: summarize(group) for agent, group in sorted(groups.items())}

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``summary``, ``by_agent`` and every entry."""
        return {
            "summary": self.summary(),
            "by_agent": self.by_agent(),
            "entries": [asdict(e) for e in self.entries],
        }

    def to_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def __getstate__(self) -> dict[str, Any]:
        return {"entries": self.entries}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._entries = list(state["entries"])
