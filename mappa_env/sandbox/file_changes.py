"""Which files of a workspace a call wrote: stamps taken before and after it.

:func:`snapshot` stamps every file under a directory (up to a cap), and
:func:`changed_files` names those whose stamp changed; :class:`ExecResult.files_written
<mappa_env.sandbox.base.ExecResult>` is made of them.
"""

from __future__ import annotations

import os

FileStamp = tuple[int, int, int]


def snapshot(root: str, cap: int) -> dict[str, FileStamp] | None:
    """Map each file under ``root`` to (mtime, size, inode); None when over ``cap`` entries.

    Symbolic links are not followed (a link to ``/`` would make the scan unbounded);
    ``__pycache__`` directories are skipped.
    """
    stamps: dict[str, FileStamp] = {}
    entries = 0
    prefix = len(root) + 1
    stack = [root]
    while stack:
        try:
            iterator = os.scandir(stack.pop())
        except OSError:
            continue
        with iterator:
            for entry in iterator:
                entries += 1
                if entries > cap:
                    return None
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(entry.path)
                        continue
                    stat = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                stamps[entry.path[prefix:]] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    return stamps


def changed_files(
    before: dict[str, FileStamp] | None, after: dict[str, FileStamp] | None
) -> tuple[str, ...]:
    """Files of ``after`` that are new or changed since ``before`` (none when either is None)."""
    if before is None or after is None:
        return ()
    return tuple(sorted(path for path, stamp in after.items() if before.get(path) != stamp))
