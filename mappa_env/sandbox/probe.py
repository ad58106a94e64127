"""What this machine can confine: bubblewrap found, its version, one confined start.

:func:`probe_namespaces` builds the namespace confinement for this process
(:func:`namespaces_confinement`: bubblewrap, the bound paths, cgroups, the uid pool, the
seccomp filter) and starts one confined interpreter with it
(:func:`check_confinement`), once per process; :mod:`mappa_env.sandbox.isolation`
decides from the answer what each isolation mode does.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mappa_env.sandbox.binds import python_paths, system_paths
from mappa_env.sandbox.cgroups import find_cgroup_parent, find_pids_cgroup_parent
from mappa_env.sandbox.confinement import Confinement, setpriv_path
from mappa_env.sandbox.errors import IsolationUnavailableError
from mappa_env.sandbox.uids import SANDBOX_UID, find_uid_pool

logger = logging.getLogger(__name__)

#: Oldest bubblewrap with what the confinement needs (``--perms``, ``--chmod``).
MIN_BWRAP_VERSION = (0, 5)


def bwrap_version(bwrap: str) -> tuple[int, ...]:
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


def namespaces_confinement() -> Confinement:
    """The namespace confinement for this process (not yet checked to work)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise IsolationUnavailableError(
            "bubblewrap (bwrap) is not installed; install it (Debian/Ubuntu: "
            "apt-get install bubblewrap) or use isolation='none'"
        )
    version = bwrap_version(bwrap)
    if version < MIN_BWRAP_VERSION:
        raise IsolationUnavailableError(
            f"bubblewrap {'.'.join(map(str, version))} is too old: 0.5 or newer is needed"
        )
    from mappa_env.sandbox._seccomp import filter_file

    run_as = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else None
    if run_as is not None:
        setpriv_path()
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


def check_confinement(confinement: Confinement) -> None:
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
def probe_namespaces() -> Confinement | IsolationUnavailableError:
    """The namespace confinement checked to work, or why it cannot (once per process)."""
    try:
        confinement = namespaces_confinement()
        check_confinement(confinement)
    except IsolationUnavailableError as exc:
        return exc
    logger.debug("namespace isolation available: %s", confinement.describe())
    return confinement
