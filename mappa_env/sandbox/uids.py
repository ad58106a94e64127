"""The users confined processes run as: a uid per workspace, leased from a pool.

Run as root, a confined process switches to an unprivileged user: a uid of its own per
workspace, leased from :data:`SANDBOX_UID_POOL` through a :class:`UidPool` where this
machine maps those uids (:func:`find_uid_pool`), else :data:`SANDBOX_UID` (``nobody``),
shared by every sandbox. :func:`hand_over_tree` gives a workspace's files to its user.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

SANDBOX_UID = 65534
"""Host uid (and gid) that confined processes run as when this process is root."""


#: Entries of a workspace handed over at most (a bigger tree keeps the rest as it is).
HAND_OVER_LIMIT = 20_000


def hand_over_tree(root: Path, uid: int, gid: int, limit: int = HAND_OVER_LIMIT) -> int:
    """Give every entry under ``root`` to ``uid:gid``, without following any link.

    Walks with directory file descriptors (``os.fwalk``) and changes owners relative to
    them, so a directory swapped for a link to elsewhere mid-walk cannot redirect the
    change outside ``root``.

    Returns:
        The number of entries handed over.
    """
    count = 0
    for _, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in (*dirs, *files):
            if count >= limit:
                logger.debug("handed over the first %d entries of %s only", limit, root)
                return count
            try:
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                logger.debug("could not hand over %s in %s: %s", name, root, exc)
            count += 1
    return count


#: The host uids handed to workspaces, one each, when this process is root: above the
#: ranges distributions give to people (1000-59999) and below ``nobody`` (65534). A uid
#: that names an account in the user database, or that this process's user namespace
#: does not map, is skipped.
SANDBOX_UID_POOL = range(64_000, 64_256)
#: Where leases are kept: one lock file a uid, held by the process that leased it.
UID_LOCK_DIR = Path("/run/mappa/sandbox-uids")


@dataclass
class UidLease:
    """One uid of the pool, held (an open, locked file) until :meth:`release`.

    Attributes:
        uid: The host uid (the gid is the same number).
    """

    uid: int
    _handle: int | None = field(default=None, repr=False)

    @property
    def user(self) -> tuple[int, int]:
        """``(uid, gid)``: the same number."""
        return self.uid, self.uid

    def release(self) -> None:
        """Give the uid back; idempotent. Exiting the process releases it as well."""
        handle, self._handle = self._handle, None
        if handle is not None:
            os.close(handle)  # closing drops the lock


@dataclass(frozen=True)
class UidPool:
    """Host uids that workspaces (and every sandbox working in one) lease one each.

    Sandboxes that share a uid share the kernel's per-user limits: inotify instances
    (``fs.inotify.max_user_instances``, often 128), ``RLIMIT_NPROC``, message queues.
    A uid per workspace keeps one episode's agents from taking them from all others.
    Leases are lock files (``flock``) in :data:`UID_LOCK_DIR`, so that processes
    running side by side (several trainers on one machine) never hand out one uid
    twice, and a process that dies frees its uids.

    Attributes:
        uids: The uids leased.
        lock_dir: Directory of the lock files.
    """

    uids: tuple[int, ...]
    lock_dir: Path

    def lease(self, uid: int | None = None) -> UidLease | None:
        """A free uid of the pool (``uid`` itself when given), or ``None``.

        Args:
            uid: The one uid wanted (a workspace's owner): ``None`` when someone holds
                it (the environment that made the workspace).

        Returns:
            The lease; ``None`` (logged) when every uid is taken.
        """
        if uid is not None:
            return self._try(uid) if uid in self.uids else None
        for candidate in self.uids:
            lease = self._try(candidate)
            if lease is not None:
                return lease
        _warn_pool_used_up(len(self.uids))
        return None

    def _try(self, uid: int) -> UidLease | None:
        import fcntl

        try:
            handle = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            logger.debug("cannot open the lease of uid %d: %s", uid, exc)
            return None
        try:
            # Locks of separate opens exclude each other, in this process as in others.
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(handle)
            return None
        return UidLease(uid, handle)


@functools.cache
def _warn_pool_used_up(size: int) -> None:
    """Warn once per process that workspaces now share :data:`SANDBOX_UID`."""
    logger.warning(
        "all %d sandbox uids are taken (more workspaces at once than the pool holds): "
        "further sandboxes share uid %d",
        size,
        SANDBOX_UID,
    )


def _mapped(ids: Iterable[int], map_file: str) -> set[int]:
    """The ids of ``ids`` that this process's user namespace maps (``/proc/self/*_map``)."""
    try:
        ranges = [
            (int(inside), int(count))
            for inside, _, count in (
                line.split() for line in Path(map_file).read_text().splitlines() if line.strip()
            )
        ]
    except (OSError, ValueError):
        return set()
    return {i for i in ids if any(start <= i < start + count for start, count in ranges)}


def find_uid_pool(
    uids: Sequence[int] = SANDBOX_UID_POOL, lock_dir: Path = UID_LOCK_DIR
) -> UidPool | None:
    """The uid pool where this machine allows one: root, mapped uids, a lock directory.

    Returns:
        The pool, or ``None`` (sandboxes then share :data:`SANDBOX_UID`).
    """
    import grp
    import pwd

    if os.geteuid() != 0:
        return None
    usable = _mapped(uids, "/proc/self/uid_map") & _mapped(uids, "/proc/self/gid_map")
    free = []
    for uid in uids:
        if uid not in usable:
            continue
        try:
            pwd.getpwuid(uid)
            continue  # an account of this machine
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue  # a group of this machine
        except KeyError:
            free.append(uid)
    if len(free) < 2:
        return None
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(lock_dir, 0o700)
    except OSError as exc:
        logger.debug("no uid pool: cannot use %s: %s", lock_dir, exc)
        return None
    return UidPool(tuple(free), lock_dir)
