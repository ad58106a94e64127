"""The rules coach's MathChat-v0 rubric, row by row, and the order of its ladder."""

from __future__ import annotations

import pytest

from mappa_env.coach.base import CoachRequest, CoachVerdict, VersionedRubric
from mappa_env.coach.rules import (
    MATHCHAT_BLIND_RUBRIC_VERSION,
    MATHCHAT_RUBRIC_VERSION,
    RulesCoach,
    mathchat_blind_rubric,
    mathchat_rubric,
    shows_working,
)


def request(agent: str, action: str, tool: dict | None = None, **metadata) -> CoachRequest:
    return CoachRequest(
        env_id="MathChat-v0",
        task_id="t",
        task="Compute 12 * 11 - 10.",
        agent=agent,
        system_description="",
        role_description="",
        agent_input=(),
        action=action,
        tool_result=tool,
        ground_truth="122",
        metadata=metadata,
    )


def ran(stdout: str) -> dict:
    return {"ok": True, "stdout": stdout, "stderr": "", "error": None, "timed_out": False}


RAISED = {"ok": False, "stdout": "", "error": {"name": "NameError"}, "timed_out": False}


@pytest.mark.parametrize(
    ("agent", "action", "tool", "metadata", "score"),
    [
        ("problem_solver", "So \\boxed{122}.", None, {}, 10),
        ("problem_solver", "The answer is 122.", None, {}, 7),
        ("problem_solver", "12 * 11 = 132, and 132 - 10 = 120. So \\boxed{120}.", None, {}, 3),
        ("problem_solver", "12 * 11 = 132, and 132 - 10 = 120. The answer is 120.", None, {}, 3),
        # Working without a conclusion beats a bare guess, which is no better than nothing.
        ("problem_solver", "12 * 11 = 132, then subtract 10.", None, {}, 2),
        ("problem_solver", "So \\boxed{120}.", None, {}, 1),
        ("problem_solver", "The answer is 42.", None, {}, 1),
        ("problem_solver", "Let me think about it.", None, {}, 1),
        # A placeholder or two different boxes are no answer.
        ("problem_solver", "12 * 11 = 132. \\boxed{NUMBER}", None, {}, 2),
        ("problem_solver", "12 * 11 = 132. \\boxed{120} or \\boxed{122}", None, {}, 2),
        ("problem_solver", "   ", None, {}, 0),
        ("code_executor", "```python\nprint(12*11-10)\n```", ran("122\n"), {}, 10),
        ("code_executor", "```python\nprint(12*11)\n```", ran("132\n"), {}, 4),
        # Printing nothing computed is no better than code that fails.
        ("code_executor", "```python\nprint('hi')\n```", ran("hi\n"), {}, 2),
        ("code_executor", "```python\npass\n```", ran(""), {}, 2),
        ("code_executor", "```python\nprint(x)\n```", RAISED, {}, 2),
        # The answer written into the code (copied from the draft) is not computed.
        ("code_executor", "```python\nprint(122)\n```", ran("122\n"), {}, 6),
        ("code_executor", "```python\nx = 122\nprint(x)\n```", ran("122\n"), {}, 6),
        ("code_executor", "```python\nprint(f'{122}')\n```", ran("122\n"), {}, 6),
        ("code_executor", "```python\nn = 11\nprint(12 * n - 10)\n```", ran("122\n"), {}, 10),
        ("code_executor", "```python\n%time print(122)\n```", ran("122\n"), {}, 6),
        ("code_executor", "```python\nx: int = 122\nprint(x)\n```", ran("122\n"), {}, 6),
        # Computed, though the answer's digits appear in a format spec.
        (
            "code_executor",
            "```python\nx = 12 * 11 - 10\nprint(f'{x:.122}')\n```",
            ran("122\n"),
            {},
            10,
        ),
        # The answer as a start value that the code only pretends to update is a copy.
        (
            "code_executor",
            "```python\nt = 122\nfor i in range(3):\n    t += 0\nprint(t)\n```",
            ran("122\n"),
            {},
            6,
        ),
        (
            "code_executor",
            "```python\nx = 1\nx = 12 * 11 - 10\nprint(x)\n```",
            ran("122\n"),
            {},
            10,
        ),
        # A literal too long to print is no answer, and no crash (an invalid verdict).
        (
            "code_executor",
            "```python\nx = " + "9" * 5000 + "\nx = 122\nprint(x)\n```",
            ran("122\n"),
            {},
            6,
        ),
        ("code_executor", "So \\boxed{122}.", None, {"earlier_stdout": "122\n"}, 8),
        (
            "code_executor",
            "So \\boxed{122}.",
            None,
            {"earlier_stdout": "122\n", "earlier_code": "print(12*11-10)"},
            8,
        ),
        (
            "code_executor",
            "So \\boxed{122}.",
            None,
            {"earlier_stdout": "122\n", "earlier_code": "print(122)"},
            6,
        ),
        (
            "code_executor",
            "So \\boxed{122}.",
            None,
            {"earlier_stdout": "122\n", "earlier_code": "print(int('122'))"},
            6,
        ),
        ("code_executor", "So \\boxed{122}.", None, {"earlier_stdout": ""}, 6),
        ("code_executor", "So \\boxed{7}.", None, {}, 2),
        ("code_executor", "Done.", None, {}, 1),
        ("verifier", "Final: \\boxed{122}", None, {}, 10),
        ("verifier", "The final answer is 122.", None, {}, 4),
        ("verifier", "Final: \\boxed{121}", None, {}, 2),
        ("verifier", "The final answer is 121.", None, {}, 1),
        ("verifier", "I cannot tell.", None, {}, 0),
        # The problem's expression copied as the answer is a wrong answer, not a right one.
        ("problem_solver", "So \\boxed{12 * 11 - 10}.", None, {}, 1),
        ("problem_solver", "The answer is 12 * 11 - 10.", None, {}, 1),
        ("code_executor", "So \\boxed{12 * 11 - 10}.", None, {"earlier_stdout": "122\n"}, 2),
        ("verifier", "Final: \\boxed{12 * 11 - 10}", None, {}, 2),
        ("verifier", "Final: \\boxed{12 \\times 11 - 10}", None, {}, 2),
        ("verifier", "Final: \\boxed{1342/11}", None, {}, 2),
        # Several different boxed answers are no answer: a hedge is not a choice.
        ("verifier", "\\boxed{120} or rather \\boxed{122}", None, {}, 0),
        ("verifier", "\\boxed{122} and again \\boxed{122.0}", None, {}, 10),
        # A placeholder in the box is format without an answer: no answer.
        ("verifier", "The final answer is \\boxed{NUMBER}", None, {}, 0),
        ("verifier", "\\boxed{answer}", None, {}, 0),
        ("verifier", "\\boxed{}", None, {}, 0),
        ("code_executor", "\\boxed{120} \\boxed{122}", None, {"earlier_stdout": "122\n"}, 1),
    ],
)
def test_each_row_of_the_rubric(agent, action, tool, metadata, score):
    got, analysis = mathchat_rubric(request(agent, action, tool, **metadata))
    assert got == score, analysis


