"""Per-kernel cgroups: the memory and ``pids`` limits of a confined sandbox.

Where this process may create cgroups (``/sys/fs/cgroup``, v1 or v2),
:func:`find_cgroup_parent` and :func:`find_pids_cgroup_parent` find where, checked by
making, limiting and joining one; :class:`CgroupParent` makes a :class:`SandboxCgroup`
per kernel, which counts every process, shared memory and tmpfs of the sandbox, reports
its out-of-memory kills and kills what is left when removed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CgroupParent:
    """A cgroup directory under which this process may make per-kernel cgroups.

    Attributes:
        version: 1 (one controller's own hierarchy) or 2 (unified).
        path: The directory children are made in.
        controller: The v1 hierarchy's controller (``"memory"`` or ``"pids"``); on v2
            the controllers the parent delegates to its children decide.
    """

    version: int
    path: Path
    controller: str = "memory"

    @property
    def limit_files(self) -> tuple[str, ...]:
        """Files that take the memory limit (v1 also caps memory plus swap)."""
        if self.version == 2:
            return ("memory.max", "memory.swap.max")
        return ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")

    def create(
        self, memory_bytes: int | None = None, max_tasks: int | None = None
    ) -> SandboxCgroup | None:
        """A new cgroup with the given limits, or None when it cannot be made or limited.

        Args:
            memory_bytes: Memory limit of everything in the cgroup (not for a v1
                ``pids`` hierarchy).
            max_tasks: Most threads and processes in the cgroup (``pids.max``; not for
                a v1 ``memory`` hierarchy).
        """
        path = self.path / f"mappa-{os.getpid()}-{time.monotonic_ns()}"
        try:
            path.mkdir()
        except OSError as exc:
            logger.debug("cannot make cgroup %s: %s", path, exc)
            return None
        cgroup = SandboxCgroup(path, self.version)
        limits: list[tuple[str, int]] = []
        if memory_bytes is not None:
            limits.append((self.limit_files[0], int(memory_bytes)))
        if max_tasks is not None:
            limits.append(("pids.max", int(max_tasks)))
        for name, value in limits:
            try:
                (path / name).write_text(str(value))
            except OSError as exc:
                logger.debug("cannot limit cgroup %s (%s): %s", path, name, exc)
                cgroup.remove()
                return None
        if memory_bytes is not None:
            swap = "0" if self.version == 2 else str(int(memory_bytes))
            try:
                (path / self.limit_files[1]).write_text(swap)  # no swapping past the limit
            except OSError:
                pass  # swap accounting is off on this machine: the limit still holds RAM
        return cgroup


@dataclass
class SandboxCgroup:
    """One kernel's cgroup: its processes, its memory limit, its out-of-memory kills."""

    path: Path
    version: int
    _removed: bool = field(default=False, repr=False)

    @property
    def procs_file(self) -> Path:
        """The file a process writes its pid to, to join."""
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        """Processes in the cgroup now."""
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's memory limit so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> None:
        """SIGKILL every process in the cgroup."""
        kill_file = self.path / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, 9)
            except OSError:
                continue

    def remove(self, wait_s: float = 2.0) -> None:
        """Kill what is left and delete the cgroup (retrying while processes exit)."""
        if self._removed:
            return
        deadline = time.monotonic() + wait_s
        while True:
            self.kill()
            try:
                self.path.rmdir()
                self._removed = True
                return
            except FileNotFoundError:
                self._removed = True
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    logger.warning("cgroup %s could not be removed: %s", self.path, exc)
                    return
                time.sleep(0.02)


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path for ``controller`` (``None``: the unified hierarchy)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",") if controllers else []
        if (controller is None and not controllers) or (controller in names):
            return path
    return None


def find_cgroup_parent() -> CgroupParent | None:
    """Where per-kernel memory cgroups can be made, checked by making and limiting one."""
    root = Path("/sys/fs/cgroup")
    candidates: list[CgroupParent] = []
    unified = _own_cgroup(None)
    if (root / "cgroup.controllers").exists() and unified is not None:
        candidates.append(CgroupParent(2, root / unified.lstrip("/")))
    memory = _own_cgroup("memory")
    if (root / "memory").is_dir() and memory is not None:
        candidates.append(CgroupParent(1, root / "memory" / memory.lstrip("/")))
    return _first_usable(candidates, memory_bytes=64 * 1024**2)


def find_pids_cgroup_parent() -> CgroupParent | None:
    """Where per-kernel ``pids`` cgroups can be made (v2 unified, else the v1 hierarchy).

    Checked by making one, limiting it and moving a process into it.
    """
    root = Path("/sys/fs/cgroup")
    candidates: list[CgroupParent] = []
    unified = _own_cgroup(None)
    if (root / "cgroup.controllers").exists() and unified is not None:
        candidates.append(CgroupParent(2, root / unified.lstrip("/"), "pids"))
    pids = _own_cgroup("pids")
    if (root / "pids").is_dir() and pids is not None:
        candidates.append(CgroupParent(1, root / "pids" / pids.lstrip("/"), "pids"))
    return _first_usable(candidates, max_tasks=64)


def _first_usable(
    candidates: Sequence[CgroupParent],
    *,
    memory_bytes: int | None = None,
    max_tasks: int | None = None,
) -> CgroupParent | None:
    """The first candidate under which a limited cgroup can be made and joined."""
    for parent in candidates:
        probe = parent.create(memory_bytes=memory_bytes, max_tasks=max_tasks)
        if probe is None:
            continue
        try:
            # A process must be able to join it too (the launch shim's first act).
            joined = (
                subprocess.run(
                    ["/bin/sh", "-c", 'echo $$ > "$0"', str(probe.procs_file)],
                    capture_output=True,
                    timeout=10,
                ).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            joined = False
        finally:
            probe.remove()
        if joined:
            _remove_stale_cgroups(parent)
            return parent
    return None


def _remove_stale_cgroups(parent: CgroupParent) -> None:
    """Remove the cgroups that processes killed before they could clean up left behind."""
    for path in parent.path.glob("mappa-*-*"):
        try:
            owner = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if owner != os.getpid() and not os.path.exists(f"/proc/{owner}"):
            SandboxCgroup(path, parent.version).remove(wait_s=0.5)
