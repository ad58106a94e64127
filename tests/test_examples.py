"""The examples run as users would run them."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_scripted_loop_example_solves_its_task(capsys):
    runpy.run_path(str(EXAMPLES / "scripted_loop.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "'correct': True" in out
    assert "verifier        reward 1.00" in out