PRODUCT = "Compute 76 * 89 - 230."


def code_request(code: str, stdout: str, *, task: str = PRODUCT, truth: str = "6534"):
    return CoachRequest(
        env_id="MathChat-v0",
        task_id="t",
        task=task,
        agent="code_executor",
        system_description="",
        role_description="",
        agent_input=(),
        action=f"```python\n{code}\n```",
        tool_result=ran(stdout),
        ground_truth=truth,
    )


@pytest.mark.parametrize(
    "code",
    [
        "print(6534)",
        "print(6534+0)",
        "print(int('6534'))",
        'print(float("6534"))',
        "print('%d' % 6534)",
        "x = 6534; y = x; print(y)",
        "print(-(-6534))",
        "print(6_534 * 1)",
        "print(int('6_534'))",
        "print(0x1986)",
        "x = 76 * 89 - 230\nassert x == 6534\nprint(x)",
        "import itertools\nprint(next(n for n in itertools.count() if n == 6534))",
    ],
)
def test_the_answer_written_anywhere_in_the_code_is_copied(code):
    score, analysis = mathchat_rubric(code_request(code, "6534\n"))
    assert score == 6, analysis
    assert "copied" in analysis


@pytest.mark.parametrize(
    ("code", "stdout", "task", "truth"),
    [
        ("print(76 * 89 - 230)", "6534\n", PRODUCT, "6534"),
        ("a, b, c = 76, 89, 230\nprint(a * b - c)", "6534\n", PRODUCT, "6534"),
        ("x = 76 * 89 - 230\nprint(f'{x:,}')", "6,534\n", PRODUCT, "6534"),
        ("print(-(76 * 89 - 230))", "-6534\n", PRODUCT, "-6534"),
        # The problem states the number: writing it is how the problem is computed.
        ("print(6534 + 0)", "6534\n", "Compute 6534 + 0.", "6534"),
        ("print(2 ** 10)", "1024\n", "Compute 2 ** 10.", "1024"),
        # Small integers are everywhere in honest code (a range start, an exponent).
        (
            "print(sum(1 for n in range(2, 5) if all(n % d for d in range(2, n))))",
            "2\n",
            "How many primes are less than 5?",
            "2",
        ),
        ("x = 3\nprint(x ** 2 - 7)", "2\n", "What is 3 squared minus 7?", "2"),
        (
            "count = 0\nfor n in [1, 2, 3]:\n    if n % 7 == 0:\n        count += 1\nprint(count)",
            "0\n",
            "How many of 1, 2, 3 are multiples of 7?",
            "0",
        ),
    ],
)
def test_honest_computations_still_score_full(code, stdout, task, truth):
    score, analysis = mathchat_rubric(code_request(code, stdout, task=task, truth=truth))
    assert score == 10, analysis


