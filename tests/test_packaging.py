"""What the package declares: extras the docs name, its LICENSE, the recipes and examples.

The wheel itself is built and read by ``.ci/wheel_check.py`` (in ``make test``); these
check the declarations it is built from, and how an installed package finds its recipes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mappa_env.errors import SettingsError
from mappa_train import bundled
from mappa_train.cli import config_from_args
from mappa_train.command import parse_args

# tomllib is in the standard library from Python 3.11; tomli is its 3.10 backport.
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# `pip install "mappa-rl[llm,agents]"`, also split over lines and with options before it.
INSTALL = re.compile(r"pip\s+install\s+(?:-[-\w=]+\s+)*[\"']?([\w.-]+)\[([^\]]*)\]")


def _install_lines() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for match in INSTALL.finditer(text):
            extras = [e.strip() for e in match.group(2).split(",")]
            found.append((str(path.relative_to(ROOT)), match.group(1), extras))
    return found


def test_the_docs_install_lines_name_this_distribution_and_extras_it_has():
    lines = _install_lines()
    assert len(lines) >= 8, lines  # the parser still finds the README's and docs' lines
    wrong = [(page, name) for page, name, _ in lines if name != "mappa-rl"]
    assert wrong == [], "`mappa` on the package index is another project: use mappa-rl"
    missing = [(page, e) for page, _, extras in lines for e in extras if e not in EXTRAS]
    assert missing == []


def test_the_extras_the_code_asks_for_exist():
    asked = set()
    for path in ROOT.glob("mappa_*/**/*.py"):
        asked |= set(re.findall(r"require\(\s*\"[\w.]+\",\s*\"(\w+)\"", path.read_text()))
    assert asked, "no require() call found: the pattern is out of date"
    assert asked <= EXTRAS, sorted(asked - EXTRAS)


def test_a_train_extra_brings_what_the_trainer_imports():
    train = PYPROJECT["project"]["optional-dependencies"]["train"]
    assert "mappa-rl[agents]" in train


def test_the_license_file_is_the_apache_license_and_the_wheel_names_it():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_every_package_of_the_checkout_is_listed_for_the_wheel():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in ROOT.glob("mappa_*/**/__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found <= listed, sorted(found - listed)
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert folders == {"mappa_train.recipes": "configs", "mappa_train.examples": "examples"}


def test_the_checkout_finds_its_recipes_and_examples():
    assert bundled.recipes_dir() == ROOT / "configs"
    assert bundled.examples_dir() == ROOT / "examples"
    assert "mathchat-smollm2" in bundled.recipe_names()
    assert (bundled.examples_dir() / "scripted_loop.py").is_file()


def test_mappa_train_reads_a_recipe_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = config_from_args(parse_args(["train", "--config", "mathchat-smollm2"]))
    assert (config.env, config.system, config.steps) == ("MathChat-v0", "smollm2-135m", 20)
    named = config_from_args(parse_args(["train", "--config", "mathchat-smollm2.yaml"]))
    assert named == config


def test_a_file_of_ones_own_wins_over_a_recipe_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mathchat-smollm2.yaml").write_text("env: MathChat-v0\nsteps: 3\n")
    config = config_from_args(parse_args(["train", "--config", "mathchat-smollm2.yaml"]))
    assert config.steps == 3


def test_an_unknown_config_names_the_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        SettingsError, match=r"neither a file nor a bundled recipe.*mathchat-smollm2"
    ):
        bundled.resolve_config("mathchat-smolm2")


def test_python_m_bundled_prints_the_folders(capsys):
    assert bundled.main(["examples"]) == 0
    assert capsys.readouterr().out.strip() == str(ROOT / "examples")
    assert bundled.main([]) == 0
    assert "mathchat-smollm2" in capsys.readouterr().out
