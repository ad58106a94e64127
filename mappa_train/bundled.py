"""The training recipes and the examples, in a wheel or in a checkout of the repository.

Their one home is the repository's ``configs/`` and ``examples/`` folders; the wheel
carries them as ``mappa_train/recipes/`` and ``mappa_train/examples/`` (see
``pyproject.toml``), so ``pip install mappa-rl`` users have them too:

- ``mappa train --config mathchat-smollm2`` reads the recipe of that name
  (:func:`resolve_config`); a path to a file of one's own works as before.
- ``python -m mappa_train.bundled`` prints both folders and the recipes' names; copy an
  example from there, or run it in place (``python "$(python -m mappa_train.bundled
  examples)/scripted_loop.py"``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mappa_env.errors import SettingsError

_HERE = Path(__file__).resolve().parent
RECIPE_SUFFIXES = (".yaml", ".yml")


def _folder(installed: str, checkout: str) -> Path:
    """``mappa_train/<installed>`` in a wheel, else the checkout's ``<checkout>`` folder."""
    inside = _HERE / installed
    return inside if inside.is_dir() else _HERE.parent / checkout


def recipes_dir() -> Path:
    """The folder of the training recipes (``configs/`` of the repository)."""
    return _folder("recipes", "configs")


def examples_dir() -> Path:
    """The folder of the runnable examples (``examples/`` of the repository)."""
    return _folder("examples", "examples")


def recipe_names() -> list[str]:
    """The names ``mappa train --config`` takes for the bundled recipes, sorted."""
    folder = recipes_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.iterdir() if p.suffix in RECIPE_SUFFIXES)


def resolve_config(value: str) -> Path:
    """The file a ``--config`` value names: a path to a file, or a bundled recipe's name.

    A file that exists wins, so a recipe name never hides a user's own file of that name.

    Args:
        value: ``path/to/file.yaml`` or ``mathchat-smollm2`` (``.yaml`` may be given).

    Returns:
        The path to read.

    Raises:
        mappa_env.errors.SettingsError: When ``value`` is neither a file nor a recipe,
            with the recipes there are.
    """
    path = Path(value).expanduser()
    if path.is_file():
        return path
    name = path.name
    for suffix in RECIPE_SUFFIXES:
        name = name.removesuffix(suffix)
    if path.parent == Path(".") and name in recipe_names():
        for suffix in RECIPE_SUFFIXES:
            recipe = recipes_dir() / f"{name}{suffix}"
            if recipe.is_file():
                return recipe
    known = ", ".join(recipe_names()) or "none found"
    raise SettingsError(
        f"--config {value!r} is neither a file nor a bundled recipe (recipes: {known}); "
        "give a path to a YAML or JSON file, or one of those names"
    )


def main(argv: list[str] | None = None) -> int:
    """Print where the recipes and examples are (``examples``/``recipes``: that folder only)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["examples"]:
        print(examples_dir())
    elif args == ["recipes"]:
        print(recipes_dir())
    elif not args:
        print(f"recipes: {recipes_dir()} ({', '.join(recipe_names())})")
        print(f"examples: {examples_dir()}")
    else:
        print("usage: python -m mappa_train.bundled [examples|recipes]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
