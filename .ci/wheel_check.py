"""Build the sdist and wheel, install the wheel into a fresh venv, run what a new user runs.

A wheel is what users install: a module or data file that only exists in the checkout,
or an import that works only from the repository root, passes every other test and fails
here. The fresh venv gets the wheel alone (the light base package, no torch); the
README's first loop and ``mappa --help`` then run from a new directory outside the
checkout, with no benchmark folder anywhere above it.

Run: ``python .ci/wheel_check.py`` (``make test`` does). Prints the seconds it took.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mappa_env", "mappa_agents", "mappa_train")
# Repository folders the wheel carries inside a package (pyproject's package-dir):
# the training recipes and the examples, for users who have only the wheel.
BUNDLED = {"configs": "mappa_train/recipes", "examples": "mappa_train/examples"}
# The README's first loop: the first python block after this heading.
FIRST_LOOP = re.compile(r"^## A first loop\n.*?^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``command``, echo its output on failure, and stop the check there."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.stdout.write(result.stdout + result.stderr)
        raise SystemExit(f"wheel check: {' '.join(command)} exited {result.returncode}")
    return result


def source_files() -> set[str]:
    """The package files git tracks (what the wheel must hold)."""
    listed = run(["git", "ls-files", *PACKAGES], cwd=ROOT).stdout.split()
    return {name for name in listed if not name.endswith("/")}


def bundled_files() -> dict[str, str]:
    """Tracked recipe and example files -> where the wheel holds them."""
    listed = run(["git", "ls-files", *BUNDLED], cwd=ROOT).stdout.split()
    placed = {}
    for name in listed:
        folder, rest = name.split("/", 1)
        if "/" not in rest and rest.endswith((".py", ".yaml")):
            placed[name] = f"{BUNDLED[folder]}/{rest}"
    if not any(name.startswith("configs/") for name in placed):
        raise SystemExit("wheel check: git lists no recipe under configs/")
    return placed


def check_archives(dist: Path) -> Path:
    """The wheel holds the package files, recipes, examples and LICENSE; the sdist too.

    The sdist holds the README as well, and the repository folders the recipes and
    examples come from.
    """
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    wanted = source_files()
    bundled = bundled_files()
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    licenses = {name for name in in_wheel if ".dist-info/licenses/" in name}
    if not any(name.endswith("/licenses/LICENSE") for name in licenses):
        raise SystemExit(f"wheel check: {wheel.name} carries no LICENSE (has {sorted(licenses)})")
    missing = sorted((wanted | set(bundled.values())) - in_wheel)
    if missing:
        raise SystemExit(f"wheel check: {wheel.name} lacks {missing[:10]}")
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = sorted(
        (wanted | set(bundled) | {"README.md", "pyproject.toml", "LICENSE"}) - in_sdist
    )
    if missing:
        raise SystemExit(f"wheel check: {sdist.name} lacks {missing[:10]}")
    return wheel


def main() -> int:
    """Run the check; exits non-zero with the reason on the first failure."""
    started = time.perf_counter()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = FIRST_LOOP.search(readme)
    if match is None:
        raise SystemExit("wheel check: README.md has no python block under '## A first loop'")
    with tempfile.TemporaryDirectory(prefix="mappa-wheel-check-") as scratch_dir:
        scratch = Path(scratch_dir)
        dist = scratch / "dist"
        # The sdist first, then the wheel built from it (build's default): a file the
        # sdist leaves out is missing from the wheel too.
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)])
        wheel = check_archives(dist)
        built = time.perf_counter()

        env_dir = scratch / "venv"
        venv.create(env_dir, with_pip=True)
        python = env_dir / "bin" / "python"
        constraints = ROOT / "requirements" / "cpu-constraints.txt"
        # --no-compile: byte-compiling every installed module (scipy, sympy, pandas, ...)
        # took 3-4x the install itself here; the runs below compile what they import.
        install = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
        run([*install, "-c", str(constraints), str(wheel)])
        installed = time.perf_counter()

        # A directory of its own, under the system's temporary folder: nothing of the
        # checkout on sys.path, no shared/data/bench above it, no configured bench dir.
        workdir = scratch / "user"
        workdir.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MAPPA_", "PYTHON"))}
        env["MAPPA_CACHE_DIR"] = str(scratch / "cache")  # the task secret lands here
        (workdir / "first_loop.py").write_text(match.group(1), encoding="utf-8")
        probe = (
            "import mappa_env, mappa_env.tasks as t; "
            "assert t.find_bench_dir(required=False) is None, t.find_bench_dir(required=False); "
            "assert 'site-packages' in mappa_env.__file__, mappa_env.__file__"
        )
        run([str(python), "-c", probe], cwd=workdir, env=env)
        loop = run([str(python), "first_loop.py"], cwd=workdir, env=env)
        if "'correct':" not in loop.stdout:
            raise SystemExit(f"wheel check: the first loop printed no outcome:\n{loop.stdout}")
        usage = run([str(env_dir / "bin" / "mappa"), "--help"], cwd=workdir, env=env)
        if "usage: mappa" not in usage.stdout:
            raise SystemExit(f"wheel check: `mappa --help` printed:\n{usage.stdout}")
        # The installed package finds its own recipes (what `mappa train --config NAME` reads).
        where = run([str(python), "-m", "mappa_train.bundled"], cwd=workdir, env=env).stdout
        if "site-packages" not in where or "mathchat-smollm2" not in where:
            raise SystemExit(f"wheel check: the installed recipes were not found:\n{where}")
    done = time.perf_counter()
    print(
        f"wheel check passed in {done - started:.1f} s: built {wheel.name} and its sdist "
        f"({built - started:.1f} s), installed it into a fresh venv ({installed - built:.1f} s), "
        f"ran the README's first loop, `mappa --help` and found the recipes outside the checkout "
        f"({done - installed:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
