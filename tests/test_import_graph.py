"""The training package's imports: no circles, no private names, light learner ranks.

A learner rank (a Ray actor) imports what it trains with and the rows it reads, not the
environments: a rank's process then starts without PettingZoo, Gymnasium, sandboxes or
coaches. And across all three packages no module imports another that imports it back,
not even for type hints only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mappa_train"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that runs (at import time or in a function), not type-only."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _edges(name: str) -> set[str]:
    """The ``mappa_train`` modules ``name`` imports (``from pkg import sub`` counts ``sub``)."""
    targets: set[str] = set()
    for node in _imports(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names if a.name in MODULES}
        elif node.module and node.level == 0 and node.module in MODULES:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            targets |= (subs & MODULES.keys()) or {node.module}
    return targets - {name}


def test_no_import_circles_inside_mappa_train():
    graph = {name: _edges(name) for name in MODULES}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert circles == []


def test_no_module_imports_another_modules_private_name():
    private = []
    for name, path in MODULES.items():
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private += [
                    f"{name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"
                ]
    assert private == []


def test_the_learner_rank_modules_import_no_environment_code():
    # What a rank's process imports: its actor class, the rows it unpickles, and what
    # its setup imports (the config, the sharded learner, dtypes).
    code = (
        "import json, sys\n"
        "import mappa_train.learner_rank, mappa_train.fsdp, mappa_train.update\n"
        "import mappa_train.config, mappa_agents.dtypes\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert "mappa_train.learner_rank" in loaded
    heavy = {"pettingzoo", "gymnasium", "mappa_agents.runner", "mappa_agents.hf"}
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)
    # Of the environment package only the names of the credit modes (the config checks
    # its credit_mode against them) and the standard-library checker of field types with
    # its error class; no environment, sandbox, coach or registry.
    assert {m for m in loaded if m.split(".")[0] == "mappa_env"} <= {
        "mappa_env",
        "mappa_env.credit",
        "mappa_env.errors",
        "mappa_env.typecheck",
    }


# ------------------------------------------------ every package, type-only imports included

PACKAGES = ("mappa_env", "mappa_agents", "mappa_train")
ALL_MODULES = {
    _module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
}

#: Circles tolerated for now (none: the project has no import circle). One added here must
#: leave when it goes: the test fails on a listed circle that no longer exists.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, ``if TYPE_CHECKING:`` blocks and functions included."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _imported_module(name: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    package = name.split(".")
    if ALL_MODULES[name].name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _known_prefix(dotted: str) -> str | None:
    while dotted and dotted not in ALL_MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _all_edges(name: str) -> set[str]:
    """The project modules ``name`` imports in any way (``from pkg import sub``: ``sub``)."""
    targets: set[str] = set()
    for node in _all_imports(ast.parse(ALL_MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            targets |= {m for a in node.names if (m := _known_prefix(a.name))}
            continue
        module = _imported_module(name, node)
        if module not in ALL_MODULES:
            found = _known_prefix(module)
            targets |= {found} if found else set()
            continue
        subs = {f"{module}.{a.name}" for a in node.names} & ALL_MODULES.keys()
        targets |= subs
        if len(subs) < len(node.names):  # names defined in the module itself
            targets.add(module)
    return targets - {name}


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in sorted(graph[name]):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == name:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_the_circle_finder_finds_type_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == {frozenset("abc")}
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import y\n"
    assert [node.module for node in _all_imports(ast.parse(code))] == ["typing", "x"]


def test_no_import_circles_in_any_package_type_only_imports_included():
    graph = {name: _all_edges(name) for name in ALL_MODULES}
    circles = _circles(graph)
    new = sorted(sorted(c) for c in circles - KNOWN_CIRCLES)
    gone = sorted(sorted(c) for c in KNOWN_CIRCLES - circles)
    assert not new, f"modules that import each other (TYPE_CHECKING imports count): {new}"
    assert not gone, f"no longer a circle, remove it from KNOWN_CIRCLES: {gone}"


# ------------------------------------------------ the Ray package and its former paths

RAY_MOVES = {
    "ray_support": "support",
    "placement": "placement",
    "rollout_engines": "rollout_engines",
    "weight_sync": "weight_sync",
    "learner_rank": "learner_rank",
    "ray_learner": "learner",
    "sync_modes": "sync_modes",
    "ray_backend": "backend",
    "ray_trainer": "trainer",
}


def test_the_former_ray_module_paths_are_the_modules_themselves():
    code = (
        "import importlib, json, sys\n"
        "import mappa_train.ray\n"
        "light = 'ray' not in sys.modules and 'torch' not in sys.modules\n"
        f"moves = {RAY_MOVES!r}\n"
        "same = {old: importlib.import_module('mappa_train.' + old)\n"
        "        is importlib.import_module('mappa_train.ray.' + new)\n"
        "        for old, new in moves.items()}\n"
        "from mappa_train.ray.support import import_ray\n"
        "real = getattr(import_ray(), 'init', None) is not None\n"
        "print(json.dumps([light, same, real]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    if "MissingExtraError" in result.stderr:
        pytest.skip("needs the distributed extra (ray)")
    assert result.returncode == 0, result.stderr
    light, same, real = json.loads(result.stdout.strip().splitlines()[-1])
    assert light, "importing mappa_train.ray imported Ray or torch"
    assert same == dict.fromkeys(RAY_MOVES, True)
    assert real, "mappa_train.ray shadowed the real Ray"
