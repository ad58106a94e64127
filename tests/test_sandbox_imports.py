"""The sandbox package's shape: no module in an import circle, no file too long to read.

Every import counts, wherever it stands: at the top of a module, inside a function
(run-time imports that break a circle only at import time) and under ``TYPE_CHECKING``
(a circle of types is still a circle a reader has to untangle). Circles are looked for
in all of ``mappa_env``, so one that leaves the sandbox package and comes back counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mappa_env"
SANDBOX = "mappa_env.sandbox"
#: Longest a module of the sandbox package may be: what one reads in one sitting.
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _owner(name: str) -> str | None:
    """The module of ``mappa_env`` that ``name`` (a dotted import target) loads, if any."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def import_edges(source: str, name: str) -> set[str]:
    """The ``mappa_env`` modules that module ``name`` imports, with all of its imports.

    ``from pkg import sub`` counts the submodule ``sub``; ``from pkg import Name`` counts
    ``pkg``. Imports inside functions and under ``TYPE_CHECKING`` count like any other.
    """
    package = name if MODULES.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets |= {owner for a in node.names if (owner := _owner(a.name))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            owner = _owner(base)
            targets |= subs or ({owner} if owner else set())
    return targets - {name}


def circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest import path from ``start`` back to itself, or None when there is none."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(graph.get(name, ())):
                if target == start:
                    path = [name]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in came_from:
                    came_from[target] = name
                    following.append(target)
        frontier = following
    return None


def _in_sandbox(name: str) -> bool:
    return name == SANDBOX or name.startswith(SANDBOX + ".")


def test_the_edges_count_function_level_and_type_only_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from mappa_env.sandbox import _process\n"
        "if TYPE_CHECKING:\n"
        "    from mappa_env.sandbox.isolation import Confinement\n"
        "def f():\n"
        "    import mappa_env.sandbox.quota\n"
        "    from mappa_env.sandbox.limits import SandboxLimits\n"
    )
    assert import_edges(source, "mappa_env.sandbox._kernel") == {
        "mappa_env.sandbox._process",
        "mappa_env.sandbox.isolation",
        "mappa_env.sandbox.quota",
        "mappa_env.sandbox.limits",
    }
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"a"}}
    assert circle_through(graph, "b") == ["b", "c", "a", "b"]
    assert circle_through(graph, "a") == ["a", "d", "a"]
    assert circle_through(graph, "e") is None


def test_no_sandbox_module_is_in_an_import_circle():
    graph = {
        name: import_edges(path.read_text(encoding="utf-8"), name) for name, path in MODULES.items()
    }
    found = [
        c for name in sorted(graph) if _in_sandbox(name) and (c := circle_through(graph, name))
    ]
    assert found == [], "import circles through mappa_env.sandbox: " + "; ".join(
        " -> ".join(c) for c in found
    )


def test_every_sandbox_module_is_short_enough_to_read_in_one_sitting():
    long = {
        name: n
        for name, path in MODULES.items()
        if _in_sandbox(name)
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules of mappa_env.sandbox over {MAX_LINES} lines: {long}"
