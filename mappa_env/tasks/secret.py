"""The user's task secret: what makes generated tasks impossible to rebuild from their seed.

Generated tasks (MathChat's problems, DSBench's built-in data) are drawn from random
streams keyed by a seed. Seeds are public (they sit in configs, task ids and logs), so an
agent that knows the generator's code could rebuild a task and read its answer. Mixing a
secret into every key closes that path: the same seed gives the same tasks only to
someone who holds the same secret.

The user's secret is, in this order:

1. the ``MAPPA_TASK_SECRET`` environment variable, when set and not empty;
2. the first line of ``task-secret`` in ``$MAPPA_CACHE_DIR`` (or ``~/.cache/mappa``),
   created once with a fresh random value (file mode 0600).

Agents must never see it: the sandbox passes no ``MAPPA_*`` variable to the kernels
(:func:`mappa_env.sandbox.limits.kernel_environment` uses an allow-list), and the cache
directory must stay outside what a confined kernel can read.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

TASK_SECRET_ENV = "MAPPA_TASK_SECRET"
"""Environment variable that, when set and not empty, is the user's task secret."""

CACHE_DIR_ENV = "MAPPA_CACHE_DIR"
"""Environment variable naming mappa's cache directory (default ``~/.cache/mappa``)."""

TASK_SECRET_FILE = "task-secret"
"""File name of the stored secret inside the cache directory."""

# A secret file another process created with O_EXCL (the fallback where hard links are
# not supported) is empty until that process writes it: wait this long for its content.
_PARTIAL_WRITE_WAIT_S = 2.0


def task_secret_path() -> Path:
    """Where the user's secret is stored (``$MAPPA_CACHE_DIR`` or ``~/.cache/mappa``)."""
    configured = os.environ.get(CACHE_DIR_ENV)
    root = Path(configured).expanduser() if configured else Path.home() / ".cache" / "mappa"
    return root / TASK_SECRET_FILE


def user_task_secret() -> str:
    """The user's task secret (see the module docs), created on first use.

    Creation is safe across processes started at the same moment: each writes a
    complete temporary file and hard-links it to the final name, which fails when the
    name exists, so the first link wins and every process reads that one secret.

    Returns:
        The secret, a non-empty string.

    Raises:
        OSError: If the secret file can neither be read nor created (e.g. a read-only
            home directory); set ``MAPPA_TASK_SECRET`` then.
    """
    configured = os.environ.get(TASK_SECRET_ENV)
    if configured:
        return configured
    path = task_secret_path()
    stored = _read_secret(path)
    if stored:
        return stored
    path.parent.mkdir(parents=True, exist_ok=True)
    _create_secret(path)
    deadline = time.monotonic() + _PARTIAL_WRITE_WAIT_S
    while True:
        stored = _read_secret(path)
        if stored:
            return stored
        if time.monotonic() > deadline:
            raise OSError(
                errno.EIO,
                f"the task secret file {path} is empty; delete it, or set {TASK_SECRET_ENV}",
            )
        time.sleep(0.01)


def _read_secret(path: Path) -> str | None:
    """The first line of the secret file, or None when the file is missing or empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    return lines[0].strip() if lines and lines[0].strip() else None


def _create_secret(path: Path) -> None:
    """Create the secret file unless another process got there first."""
    fresh = secrets.token_hex(32)
    # mkstemp creates the file with mode 0600: the secret is never readable by others.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".task-secret-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(fresh + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        try:
            # A hard link publishes the complete file atomically and never replaces an
            # existing one (os.replace would: two processes could then hold two secrets).
            os.link(temporary, path)
            logger.info("created a new task secret in %s", path)
        except FileExistsError:
            logger.debug("another process created %s first", path)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                raise
            _create_exclusively(path, fresh)
    finally:
        os.unlink(temporary)


def _create_exclusively(path: Path, fresh: str) -> None:
    """Fallback for file systems without hard links: O_EXCL creation, then the write."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        stream.write(fresh + "\n")
    logger.info("created a new task secret in %s", path)
