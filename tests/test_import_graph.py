"""The training package's imports: no circles, no private names, light learner ranks.

A learner rank (a Ray actor) imports what it trains with and the rows it reads, not the
environments: a rank's process then starts without PettingZoo, Gymnasium, sandboxes or
coaches. And across all three packages no module imports another that imports it back,
not even for type hints only.
"""

from __future__ import annotations

import ast
import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mappa_train"


@pytest.fixture(autouse=True)
def _no_garbage_collection_while_parsing():
    """No finalizer runs inside ``ast.parse`` while these tests parse the packages.

    CPython 3.11 keeps one AST recursion counter per interpreter, and a parse that
    another one interleaves with fails with "AST constructor recursion depth mismatch"
    (python/cpython#106905). Seen once in the suite, with an asyncio task an earlier
    test had left pending destroyed (and its error logged) during the parse: a garbage
    collection inside ``compile`` runs such finalizers. Collecting first and pausing
    the collector while the test runs leaves none to run there.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


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


# ------------------------------------------------ one environment never imports another

#: The environments' packages: ``mappa_env/envs/<name>/``.
ENVIRONMENTS = frozenset(p.parent.name for p in (ROOT / "mappa_env" / "envs").glob("*/__init__.py"))


def _environment(module: str) -> str | None:
    """The environment whose package holds ``module`` (``None`` for shared modules)."""
    parts = module.split(".")
    if parts[:2] == ["mappa_env", "envs"] and len(parts) > 2 and parts[2] in ENVIRONMENTS:
        return parts[2]
    return None


def _only_strings(node: ast.expr) -> bool:
    return isinstance(node, ast.Dict) and all(
        isinstance(v, ast.Constant) and isinstance(v.value, str) for v in [*node.keys, *node.values]
    )


def _reexports(module: str) -> dict[str, tuple[str, str | None]] | None:
    """What a module that only re-exports names passes on: name -> (home, name there).

    ``None`` for a module that defines anything of its own. A re-export module holds
    imports, ``__all__``, a lazy map of names to modules (``EXPORTS`` with a
    ``__getattr__``), or makes its name another module (``sys.modules[__name__] = m``:
    the key ``"*"``). A home is ``(module, None)`` when the name is a module itself.
    """
    if module not in ALL_MODULES or _environment(module) is not None:
        return None
    tree = ast.parse(ALL_MODULES[module].read_text())
    passed: dict[str, tuple[str, str | None]] = {}
    bound: dict[str, tuple[str, str | None]] = {}  # import-bound names (for sys.modules)

    def record(node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            return
        source = _imported_module(module, node)
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            home = (sub, None) if sub in ALL_MODULES else (source, alias.name)
            bound[alias.asname or alias.name] = home
            if source in ALL_MODULES:
                passed[alias.asname or alias.name] = home

    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            record(node)
        elif isinstance(node, ast.If) and _is_type_checking(node) and not node.orelse:
            for child in node.body:
                if not isinstance(child, (ast.Import, ast.ImportFrom)):
                    return None
                record(child)
        elif isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
            continue
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if len(targets) != 1 or value is None:
                return None
            target = targets[0]
            if isinstance(target, ast.Name) and target.id == "__all__":
                continue
            if isinstance(target, ast.Name) and _only_strings(value):
                pairs = zip(value.keys, value.values, strict=True)  # type: ignore[attr-defined]
                for key, home in ((k.value, v.value) for k, v in pairs):
                    if home in ALL_MODULES:
                        passed[key] = (home, key)
                continue
            if (
                isinstance(target, ast.Subscript)
                and ast.unparse(target) == "sys.modules[__name__]"
                and isinstance(value, ast.Name)
                and value.id in bound
            ):
                return {"*": bound[value.id]}
            return None
        else:
            return None
    return passed


def _homes(module: str, name: str | None, seen: frozenset[str] = frozenset()) -> set[str]:
    """The modules that importing ``name`` from ``module`` (the module if ``None``) loads
    from, following re-export modules to where the names are defined."""
    exports = None if module in seen else _reexports(module)
    if exports is None:
        return {module}
    seen = seen | {module}
    if "*" in exports:
        home, attribute = exports["*"]
        return _homes(home, name if attribute is None else attribute, seen)
    if name is None:
        found = {m for home in exports.values() for m in _homes(*home, seen)}
        return found or {module}
    if name not in exports:
        return {module}
    return _homes(*exports[name], seen)


def _imports_of_other_environments(module: str, tree: ast.AST) -> list[str]:
    """``module -> home`` for each import of ``module`` that loads another environment's
    module, directly or through re-export modules (type-only imports included)."""
    mine = _environment(module)
    found: set[str] = set()
    for node in _all_imports(tree):
        homes: set[str] = set()
        if isinstance(node, ast.Import):
            for alias in node.names:
                if known := _known_prefix(alias.name):
                    homes |= _homes(known, None)
        else:
            source = _imported_module(module, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in ALL_MODULES:
                    homes |= _homes(sub, None)
                elif source in ALL_MODULES:
                    homes |= _homes(source, alias.name)
                elif known := _known_prefix(source):
                    homes |= _homes(known, None)
        found |= {f"{module} -> {h}" for h in homes if _environment(h) not in (None, mine)}
    return sorted(found)


def test_re_export_modules_are_followed_to_where_names_live():
    assert {"mathchat", "dsbench"} <= ENVIRONMENTS
    # A module that is another module under a second name.
    assert _homes("mappa_env.tasks.math", "load_math_tasks") == {"mappa_env.envs.mathchat.tasks"}
    # A lazy package: each name to its own home, the shared ones included.
    assert _homes("mappa_env.tasks", "load_math_tasks") == {"mappa_env.envs.mathchat.tasks"}
    assert _homes("mappa_env.tasks", "user_task_secret") == {"mappa_env.tasks.secret"}
    # Plain re-exports, by name and as a whole.
    assert _homes("mappa_env.dsbench.tasks", "DSBenchTask") == {"mappa_env.envs.dsbench.tasks"}
    assert "mappa_env.envs.mathchat.grading" in _homes("mappa_env.grading", None)
    # A module with code of its own is where its names live.
    assert _homes("mappa_env.tasks.secret", "user_task_secret") == {"mappa_env.tasks.secret"}
    # How an environment reached another one before: through a former import path.
    code = "from mappa_env.tasks.math import BENCH_DIR_ENV, find_bench_dir\n"
    assert _imports_of_other_environments("mappa_env.envs.dsbench.tasks", ast.parse(code)) == [
        "mappa_env.envs.dsbench.tasks -> mappa_env.envs.mathchat.tasks"
    ]
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..mathchat import env\n"
    assert _imports_of_other_environments("mappa_env.envs.dsbench.files", ast.parse(code)) == [
        "mappa_env.envs.dsbench.files -> mappa_env.envs.mathchat.env"
    ]
    code = "from mappa_env.tasks import user_task_secret\nimport mappa_env.envs.pipeline\n"
    assert _imports_of_other_environments("mappa_env.envs.dsbench.files", ast.parse(code)) == []


def test_no_environment_imports_another_environment():
    crossing = [
        line
        for name, path in ALL_MODULES.items()
        if _environment(name) is not None
        for line in _imports_of_other_environments(name, ast.parse(path.read_text()))
    ]
    assert crossing == [], "an environment imports another (through re-exports too)"
