"""What a confined interpreter sees of this machine: the paths bound inside it.

The system directories and the few ``/etc`` files programs need, this interpreter's
prefixes, site directories and ``PYTHONPATH`` entries (:func:`python_paths`,
:func:`system_paths`), minus anything of a checkout of this project, whose packages are
covered where they are installed (:func:`bindable`); and where the interpreter is found
inside (:func:`interpreter_path`). Used by :mod:`mappa_env.sandbox.confinement` and
:mod:`mappa_env.sandbox.probe`.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from mappa_env.sandbox.limits import inherited_import_paths

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


def _project_package_dirs() -> list[Path]:
    """Directories of this project's packages as this interpreter imports them."""
    found = []
    for name in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found.extend(Path(p).resolve() for p in spec.submodule_search_locations)
    return found


def is_within(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or lies inside it."""
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
        in_checkout = any(is_within(path, root) for root in roots)
        if in_checkout and not any(is_within(path, prefix) for prefix in prefixes):
            continue
        kept.append(path)
    unique = sorted(set(kept), key=lambda p: (len(p.parts), str(p)))
    outermost: list[Path] = []
    for path in unique:
        if not any(is_within(path, other) for other in outermost):
            outermost.append(path)
    covered = {
        str(inner)
        for inner in (*roots, *packages)
        for path in outermost
        if is_within(inner, path) and inner != path
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
