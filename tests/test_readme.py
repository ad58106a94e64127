"""The README's first loop runs as written and prints what the README shows.

`.ci/wheel_check.py` (run by `make test`) runs the same block from a fresh venv that
holds only the built wheel; this test runs it in the suite, against the checkout.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTION = README[README.index("## A first loop") :]
SECTION = SECTION[: SECTION.index("\n## ", 1)]


def _block(language: str) -> str:
    match = re.search(rf"^```{language}\n(.*?)^```", SECTION, re.DOTALL | re.MULTILINE)
    assert match, f"no {language} block in the README's first-loop section"
    return match.group(1)


def test_the_first_loop_runs_and_prints_the_output_the_readme_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of the checkout is needed
    monkeypatch.delenv("MAPPA_BENCH_DIR", raising=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_block("python"), "README.md", "exec"), {"__name__": "readme"})
    lines = printed.getvalue().splitlines()
    shown = _block("text").splitlines()
    # The three agents' lines do not depend on the problem; the outcome names the problem,
    # which the user's task secret picks, so only its shape is compared.
    assert lines[:3] == shown[:3]
    outcome, shown_outcome = ast.literal_eval(lines[3]), ast.literal_eval(shown[3])
    assert outcome.keys() == shown_outcome.keys()
    assert outcome["predicted"] == shown_outcome["predicted"] == "42"
    assert len(lines) == len(shown) == 4


def test_the_first_loop_uses_tasks_that_need_nothing():
    code = _block("python")
    assert 'tasks="gen:' in code
    assert "pip install mappa-rl" in SECTION
