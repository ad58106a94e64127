"""Training reproduces its recorded figures: every credit mode in one process, LoRA, a
frozen agent, a killed run resumed, and on Ray with HF rollouts and with rollout engines.

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


#: On Ray, the suite runs one credit mode with HF rollouts and the engines' run: the
#: credit modes differ in what the environment pays, which the one-process runs check
#: mode by mode, not in the Ray path. ``python -m tests.golden_runs --check`` runs all.
RAY_IN_SUITE = ["ray/process", "ray/engines"]


def _halves(names: list[str]) -> list[list[str]]:
    names = sorted(names)
    return [names[: len(names) // 2], names[len(names) // 2 :]]


# One process in two halves and the Ray runs one by one, so parallel workers share them.
@pytest.mark.parametrize(
    "names",
    [
        *_halves([name for name in golden_runs.RUNS if name.startswith("one_process/")]),
        *([name] for name in RAY_IN_SUITE),
    ],
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
