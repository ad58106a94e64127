"""Start an IPython kernel after fencing its process in with resource limits.

The sandbox runs this file's source with ``python -c <source> <spec-json> <kernel args>``
rather than ``python -m``: the kernel's working directory is the agents' workspace, so
nothing here may depend on the project being importable from there, and importing no
``mappa_env`` module keeps the kernel's start fast.

The spec is a JSON object:

- ``rlimits``: ``{"RLIMIT_DATA": [soft, hard], ...}``; ``-1`` means unlimited. Limits are
  only ever lowered: a value above the current hard limit is clamped to it, because an
  unprivileged process may not raise its hard limit and the kernel must still start.
- ``subreaper``: on Linux, make the kernel the reaper of its orphaned descendants, so that
  a process which detaches from its parent (a daemon, ``setsid``) stays in the kernel's
  process tree where the sandbox can count and kill it.
- ``fault_log``: file that receives fatal-error tracebacks (segfault, abort), read by the
  sandbox when the kernel dies.
- ``startup_error_log``: file that receives the traceback when the kernel cannot start.
- ``sys_path``: absolute directories put first on ``sys.path`` (the creating process's
  ``PYTHONPATH``, which the kernel's environment does not carry), so the kernel imports
  what that process imports.
- ``quiet_stderr``: point file descriptor 2 at ``/dev/null`` first. A confined kernel's
  stderr is a file that catches what bubblewrap says when it refuses to start it; from
  here on only the kernel would write there.

The kernel's own stderr goes to ``/dev/null``: the kernel copies everything agents write to
file descriptor 2 there, so a file would grow without bound.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import traceback

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>


def _clamp(value: int, ceiling: int) -> int:
    """Return ``value`` lowered to ``ceiling``; either may be ``RLIM_INFINITY``."""
    if ceiling == resource.RLIM_INFINITY:
        return value
    if value == resource.RLIM_INFINITY:
        return ceiling
    return min(value, ceiling)


def apply_rlimits(rlimits: dict[str, list[int]]) -> None:
    """Lower this process's resource limits to ``rlimits`` (never raise them)."""
    for name, (soft, hard) in rlimits.items():
        which = getattr(resource, name)
        _, current_hard = resource.getrlimit(which)
        new_hard = _clamp(resource.RLIM_INFINITY if hard < 0 else hard, current_hard)
        new_soft = _clamp(resource.RLIM_INFINITY if soft < 0 else soft, new_hard)
        resource.setrlimit(which, (new_soft, new_hard))


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux only); return whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _replace_unencodable(value: object) -> object:
    """``value`` with lone surrogates in its strings replaced by ``?``."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_replace_unencodable(k): _replace_unencodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace_unencodable(v) for v in value]
    return value


def _pack_unencodable_text(session: object) -> None:
    """Make the kernel's message packer survive text that is not valid UTF-8.

    Agent code can print a lone surrogate (``print("\\ud800")``); the default packer then
    raises and the output is lost. Retry such a message with those characters replaced.
    """
    original = session.pack  # type: ignore[attr-defined]

    def pack(obj: object) -> bytes:
        try:
            return original(obj)
        except UnicodeEncodeError:
            return original(_replace_unencodable(obj))

    session.pack = pack  # type: ignore[attr-defined]


#: Longest wait, after a cell, for its output written to file descriptors to come through.
DESCRIPTOR_SYNC_TIMEOUT_S = 2.0


def _longest_marker_start(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class DescriptorSync:
    """Make what a cell writes to file descriptor 1 or 2 part of that cell's output.

    ipykernel forwards what reaches the descriptors (a child process's output, ``os.write``)
    from a pipe, in a thread of its own. When that thread runs late (a loaded machine),
    a cell's last bytes are sent after the kernel reported the cell done, and a client
    that reads a cell's output until then loses them. After each cell, :meth:`sync`
    writes a marker into the pipe and waits until the forwarding thread has passed it on:
    the pipe keeps order, so everything written before it has been passed on too. The
    marker is removed from the text; the wait ends after ``timeout_s`` whatever happens.

    Args:
        stream: ipykernel's ``OutStream`` for ``stdout`` or ``stderr``.
        timeout_s: The longest wait in :meth:`sync`.
    """

    def __init__(self, stream: object, timeout_s: float = DESCRIPTOR_SYNC_TIMEOUT_S) -> None:
        self.stream = stream
        self.timeout_s = timeout_s
        self.marker = f"\x00mappa-sync-{os.urandom(8).hex()}\x00"
        self.passed = threading.Event()
        self._held = ""
        self._forward = stream.write  # type: ignore[attr-defined]
        # The forwarding thread calls ``self.write`` on the stream: an instance attribute
        # comes first.
        stream.write = self.write  # type: ignore[attr-defined]

    @classmethod
    def for_watched(cls, *streams: object) -> list[DescriptorSync]:
        """One sync per stream whose descriptor ipykernel watches (none where it does not)."""
        return [cls(s) for s in streams if getattr(s, "_should_watch", False)]

    def write(self, text: str) -> int | None:
        """The stream's ``write``; the forwarding thread's text loses the marker here.

        The thread reads the pipe in chunks, so a marker may arrive in two: a chunk's end
        that could begin one is held back until the next chunk (the marker that follows
        every cell brings it).
        """
        if threading.current_thread() is not getattr(self.stream, "watch_fd_thread", None):
            return self._forward(text)
        text, self._held = self._held + text, ""
        done, tail = "", text
        passed = self.marker in text
        if passed:
            before, _, tail = text.rpartition(self.marker)
            done = before.replace(self.marker, "")
        held = _longest_marker_start(tail, self.marker)
        if held:
            tail, self._held = tail[:-held], tail[-held:]
        text = done + tail
        written = self._forward(text) if text else 0
        if passed:  # only once the text before the marker is in the stream
            self.passed.set()
        return written

    def _pipe_intact(self, fd: int) -> bool:
        """Whether ``fd`` is still the watched pipe (code may have pointed it elsewhere)."""
        read_end = getattr(self.stream, "_fid", None)
        thread = getattr(self.stream, "watch_fd_thread", None)
        if read_end is None or thread is None or not thread.is_alive():
            return False
        try:
            ours, now = os.fstat(read_end), os.fstat(fd)
        except OSError:
            return False
        return (ours.st_dev, ours.st_ino) == (now.st_dev, now.st_ino)

    def sync(self) -> bool:
        """Wait until what was written to the descriptor so far has been passed on.

        Returns:
            Whether the marker came through in time (False also where the descriptor no
            longer leads to the watched pipe: nothing is written then).
        """
        fd = getattr(self.stream, "_original_stdstream_fd", None)
        if fd is None or not self._pipe_intact(fd):
            return False
        self.passed.clear()
        try:
            os.write(fd, self.marker.encode())
        except OSError:
            return False
        return self.passed.wait(self.timeout_s)


def _sync_descriptor_output(shell: object) -> None:
    """Run :meth:`DescriptorSync.sync` after every cell of ``shell`` (an IPython shell)."""
    syncs = DescriptorSync.for_watched(sys.stdout, sys.stderr)
    if not syncs:
        return

    def after_cell() -> None:
        for sync in syncs:
            sync.sync()

    shell.events.register("post_execute", after_cell)  # type: ignore[attr-defined]


def main() -> None:
    """Apply the spec in ``sys.argv[1]``, then run the kernel with the remaining arguments."""
    spec = json.loads(sys.argv.pop(1))
    if spec.get("quiet_stderr"):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    fault_log = None
    if spec.get("fault_log"):
        import faulthandler

        # Kept open for the life of the process: faulthandler writes to its descriptor.
        fault_log = open(spec["fault_log"], "w")  # noqa: SIM115
        faulthandler.enable(file=fault_log, all_threads=True)
    try:
        apply_rlimits(spec.get("rlimits", {}))
        if spec.get("subreaper"):
            become_subreaper()
        # ``python -c`` puts the working directory first on sys.path; the kernel adds it
        # back itself after its imports, so a workspace file cannot shadow them.
        if sys.path and sys.path[0] in ("", os.getcwd()):
            del sys.path[0]
        for entry in reversed(spec.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        from ipykernel.kernelapp import IPKernelApp

        app = IPKernelApp.instance()
        app.initialize()
        _pack_unencodable_text(app.session)
        _sync_descriptor_output(app.shell)
    except BaseException:
        if spec.get("startup_error_log"):
            with open(spec["startup_error_log"], "w") as log:
                traceback.print_exc(file=log)
        raise
    app.start()


if __name__ == "__main__":
    main()
