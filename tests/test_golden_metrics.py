"""Training reproduces its recorded figures: every credit mode, in one process and on Ray
(with and without rollout engines), LoRA, a frozen agent, and a killed run resumed.

The figures in ``tests/golden/metrics.json`` were recorded by ``python -m
tests.golden_runs --write``; a change that alters training on purpose records them again
and says why in its commit.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import golden_runs

RECORDED = json.loads(golden_runs.GOLDEN_FILE.read_text())


def _halves(backend: str) -> list[list[str]]:
    names = sorted(name for name in golden_runs.RUNS if name.startswith(f"{backend}/"))
    return [names[: len(names) // 2], names[len(names) // 2 :]]


# Each backend's configurations in two halves, so parallel test workers share them.
@pytest.mark.parametrize(
    "names",
    [*_halves("one_process"), *_halves("ray")],
    ids=lambda names: "+".join(names),
)
def test_every_configuration_trains_exactly_as_recorded(names):
    if names[0].startswith("ray/"):
        pytest.importorskip("ray")
    got = golden_runs.run(names)
    assert golden_runs.differences(got, {n: RECORDED[n] for n in names}) == []


def test_the_comparison_sees_a_changed_figure():
    recorded = RECORDED["one_process/process"]
    changed = json.loads(json.dumps(recorded))
    changed["metrics"][1]["editor/loss"] += 1e-12
    changed["weights"]["editor"] = "0" * 64
    problems = golden_runs.differences({"one_process/process": changed}, RECORDED)
    assert any("editor/loss" in p for p in problems)
    assert any("final weights differ" in p for p in problems)
    assert any("not run" in p for p in problems)