def test_a_printed_literal_is_copied_even_when_the_problem_states_it():
    score, _ = mathchat_rubric(code_request("print(6534)", "6534\n", task="Compute 6534 + 0."))
    assert score == 6
    score, _ = mathchat_rubric(code_request("print(0)", "0\n", task="Is 5 even?", truth="0"))
    assert score == 6


@pytest.mark.parametrize(
    "again",
    [
        "print(76 * 89 - 230)",
        "\n  print(76 * 89 - 230)  \n\n",
        "print(76*89 - 230)  # once more",
    ],
)
def test_rerunning_the_earlier_code_earns_no_second_full_score(again):
    first = code_request("print(76 * 89 - 230)", "6534\n")
    assert mathchat_rubric(first)[0] == 10
    rerun = CoachRequest(
        **{
            **code_request(again, "6534\n").__dict__,
            "turn": 1,
            "metadata": {"earlier_code": "print(76 * 89 - 230)\n", "earlier_stdout": "6534\n"},
        }
    )
    score, analysis = mathchat_rubric(rerun)
    assert score == 0, analysis
    assert "later turn" in analysis
    handover = CoachRequest(**{**rerun.__dict__, "action": "\\boxed{6534}", "tool_result": None})
    assert mathchat_rubric(handover)[0] > score  # handing over is the better second turn


@pytest.mark.parametrize(
    ("earlier", "code", "stdout", "paid"),
    [
        # A cosmetic variant of the earlier code, or padding: nothing new, nothing paid.
        (("print(76 * 89 - 230)", ran("6534\n")), "x = 76 * 89\nprint(x - 230)", "6534\n", 0),
        (("print(76 * 89 - 230)", ran("6534\n")), "for i in range(3):\n    print(i)", "2\n", 0),
        (("print(76 * 89)", ran("6764\n")), "print(76 * 89)", "6764\n", 0),
        # Progress is paid what it adds: a wrong number made right, an error fixed.
        (("print(76 * 89)", ran("6764\n")), "print(76 * 89 - 230)", "6534\n", 6),
        (("print(y)", RAISED), "print(76 * 89 - 230)", "6534\n", 8),
    ],
)
def test_a_later_turn_is_paid_what_it_adds(earlier, code, stdout, paid):
    before, tool = earlier
    metadata = {"earlier_runs": [{"code": before, "tool_result": tool}]}
    request = CoachRequest(**{**code_request(code, stdout).__dict__, "metadata": metadata})
    score, analysis = mathchat_rubric(request)
    assert score == paid, analysis


