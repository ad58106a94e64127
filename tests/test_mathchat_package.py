"""MathChat-v0 as one package: its parts, and the old import paths that lead to them."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Old module -> the module its code lives in now.
MOVED_MODULES = {
    "mappa_env.tasks.generator": "mappa_env.envs.mathchat.generator",
    "mappa_env.tasks.word_problems": "mappa_env.envs.mathchat.word_problems",
    "mappa_env.tasks.checks": "mappa_env.envs.mathchat.checks",
    "mappa_env.grading.answers": "mappa_env.envs.mathchat.answers",
}


def _public_names(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_") and name != "logger"}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_gives_every_public_name_of_its_new_home(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    names = _public_names(new_module)
    assert names
    differ = {n for n in names if getattr(old_module, n, None) is not getattr(new_module, n)}
    assert differ == set()


def test_the_old_grading_module_gives_the_grader_and_its_workers():
    import mappa_env.grading.math as old
    from mappa_env.envs.mathchat import grading, symbolic

    for module in (grading, symbolic):
        for name in _public_names(module):
            assert getattr(old, name) is getattr(module, name), name


def test_the_old_task_module_is_the_new_one():
    # One module under two names: a function patched under the old name is the one the
    # loaders call.
    import mappa_env.tasks.math as old
    from mappa_env.envs.mathchat import tasks

    assert old is tasks


def test_the_package_parts_are_its_modules():
    import mappa_env.envs.mathchat as package

    found = sorted(p.stem for p in Path(package.__file__).parent.glob("*.py"))
    assert sorted(package.PARTS) == [name for name in found if name != "__init__"]


def test_the_package_gives_every_name_of_the_environment_module():
    import mappa_env.envs.mathchat as package
    from mappa_env.envs.mathchat import env

    for name in [*_public_names(env), "_resolve_tasks", "_generated_tasks"]:
        assert getattr(package, name) is getattr(env, name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        package.no_such_name  # noqa: B018


def test_the_rules_coach_still_gives_the_names_that_moved():
    from mappa_env.coach import rules
    from mappa_env.envs.mathchat import rubric

    for name in rules.MOVED_NAMES:
        assert getattr(rules, name) is getattr(rubric, name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        rules.no_such_name  # noqa: B018


def test_the_rules_coach_imports_no_environment():
    tree = ast.parse((ROOT / "mappa_env" / "coach" / "rules.py").read_text())
    imported = [
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    ] + [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert [name for name in imported if name.startswith("mappa_env.envs")] == []


@pytest.mark.parametrize(
    "first",
    [
        "mappa_env.coach.evidence",
        "mappa_env.grading",
        "mappa_env.tasks",
        "mappa_env.envs.mathchat.grading",
        "mappa_env.envs.mathchat.rubric",
        "mappa_env.coach.rules",
        "mappa_env.envs.mathchat.generator",
        "mappa_env.tasks.secret",
        "mappa_env.tasks.timeouts",
        "mappa_env.tasks.math",
    ],
)
def test_a_part_of_the_package_imports_first_without_the_environment(first):
    # The coach's evidence readers use the grader: importing them (or any part) first
    # must neither run into a half-imported module nor pull in the environment.
    code = f"import json, sys\nimport {first}\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert first in loaded
    assert loaded.isdisjoint({"mappa_env.envs.mathchat.env", "mappa_env.envs.pipeline"})


def test_the_symbolic_workers_import_the_grader_from_its_package_root(monkeypatch):
    # A worker process finds the grader through the root of the package it came from.
    from mappa_env.envs.mathchat import symbolic
    from mappa_env.envs.mathchat.grading import answers_match

    assert Path(symbolic._PACKAGE_ROOT, "mappa_env", "envs", "mathchat", "symbolic.py").is_file()
    monkeypatch.delenv("PYTHONPATH", raising=False)
    checker = symbolic.SymbolicChecker(max_workers=1)
    try:
        assert answers_match("\\sqrt{8}", "2\\sqrt{2}", checker=checker)
    finally:
        checker.close()
