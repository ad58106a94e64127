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