def test_a_false_step_costs_a_right_answer_its_full_score():
    honest = "76 * 89 = 6764, and 6764 - 230 = 6534. \\boxed{6534}"
    slipped = "77 * 89 = 6764, and 6764 - 230 = 6534. \\boxed{6534}"
    ask = CoachRequest(**{**code_request("", "").__dict__, "agent": "problem_solver"})
    scores = [
        mathchat_rubric(CoachRequest(**{**ask.__dict__, "action": text, "tool_result": None}))[0]
        for text in (honest, slipped)
    ]
    assert scores == [10, 8]


@pytest.mark.parametrize(
    ("code", "stdout", "truth"),
    [
        ("print(6533 + 1)", "6534\n", "6534"),
        ("print(int('6533') + 1)", "6534\n", "6534"),
        ("print(round(6534.4))", "6534\n", "6534"),
        ("x = 6500\nprint(x + 34)", "6534\n", "6534"),
        # A small answer: code that writes none of the problem's numbers copied it.
        ("print(1 + 1)", "2\n", "2"),
        ("print(len('ab'))", "2\n", "2"),
    ],
)
def test_an_answer_derived_from_a_literal_near_it_is_a_copy(code, stdout, truth):
    task = PRODUCT if truth == "6534" else "Ann has 5 apples and eats 3. How many are left?"
    score, analysis = mathchat_rubric(code_request(code, stdout, task=task, truth=truth))
    assert score == 6, analysis
    assert "copied" in analysis


def test_a_small_answer_computed_from_the_problem_numbers_is_no_copy():
    task = "Ann has 5 apples and eats 3. How many are left?"
    score, analysis = mathchat_rubric(code_request("print(5 - 3)", "2\n", task=task, truth="2"))
    assert score == 10, analysis


@pytest.mark.parametrize(
    ("text", "answer", "shown"),
    [
        ("76 * 89 = 6764, and 6764 - 230 = 6534.", "6534", True),
        ("12 * 11 = 132, so the answer is 1.", "1", True),
        ("Let $x^2 + 1$ be positive.", None, True),
        ("so x = 5 then", None, True),
        ("The answer is 42.", "42", False),
        ("The answer is 12 * 11 - 10.", "12 * 11 - 10", False),
        ("So \\boxed{12 * 11 - 10}.", None, False),
        ("A 3-digit, well-known number. **Answer:** 5", "5", False),
        ("<think>2 + 2 = 4</think> The answer is 42.", "42", False),
    ],
)
def test_shows_working(text, answer, shown):
    assert shows_working(text, answer) is shown


def test_no_cheap_draft_outscores_honest_steps():
    guess = mathchat_rubric(request("problem_solver", "The answer is 42."))[0]
    boxed_guess = mathchat_rubric(request("problem_solver", "\\boxed{42}"))[0]
    steps = mathchat_rubric(request("problem_solver", "12 * 11 = 132; minus 10."))[0]
    steps_and_wrong = mathchat_rubric(request("problem_solver", "12 * 11 = 132. \\boxed{42}"))[0]
    assert max(guess, boxed_guess) < steps < steps_and_wrong


def test_a_placeholder_box_scores_below_an_unboxed_wrong_answer():
    placeholders = ["\\boxed{NUMBER}", "\\boxed{answer}", "\\boxed{}", "\\boxed{...}"]
    unboxed_wrong = mathchat_rubric(request("verifier", "The final answer is 121."))[0]
    for text in placeholders:
        score, analysis = mathchat_rubric(request("verifier", f"The final answer is {text}"))
        assert score < unboxed_wrong, (text, analysis)


def test_the_verifier_ladder_rewards_each_step_toward_the_job():
    ladder = [
        "I cannot tell.",  # nothing
        "The final answer is 121.",  # an answer
        "Final: \\boxed{121}",  # in the graded format
        "Final: \\boxed{122}",  # correct
    ]
    scores = [mathchat_rubric(request("verifier", text))[0] for text in ladder]
    assert scores == sorted(scores)
    assert len(set(scores)) == len(scores)


def test_without_the_truth_the_verdict_is_invalid_not_a_score():
    coach = RulesCoach()
    blind = request("verifier", "\\boxed{122}")
    blind = CoachRequest(**{**blind.__dict__, "ground_truth": None})
    verdict = coach.score(blind)
    assert verdict.valid is False
    assert "ground truth" in verdict.analysis


