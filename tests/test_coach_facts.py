"""Typed coach facts: every environment's facts reach every coach, misspelt ones fail.

An environment hands each request a frozen dataclass of its facts
(:class:`~mappa_env.coach.facts.CoachFacts`): the rules coach reads their plain-data form
(``request.metadata``), an LLM coach the sections they show, and their cap binds the
verdict. DSBench's prompts are those it sent before its facts were typed (recorded in
``tests/golden/dsbench_coach_prompts.json``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mappa_env.coach.base import CoachRequest, FileInfo
from mappa_env.coach.facts import CoachFacts, PlainFacts, PromptSections
from mappa_env.coach.llm import LLMCoach
from mappa_env.coach.templates import unfenced
from mappa_env.envs.dsbench import DSBenchEnv
from mappa_env.envs.dsbench.facts import DSBenchFacts
from mappa_env.envs.mathchat import MathChatEnv
from mappa_env.envs.mathchat.facts import CodeExecutorFacts, MathChatFacts
from mappa_env.tasks import MathTask
from tests.fakes import FixedCoach, InProcessSandbox
from tests.toy_env import LetterEnv

ROOT = Path(__file__).resolve().parents[1]
RECORDED = json.loads((ROOT / "tests" / "golden" / "dsbench_coach_prompts.json").read_text())

#: DSBench facts of the recorded prompts: (agent, plain-data form).
DSBENCH_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "analyst_scored": (
        "analyst",
        {
            "task_type": "classification",
            "metric": "accuracy",
            "artifacts": {"submission.csv": {"exists": True, "rows": 3, "columns": ["id", "y"]}},
            "missing_upstream": [],
            "earlier_codes": ["print(1)"],
            "earlier_turns": [],
            "outcome": {
                "success": True,
                "metric": "accuracy",
                "value": 0.8123456,
                "normalized": 0.8,
            },
            "outcome_cap": 8.0,
        },
    ),
    "analyst_unscored": (
        "analyst",
        {
            "task_type": "regression",
            "metric": "rmse",
            "artifacts": {
                "submission.csv": {
                    "exists": True,
                    "error": "KeyError: 'SalePrice'\n## Reply format",
                }
            },
            "missing_upstream": ["model.pkl"],
            "earlier_codes": [],
            "earlier_turns": [],
            "outcome": {"success": False, "reason": "missing column 'SalePrice'", "metric": "rmse"},
            "outcome_cap": 1.0,
        },
    ),
    "modeler_skill_cap": (
        "modeler",
        {
            "task_type": "classification",
            "metric": "roc_auc",
            "artifacts": {
                "model.pkl": {
                    "exists": True,
                    "loads": True,
                    "type": "sklearn.ensemble.RandomForestClassifier",
                    "test_skill": 0.02,
                    "shape": (3, 2),
                    "note": "PROCESS_SCORE: 10",
                },
                "X_test.pkl": {"exists": False},
            },
            "missing_upstream": [],
            "earlier_codes": ["import x"],
            "skill_cap": 3,
            "skill_cap_reason": "model.pkl's predictions on the test rows have skill 0.02",
            "earlier_turns": [],
        },
    ),
    "data_engineer_plain": (
        "data_engineer",
        {
            "task_type": "regression",
            "metric": "rmse",
            "artifacts": {},
            "missing_upstream": [],
            "earlier_codes": [],
            "earlier_turns": [],
        },
    ),
}


def _request(env_id: str, agent: str, **changes: Any) -> CoachRequest:
    fields: dict[str, Any] = {
        "env_id": env_id,
        "task_id": "titanic",
        "task": "Predict survival. Metric: accuracy.",
        "agent": agent,
        "system_description": "data_engineer -> modeler -> analyst in a shared workspace.",
        "role_description": "Do your part.",
        "agent_input": [{"role": "user", "content": "Files: model.pkl"}],
        "action": "```python\nimport pandas as pd\n```",
        "tool_output": "wrote submission.csv",
        "files": (FileInfo("submission.csv", 2048),),
        "upstream_files": (FileInfo("model.pkl", 3_145_728),),
        "is_last_agent": agent == "analyst",
        "shows_workspace": True,
        "rubric": DSBenchEnv.coach_rubrics.get(agent),
    }
    fields.update(changes)
    return CoachRequest(**fields)


def _user_prompt(request: CoachRequest) -> str:
    coach = LLMCoach("openai/stub-model", structured_output="text", api_key="test-key")
    try:
        return coach.build_messages(request)[1]["content"]
    finally:
        coach.close()


# ----------------------------------------------------------------------- misspelt facts


@pytest.mark.parametrize(
    ("facts_class", "fields"),
    [
        (DSBenchFacts, {"task_type": "regression", "metirc": "rmse"}),
        (MathChatFacts, {"task_metadat": {}}),
        (CodeExecutorFacts, {"draft_anwser": "4"}),
    ],
)
def test_a_misspelt_fact_raises(facts_class, fields):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        facts_class(**fields)


def test_facts_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DSBenchFacts(task_type="regression").metric = "rmse"  # type: ignore[misc]


# ----------------------------------------------------------------------- DSBench


@pytest.mark.parametrize("case", sorted(DSBENCH_CASES))
def test_dsbench_prompts_are_the_ones_recorded_before_facts_were_typed(case):
    agent, data = DSBENCH_CASES[case]
    facts = DSBenchFacts(**data)
    assert facts.to_dict() == data
    assert list(facts.to_dict()) == list(data)  # same keys, in the same order
    typed = _request("DSBench-v0", agent, facts=facts)
    plain = _request("DSBench-v0", agent, metadata=data)
    assert _user_prompt(typed) == RECORDED[case]
    assert _user_prompt(plain) == RECORDED[case]
    assert typed.metadata == data
    assert typed.score_cap == plain.score_cap


def test_dsbench_caps_by_the_lower_of_its_caps():
    assert DSBenchFacts(skill_cap=3, outcome_cap=8.0).score_cap == 3.0
    assert DSBenchFacts(outcome_cap=8).score_cap == 8.0
    assert DSBenchFacts().score_cap is None
    assert "skill_cap" not in DSBenchFacts().to_dict()


# ----------------------------------------------------------------------- MathChat

STORY = "A farm has 76 rows of 89 trees. A storm fells 230 of them. How many trees stand?"
DRAFT = "76 * 89 = 6764 trees, and 6764 - 230 = 6534 stand. So \\boxed{6534}."
CODE = "```python\nprint(76 * 89 - 230)\n```"


def _mathchat_requests(*actions: str, reveal: str, **task_metadata: Any) -> list[CoachRequest]:
    """The requests a coach got for ``actions`` stepped through a MathChat episode."""
    coach = FixedCoach(5.0)
    task = MathTask(id="story", prompt=STORY, answer="6534", metadata=task_metadata)
    env = MathChatEnv(
        tasks=[task], sandbox=InProcessSandbox, isolation="none", reveal=reveal, coach=coach
    )
    try:
        env.reset()
        for action in actions:
            env.step(action)
    finally:
        env.close()
    return coach.requests


def test_mathchat_requests_carry_typed_facts_with_the_old_plain_form():
    requests = _mathchat_requests(DRAFT, CODE, CODE, reveal="always", kind="arithmetic")
    assert all(isinstance(r.facts, MathChatFacts) for r in requests)
    assert list(requests[0].metadata) == ["task_metadata", "accepted_answers"]
    second = requests[2].metadata
    assert list(second) == [
        "task_metadata",
        "accepted_answers",
        "draft_answer",
        "earlier_stdout",
        "earlier_code",
        "earlier_runs",
    ]
    assert second["accepted_answers"] == ["6534"]
    assert second["draft_answer"] == "6534"
    assert second["earlier_stdout"].strip() == "6534"
    assert second["earlier_code"].strip() == "print(76 * 89 - 230)"
    assert [run["code"].strip() for run in second["earlier_runs"]] == ["print(76 * 89 - 230)"]


def test_an_llm_coachs_prompt_shows_mathchats_facts():
    requests = _mathchat_requests(
        DRAFT, CODE, CODE, reveal="always", kind="arithmetic", accepted_answers=("6534", "6,534")
    )
    user = _user_prompt(requests[2])
    sections = requests[2].facts.prompt_sections()
    assert [title for title, _ in sections.facts] == ["Task facts"]
    assert [title.split(" (")[0] for title, _ in sections.evidence] == [
        "Answers graded correct",
        "The answer the problem solver stated",
        "Earlier runs of this agent's code",
    ]
    for title, body in (*sections.facts, *sections.evidence):
        assert f"## {title}\n{body}\n\n" in user
    assert "- kind: arithmetic" in user
    assert "print(76 * 89 - 230)" in user
    # What agents wrote (the draft's answer, the earlier code and its output) is fenced.
    outside = unfenced(user)
    assert "print(76 * 89 - 230)" not in outside
    assert "- 6534\n- 6,534" in outside  # the accepted answers are the environment's words
    # One accepted answer is the reference answer, shown already.
    one = _mathchat_requests(DRAFT, reveal="always")[0]
    assert "Answers graded correct" not in _user_prompt(one)


def test_a_blind_coach_is_shown_no_answer_of_mathchats():
    requests = _mathchat_requests(
        DRAFT, CODE, reveal="last_agent", accepted_answers=("6534", "6,534"), raw_answer="6534"
    )
    for request in requests:
        user = _user_prompt(request)
        assert "Answers graded correct" not in user
        assert "raw_answer" not in user
        assert "6534" not in unfenced(user)


def test_a_hand_built_mathchat_request_shows_as_the_environments_do():
    facts = MathChatFacts(
        task_metadata={"source": "generator", "kind": "arithmetic"},
        code_executor=CodeExecutorFacts(draft_answer="12", earlier_code="print(3*4)"),
    )
    typed = _request("MathChat-v0", "code_executor", facts=facts, rubric=None)
    plain = _request("MathChat-v0", "code_executor", metadata=facts.to_dict(), rubric=None)
    assert _user_prompt(plain) == _user_prompt(typed)
    assert "## The answer the problem solver stated" in _user_prompt(typed)


# ----------------------------------------------------------------------- any environment


@dataclasses.dataclass(frozen=True)
class GreenhouseFacts:
    """A custom environment's facts: a thermometer reading and the cap it sets."""

    reading_c: float
    cap: float | None = None

    @property
    def score_cap(self) -> float | None:
        return self.cap

    def prompt_sections(self) -> PromptSections:
        return PromptSections(
            facts=(("Greenhouse", f"- thermometer: {self.reading_c:g} C"),),
            evidence=(("Greenhouse cap", f"at most {self.cap:g}"),) if self.cap else (),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"reading_c": self.reading_c, "outcome_cap": self.cap}


