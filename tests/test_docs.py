"""The tutorials run as written: every ```python block after a `<!-- run -->` line.

Each page's marked blocks run in order in one namespace (a later block uses what an
earlier one defined), in a fresh directory that holds links to the repository's
`examples/` and `configs/`, as if run from the repository root. Blocks without the
marker (GPU runs, API keys, shell commands) are shown but not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
PAGES = sorted(TUTORIALS.glob("*.md"))
MARKER = "<!-- run -->"
# A fenced python block: its opening fence, the code, the closing fence (same indent).
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)


def run_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each python block whose previous non-blank line is MARKER."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        if before and before[-1].strip() == MARKER:
            blocks.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return blocks


def test_every_tutorial_page_has_blocks_that_run():
    assert PAGES, "no tutorial pages found"
    for page in PAGES:
        assert run_blocks(page.read_text(encoding="utf-8")), f"{page.name} runs nothing"


def test_a_marker_must_precede_a_python_block():
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() == MARKER:
                following = next((x for x in lines[i + 1 :] if x.strip()), "")
                assert following.startswith("```python"), f"{page.name}:{i + 1}: {following!r}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_tutorial_runs(page, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    for name in ("examples", "configs"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    # litellm reads its bundled model-cost map instead of fetching one.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for line, code in run_blocks(page.read_text(encoding="utf-8")):
        # Padded so that a traceback names the page's own line numbers.
        exec(compile("\n" * line + code, str(page), "exec"), namespace)
