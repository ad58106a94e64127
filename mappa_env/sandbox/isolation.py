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


Where the code lives: the bubblewrap command line and :class:`Confinement` in
:mod:`mappa_env.sandbox.confinement`, the bound paths in :mod:`mappa_env.sandbox.binds`,
cgroups in :mod:`mappa_env.sandbox.cgroups`, the uid pool in
:mod:`mappa_env.sandbox.uids`, the probe of what this machine can confine in
:mod:`mappa_env.sandbox.probe`; this module resolves a mode (and re-exports those names,
so their old import paths keep working).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Literal

from mappa_env.sandbox.binds import (
    PROJECT_PACKAGES,
    bindable,
    interpreter_path,
    python_paths,
    system_paths,
)
from mappa_env.sandbox.cgroups import (
    CgroupParent,
    SandboxCgroup,
    find_cgroup_parent,
    find_pids_cgroup_parent,
)
from mappa_env.sandbox.confinement import Confinement
from mappa_env.sandbox.errors import CGROUP_JOIN_FAILED, IsolationUnavailableError, SandboxError
from mappa_env.sandbox.probe import MIN_BWRAP_VERSION, probe_namespaces
from mappa_env.sandbox.uids import (
    HAND_OVER_LIMIT,
    SANDBOX_UID,
    SANDBOX_UID_POOL,
    UID_LOCK_DIR,
    UidLease,
    UidPool,
    find_uid_pool,
    hand_over_tree,
)

__all__ = [
    "CGROUP_JOIN_FAILED",
    "HAND_OVER_LIMIT",
    "ISOLATION_MODES",
    "MIN_BWRAP_VERSION",
    "MISSING_WITHOUT_NAMESPACES",
    "PROJECT_PACKAGES",
    "REQUIRE_ISOLATION_ENV",
    "SANDBOX_UID",
    "SANDBOX_UID_POOL",
    "UID_LOCK_DIR",
    "CgroupParent",
    "Confinement",
    "IsolationMode",
    "IsolationUnavailableError",
    "SandboxCgroup",
    "SandboxError",
    "UidLease",
    "UidPool",
    "bindable",
    "declared_confinement",
    "find_cgroup_parent",
    "find_pids_cgroup_parent",
    "find_uid_pool",
    "hand_over_tree",
    "interpreter_path",
    "isolation_required",
    "python_paths",
    "refuse_unconfined",
    "resolve_confinement",
    "system_paths",
    "unconfined_reason",
]

logger = logging.getLogger(__name__)

IsolationMode = Literal["auto", "namespaces", "none"]
"""``"auto"``: namespaces where bubblewrap works, else none with a warning;
``"namespaces"``: always, or an error; ``"none"``: never."""

ISOLATION_MODES: tuple[str, ...] = ("auto", "namespaces", "none")

#: Guarantees that only namespace isolation gives, named in the warning of "auto".
MISSING_WITHOUT_NAMESPACES = (
    "agent code can read every file this user can read (project source, task files, "
    "answers), reach the network and servers on 127.0.0.1, see, read and signal other "
    "processes (the environment's own memory included), and leave processes running"
)


#: The namespace confinement checked to work, or why it cannot (once per process); looked
#: up here at each use, so that a caller can stand in for another machine's answer.
_probe = probe_namespaces


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