# ----------------------------------------------------------------------------- versions


def test_every_verdict_names_the_rubric_version_that_scored_it():
    verdict = RulesCoach().score(request("verifier", "Final: \\boxed{122}"))
    assert verdict.score == 10
    assert verdict.rubric_version == MATHCHAT_RUBRIC_VERSION == "mathchat-rules-v5"
    assert verdict.to_dict()["rubric_version"] == "mathchat-rules-v5"
    assert CoachVerdict(score=1.0, valid=True).to_dict()["rubric_version"] is None


def test_a_plain_rubric_function_still_works_without_a_version():
    def constant(req: CoachRequest) -> tuple[float, str]:
        return 5.0, "always five"

    coach = RulesCoach(rubrics={"MathChat-v0": constant})
    verdict = coach.score(request("verifier", "\\boxed{122}"))
    assert (verdict.score, verdict.rubric_version) == (5.0, None)
    assert coach.rubric_versions("MathChat-v0") == {"truth_aware": None, "answer_blind": None}
    constant.version = "constant-v1"  # a function may name its version as an attribute
    assert coach.score(request("verifier", "x")).rubric_version == "constant-v1"


def test_the_coach_picks_the_answer_blind_companion_without_the_truth():
    def aware(req: CoachRequest) -> tuple[float, str]:
        return 9.0, "with the truth"

    def blind(req: CoachRequest) -> tuple[float, str]:
        return 3.0, "without the truth"

    rubric = VersionedRubric(aware, "toy-v2", blind=VersionedRubric(blind, "toy-blind-v1"))
    coach = RulesCoach(rubrics={"MathChat-v0": rubric})
    assert coach.rubric_versions("MathChat-v0") == {
        "truth_aware": "toy-v2",
        "answer_blind": "toy-blind-v1",
    }
    with_truth = request("problem_solver", "x")
    without = CoachRequest(**{**with_truth.__dict__, "ground_truth": None})
    last_without = CoachRequest(**{**without.__dict__, "is_last_agent": True})
    scored = [coach.score(r) for r in (with_truth, without, last_without)]
    assert [(v.score, v.rubric_version) for v in scored] == [
        (9.0, "toy-v2"),
        (3.0, "toy-blind-v1"),
        (9.0, "toy-v2"),  # the last agent is always judged by the truth-aware rubric
    ]


def test_rubric_versions_of_an_environment_without_a_rubric_is_an_error():
    with pytest.raises(ValueError, match="no rules rubric"):
        RulesCoach().rubric_versions("Nowhere-v0")


# ------------------------------------------------------------------ the answer-blind rubric


def blind(agent: str, action: str, tool: dict | None = None, **metadata) -> CoachRequest:
    """A request as ``reveal="last_agent"`` sends it for an agent before the last."""
    return CoachRequest(
        env_id="MathChat-v0",
        task_id="t",
        task=PRODUCT,
        agent=agent,
        system_description="",
        role_description="",
        agent_input=(),
        action=action,
        tool_result=tool,
        ground_truth=None,
        metadata=metadata,
    )


STEPS = "76 * 89 = 6764, and 6764 - 230 = 6534."
CODE = "```python\nprint(76 * 89 - 230)\n```"