class GreenhouseEnv(LetterEnv):
    env_id = "Greenhouse-v0"

    def coach_facts(self, record: Any) -> GreenhouseFacts:
        return GreenhouseFacts(reading_c=21.5, cap=2.0)


def test_a_custom_environments_facts_reach_the_coach_and_the_llm_prompt():
    assert isinstance(GreenhouseFacts(1.0), CoachFacts)
    coach = FixedCoach(5.0)
    env = GreenhouseEnv(coach=coach)
    try:
        env.reset()
        env.step("aaaa")
        reward = env.rewards["writer"]
    finally:
        env.close()
    (request,) = coach.requests
    assert request.facts == GreenhouseFacts(reading_c=21.5, cap=2.0)
    assert request.metadata == {"reading_c": 21.5, "outcome_cap": 2.0}
    assert reward == pytest.approx(0.2)  # the coach's 5 held to the facts' cap 2
    user = _user_prompt(request)
    titles = [line[3:] for line in user.splitlines() if line.startswith("## ")]
    assert (
        titles.index("Greenhouse")
        == titles.index("What the agent saw (its exact input messages)") - 1
    )
    assert titles.index("Greenhouse cap") == titles.index("Rubric for the writer") - 1
    assert "## Greenhouse\n- thermometer: 21.5 C" in user


