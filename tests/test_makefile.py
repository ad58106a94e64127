"""The Makefile's demo command: the dtype it picks for the CPU it runs on."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _demo_command(*overrides: str) -> str:
    result = subprocess.run(
        ["make", "-n", "demo", *overrides], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout


def test_the_demo_runs_bfloat16_only_where_the_cpu_computes_it():
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    native = re.search(r"\b(?:avx512_bf16|amx_bf16)\b", flags) is not None
    assert f"--dtype {'bfloat16' if native else 'float32'} " in _demo_command()
    assert "--dtype float32 " in _demo_command("DEMO_DTYPE=float32")


def _commands(text: str) -> list[str]:
    """Shell commands of a text, continuation lines joined, spaces normalised."""
    return [" ".join(line.split()) for line in re.sub(r"\\\n\s*", " ", text).splitlines()]


def test_the_docs_demo_command_is_what_make_demo_runs():
    # The demo's command, as a user types it after `make install` (float32: any CPU).
    (made,) = [c for c in _commands(_demo_command("DEMO_DTYPE=float32")) if " eval " in c]
    made = "mappa " + made.split("/mappa ", 1)[1]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    shown = [
        (page.name, command)
        for page in pages
        for command in _commands(page.read_text(encoding="utf-8"))
        if command.startswith("mappa eval") and "--out runs/demo" in command
    ]
    assert shown, "no page shows the demo's command"
    for page, command in shown:
        assert command == made, page
