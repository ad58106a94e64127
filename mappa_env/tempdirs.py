"""Temporary files and folders that name their owner, and the clean-up of dead runs'.

Kernel runtime folders, episode workspaces, kernel pools and seccomp filter files go to
the system's temporary folder (``TMPDIR``). A run that is killed cannot remove them, so
each name carries its owner: ``mappa-<kind>-p<pid>h<host>-<random>``, where ``<host>``
is a short hash of the machine's name (machines, or containers, that share a folder
do not judge each other's processes). :func:`remove_stale` removes those of this
machine whose process is gone; another live run's are never touched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import tempfile
from pathlib import Path

from mappa_env._fs import remove_tree

logger = logging.getLogger(__name__)

__all__ = ["make_temp_dir", "make_temp_file", "owner_tag", "remove_stale"]

_OWNED = re.compile(r"^mappa-[a-z0-9_.-]+?-p(\d+)h([0-9a-f]{6})-")


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def owner_tag() -> str:
    """``p<pid>h<host>``: the part of a temporary name that says whose it is."""
    return f"p{os.getpid()}h{_host()}"


def _prefix(kind: str) -> str:
    return f"mappa-{kind}-{owner_tag()}-"


def make_temp_dir(kind: str) -> Path:
    """A new folder ``mappa-<kind>-p<pid>h<host>-*`` in the temporary folder.

    Args:
        kind: What it holds (``kernel``, ``sandbox``, ``mathchat-v0``...): lowercase
            letters, digits, ``.``, ``_`` and ``-``.
    """
    return Path(tempfile.mkdtemp(prefix=_prefix(kind)))


def make_temp_file(kind: str, suffix: str = "") -> tuple[int, str]:
    """A new file ``mappa-<kind>-p<pid>h<host>-*<suffix>``.

    Returns:
        ``(descriptor, name)``, as :func:`tempfile.mkstemp` returns them.
    """
    return tempfile.mkstemp(prefix=_prefix(kind), suffix=suffix)


def remove_stale(folder: str | Path | None = None) -> list[Path]:
    """Remove the temporary files and folders that runs of this machine left behind.

    Only entries named by :func:`make_temp_dir` / :func:`make_temp_file`, owned by this
    user, made on this machine, whose process no longer runs.

    Args:
        folder: Where to look (default: the system's temporary folder).

    Returns:
        What was removed.
    """
    root = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    host = _host()
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError as exc:
        logger.debug("cannot list %s: %s", root, exc)
        return []
    for entry in entries:
        match = _OWNED.match(entry.name)
        if match is None or match.group(2) != host or _alive(int(match.group(1))):
            continue
        try:
            if entry.lstat().st_uid != os.getuid():
                continue
            if entry.is_dir() and not entry.is_symlink():
                left = remove_tree(entry)
                if left:
                    logger.debug("could not remove all of %s: %s", entry, left[:3])
                    continue
            else:
                entry.unlink()
        except OSError as exc:
            logger.debug("could not remove %s: %s", entry, exc)
            continue
        removed.append(entry)
    if removed:
        logger.info("removed %d temporary files and folders of runs that ended", len(removed))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
