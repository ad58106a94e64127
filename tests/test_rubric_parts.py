"""Rules-coach rubrics as ``{agent: function}``: each score's named parts, from the
rubric through the verdict and the environment's infos to the trainer's metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mappa_env.coach.base import CoachRequest, VersionedRubric
from mappa_env.coach.rubric import AgentRubric, RubricScore, judge
from mappa_env.coach.rules import RulesCoach

ROOT = Path(__file__).resolve().parent.parent


def request(agent: str, action: str = "x", **fields) -> CoachRequest:
    given = {"env_id": "Parts-v0", "task_id": "t", "task": "task", **fields}
    return CoachRequest(
        agent=agent,
        system_description="",
        role_description="",
        agent_input=[],
        action=action,
        **given,
    )


def test_adjustments_are_parts_that_add_up_to_the_score():
    scored = RubricScore.row(9.0, "row").adjusted("skill_cap", 5.0, "capped")
    scored = scored.adjusted("rerun_cap", 2.0, "rerun").adjusted("noop", 2.0, "same")
    assert scored.score == 2.0
    assert scored.analysis == "same"
    assert dict(scored.parts) == {"base": 9.0, "skill_cap": -4.0, "rerun_cap": -3.0}
    assert sum(scored.parts.values()) == pytest.approx(scored.score)


def test_each_agents_function_is_called_for_its_agent_only():
    calls: list[tuple[str, str]] = []

    def scorer(name: str, score: float):
        def score_it(req: CoachRequest) -> RubricScore:
            calls.append((name, req.agent))
            return RubricScore.row(score, name).adjusted("cap", score - 1, f"{name} capped")

        return score_it

    rubric = AgentRubric({"a": scorer("a", 7.0), "b": scorer("b", 3.0)})
    coach = RulesCoach(rubrics={"Parts-v0": rubric})
    first, second = coach.score(request("a")), coach.score(request("b"))
    assert calls == [("a", "a"), ("b", "b")]
    assert (first.score, first.analysis, first.parts) == (6.0, "a capped", {"base": 7, "cap": -1})
    assert (second.score, second.parts) == (2.0, {"base": 3.0, "cap": -1.0})
    # Called like a plain rubric, it is one: (score, analysis).
    assert rubric(request("b")) == (2.0, "b capped")
    missing = coach.score(request("c"))
    assert not missing.valid
    assert missing.error == "rubric failed: no rubric for agent 'c'"
    assert calls == [("a", "a"), ("b", "b"), ("b", "b")]


def test_a_plain_mapping_and_a_versioned_one_dispatch_too_and_a_function_names_no_parts():
    by_agent = {"a": lambda req: RubricScore.row(4.0, "four")}
    assert judge(by_agent, request("a")).parts == {"base": 4.0}
    versioned = VersionedRubric(AgentRubric(by_agent), "parts-v1")
    verdict = RulesCoach(rubrics={"Parts-v0": versioned}).score(request("a"))
    assert (verdict.score, verdict.rubric_version, verdict.parts) == (4.0, "parts-v1", {"base": 4})
    plain = RulesCoach(rubrics={"Parts-v0": lambda req: (5, "five")}).score(request("a"))
    assert (plain.score, plain.parts) == (5.0, {})
    assert plain.to_dict()["parts"] == {}


def test_dsbench_names_its_caps_and_keeps_its_scores():
    from mappa_env.envs.dsbench.rubric import dsbench_rubric

    ran = {"ok": True, "stdout": "", "error": None, "timed_out": False}
    metadata = {"artifacts": {}, "skill_cap": 3.0, "skill_cap_reason": "no skill"}
    capped = request(
        "data_engineer", "```python\nprint(1)\n```", tool_result=ran, metadata=metadata
    )
    scored = dsbench_rubric["data_engineer"](capped)
    assert dsbench_rubric(capped) == scored.as_tuple()
    assert scored.score == 3.0
    assert dict(scored.parts) == {"base": 4.0, "skill_cap": -1.0}
    rerun = dict(metadata, earlier_codes=["print(1)"], skill_cap=None)
    scored = dsbench_rubric["data_engineer"](
        request("data_engineer", "```python\nprint(1)\n```", tool_result=ran, metadata=rerun)
    )
    # A rerun earns one below the hand-over without artifacts (1): 0.
    assert (scored.score, dict(scored.parts)) == (0.0, {"base": 4.0, "rerun_cap": -4.0})
    later = dict(metadata, skill_cap=None, earlier_turns=[{"action": "```python\nx=1\n```",
                 "tool_result": ran, "metadata": {"artifacts": {}}}])  # fmt: skip
    scored = dsbench_rubric["data_engineer"](
        request("data_engineer", "```python\nprint(2)\n```", tool_result=ran, metadata=later)
    )
    assert (scored.score, dict(scored.parts)) == (0.0, {"base": 4.0, "later_turn": -4.0})
    with pytest.raises(ValueError, match="no DSBench rubric for agent 'x'"):
        dsbench_rubric(request("x", metadata={"artifacts": {}}))


def test_mathchat_names_the_later_turn_pay():
    from mappa_env.envs.mathchat.rubric import mathchat_rubric

    ran = {"ok": True, "stdout": "5\n", "error": None, "timed_out": False}
    earlier = [{"code": "print(2 + 3)", "tool_result": ran}]
    rerun = request(
        "code_executor",
        "```python\nprint(2 + 3)\n```",
        task="What is 2 + 3?",
        ground_truth="5",
        tool_result=ran,
        metadata={"earlier_runs": earlier},
        rules_rubric=mathchat_rubric,
    )
    verdict = RulesCoach().score(rerun)
    assert verdict.score == 0.0
    assert verdict.parts == {"base": 10.0, "later_turn": -10.0}
    assert verdict.rubric_version == "mathchat-rules-v5"


def test_the_environments_infos_carry_the_parts():
    from examples.custom_env import TASKS, PlannerCoderEnv

    env = PlannerCoderEnv(sandbox=None, isolation="none")
    env.reset(options={"task": TASKS[0]})
    env.step("1. write add")
    assert env.infos["planner"]["coach"]["parts"] == {"base": 6.0}
    env.close()


def test_the_trainer_logs_each_parts_mean_per_agent(tmp_path):
    pytest.importorskip("torch")
    from mappa_agents.tiny_models import tiny_model_dir
    from mappa_train.command import main

    out = tmp_path / "run"
    code = main(
        [
            "train", "--env", "examples.custom_env:PlannerCoderEnv",
            "--system", str(tiny_model_dir(tmp_path / "model")),
            "--env-options", json.dumps({"sandbox": None}), "--steps", "1",
            "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-new-tokens", "8",
            "--train-batch-size", "4", "--micro-batch-size", "2", "--output-dir", str(out),
            "--no-progress", "--no-tensorboard", "--save-every", "0",
        ]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    rows = [json.loads(line) for line in (out / "rollouts" / "step-000000.jsonl").open()]
    for agent in ("planner", "coder"):
        scores = [r["coach"]["score"] for r in rows if r["agent"] == agent and r["coach"]["valid"]]
        assert scores
        # The custom rubric's scores are rows only: the base part is the score.
        assert metrics[f"{agent}/reward_part/base"] == pytest.approx(sum(scores) / len(scores) / 10)
    assert not [key for key in metrics if "reward_part" in key and not key.endswith("/base")]


#: The rubrics, the coach that dispatches to them and the example a new environment copies.
RUBRIC_FILES = (
    "mappa_env/coach/rules.py",
    "mappa_env/coach/rubric.py",
    "mappa_env/envs/mathchat/rubric.py",
    "mappa_env/envs/dsbench/rubric.py",
    "examples/custom_env.py",
)


@pytest.mark.parametrize("path", RUBRIC_FILES)
def test_no_rubric_dispatches_on_the_agent_with_an_if_ladder(path):
    ladder = re.compile(r"\bif (request\.)?agent ==")
    lines = (ROOT / path).read_text().splitlines()
    assert [line for line in lines if ladder.search(line)] == []


def test_an_environment_cap_is_a_part_too_and_the_dict_form_is_a_copy():
    from mappa_env.coach.base import CoachVerdict, cap_verdict

    verdict = CoachVerdict(score=8.0, valid=True, analysis="", coach="rules", parts={"base": 8.0})
    capped = cap_verdict(verdict, 5.0)
    assert capped.score == 5.0
    assert capped.parts == {"base": 8.0, "environment_cap": -3.0}
    assert sum(capped.parts.values()) == capped.score
    assert cap_verdict(CoachVerdict(score=8.0, valid=True, analysis="", coach="x"), 5.0).parts == {}
    data = capped.to_dict()
    data["parts"]["base"] = 0.0
    assert capped.parts["base"] == 8.0