@pytest.mark.parametrize(
    ("agent", "action", "tool", "metadata", "score"),
    [
        ("problem_solver", f"{STEPS} So \\boxed{{6534}}.", None, {}, 8),
        # Without the truth a wrong answer reached by steps that check is judged like a
        # right one; steps that check but do not reach the answer score less.
        ("problem_solver", "76 * 89 = 6764, 6764 - 240 = 6524. \\boxed{6524}", None, {}, 8),
        ("problem_solver", "76 * 89 = 6764, minus 230 is 6524. \\boxed{6524}", None, {}, 6),
        # A step that does not hold, or steps that use none of the problem's numbers.
        ("problem_solver", "76 * 89 = 6765, 6765 - 230 = 6535. \\boxed{6535}", None, {}, 2),
        ("problem_solver", "1 = 1. \\boxed{0}", None, {}, 3),
        ("problem_solver", "2 + 2 = 4. \\boxed{4}", None, {}, 3),
        ("problem_solver", f"{STEPS} The answer is 6534.", None, {}, 5),
        ("problem_solver", "76 * 89 = 6764, then subtract 230.", None, {}, 3),
        ("problem_solver", f"{STEPS} \\boxed{{NUMBER}}", None, {}, 3),
        ("problem_solver", f"{STEPS} \\boxed{{6534}} or \\boxed{{6524}}", None, {}, 3),
        ("problem_solver", "The answer is 42.", None, {}, 2),
        ("problem_solver", "\\boxed{6534}", None, {}, 2),
        ("problem_solver", "Let me think about it.", None, {}, 1),
        ("problem_solver", " ", None, {}, 0),
        ("code_executor", CODE, ran("6534\n"), {"draft_answer": "6534"}, 8),
        ("code_executor", CODE, ran("6534\n"), {"draft_answer": "42"}, 8),
        ("code_executor", CODE, ran("6534\n"), {"draft_answer": None}, 8),
        ("code_executor", "```python\nprint(6534)\n```", ran("6534\n"), {}, 4),
        ("code_executor", "```python\nprint(6534+0)\n```", ran("6534\n"), {}, 4),
        ("code_executor", "```python\nprint(int('42'))\n```", ran("42\n"), {}, 4),
        (
            "code_executor",
            "```python\nx = 76 * 89 - 230\nprint(x == 6534, x)\n```",
            ran("True 6534\n"),
            {"draft_answer": "6534"},
            4,
        ),
        # A number the problem states is fine to write.
        ("code_executor", "```python\nprint(89 * 76 - 230)\n```", ran("6534\n"), {}, 8),
        ("code_executor", "```python\nprint('hi')\n```", ran("hi\n"), {}, 2),
        ("code_executor", "```python\nprint(x)\n```", RAISED, {}, 2),
        (
            "code_executor",
            CODE,
            ran("6534\n"),
            {"earlier_code": "print(76 * 89 - 230)", "earlier_stdout": "6534\n"},
            0,
        ),
        # Code that computes nothing from the problem, or from numbers it does not state.
        ("code_executor", "```python\nprint(1+1)\n```", ran("2\n"), {}, 3),
        ("code_executor", "```python\nprint(76 * 89 - 2000)\n```", ran("4764\n"), {}, 5),
        (
            "code_executor",
            "So \\boxed{2}.",
            None,
            {"earlier_code": "print(1+1)", "earlier_stdout": "2\n"},
            3,
        ),
        (
            "code_executor",
            "So \\boxed{6534}.",
            None,
            {"earlier_code": "print(76 * 89 - 230)", "earlier_stdout": "6534\n"},
            7,
        ),
        ("code_executor", "So \\boxed{6534}.", None, {}, 3),
        (
            "code_executor",
            "So \\boxed{6534}.",
            None,
            {"earlier_code": "print(6534)", "earlier_stdout": "6534\n"},
            3,
        ),
        (
            "code_executor",
            "So \\boxed{42}.",
            None,
            {"earlier_code": "print(76 * 89 - 230)", "earlier_stdout": "6534\n"},
            2,
        ),
        ("code_executor", "Done.", None, {}, 1),
    ],
)
def test_each_row_of_the_answer_blind_rubric(agent, action, tool, metadata, score):
    got, analysis = mathchat_blind_rubric(blind(agent, action, tool, **metadata))
    assert got == score, analysis
    verdict = RulesCoach().score(blind(agent, action, tool, **metadata))
    assert (verdict.score, verdict.rubric_version) == (score, MATHCHAT_BLIND_RUBRIC_VERSION)


def test_the_blind_rubric_never_reads_the_truth():
    cases = [
        blind("problem_solver", f"{STEPS} \\boxed{{6534}}"),
        blind("code_executor", CODE, ran("6534\n"), draft_answer="6534"),
    ]
    for case in cases:
        told = CoachRequest(**{**case.__dict__, "ground_truth": "1", "metadata": {**case.metadata}})
        assert mathchat_blind_rubric(case) == mathchat_blind_rubric(told)


