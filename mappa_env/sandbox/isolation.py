"""Confining agents' interpreters with Linux namespaces (bubblewrap) and a cgroup.

Under ``isolation="namespaces"`` every interpreter that runs agent code or reads what
agent code wrote (the Jupyter kernels, DSBench's artifact inspector) starts through
`bubblewrap <https://github.com/containers/bubblewrap>`_ in namespaces of its own:

- **network**: an empty network namespace (only its own loopback): no TCP to servers on
  the host's ``127.0.0.1``, nothing outside.
- **processes**: its own PID namespace, so it sees and signals only its own processes;
  when the interpreter dies, the kernel kills everything left in the namespace (no
  process can outlive the sandbox by forking away). Also its own IPC and UTS namespaces.
- **files**: an empty root with, read-only, the system directories (``/usr``, the
  library directories, a few files of ``/etc``) and this interpreter's prefix and
  package directories; read-write, the workspace (and the kernel's private socket
  directory); a private ``/tmp`` and ``/dev/shm`` (tmpfs, size-capped), a fresh
  ``/proc`` and a minimal ``/dev``. Nothing else: not this project's source, not the
  benchmark files, not answers, not other episodes' workspaces or kernels. This
  package (``mappa_env``, ``mappa_agents``, ``mappa_train``) cannot be imported inside.
- **user**: run as root, the process switches to an unprivileged user with no
  capabilities and ``no_new_privs`` after the namespaces are set up, so it can read only
  world-readable files of what is bound and write only the workspace: a uid of its own
  per workspace, leased from :data:`SANDBOX_UID_POOL` (see :class:`UidPool`), where
  this machine maps those uids; else ``nobody`` (uid 65534), shared by every sandbox.
  Run as another user, bubblewrap maps that user into a new user namespace in which it
  may not create further user namespaces.
- **memory**: where this process may create cgroups (``/sys/fs/cgroup``, v1 or v2),
  each kernel gets a cgroup whose memory limit counts all of its processes, shared
  memory and its tmpfs together; where it may not, each process is still held by
  ``RLIMIT_DATA`` and the tmpfs sizes, but shared memory is not counted.
- **threads**: where it may create ``pids`` cgroups (v1, or v2 where the parent
  delegates the controller), each kernel's cgroup holds every thread and process of
  the sandbox to ``SandboxLimits.max_threads``; elsewhere the sandbox's host-side count
  holds it.

``isolation="auto"`` (the default) confines where bubblewrap works and otherwise warns
once, naming what is then not guaranteed; ``"none"`` runs the interpreter directly (a
resource fence only: limits, timeouts, an allow-listed environment). With
:data:`REQUIRE_ISOLATION_ENV` set, every run must confine: ``"auto"`` acts as
``"namespaces"`` and ``"none"`` is refused. A sandbox factory declares its confinement
as its ``confinement`` attribute (:func:`declared_confinement`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mappa_env.sandbox._kernel import CGROUP_JOIN_FAILED, SandboxError
from mappa_env.sandbox.limits import inherited_import_paths

logger = logging.getLogger(__name__)

IsolationMode = Literal["auto", "namespaces", "none"]
"""``"auto"``: namespaces where bubblewrap works, else none with a warning;
``"namespaces"``: always, or an error; ``"none"``: never."""

ISOLATION_MODES: tuple[str, ...] = ("auto", "namespaces", "none")

SANDBOX_UID = 65534
"""Host uid (and gid) that confined processes run as when this process is root."""

#: Packages of this project: hidden inside the sandbox, so agent code cannot rebuild
#: tasks or answers with them.
PROJECT_PACKAGES = ("mappa_env", "mappa_agents", "mappa_train")

#: System directories bound read-only (symbolic links, as on merged-/usr systems, are
#: recreated as links).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Files and directories of /etc that programs need to start and find libraries, time
#: zones, users' names and certificates; no secrets (no shadow, no credentials).
_ETC_PATHS = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/fonts",
    "/etc/mime.types",
    "/etc/os-release",
)
#: Where the confined process keeps its home, caches and temporary files (its tmpfs).
_INSIDE_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "TEMP": "/tmp",
    "TMP": "/tmp",
    "IPYTHONDIR": "/tmp/.ipython",
    "MPLCONFIGDIR": "/tmp/.config/matplotlib",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "XDG_CONFIG_HOME": "/tmp/.config",
}
#: The launch shim, run before it becomes bubblewrap: join the cgroups whose
#: ``cgroup.procs`` files its first argument lists, separated by ":" (or stop with
#: ``CGROUP_JOIN_FAILED``, 97), ignore SIGINT (the sandbox interrupts code by signalling the
#: kernel's process group; bubblewrap would die of it, the interpreter handles it), open
#: the seccomp filter named second as descriptor 9, then exec.
_SHIM = (
    'IFS=:; for p in $0; do echo $$ > "$p" || exit '
    f"{CGROUP_JOIN_FAILED}; done; unset IFS; "
    'f="$1"; shift; trap "" INT; '
    'if [ -n "$f" ]; then exec "$@" 9<"$f"; fi; exec "$@"'
)
_SECCOMP_FD = "9"

#: Guarantees that only namespace isolation gives, named in the warning of "auto".
MISSING_WITHOUT_NAMESPACES = (
    "agent code can read every file this user can read (project source, task files, "
    "answers), reach the network and servers on 127.0.0.1, see, read and signal other "
    "processes (the environment's own memory included), and leave processes running"
)


class IsolationUnavailableError(SandboxError):
    """``isolation="namespaces"`` was asked for, but bubblewrap cannot confine here."""


@dataclass(frozen=True)
class Confinement:
    """How sandboxed interpreters are started: directly, or confined in namespaces.

    Build one with :func:`resolve_confinement`; :meth:`command` wraps an interpreter's
    command line.

    Attributes:
        mode: ``"namespaces"`` or ``"none"``.
        bwrap: Path of the bubblewrap executable (namespaces only).
        run_as: Host ``(uid, gid)`` the confined process switches to (when this process
            is root), or ``None`` to keep this process's user inside a user namespace.
        read_only: Host paths bound read-only at the same place inside.
        symlinks: ``(target, link)`` symbolic links recreated inside.
        hidden: Directories inside bound paths covered by an empty tmpfs (this
            project's packages in an installed environment).
        cgroups: Where per-kernel memory cgroups are made, or ``None`` when this
            process may not make them.
        pids_cgroups: Where per-kernel ``pids`` cgroups are made (the same place as
            ``cgroups`` on a unified v2 hierarchy that delegates both controllers), or
            ``None`` when this process may not make them.
        uid_pool: Host uids handed to sandboxes one workspace each (see
            :class:`UidPool`), or ``None`` when all run as ``run_as``.
        reason: Why namespaces are not used (``"none"`` resolved from ``"auto"``).
        seccomp: File holding the seccomp filter (see :mod:`mappa_env.sandbox._seccomp`),
            or ``None`` where none is defined for this architecture.
        bwrap_version: bubblewrap's version: options newer than it are left out.
    """

    mode: Literal["namespaces", "none"]
    bwrap: str | None = None
    run_as: tuple[int, int] | None = None
    read_only: tuple[str, ...] = ()
    symlinks: tuple[tuple[str, str], ...] = ()
    hidden: tuple[str, ...] = ()
    cgroups: CgroupParent | None = None
    pids_cgroups: CgroupParent | None = None
    uid_pool: UidPool | None = None
    reason: str = ""
    seccomp: str | None = None
    bwrap_version: tuple[int, ...] = ()

    @property
    def isolated(self) -> bool:
        """Whether processes are confined in namespaces."""
        return self.mode == "namespaces"

    @property
    def wrapper_processes(self) -> int:
        """Processes a confined interpreter runs under, among its host descendants.

        That is bubblewrap's init in the PID namespace.
        """
        return 1 if self.isolated else 0

    def describe(self) -> dict[str, object]:
        """What the confinement enforces, for reports and logs."""
        if not self.isolated:
            return {"isolation": "none", "reason": self.reason}
        return {
            "isolation": "namespaces",
            "network": "none (own namespace)",
            "processes": "own PID namespace, killed together",
            "user": self._user_description(),
            "memory_cgroup": None if self.cgroups is None else f"v{self.cgroups.version}",
            "pids_cgroup": None if self.pids_cgroups is None else f"v{self.pids_cgroups.version}",
            "seccomp": self.seccomp is not None,
            "bubblewrap": ".".join(map(str, self.bwrap_version)),
        }

    def _user_description(self) -> str:
        if self.run_as is None:
            return "own user namespace"
        if self.uid_pool is None:
            return f"uid {self.run_as[0]}, shared by every sandbox"
        first, last = self.uid_pool.uids[0], self.uid_pool.uids[-1]
        return f"a uid of its own per workspace ({first}-{last}; uid {self.run_as[0]} when used up)"

    def lease_user(self, uid: int | None = None) -> UidLease | None:
        """A host uid for one new workspace and its sandboxes, held until released.

        Args:
            uid: Lease this uid only (the owner of an existing workspace), when free.

        Returns:
            The lease, or ``None`` where sandboxes share ``run_as`` (not root, no uid
            pool here, or every uid of the pool is taken) or ``uid`` is held already.
        """
        if not (self.isolated and self.run_as is not None and self.uid_pool is not None):
            return None
        return self.uid_pool.lease(uid)

    def workspace_user(self, path: Path) -> tuple[int, int] | None:
        """The ``(uid, gid)`` confined processes working in ``path`` run as.

        The uid of the pool that owns ``path`` (a workspace leased one), else ``run_as``;
        ``None`` without a change of user (not isolated, or not root).
        """
        if not (self.isolated and self.run_as is not None):
            return None
        if self.uid_pool is not None:
            try:
                owner = os.lstat(path).st_uid
            except OSError:
                owner = None
            if owner in self.uid_pool.uids:
                return owner, owner
        return self.run_as

    def prepare_writable(
        self, path: Path, *, contents: bool = False, user: tuple[int, int] | None = None
    ) -> None:
        """Let the confined user write ``path`` (it belongs to it from now on).

        Args:
            path: A directory the confined process writes.
            contents: Also hand over what is in it (a workspace holding files this
                process wrote, which agent code may change).
            user: The ``(uid, gid)`` to hand it to: a leased uid (:meth:`lease_user`);
                by default the user already working in it (:meth:`workspace_user`).

        Raises:
            OSError: If ``path`` itself cannot be handed over.
        """
        if user is None:
            user = self.workspace_user(path)
        if not self.isolated or self.run_as is None or user is None:
            return
        os.chown(path, *user)
        if contents:
            hand_over_tree(path, *user)

    def owns(self, path: Path) -> bool:
        """Whether ``path`` belongs to a confined user already (a workspace made for it)."""
        if not (self.isolated and self.run_as is not None):
            return False
        try:
            owner = os.lstat(path).st_uid
        except OSError:
            return False
        return owner == self.run_as[0] or (
            self.uid_pool is not None and owner in self.uid_pool.uids
        )

    def check_workdir(self, workdir: Path) -> None:
        """Refuse a workdir whose read-write mount would cover a read-only bound path.

        Raises:
            ValueError: If ``workdir`` contains, or lies inside, a path bound read-only
                (the interpreter's prefix, system directories): bound read-write over
                them, it would let agent code change what this process later imports.
        """
        if not self.isolated:
            return
        path = Path(workdir).resolve()
        for bound in self.read_only:
            inner = Path(bound)
            if _is_within(inner, path) or _is_within(path, inner):
                raise ValueError(
                    f"the workdir {path} {'holds' if _is_within(inner, path) else 'is inside'} "
                    f"{inner}, which the sandbox binds read-only; a writable workspace there "
                    "would let agent code change it: use a directory of its own"
                )

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the home, temporary and cache directories moved inside."""
        merged = dict(env)
        if self.isolated:
            merged.update(_INSIDE_ENV)
        return merged

    def command(
        self,
        argv: Sequence[str],
        *,
        workdir: Path,
        writable: Iterable[Path] = (),
        read_only: Iterable[Path] = (),
        workdir_writable: bool = True,
        tmp_bytes: int | None = None,
        cgroup_procs: Sequence[Path] = (),
    ) -> list[str]:
        """The command line that runs ``argv`` confined (or ``argv`` itself).

        Args:
            argv: The interpreter's command; its first element must be an absolute
                path inside the bound directories (``sys.executable`` is). It is run
                by its real directory (:func:`interpreter_path`): bound directories are
                mounted at their real paths only.
            workdir: Working directory inside, bound at the same path.
            writable: More directories bound read-write at the same path.
            read_only: More directories bound read-only at the same path (those that
                hold this project's source are left out, as for ``PYTHONPATH``).
            workdir_writable: Bind the workdir read-write (else read-only).
            tmp_bytes: Size of the private ``/tmp`` and ``/dev/shm`` (each).
            cgroup_procs: The ``cgroup.procs`` files of the cgroups the process joins
                first (its memory and ``pids`` cgroups).

        Returns:
            The full command line.
        """
        if not self.isolated:
            return list(argv)
        assert self.bwrap is not None
        for path in (workdir, *writable):
            self.check_workdir(path)
        args = [
            "/bin/sh",
            "-c",
            _SHIM,
            ":".join(str(p) for p in cgroup_procs),
            self.seccomp or "",
            self.bwrap,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--die-with-parent",
        ]
        if self.run_as is None:
            args.append("--unshare-user")
            if self.bwrap_version >= (0, 8):
                args.append("--disable-userns")
        if self.seccomp is not None:
            args += ["--seccomp", _SECCOMP_FD]
        args += ["--proc", "/proc", "--dev", "/dev"]
        # --size came with bubblewrap 0.7; before it the tmpfs is held by the cgroup only.
        sized = tmp_bytes is not None and self.bwrap_version >= (0, 7)
        size = ["--size", str(int(tmp_bytes))] if sized else []
        args += ["--perms", "1777", *size, "--tmpfs", "/tmp"]
        args += ["--perms", "1777", *size, "--tmpfs", "/dev/shm"]
        # What exists inside so far: "empty" (a tmpfs or made directory, whose children
        # must be made) or "bind" (a host tree, whose children exist as on the host).
        made = {"/": "empty", "/tmp": "empty", "/dev": "empty", "/dev/shm": "empty"}
        made["/proc"] = "bind"
        for target, link in self.symlinks:
            args += ["--symlink", target, link]
            made[link] = "bind"
        mounts: list[tuple[str, str]] = [("--ro-bind", p) for p in self.read_only]
        # PYTHONPATH may have changed since the confinement was made.
        extra, hidden = bindable([*inherited_import_paths(), *read_only])
        mounts += [("--ro-bind", p) for p in extra if p not in self.read_only]
        mounts.append(("--bind" if workdir_writable else "--ro-bind", str(workdir)))
        mounts += [("--bind", str(p)) for p in writable]
        for kind, path in mounts:
            args += _parent_dirs(path, made)
            args += [kind, path, path]
            made[path] = "bind"
        for path in dict.fromkeys([*self.hidden, *hidden]):
            args += ["--tmpfs", path]
        args += ["--chdir", str(workdir)]
        args.append("--")
        user = self.workspace_user(workdir)
        if user is not None:
            uid, gid = user
            args += [
                _setpriv(),
                f"--reuid={uid}",
                f"--regid={gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return [*args, interpreter_path(argv[0]), *argv[1:]]


def interpreter_path(executable: str | None = None) -> str:
    """Where an interpreter is found inside the sandbox: its real directory, its own name.

    Python started through a symbolic link to a folder (``/data/envs -> /srv/envs``) or
    by a relative path (``../venv/bin/python``) keeps that spelling in
    ``sys.executable``; the sandbox binds directories at their real paths only, so that
    spelling names nothing inside. The file name is kept, not resolved: a virtual
    environment's ``python`` is a link to the base interpreter, and started by the
    link's target Python would not find the environment's ``pyvenv.cfg`` (nor its
    packages). The link's target is bound too (see :func:`python_paths`).

    Args:
        executable: An interpreter's path, by default ``sys.executable``.

    Returns:
        The absolute path with every directory resolved; a bare name is returned as is.
    """
    path = sys.executable if executable is None else executable
    if os.sep not in path:
        return path
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(directory), name)


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


def _parent_dirs(path: str, made: dict[str, str]) -> list[str]:
    """``--dir`` arguments for the parents of ``path`` that do not exist inside yet.

    A parent inside a bound host tree exists already; one inside a tmpfs is made,
    world-traversable (bubblewrap would make it readable by its own user only, which
    the unprivileged user inside could not traverse).
    """
    args: list[str] = []
    for parent in (str(p) for p in reversed(Path(path).parents)):
        if parent in made:
            continue
        container = max((m for m in made if parent.startswith(m.rstrip("/") + "/")), key=len)
        if made[container] == "bind":
            continue
        args += ["--perms", "0755", "--dir", parent]
        made[parent] = "empty"
    return args


@functools.cache
def _setpriv() -> str:
    found = shutil.which("setpriv")
    if found is None:
        raise IsolationUnavailableError(
            "setpriv (util-linux) is needed to drop root inside the sandbox; install util-linux"
        )
    return found


# --------------------------------------------------------------------------------------
# What to bind
# --------------------------------------------------------------------------------------


def _project_package_dirs() -> list[Path]:
    """Directories of this project's packages as this interpreter imports them."""
    found = []
    for name in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found.extend(Path(p).resolve() for p in spec.submodule_search_locations)
    return found


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _source_roots(packages: Sequence[Path]) -> list[Path]:
    """Checkouts this project is imported from (a package's parent outside site dirs)."""
    return sorted(
        {p.parent for p in packages if not any(x in p.parts for x in _SITE_DIRS)}, key=str
    )


_SITE_DIRS = ("site-packages", "dist-packages")


def bindable(candidates: Iterable[str | Path]) -> tuple[list[str], list[str]]:
    """Which of ``candidates`` may be bound read-only, and directories to cover in them.

    Anything inside a checkout this project is imported from (its code, tests,
    benchmarks, configs and data) is left out, except the interpreter's own prefixes (a
    ``.venv`` inside the checkout). Checkouts and this project's package directories
    inside a kept path are returned to be covered by an empty tmpfs. Paths are resolved
    (a link to them, such as a venv's python, then resolves inside), and ones inside
    another kept path are dropped.

    Returns:
        ``(read_only, hidden)``.
    """
    packages = _project_package_dirs()
    roots = _source_roots(packages)
    prefixes = {
        Path(p).resolve()
        for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    }
    kept: list[Path] = []
    for candidate in candidates:
        if not os.path.exists(candidate):
            continue
        path = Path(candidate).resolve()
        in_checkout = any(_is_within(path, root) for root in roots)
        if in_checkout and not any(_is_within(path, prefix) for prefix in prefixes):
            continue
        kept.append(path)
    unique = sorted(set(kept), key=lambda p: (len(p.parts), str(p)))
    outermost: list[Path] = []
    for path in unique:
        if not any(_is_within(path, other) for other in outermost):
            outermost.append(path)
    covered = {
        str(inner)
        for inner in (*roots, *packages)
        for path in outermost
        if _is_within(inner, path) and inner != path
    }
    return [str(p) for p in outermost], sorted(covered)


def python_paths() -> tuple[list[str], list[str]]:
    """Read-only paths an interpreter like this one needs, and package dirs to hide.

    The interpreter's prefixes and site directories and the ``PYTHONPATH`` entries,
    filtered by :func:`bindable` (nothing of a checkout of this project; its packages
    covered where they are installed in a site directory).

    Returns:
        ``(read_only, hidden)``.
    """
    candidates: list[Path] = []
    for value in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        candidates.append(Path(value))
    executable = Path(sys.executable)
    candidates.append(executable.parent)
    candidates.append(executable.resolve().parent.parent)
    candidates.extend(Path(p) for p in site.getsitepackages())
    user_site = site.getusersitepackages()
    if site.ENABLE_USER_SITE and user_site and os.path.isdir(user_site):
        candidates.append(Path(user_site))
    # Not sys.path as such: its first entry is the running script's directory (a user's
    # experiment folder, maybe beside a data directory with answers). Directories that
    # .pth files add outside the site directories (editable installs of other packages)
    # are not bound either; put them on PYTHONPATH to make them importable inside.
    candidates.extend(Path(p) for p in inherited_import_paths())
    return bindable(candidates)


def system_paths() -> tuple[list[str], list[tuple[str, str]]]:
    """System directories and /etc files to bind read-only, and links to recreate."""
    read_only: list[str] = []
    links: list[tuple[str, str]] = []
    for path in (*_SYSTEM_DIRS, *_ETC_PATHS):
        if os.path.islink(path) and path in _SYSTEM_DIRS:
            links.append((os.readlink(path), path))
        elif os.path.exists(path):
            read_only.append(path)
    return read_only, links


# --------------------------------------------------------------------------------------
# Memory and pids cgroups
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# A uid per workspace
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Resolving a mode
# --------------------------------------------------------------------------------------


#: Oldest bubblewrap with what the confinement needs (``--perms``, ``--chmod``).
MIN_BWRAP_VERSION = (0, 5)


def _bwrap_version(bwrap: str) -> tuple[int, ...]:
    """Bubblewrap's version as numbers, from ``bwrap --version`` ("bubblewrap 0.8.0")."""
    try:
        done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IsolationUnavailableError(f"bubblewrap ({bwrap}) could not run: {exc}") from exc
    words = done.stdout.split()
    try:
        return tuple(int(part) for part in words[-1].split("."))
    except (IndexError, ValueError):
        raise IsolationUnavailableError(
            f"cannot read bubblewrap's version from {done.stdout.strip()!r}"
        ) from None


def _namespaces_confinement() -> Confinement:
    """The namespace confinement for this process (not yet checked to work)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise IsolationUnavailableError(
            "bubblewrap (bwrap) is not installed; install it (Debian/Ubuntu: "
            "apt-get install bubblewrap) or use isolation='none'"
        )
    version = _bwrap_version(bwrap)
    if version < MIN_BWRAP_VERSION:
        raise IsolationUnavailableError(
            f"bubblewrap {'.'.join(map(str, version))} is too old: 0.5 or newer is needed"
        )
    from mappa_env.sandbox._seccomp import filter_file

    run_as = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else None
    if run_as is not None:
        _setpriv()
    python_ro, hidden = python_paths()
    system_ro, links = system_paths()
    return Confinement(
        mode="namespaces",
        bwrap=bwrap,
        run_as=run_as,
        read_only=tuple(dict.fromkeys([*system_ro, *python_ro])),
        symlinks=tuple(links),
        hidden=tuple(hidden),
        cgroups=find_cgroup_parent(),
        pids_cgroups=find_pids_cgroup_parent(),
        uid_pool=find_uid_pool() if run_as is not None else None,
        seccomp=None if (path := filter_file()) is None else str(path),
        bwrap_version=version,
    )


def _check(confinement: Confinement) -> None:
    """Start a confined interpreter once; raise with its error when it cannot start."""
    with tempfile.TemporaryDirectory(prefix="mappa-isolation-check-") as tmp:
        workdir = Path(tmp)
        confinement.prepare_writable(workdir)
        argv = confinement.command(
            [sys.executable, "-I", "-c", "import os; open('ok', 'w').write(str(os.getpid()))"],
            workdir=workdir,
        )
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
                env=confinement.environment({"PATH": os.environ.get("PATH", os.defpath)}),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise IsolationUnavailableError(f"bubblewrap could not run: {exc}") from exc
        written = workdir / "ok"
        if done.returncode != 0 or not written.exists():
            detail = (done.stderr or done.stdout).strip()[-1500:]
            hint = (
                " Unprivileged user namespaces may be disabled (sysctl "
                "kernel.unprivileged_userns_clone=1, or an AppArmor profile for bwrap)."
                if confinement.run_as is None
                else ""
            )
            raise IsolationUnavailableError(
                f"bubblewrap could not start a confined interpreter (exit "
                f"{done.returncode}): {detail or 'no output'}.{hint}"
            )
        if written.read_text() != "2":
            raise IsolationUnavailableError(
                "the confined interpreter did not run in a PID namespace of its own"
            )


@functools.cache
def _probe() -> Confinement | IsolationUnavailableError:
    """The namespace confinement checked to work, or why it cannot (once per process)."""
    try:
        confinement = _namespaces_confinement()
        _check(confinement)
    except IsolationUnavailableError as exc:
        return exc
    logger.debug("namespace isolation available: %s", confinement.describe())
    return confinement


#: Reasons for running unconfined that a caller has told its user already
#: (:func:`unconfined_reason`): not logged again.
_TOLD: set[str] = set()


@functools.cache
def _warn_unconfined(reason: str) -> None:
    """Warn once per process and reason that auto isolation fell back to none."""
    if reason in _TOLD:
        logger.debug("isolation='auto' runs agent code without namespaces: %s", reason)
        return
    logger.warning(
        "isolation='auto' runs agent code without namespaces: %s. Then %s. Install "
        "bubblewrap to confine it, or pass isolation='none' to accept this.",
        reason,
        MISSING_WITHOUT_NAMESPACES,
    )


#: Set to 1 (or true, yes, on), every run must confine agents' code: ``"auto"`` then acts
#: as ``"namespaces"`` and raises where it cannot, and ``"none"``, pooled kernels and
#: sandbox factories that declare no confinement are refused.
REQUIRE_ISOLATION_ENV = "MAPPA_REQUIRE_ISOLATION"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def isolation_required() -> bool:
    """Whether :data:`REQUIRE_ISOLATION_ENV` asks every run to confine agents' code.

    Raises:
        ValueError: For a value that is neither true nor false, naming the variable.
    """
    value = os.environ.get(REQUIRE_ISOLATION_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{REQUIRE_ISOLATION_ENV}={os.environ[REQUIRE_ISOLATION_ENV]!r} is neither true "
        f"({', '.join(_TRUE)}) nor false ({', '.join(v for v in _FALSE if v)} or unset)"
    )


def refuse_unconfined(what: str) -> None:
    """Raise when :data:`REQUIRE_ISOLATION_ENV` is set: ``what`` would run unconfined.

    Raises:
        IsolationUnavailableError: Naming ``what``, the variable and the fix.
    """
    if isolation_required():
        raise IsolationUnavailableError(
            f"{what} would run agents' code without namespace isolation, and "
            f"{REQUIRE_ISOLATION_ENV} is set: use namespace isolation (sandbox='jupyter' "
            f"with bubblewrap installed), or unset {REQUIRE_ISOLATION_ENV}"
        )


def unconfined_reason(isolation: IsolationMode | str = "auto") -> str | None:
    """Why ``isolation`` would run agents' code unconfined here, for a caller to say first.

    A command line says it in its first line; the warning :func:`resolve_confinement`
    would log for the same reason is then not repeated.

    Args:
        isolation: The mode a run asked for.

    Returns:
        The reason where ``"auto"`` finds no namespace isolation (and
        :data:`REQUIRE_ISOLATION_ENV` is not set: then resolving refuses the run
        instead); ``None`` where it confines, and for ``"namespaces"`` and ``"none"``
        (which confine or fail, or were asked for).
    """
    if isolation != "auto" or isolation_required():
        return None
    probed = _probe()
    if isinstance(probed, Confinement):
        return None
    _TOLD.add(str(probed))
    return str(probed)


def declared_confinement(factory: object) -> Confinement | None:
    """The confinement a sandbox factory declares (its ``confinement`` attribute), if any.

    :meth:`JupyterSandbox.factory <mappa_env.sandbox.JupyterSandbox.factory>` and
    :class:`~mappa_env.sandbox.KernelPool` declare theirs; a factory of one's own
    declares it by carrying a :class:`Confinement` as ``factory.confinement``. One
    that does not is taken to run code unconfined.
    """
    declared = getattr(factory, "confinement", None)
    return declared if isinstance(declared, Confinement) else None


def resolve_confinement(isolation: IsolationMode | str = "auto") -> Confinement:
    """The confinement of an isolation mode on this machine.

    With :data:`REQUIRE_ISOLATION_ENV` set, ``"auto"`` acts as ``"namespaces"`` and
    ``"none"`` is refused.

    Args:
        isolation: ``"auto"``, ``"namespaces"`` or ``"none"``.

    Returns:
        The confinement to use.

    Raises:
        ValueError: For an unknown mode.
        IsolationUnavailableError: For ``"namespaces"`` when bubblewrap cannot confine
            here (the message names the cause and the fix), and for any mode that
            would not confine when :data:`REQUIRE_ISOLATION_ENV` is set.
    """
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    required = isolation_required()
    if isolation == "none":
        refuse_unconfined("isolation='none'")
        return Confinement(mode="none", reason="isolation='none' was asked for")
    probed = _probe()
    if isinstance(probed, Confinement):
        return probed
    if isolation == "namespaces":
        raise IsolationUnavailableError(str(probed))
    if required:
        raise IsolationUnavailableError(
            f"{probed} ({REQUIRE_ISOLATION_ENV} is set, so isolation='auto' must confine)"
        )
    _warn_unconfined(str(probed))
    return Confinement(mode="none", reason=str(probed))
