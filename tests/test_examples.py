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


@pytest.mark.slow
def test_api_example_runs_against_a_local_openai_compatible_server(monkeypatch, tmp_path, capsys):
    from tests.openai_stub_server import run_stub_server

    with run_stub_server(lambda request: "Checked. \\boxed{1}\nPROCESS_SCORE: 6") as server:
        monkeypatch.setenv("OPENAI_API_BASE", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr("sys.argv", ["api_agents.py", "openai/stub-model"])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(EXAMPLES / "api_agents.py"), run_name="__main__")
        assert done.value.code == 0
        assert server.request_count >= 8 * 3 * 2  # every action generated and judged
    out = capsys.readouterr().out
    assert "MathChat-v0: 8 episodes" in out
    assert "invalid coach verdicts 0%" in out
