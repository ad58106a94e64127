"""DSBench-v0 as one package: its seams, its old import paths, and no import circles.

The inspector is a script of its own whose text is what the sandbox runs; the label
rule is that script's one function; the coach's generic templates name no environment
and take an environment's prompt sections through its class; the old module paths
re-export the package's names.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest
from pettingzoo import AECEnv

from mappa_env import registry
from mappa_env.coach.base import CoachRequest
from mappa_env.coach.templates import CoachTemplates, PromptSections, environment_sections

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mappa_env" / "envs" / "dsbench"

#: The public names of the module the package replaced (mappa_env/envs/dsbench.py).
OLD_MODULE_NAMES = [
    "ANALYST",
    "ARTIFACTS",
    "COACH_RUBRICS",
    "DATA_ENGINEER",
    "INPUT_FILES",
    "INSPECT_OUTPUT_BYTES",
    "INSPECT_SAMPLE_ROWS",
    "INSPECT_TIMEOUT_S",
    "MAX_SUBMISSION_BYTES",
    "MODELER",
    "NEEDS",
    "SKILL_ROWS",
    "SUBMISSION_FILE",
    "SYSTEM_DESCRIPTION",
    "TARGET_CHECK_ROWS",
    "UNFIT_DATA_CAP",
    "BuiltinTaskSet",
    "DSBenchEnv",
    "DSBenchTask",
    "SHARED_INSPECTIONS",
    "dsbench_rubric",
    "format_listing",
    "holds_target",
    "inspection_key",
    "list_files",
    "target_translation",
    "_INSPECT_CODE",
]


def _imported_modules(tree: ast.AST) -> list[str]:
    """Every module an import statement names, at any depth (TYPE_CHECKING ones too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def test_the_inspector_is_a_script_that_imports_nothing_of_mappa():
    source = (PACKAGE / "inspector.py").read_text(encoding="utf-8")
    tree = ast.parse(source)  # valid Python
    assert _imported_modules(tree)  # it imports its tools (json, pickle, numpy, ...)
    assert not [m for m in _imported_modules(tree) if m.split(".")[0] == "mappa_env"]


def test_the_environment_runs_the_inspector_modules_text():
    from mappa_env.envs import dsbench
    from mappa_env.envs.dsbench.inspections import INSPECTOR_SOURCE

    text = (PACKAGE / "inspector.py").read_text(encoding="utf-8")
    assert text == INSPECTOR_SOURCE
    assert text == dsbench._INSPECT_CODE
    argv = dsbench.DSBenchEnv._inspector_argv(None)  # uses nothing of the instance
    assert argv[1:3] == ["-I", "-c"]
    assert argv[3] == text


def test_the_label_rule_is_the_inspectors_one_function():
    from mappa_env.envs.dsbench.labels import label_rows, label_text

    assert label_text.__code__.co_filename == "inspector.py"
    assert label_text.__name__ == "canonical"
    values = [1, 1.0, np.int64(2), np.float64(2.0), True, "a", 1.5, np.float32(3.0), "1.0"]
    assert [label_text(v) for v in values] == ["1", "1", "2", "2", "True", "a", "1.5", "3", "1"]
    import pandas as pd

    frame = pd.DataFrame({"a": [1.0, 2.5], "b": ["x", "y"]})
    assert label_rows(frame).tolist() == ["1|x", "2.5|y"]
    # No other copy of the rule is left in the package.
    copies = [
        path.name
        for path in PACKAGE.glob("*.py")
        if path.name != "inspector.py"
        and 'lowered in ("true", "false")' in path.read_text(encoding="utf-8")
    ]
    assert copies == []


def test_an_unknown_inspector_function_is_refused():
    from mappa_env.envs.dsbench.inspections import inspector_function

    with pytest.raises(KeyError, match="no function 'nothing_of_that_name'"):
        inspector_function("nothing_of_that_name")


def test_the_generic_templates_name_no_environment():
    text = (ROOT / "mappa_env" / "coach" / "templates.py").read_text(encoding="utf-8").lower()
    for name in ("dsbench", "mathchat", "submission", "pkl"):
        assert name not in text, name
    tree = ast.parse(text)
    assert not [m for m in _imported_modules(tree) if m.startswith("mappa_env.envs")]


class _ProbeFacts:
    """Facts that show a probe section in each place."""

    score_cap = None

    def __init__(self, data):
        self.data = data

    @classmethod
    def from_dict(cls, data):
        return cls(data)

    def prompt_sections(self) -> PromptSections:
        return PromptSections(
            facts=(("Probe facts", f"task type {self.data.get('task_type')}"),),
            evidence=(("Probe evidence", "measured"),),
        )

    def to_dict(self):
        return dict(self.data)


class _SectionsProbeEnv(AECEnv):
    """Only what the templates read of an environment class: its facts class."""

    coach_facts_type = _ProbeFacts


def _request(env_id: str, **changes) -> CoachRequest:
    fields = {
        "env_id": env_id,
        "task_id": "t",
        "task": "Do the thing.",
        "agent": "planner",
        "system_description": "one agent",
        "role_description": "the planner",
        "agent_input": (),
        "action": "done",
        "turn": 0,
        "is_last_agent": True,
        "ground_truth": "42",
        # DSBench's metadata keys: an environment without sections shows none of them.
        "metadata": {"task_type": "regression", "artifacts": {"model.pkl": {"exists": True}}},
    }
    fields.update(changes)
    return CoachRequest(**fields)


def test_an_environment_adds_its_sections_through_its_class(monkeypatch):
    spec = registry.EnvSpec("SectionsProbe-v0", _SectionsProbeEnv)
    monkeypatch.setitem(registry._REGISTRY, "SectionsProbe-v0", spec)
    user = CoachTemplates().render_user(_request("SectionsProbe-v0"))
    titles = [line[3:] for line in user.splitlines() if line.startswith("## ")]
    role = titles.index("The agent being judged: planner (turn 1, the final agent)")
    assert titles[role + 1] == "Probe facts"
    assert titles[role + 2] == "What the agent saw (its exact input messages)"
    assert titles.index("Probe evidence") == titles.index("Rubric for the planner") - 1
    assert titles.index("Reference answer (hidden from the agents)") < titles.index(
        "Probe evidence"
    )
    assert "## Probe facts\ntask type regression" in user


def test_an_environment_without_sections_gets_none():
    assert environment_sections(_request("MathChat-v0")) == PromptSections()
    assert environment_sections(_request("NotRegistered-v9")) == PromptSections()
    user = CoachTemplates().render_user(_request("NotRegistered-v9"))
    assert "Task facts" not in user
    assert "Checks of the files" not in user


def test_dsbench_brings_its_sections_through_its_class():
    from mappa_env.envs.dsbench import DSBenchEnv
    from mappa_env.envs.dsbench.facts import DSBenchFacts

    assert DSBenchEnv.coach_facts_type is DSBenchFacts
    request = _request(
        "DSBench-v0",
        agent="analyst",
        metadata={
            "task_type": "regression",
            "metric": "rmse",
            "artifacts": {"submission.csv": {"exists": True}},
            "outcome": {"success": True, "metric": "rmse", "value": 1.5},
            "outcome_cap": 6,
        },
    )
    sections = environment_sections(request)
    assert sections.facts == (("Task facts", "- task type: regression\n- metric: rmse"),)
    assert [title for title, _ in sections.evidence] == [
        "Checks of the files this agent makes or needs",
        "Measured outcome",
    ]
    assert "at most 6" in sections.evidence[1][1]


def test_the_skill_caps_of_upstream_agents():
    from mappa_env.envs.dsbench.caps import UNFIT_DATA_CAP, upstream_skill_cap

    model = {"model.pkl": {"test_skill": 0.02}}
    cap, why = upstream_skill_cap("modeler", model, "classification")
    assert cap == 3
    assert why == "model.pkl's predictions on the test rows have skill 0.02 on the answers"
    assert upstream_skill_cap("modeler", {"model.pkl": {"test_skill": 0.6}}, "regression")[0] == 8
    unfit = {"X_test.pkl": {"reference_error": "ValueError: text"}}
    assert upstream_skill_cap("data_engineer", unfit, "classification") == (
        UNFIT_DATA_CAP,
        "a reference model could not be fit on its files: ValueError: text",
    )
    assert upstream_skill_cap("data_engineer", {"X_test.pkl": {}}, "regression") is None
    assert upstream_skill_cap("analyst", model, "classification") is None


def test_the_package_keeps_the_names_of_the_module_it_replaced():
    package = importlib.import_module("mappa_env.envs.dsbench")
    missing = [name for name in OLD_MODULE_NAMES if not hasattr(package, name)]
    assert missing == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("mappa_env.dsbench.metrics", "mappa_env.envs.dsbench.metrics"),
        ("mappa_env.dsbench.metrics", "mappa_env.envs.dsbench.scoring"),
        ("mappa_env.dsbench.metrics", "mappa_env.envs.dsbench.outcomes"),
        ("mappa_env.dsbench.metrics", "mappa_env.envs.dsbench.caps"),
        ("mappa_env.dsbench.tasks", "mappa_env.envs.dsbench.tasks"),
        ("mappa_env.dsbench.builtin", "mappa_env.envs.dsbench.builtin"),
        ("mappa_env.dsbench.inspections", "mappa_env.envs.dsbench.inspections"),
        ("mappa_env.dsbench.reference", "mappa_env.envs.dsbench.reference"),
        ("mappa_env.dsbench.audit", "mappa_env.envs.dsbench.audit"),
        ("mappa_env.coach.rules_dsbench", "mappa_env.envs.dsbench.rubric"),
    ],
)
def test_old_module_paths_reexport_the_same_objects(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    shared = [name for name in old_module.__all__ if name in vars(new_module)]
    assert shared
    assert all(getattr(old_module, n) is getattr(new_module, n) for n in shared)
    assert set(old_module.__all__) <= set(dir(old_module))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_import_circle_among_the_dsbench_modules():
    paths = [
        *PACKAGE.glob("*.py"),
        *(ROOT / "mappa_env" / "dsbench").glob("*.py"),
        ROOT / "mappa_env" / "coach" / "templates.py",
        ROOT / "mappa_env" / "coach" / "rules_dsbench.py",
    ]
    modules = {_module_name(p): p for p in paths}
    graph = {
        name: {
            target
            for target in _imported_modules(ast.parse(path.read_text(encoding="utf-8")))
            if target in modules and target != name
        }
        for name, path in modules.items()
    }
    # A module of the package never imports the package itself (its __init__ imports them).
    assert [m for m in graph if m.startswith("mappa_env.envs.dsbench.")] != []
    assert not [
        m
        for m, targets in graph.items()
        if m.startswith("mappa_env.envs.dsbench.") and "mappa_env.envs.dsbench" in targets
    ]
    circles = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert circles == []


def test_no_module_of_the_package_is_over_800_lines():
    long = {
        p.name: n
        for p in PACKAGE.glob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 800
    }
    assert long == {}