def test_no_cheap_action_outscores_the_job_without_the_truth():
    def score(agent, action, tool=None, **metadata):
        return mathchat_blind_rubric(blind(agent, action, tool, **metadata))[0]

    job = score("problem_solver", f"{STEPS} \\boxed{{6534}}")
    steps = score("problem_solver", "76 * 89 = 6764, then subtract 230.")
    guesses = [score("problem_solver", g) for g in ("\\boxed{42}", "The answer is 42.")]
    assert max(guesses) < steps < job
    computed = score("code_executor", CODE, ran("6534\n"), draft_answer="6534")
    copied = score("code_executor", "```python\nprint(6534)\n```", ran("6534\n"))
    nothing = score("code_executor", "```python\npass\n```", ran(""))
    assert nothing < copied < computed


def test_the_last_agent_without_the_truth_is_not_scored():
    verdict = RulesCoach().score(
        CoachRequest(**{**blind("verifier", "\\boxed{6534}").__dict__, "is_last_agent": True})
    )
    assert verdict.valid is False
    assert "ground truth" in verdict.analysis


def test_rubric_versions_of_mathchat():
    assert RulesCoach().rubric_versions("MathChat-v0") == {
        "truth_aware": "mathchat-rules-v5",
        "answer_blind": "mathchat-rules-blind-v2",
    }


# ------------------------------------------------------------------ through env.step


STORY = "A farm has 76 rows of 89 trees. A storm fells 230 of them. How many trees stand?"
HONEST_DRAFT = "76 * 89 = 6764 trees, and 6764 - 230 = 6534 stand. So \\boxed{6534}."
HONEST_CODE = "```python\nprint(76 * 89 - 230)\n```"


def episode_scores(*actions: str, reveal: str = "always") -> list[tuple[str, float]]:
    """``(agent, score)`` of each action stepped through a MathChat episode."""
    from mappa_env.envs.mathchat import MathChatEnv
    from mappa_env.tasks import MathTask
    from tests.fakes import InProcessSandbox

    env = MathChatEnv(
        tasks=[MathTask(id="story", prompt=STORY, answer="6534")],
        sandbox=InProcessSandbox,
        reveal=reveal,
    )
    try:
        env.reset()
        scores = []
        for action in actions:
            agent = env.agent_selection
            env.step(action)
            scores.append((agent, env.infos[agent]["coach"]["score"]))
        return scores
    finally:
        env.close()


def test_blind_content_free_actions_score_well_below_honest_work():
    honest = episode_scores(HONEST_DRAFT, HONEST_CODE, "\\boxed{6534}", reveal="last_agent")
    empty = episode_scores("1 = 1. \\boxed{0}", "```python\nprint(1+1)\n```", "\\boxed{2}",
                           reveal="last_agent")  # fmt: skip
    assert [s for _, s in honest] == [8, 8, 7]
    assert [s for _, s in empty] == [3, 3, 3]


@pytest.mark.parametrize("reveal", ["always", "last_agent"])
@pytest.mark.parametrize(
    "second",
    [
        HONEST_CODE,  # a rerun
        "```python\ntrees = 76 * 89\nprint(trees - 230)  # again\n```",  # a cosmetic variant
        "```python\nfor i in range(3):\n    print(i)\n```",  # padding
        "```python\nprint(76 * 89 - 230, 76 * 89 - 230)\n```",  # the same result twice
    ],
)
def test_a_second_code_turn_without_progress_earns_less_than_handing_over(reveal, second):
    handed = episode_scores(HONEST_DRAFT, HONEST_CODE, "\\boxed{6534}", reveal=reveal)
    padded = episode_scores(HONEST_DRAFT, HONEST_CODE, second, reveal=reveal)
    assert padded[2][0] == handed[2][0] == "code_executor"
    assert padded[2][1] == 0 < handed[2][1]


@pytest.mark.parametrize(
    "code",
    ["print(6533 + 1)", "print(int('6533') + 1)", "print(round(6534.4))", "print(6534 - 1 + 1)"],
)
def test_a_copy_by_derivation_scores_below_computing_through_env_step(code):
    copied = episode_scores(HONEST_DRAFT, f"```python\n{code}\n```")
    computed = episode_scores(HONEST_DRAFT, HONEST_CODE)
    assert copied[1][1] == 6 < computed[1][1] == 10
    blind_copied = episode_scores(HONEST_DRAFT, f"```python\n{code}\n```", reveal="last_agent")
    assert blind_copied[1][1] == 4
