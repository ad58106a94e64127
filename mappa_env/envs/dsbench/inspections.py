"""DSBench's artifact inspections: the inspector's code and I/O, and reports remembered.

**The inspector.** Its code is :mod:`mappa_env.envs.dsbench.inspector`, a script: the
environment reads the module's text (:data:`INSPECTOR_SOURCE`) and runs it with
``python -I -c`` in a fresh, short-lived interpreter in the workspace, in isolated mode
(neither the workspace nor ``PYTHON*`` variables shape ``sys.path``, so a planted
``json.py`` or ``pickle.py`` is never imported): agent-written pickles are never
unpickled in the environment's process (unpickling runs arbitrary code), and not in the
agent's own interpreter either, where earlier agent code could forge the report. Its
parameters come as JSON on stdin (:func:`exchange`); its report is the last line of
stdout. It opens only regular files (no links, FIFOs or devices), as the environment
does. It reports facts; the rubric (:mod:`mappa_env.envs.dsbench.rubric`) judges them.
The text is passed, not the file's path: the sandbox need not see the package, and the
text is part of each report's cache key, so a changed inspector never reuses a report.

**Reports remembered.** The inspector starts a fresh interpreter that
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

import ast
import asyncio
import builtins
import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from mappa_env._fs import UnsafeFileError, read_regular_file

#: The inspector's code, as it runs: the text of :mod:`mappa_env.envs.dsbench.inspector`.
INSPECTOR_SOURCE = (
    resources.files("mappa_env.envs.dsbench").joinpath("inspector.py").read_text(encoding="utf-8")
)
#: Wall-clock limit of one artifact inspection.
INSPECT_TIMEOUT_S = 60.0
#: Rows of X_train / y_train the inspector looks at for variation and training fit.
INSPECT_SAMPLE_ROWS = 20_000
#: Leading rows of y_train compared with train.csv's target (see
#: :func:`~mappa_env.envs.dsbench.labels.holds_target`).
TARGET_CHECK_ROWS = 500
#: Leading test rows whose predictions are scored on the answers (the modeler's model,
#: and a reference model fit on the data engineer's files).
SKILL_ROWS = 5_000
#: Most bytes of the inspector's stdout (and of its stderr) kept: the tail, with the report.
INSPECT_OUTPUT_BYTES = 1024 * 1024


def inspector_function(name: str) -> Callable[..., Any]:
    """The inspector's top-level function ``name``, compiled alone from its source.

    The inspector is a script that reads its parameters from stdin as it starts, so it
    cannot be imported; the environment still applies some of its rules itself (how a
    label is written as text, :func:`~mappa_env.envs.dsbench.labels.label_text`, which
    the scorer's :func:`~mappa_env.envs.dsbench.scoring.canonical_label` runs too) and
    takes them from the same source, so the two sides cannot drift apart. The function
    sees only the builtins: it must use no global of the script.

    Args:
        name: The function's name in the inspector.

    Returns:
        The function, compiled with the inspector's file name in its code.

    Raises:
        KeyError: If the inspector has no top-level function ``name``.
    """
    tree = ast.parse(INSPECTOR_SOURCE, filename="inspector.py")
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        raise KeyError(f"the artifact inspector has no function {name!r}")
    namespace: dict[str, Any] = {"__builtins__": builtins}
    exec(compile(ast.Module(body=found, type_ignores=[]), "inspector.py", "exec"), namespace)
    return namespace[name]


async def exchange(process: asyncio.subprocess.Process, request: bytes) -> tuple[bytes, bytes]:
    """Send ``request`` on stdin; return the tails of stdout and stderr at exit.

    Like ``communicate()``, but only the last :data:`INSPECT_OUTPUT_BYTES` of each stream
    are kept: a pickle that prints without end while it loads cannot fill this
    process's memory (the report is the last line).
    """
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        process.stdin.write(request)
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it exited before reading its parameters: its output says why
    stdout, stderr = await asyncio.gather(_tail(process.stdout), _tail(process.stderr))
    await process.wait()
    return stdout, stderr


async def _tail(stream: asyncio.StreamReader) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > INSPECT_OUTPUT_BYTES:
            del kept[:-INSPECT_OUTPUT_BYTES]
    return bytes(kept)


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
