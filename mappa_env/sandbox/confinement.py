"""How a sandboxed interpreter is started: directly, or by its bubblewrap command line.

A :class:`Confinement` is what an isolation mode resolved to on this machine (see
:mod:`mappa_env.sandbox.isolation`, which builds one): :meth:`Confinement.command`
wraps an interpreter's command line in the launch shim and bubblewrap's options (the
namespaces, the bound paths, the change of user), :meth:`Confinement.describe` reports
what it enforces, and the workspace methods hand a workspace to the confined user.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mappa_env.sandbox.binds import bindable, interpreter_path, is_within
from mappa_env.sandbox.errors import CGROUP_JOIN_FAILED, IsolationUnavailableError
from mappa_env.sandbox.limits import inherited_import_paths
from mappa_env.sandbox.uids import hand_over_tree

if TYPE_CHECKING:
    from mappa_env.sandbox.cgroups import CgroupParent
    from mappa_env.sandbox.uids import UidLease, UidPool

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


@dataclass(frozen=True)
class Confinement:
    """How sandboxed interpreters are started: directly, or confined in namespaces.

    Build one with :func:`~mappa_env.sandbox.isolation.resolve_confinement`;
    :meth:`command` wraps an interpreter's command line.

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
            if is_within(inner, path) or is_within(path, inner):
                raise ValueError(
                    f"the workdir {path} {'holds' if is_within(inner, path) else 'is inside'} "
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
                setpriv_path(),
                f"--reuid={uid}",
                f"--regid={gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return [*args, interpreter_path(argv[0]), *argv[1:]]


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
def setpriv_path() -> str:
    """The path of ``setpriv``, which drops root inside the sandbox."""
    found = shutil.which("setpriv")
    if found is None:
        raise IsolationUnavailableError(
            "setpriv (util-linux) is needed to drop root inside the sandbox; install util-linux"
        )
    return found