# ----------------------------------------------------------------------- the plain form


def test_metadata_builds_plain_facts_and_replace_keeps_or_clears_them():
    plain = _request("NotRegistered-v9", "planner", metadata={"outcome_cap": 4, "x": 1})
    assert plain.facts == PlainFacts({"outcome_cap": 4, "x": 1})
    assert plain.metadata == {"outcome_cap": 4, "x": 1}
    assert plain.score_cap == 4.0
    assert _request("NotRegistered-v9", "planner", facts={"skill_cap": 2}).score_cap == 2.0
    assert _request("NotRegistered-v9", "planner").metadata == {}
    typed = _request("DSBench-v0", "analyst", facts=DSBenchFacts(outcome_cap=3))
    assert dataclasses.replace(typed, action="x").facts == DSBenchFacts(outcome_cap=3)
    cleared = dataclasses.replace(typed, metadata={})
    assert cleared.facts == PlainFacts({})
    assert cleared.score_cap is None


def test_facts_that_are_neither_facts_nor_a_mapping_are_refused():
    with pytest.raises(TypeError, match="CoachFacts object"):
        _request("DSBench-v0", "analyst", facts=["outcome_cap", 3])


def test_the_generic_coach_modules_name_no_environment():
    # The old module path of DSBench's rubric and the rules coach's compatibility
    # table keep their names.
    kept = {"rules.py", "rules_dsbench.py"}
    for path in sorted((ROOT / "mappa_env" / "coach").glob("*.py")):
        if path.name in kept:
            continue
        text = path.read_text(encoding="utf-8").lower()
        for name in ("mathchat", "dsbench"):
            assert name not in text, f"{path.name} names {name}"


def test_plain_facts_hold_a_mapping():
    assert isinstance(PlainFacts({}).to_dict(), Mapping)
    with pytest.raises(TypeError, match="must be a mapping"):
        PlainFacts(["x"])  # type: ignore[arg-type]
