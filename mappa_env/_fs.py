"""File-system helpers for directories that untrusted code has written (agents' workspaces).

Agent code can leave anything in a workspace: a 1,500-deep directory chain, 100,000
files, symbolic links to ``/proc/self/environ`` or to hidden answers, FIFOs, device
nodes, a sparse file of terabytes. The environment process must survive all of them, so
everything here is iterative (no recursion limit to hit), bounded in work, never follows
a symbolic link, and never opens anything but a regular file for reading.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

#: Deepest folder level a listing descends to (0 = only the top folder).
MAX_WALK_DEPTH = 8
#: Most directory entries a listing looks at, however many files it finds.
MAX_WALK_ENTRIES = 20_000
# remove_tree gives up on a folder after this many rounds that removed nothing.
_MAX_IDLE_ROUNDS = 2


class UnsafeFileError(Exception):
    """A workspace file that the environment refuses to read; ``str(exc)`` says why."""


@dataclass(frozen=True)
class WalkedFile:
    """One regular file found by :func:`walk_files`.

    Attributes:
        name: Path relative to the walked folder, ``/``-separated; bytes that are not
            valid UTF-8 are shown as ``?``.
        size: Size in bytes.
    """

    name: str
    size: int


def _kind(mode: int) -> str:
    """A readable name of a file type, for reasons shown to agents and coaches."""
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISREG(mode):
        return "regular file"
    return "special file"


def _printable(name: str) -> str:
    # Names that are not valid UTF-8 (bytes written by agent code) would break prompts
    # and JSON exports: show them with the bad bytes replaced.
    return name.encode("utf-8", "replace").decode("utf-8")


def walk_files(
    root: str | Path,
    *,
    limit: int,
    max_depth: int = MAX_WALK_DEPTH,
    max_entries: int = MAX_WALK_ENTRIES,
) -> list[WalkedFile]:
    """Regular files under ``root`` in sorted path order, hidden names skipped, bounded.

    The walk is depth-first with each folder's entries sorted, so files come in the
    order ``sorted(root.rglob("*"))`` would give them. Symbolic links, FIFOs, devices
    and sockets are not listed and links are never followed (nor ``root`` itself when
    it is one: then nothing is listed). Folders deeper than
    ``max_depth`` are not entered, and the walk stops after ``max_entries`` directory
    entries or ``limit`` files, whichever comes first, so its cost is bounded whatever
    the tree. Folders that vanish or cannot be read while walking are skipped.

    Args:
        root: The folder to walk.
        limit: Most files to return.
        max_depth: Deepest folder level entered (0: only ``root`` itself).
        max_entries: Most directory entries examined in all.

    Returns:
        The files found, at most ``limit``.
    """
    found: list[WalkedFile] = []
    if os.path.islink(root):  # a workspace swapped for a link would list somewhere else
        return found
    budget = max_entries
    # Depth-first: a stack of (relative name, depth) for folders and (relative name,
    # size) for files, told apart by ``is_folder``; siblings are pushed in reverse
    # sorted order so the smallest name comes off first.
    stack: list[tuple[bool, str, int]] = [(True, "", 0)]
    base = os.fspath(root)
    while stack and len(found) < limit:
        is_folder, relative, number = stack.pop()
        if not is_folder:
            found.append(WalkedFile(_printable(relative), number))
            continue
        if budget <= 0:
            continue
        folder = os.path.join(base, relative) if relative else base
        entries: list[os.DirEntry[str]] = []
        try:
            with os.scandir(folder) as iterator:
                for entry in iterator:
                    if budget <= 0:
                        break
                    budget -= 1
                    if not entry.name.startswith("."):
                        entries.append(entry)
        except OSError as exc:
            logger.debug("skipping %s while listing: %s", folder, exc)
            continue
        for entry in sorted(entries, key=lambda item: item.name, reverse=True):
            name = f"{relative}/{entry.name}" if relative else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if number < max_depth:
                        stack.append((True, name, number + 1))
                elif entry.is_file(follow_symlinks=False):
                    stack.append((False, name, entry.stat(follow_symlinks=False).st_size))
            except OSError:  # removed while listing
                continue
    return found


def file_kind(directory: str | Path, name: str) -> tuple[str | None, int]:
    """What is at ``directory/name``, without following a link.

    Returns:
        ``(None, 0)`` when nothing is there; ``("regular file", size)`` for a regular
        file; else the kind (``"symbolic link"``, ``"FIFO (named pipe)"``, ...) and 0.
    """
    try:
        info = os.lstat(os.path.join(os.fspath(directory), name))
    except (FileNotFoundError, NotADirectoryError):
        return None, 0
    except OSError as exc:
        logger.debug("cannot stat %s in %s: %s", name, directory, exc)
        return "unreadable entry", 0
    if stat.S_ISREG(info.st_mode):
        return "regular file", info.st_size
    return _kind(info.st_mode), 0


def read_regular_file(directory: str | Path, name: str, max_bytes: int) -> bytes:
    """Read ``directory/name`` if, and only if, it is a small regular file of its own.

    Neither ``directory`` nor ``name`` may be a symbolic link (so the file is inside
    the directory, not a link to ``/proc/self/environ`` or to hidden answers); FIFOs,
    sockets, devices and folders are refused before they are opened (opening a FIFO
    could block, a device could do anything); a file with other hard links is refused
    (it is also somewhere else); and a file over ``max_bytes`` is refused by its size
    without reading it. The file is opened without blocking and read through one file
    descriptor that is checked to be the entry examined, so it cannot be swapped in
    between.

    Args:
        directory: The folder (e.g. a workspace).
        name: A plain file name inside it (no ``/``).
        max_bytes: Largest size read.

    Returns:
        The file's bytes.

    Raises:
        FileNotFoundError: When nothing is at ``name``.
        UnsafeFileError: When something is there but may not be read; the message
            says what it is.
        ValueError: When ``name`` is not a plain file name.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"expected a plain file name, got {name!r}")
    try:
        folder = os.open(
            os.fspath(directory), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no such folder", os.fspath(directory)) from None
    except OSError as exc:
        # O_NOFOLLOW | O_DIRECTORY on a link gives ELOOP or ENOTDIR: say which it is.
        linked = os.path.islink(directory)
        why = "it is a symbolic link" if linked else exc.strerror
        raise UnsafeFileError(f"the folder holding {name} cannot be opened: {why}") from None
    try:
        return _read_in(folder, name, max_bytes)
    finally:
        os.close(folder)


def _read_in(folder: int, name: str, max_bytes: int) -> bytes:
    try:
        before = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnsafeFileError(f"{name} cannot be examined: {exc.strerror}") from None
    _check_regular(name, before, max_bytes)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        handle = os.open(name, flags, dir_fd=folder)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(f"{name} is a symbolic link, not a regular file") from None
        raise UnsafeFileError(f"{name} cannot be opened: {exc.strerror}") from None
    with os.fdopen(handle, "rb") as stream:
        after = os.fstat(handle)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise UnsafeFileError(f"{name} was replaced while it was being read")
        _check_regular(name, after, max_bytes)
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the size check
        raise UnsafeFileError(f"{name} is over the {max_bytes} byte limit")
    return data


def _check_regular(name: str, info: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"{name} is a {_kind(info.st_mode)}, not a regular file")
    if info.st_nlink > 1:
        raise UnsafeFileError(f"{name} is a hard link to another file, not a file of its own")
    if info.st_size > max_bytes:
        raise UnsafeFileError(f"{name} is {info.st_size} bytes, over the {max_bytes} limit")


def special_file_kind(path: str | Path) -> str | None:
    """The kind of what is at ``path`` when it is neither a regular file nor a folder.

    Links are followed (a user may name a task file through one). Checking before
    reading turns a FIFO, socket or device given as a file into a message that says so,
    rather than "not found" or a read that waits for a writer.

    Args:
        path: A path the user named as a file.

    Returns:
        ``"FIFO (named pipe)"``, ``"socket"``, ``"device"``, ...; ``None`` when nothing
        is there, or a regular file or a folder is.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _kind(mode)


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file the user named, never blocking on a special file.

    The file is opened non-blocking and checked after opening, so a FIFO put in the
    place of a file between a check and the read is refused, not waited on.

    Args:
        path: The file.
        what: What the file is, for the message (e.g. ``"task file"``).

    Returns:
        The text.

    Raises:
        SettingsError: When ``path`` is not a regular file; the message names its kind.
        FileNotFoundError: When nothing is at ``path``.
        UnicodeDecodeError: When the file is not UTF-8.
    """
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(handle, "rb") as stream:
        mode = os.fstat(handle).st_mode
        if not stat.S_ISREG(mode):
            raise SettingsError(not_a_regular_file(path, what, _kind(mode)))
        data = stream.read()
    return data.decode("utf-8")


def not_a_regular_file(path: str | Path, what: str, kind: str) -> str:
    """The one-line message for a ``what`` at ``path`` that is a ``kind``, not a file."""
    return f"{what} {path} is a {kind}, not a regular file: pass a regular file"


def remove_tree(path: str | Path) -> list[str]:
    """Remove ``path`` and everything under it; never raises.

    Unlike :func:`shutil.rmtree` (recursive, so a deep enough tree raises
    ``RecursionError`` even with ``ignore_errors=True``), the tree is flattened: the
    sub-folders of each folder are moved up into ``path`` and the folder is removed, so
    depth costs rounds, not stack frames, and every call works on short names relative
    to an open folder (no path grows with the depth). Links are removed, never followed.
    Folders without permissions are made accessible first. Problems are logged at debug
    level.

    Args:
        path: The folder (or file) to remove; nothing happens when it does not exist.

    Returns:
        What could not be removed (paths as strings; empty when everything went).
    """
    target = os.fspath(path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return []
    except OSError as exc:
        logger.debug("cannot examine %s for removal: %s", target, exc)
        return [target]
    if not stat.S_ISDIR(info.st_mode):
        return [] if _try(os.unlink, target) else [target]
    try:
        folder = _open_folder(target, None)
    except OSError as exc:
        logger.debug("cannot open %s for removal: %s", target, exc)
        return [target]
    try:
        left = _empty_folder(folder, target)
    finally:
        os.close(folder)
    if not _try(os.rmdir, target):
        left.append(target)
    return left


def _try(operation: Callable[..., object], *args: object, **kwargs: object) -> bool:
    """Run a removal step; False (logged at debug) when it fails."""
    try:
        operation(*args, **kwargs)
    except OSError as exc:
        logger.debug("removal step %s%s failed: %s", getattr(operation, "__name__", ""), args, exc)
        return False
    return True


def _open_folder(name: str, parent: int | None) -> int:
    """Open a folder (not a link) for listing, granting ourselves access when needed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except PermissionError:
        # Agent code may have chmod-ed a folder to 000; we own it, so we may open it up,
        # but never what a link swapped in meanwhile points to.
        try:
            os.chmod(name, stat.S_IRWXU, dir_fd=parent, follow_symlinks=False)
        except NotImplementedError:  # Linux cannot chmod without following: check first
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise
            os.chmod(name, stat.S_IRWXU, dir_fd=parent)
        return os.open(name, flags, dir_fd=parent)


def _empty_folder(root: int, shown: str) -> list[str]:
    """Remove everything inside the open folder ``root``; return what could not go."""
    serial = 0
    idle_rounds = 0
    while True:
        try:
            names = os.listdir(root)
        except OSError as exc:
            logger.debug("cannot list %s: %s", shown, exc)
            return [shown]
        if not names:
            return []
        progress = False
        for name in names:
            try:
                info = os.stat(name, dir_fd=root, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                progress |= _try(os.unlink, name, dir_fd=root)
                continue
            if _try(os.rmdir, name, dir_fd=root):
                progress = True
                continue
            moved, serial = _lift_contents(root, name, serial)
            progress |= moved
            progress |= _try(os.rmdir, name, dir_fd=root)
        idle_rounds = 0 if progress else idle_rounds + 1
        if idle_rounds >= _MAX_IDLE_ROUNDS:
            return [os.path.join(shown, _printable(name)) for name in names]


def _lift_contents(root: int, name: str, serial: int) -> tuple[bool, int]:
    """Remove the files of folder ``name`` and move its sub-folders up into ``root``."""
    try:
        folder = _open_folder(name, root)
    except OSError as exc:
        logger.debug("cannot open %s for removal: %s", name, exc)
        return False, serial
    progress = False
    try:
        try:
            os.fchmod(folder, stat.S_IRWXU)  # entries can only be removed with write access
            children = os.listdir(folder)
        except OSError as exc:
            logger.debug("cannot list %s: %s", name, exc)
            return False, serial
        for child in children:
            try:
                info = os.stat(child, dir_fd=folder, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                progress |= _try(os.unlink, child, dir_fd=folder)
                continue
            # A fresh name in root; rename never replaces a non-empty folder or a file,
            # so on a clash the next number is tried.
            for _ in range(100):
                serial += 1
                try:
                    os.rename(child, f".mappa-rm-{serial}", src_dir_fd=folder, dst_dir_fd=root)
                except OSError as exc:
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                        continue
                    logger.debug("cannot move %s up for removal: %s", child, exc)
                else:
                    progress = True
                break
    finally:
        os.close(folder)
    return progress, serial
