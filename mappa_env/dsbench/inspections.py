"""DSBench's artifact inspections remembered by the bytes they read.

The artifact inspector (:mod:`mappa_env.envs.dsbench`) starts a fresh interpreter that
imports pandas and scikit-learn to load an agent's pickles: about 1.5-2 s of CPU each
time. Its report is a pure function of the pickles' bytes and its parameters: it loads
only the named files, through an unpickler that admits data and estimator types only
(no pickle can run code of its own there), and fitting metrics are computed on fixed
rows. So a workspace whose pickles are byte-for-byte those of an earlier inspection gets
that inspection's report again without a new interpreter. That is what the coach audit
does over and over (each attack replays the same upstream actions) and what training
does whenever an agent rewrites the same artifacts.

Only reports of inspections that ran to the end are kept, and only when the files
hashed before the inspection are still the same after it (agent code left running in
the background cannot tie one file's report to other bytes). Entries are copied in and
out, so the environment's later edits of a report never reach the cache.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mappa_env._fs import UnsafeFileError, read_regular_file

#: Largest pickle hashed for the cache; a workspace with a larger one is inspected anew.
MAX_HASHED_BYTES = 256 * 1024 * 1024


def inspection_key(
    workdir: str | Path, names: Sequence[str], parameters: Mapping[str, Any], inspector: str
) -> str | None:
    """The cache key of inspecting ``names`` in ``workdir``, or ``None`` when uncacheable.

    ``sha256`` over the parameters (as canonical JSON), ``inspector`` (what else the
    report depends on: the inspector's code and flags, the confinement's mode) and, per
    name, either the file's bytes or that no file is there. ``None`` when something is
    at a name that is not a small regular file of its own (a link, a FIFO, a hard link,
    a file over :data:`MAX_HASHED_BYTES`): the inspector then reports on it afresh.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(parameters, sort_keys=True, default=str).encode())
    digest.update(b"\0" + inspector.encode())
    for name in names:
        digest.update(b"\0" + name.encode() + b"\0")
        try:
            content = read_regular_file(workdir, name, MAX_HASHED_BYTES)
        except FileNotFoundError:
            digest.update(b"absent")
            continue
        except (UnsafeFileError, ValueError, OSError):
            return None
        digest.update(b"file" + len(content).to_bytes(8, "little"))
        digest.update(hashlib.sha256(content).digest())
    return digest.hexdigest()


class InspectionCache:
    """Inspection reports by :func:`inspection_key`, least recently used first out.

    Thread-safe: environments stepping in several threads may share one.

    Args:
        max_entries: Most reports kept.
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._reports: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str | None) -> dict[str, Any] | None:
        """A copy of the report stored under ``key``, or ``None`` (counted as a miss)."""
        with self._lock:
            report = None if key is None else self._reports.get(key)
            if report is None:
                self.misses += 1
                return None
            self._reports.move_to_end(key)  # type: ignore[arg-type]
            self.hits += 1
            return copy.deepcopy(report)

    def put(self, key: str | None, report: Mapping[str, Any]) -> None:
        """Keep a copy of ``report`` under ``key`` (nothing for a ``None`` key)."""
        if key is None:
            return
        with self._lock:
            self._reports[key] = copy.deepcopy(dict(report))
            self._reports.move_to_end(key)
            while len(self._reports) > self.max_entries:
                self._reports.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._reports)


#: The process's cache, shared by every DSBench environment in it.
SHARED_INSPECTIONS = InspectionCache()
