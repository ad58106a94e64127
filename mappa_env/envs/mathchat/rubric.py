r"""MathChat-v0's rules rubric: the offline coach's per-role score tables.

:class:`~mappa_env.coach.rules.RulesCoach` finds it as ``MathChatEnv.rules_rubric``
(every request carries its environment's rubric; see :mod:`mappa_env.coach.rules`).

MathChat-v0's table below is version ``"mathchat-rules-v5"``
(:data:`MATHCHAT_RUBRIC_VERSION`). Both tables are an
:class:`~mappa_env.coach.rubric.AgentRubric`, one function per agent; each score names
its parts: the row as ``"base"`` and, for a later code turn, ``"later_turn"`` (what the
later-turn pay took off).

MathChat-v0 rubric (scores out of 10). "Answer" means the boxed answer of the action
(:func:`mappa_env.grading.math.extract_boxed`: several different boxed answers, an
empty box or a placeholder such as ``\boxed{NUMBER}`` are no answer), or a fallback
("the answer is 5") where noted; correctness is judged with
:func:`mappa_env.grading.math.answers_match` against the ground truth.

problem_solver:
    10  boxed answer correct, and every arithmetic step it writes holds
     8  boxed answer correct, but a step it writes does not hold (:func:`checked_steps`)
     7  correct answer only as a fallback (no box)
     3  a wrong answer, with working shown
     2  no answer, but working shown
     1  a wrong answer without working (a bare guess: "The answer is 42."), or neither
        an answer nor working (an answer-less draft must not score well)
     0  empty action

    "Working" is an equation or an arithmetic step written outside the answer itself
    (:func:`shows_working`). A draft is worth to the chain its answer and the steps the
    code executor can check. A wrong number without steps gives the code executor
    nothing to check, so it scores no more than saying nothing and below honest steps
    without a conclusion: guessing a number must never pay more than showing work.
    The check is of form only (it cannot tell sound steps from decoration); only the
    correct answer earns a high score.

code_executor, a turn with code:
    10  the code ran and its last printed number is the correct answer, computed
     6  the code printed the correct answer, but derived it from a literal that holds
        it (``print(393482)``, ``print(393481 + 1)``, ``int('393481') + 1``,
        ``print(round(393482.4))``: copied from the draft, not computed; see
        :func:`copied_literal`), or, for an answer up to 10, code that writes none of
        the problem's numbers (``print(1 + 1)``; :func:`copy_reason`)
     4  the code ran and printed a number that is not the correct answer
     2  the code ran but printed no number (nothing computed), or it raised, timed out
        or killed its interpreter
    a later code turn (one after an earlier code turn of its slot) is paid what it
        adds: its score less the best score of its earlier code turns, each scored as
        a first turn, never below 0 (:func:`_progress`). A rerun, a cosmetic variant
        or padding earns 0, below handing over; a fixed error or a wrong number made
        right earns the difference; over a slot, code turns earn what the best one
        would alone
    code_executor, a turn without code (ends its slot):
     8  correct answer, and it matches what its earlier code printed and computed
     6  correct answer, not backed by code output
     2  wrong answer
     1  no answer

verifier:
    10  boxed answer correct
     4  correct answer only as a fallback (no box): right, but in the wrong format
     2  boxed answer wrong (right format, wrong answer: above a missing one)
     1  a wrong answer, not boxed (an answer was given at all)
     0  no answer (a box holding a placeholder or two different answers included: a
        format without an answer, or a hedge, must not pay more than a plain wrong answer)

The gaps are chosen so that no cheap behaviour (an empty reply, printing many numbers,
copying an upstream answer without checking) outscores doing the job.

MathChat-v0 answer-blind rubric, version ``"mathchat-rules-blind-v2"``
(:data:`MATHCHAT_BLIND_RUBRIC_VERSION`). The paper shows the reference answer only to the
last agent's coach (``reveal="last_agent"``): the problem solver's and the code
executor's actions then arrive without the truth, and
:class:`~mappa_env.coach.rules.RulesCoach` judges them by what can be judged without it.
The verifier keeps the table above. Scores:

problem_solver (every ``a op b = c`` it writes recomputed, :func:`checked_steps`):
     8  a boxed final answer reached by a step, every step holds, and the steps use a
        number the problem states
     6  the same, but no step reaches the boxed answer
     5  a final answer only as a fallback ("the answer is 5"), with such steps
     3  working in form only (:func:`shows_working`): no step that can be recomputed,
        or none using the problem's numbers (``1 = 1. \boxed{0}``)
     2  a step that does not hold, or a final answer without working (a bare guess)
     1  neither an answer nor working
     0  empty action

code_executor, a turn with code ("the draft's answer" is the problem solver's, read
as the environment's ``agent_answers`` reads it, given as ``metadata["draft_answer"]``):
     8  the code ran and printed a number it computed from the problem's numbers
        (every literal of it a number the problem states, one off it, or a small
        integer), whether or not it agrees with the draft's answer. The code
        executor reads the draft before it writes code, so agreement is not
        independent evidence, and paying for it would pay for steering code toward
        the draft's number; disagreement is often the point of checking. The analysis
        says which it is, and the verifier, judged against the truth, settles it.
     5  computed from the problem's numbers and others it does not state
     4  it printed a number derived from a literal of its code (:func:`copied_literal`),
        or the code holds the draft's answer as a literal (``assert x == 6534``):
        copied, not computed; numbers the problem states are fine
     3  the code writes none of the problem's numbers (``print(1 + 1)``)
     2  it printed no number, or it raised, timed out or killed its interpreter
    a later code turn is paid what it adds, as in the truth-aware table
    code_executor, a turn without code:
     7  its answer is the number its earlier code computed from the problem (scored 8)
     5  its answer is the number its earlier code computed partly from other numbers
     3  an answer not backed by a number its code computed (no earlier run, a copied
        one, or code that wrote none of the problem's numbers)
     2  an answer that contradicts the number its earlier code computed
     1  no answer
     0  empty action

Without the truth the problem solver's rows judge what can be recomputed (its steps, the
problem's numbers used), not correctness: a wrong answer reached by steps that hold
scores like a right one, so the
verifier's truth-aware score and the episode outcome carry correctness.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

from mappa_env.coach.base import (
    CoachRequest,
    VersionedRubric,
    pay_what_it_adds,
)
from mappa_env.coach.evidence import (
    BOXED,
    checked_steps,
    copied_literal,
    copy_reason,
    foreign_literals,
    same_magnitude,
    stated_numbers,
    uses_problem_numbers,
)
from mappa_env.coach.rubric import AgentRubric, RubricScore
from mappa_env.envs.mathchat.answers import last_number, numbers_in, stated_answer
from mappa_env.envs.mathchat.grading import answers_match, answers_match_any, boxed_answers
from mappa_env.text import extract_code_blocks, strip_think


def _grade(answer: str | None, truths: tuple[str, ...]) -> bool:
    return answer is not None and answers_match_any(answer, truths)


def _answers(text: str) -> tuple[str | None, str | None]:
    """``(boxed answer, answer found by fallback)`` of an action."""
    return stated_answer(text, fallback=False), stated_answer(text, fallback=True)


_RELATION = r"=|≡|<|>|≤|≥|\\le(?:q)?(?![A-Za-z])|\\ge(?:q)?(?![A-Za-z])|\\equiv"
_ARITHMETIC = r"[+*/^×÷·]|\\times|\\cdot|\\div|\\pmod"
_STEP = re.compile(
    rf"(?P<left>[\w)}}\]])\s*(?P<op>{_RELATION}|{_ARITHMETIC})\s*[-−(\[{{\\]*\s*(?P<right>\w)"
    r"|\d\s*[-−]\s*\d"
)
_RELATION_OP = re.compile(_RELATION)


def shows_working(text: str, answer: str | None = None) -> bool:
    """Whether ``text`` shows a step of working outside its final answer.

    A step is an equation or relation (``x = 5``, ``a < b``) or an arithmetic operation
    with a number on one side (``76 * 89``, ``x^2``, ``6764 - 230``, ``3 \\times 4``).
    Boxes and the stated ``answer`` are removed first: ``\\boxed{12 * 11 - 10}`` or
    "the answer is 12 * 11 - 10" states an answer, it shows no step. Hyphenated words
    (``3-digit``, ``well-known``) are not steps. A form check only: it cannot tell
    sound steps from decoration.

    Args:
        text: An agent's message (reasoning in ``<think>`` blocks is ignored).
        answer: The answer the message states, when it states one.

    Returns:
        True when a step is shown.
    """
    visible = BOXED.sub(" ", strip_think(text))
    if answer and _STEP.search(answer):
        # Only an answer that looks like a step is cut out: cutting a plain number
        # ("1") would cut its digits out of the real steps ("12 * 11") too.
        visible = visible.replace(answer, " ")
    for step in _STEP.finditer(visible):
        if step.group("op") is None:  # a subtraction between two numbers
            return True
        numeric = step.group("left").isdigit() or step.group("right").isdigit()
        if numeric or _RELATION_OP.fullmatch(step.group("op")):
            return True
    return False


def _why_no_answer(action: str) -> str:
    """Why an action that looks answered has no answer, for the analysis text."""
    several = boxed_answers(action)
    if len(several) > 1:
        return f" (several different boxed answers: {', '.join(several[:4])})"
    if "\\boxed" in action or "\\fbox" in action:
        return " (its box holds no answer: empty or a placeholder)"
    return ""


def _step_values(steps: list[str]) -> list[str]:
    return [step.rpartition("=")[2].strip() for step in steps]


def _uses_stated(text: str, problem: str) -> bool:
    """Whether ``text`` (outside its boxes) writes a number the problem states."""
    stated = stated_numbers(problem)
    visible = BOXED.sub(" ", strip_think(text))
    return any(same_magnitude(n, s) for n in numbers_in(visible) for s in stated)


def _tool_failure(tool: Mapping[str, object]) -> str | None:
    if tool.get("ok", False):
        return None
    err = tool.get("error") or {}
    name = err.get("name", "failed") if isinstance(err, Mapping) else "failed"
    return "timed out" if tool.get("timed_out") else name


def earlier_runs(metadata: Mapping[str, object]) -> list[tuple[str, Mapping[str, object]]]:
    """The code executor's earlier code turns in this slot: ``[(code, tool result), ...]``.

    From ``metadata["earlier_runs"]`` (``[{"code": ..., "tool_result": ...}]``, see
    :meth:`mappa_env.envs.mathchat.MathChatEnv.coach_metadata`); a request that gives only
    ``earlier_code`` and ``earlier_stdout`` counts them as one run that ran.
    """
    runs = metadata.get("earlier_runs")
    if isinstance(runs, (list, tuple)):
        return [
            (str(run.get("code") or ""), run.get("tool_result") or {})
            for run in runs
            if isinstance(run, Mapping)
        ]
    code = str(metadata.get("earlier_code") or "")
    if not code.strip():
        return []
    stdout = str(metadata.get("earlier_stdout") or "")
    return [(code, {"ok": True, "stdout": stdout, "error": None, "timed_out": False})]


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _progress(
    request: CoachRequest,
    first: RubricScore,
    judge: Callable[[CoachRequest], tuple[float, str]],
) -> RubricScore:
    """A later code turn is paid what it adds over the best earlier turn of its slot.

    Each earlier code turn is scored again as a first turn (``judge`` on its code and
    output); this turn earns its own score less the best of those, never below 0. A
    rerun, a cosmetic variant of it or padding (new code that prints nothing better)
    earns 0, below handing over; a turn that fixes an error or a wrong number earns
    the difference. Summed over a slot, code turns pay no more than the best turn
    would alone: splitting the work or padding never out-earns doing it and handing
    over. What it takes off ``first`` is the part ``"later_turn"``.
    """
    runs = earlier_runs(request.metadata)
    if not runs:
        return first
    earlier = [
        judge(
            dataclasses.replace(request, action=_fenced(code), tool_result=dict(tool), metadata={})
        )[0]
        for code, tool in runs
    ]
    paid = pay_what_it_adds(
        first.score, first.analysis, earlier, "its earlier code (scored {best} as a first turn)"
    )
    return first.adjusted("later_turn", *paid)


def _code_turn(
    request: CoachRequest, tool: Mapping[str, object], truth: tuple[str, ...]
) -> tuple[float, str]:
    """The truth-aware score of a code executor turn whose code ran, as a first turn."""
    failure = _tool_failure(tool)
    if failure is not None:
        return 2.0, f"The code {failure}."
    printed = last_number(str(tool.get("stdout") or ""))
    code = "\n".join(extract_code_blocks(request.action))
    if _grade(printed, truth):
        copied = copy_reason(printed, code, request.task)
        if copied is not None:
            return 6.0, (
                f"The code printed the correct answer {printed}, but {copied}: copied, "
                "not computed."
            )
        return 10.0, f"The code ran and printed the correct answer {printed}."
    if printed is None:
        # No better than code that fails: running nothing must not pay for itself.
        return 2.0, "The code ran but printed no number."
    return 4.0, f"The code ran, but its last printed number ({printed}) is not correct."


def _truth_code_turn(request: CoachRequest) -> tuple[float, str]:
    truth = tuple(request.metadata.get("accepted_answers") or (request.ground_truth,))
    return _code_turn(request, request.tool_result or {}, truth)  # type: ignore[arg-type]


def _truth_aware(
    row: Callable[[CoachRequest, tuple[str, ...]], RubricScore],
) -> Callable[[CoachRequest], RubricScore]:
    """``row`` behind the checks every truth-aware score starts with.

    The ground truth must be given, and an empty action scores 0, before ``row`` judges
    the action against the accepted answers.
    """

    def scorer(request: CoachRequest) -> RubricScore:
        if request.ground_truth is None:
            raise ValueError(
                "the truth-aware rules rubric needs the ground truth: use reveal='always' "
                "(the default for this coach) or 'last_agent' (the answer-blind rubric "
                "judges the agents before the last)"
            )
        if not request.action.strip():
            return RubricScore.row(0.0, "Empty action.")
        # Some problems accept several answers; the environment lists them in the metadata.
        truth = tuple(request.metadata.get("accepted_answers") or (request.ground_truth,))
        return row(request, truth)

    return scorer


@_truth_aware
def _problem_solver(request: CoachRequest, truth: tuple[str, ...]) -> RubricScore:
    """The problem solver's row of the truth-aware table."""
    action = request.action
    boxed, loose = _answers(action)
    if _grade(boxed, truth):
        _, false_steps = checked_steps(action)
        if false_steps:
            return RubricScore.row(
                8.0,
                f"Boxed answer {boxed} is correct, but a step does not hold: {false_steps[0]}.",
            )
        return RubricScore.row(10.0, f"Boxed answer {boxed} is correct.")
    if boxed is None and _grade(loose, truth):
        return RubricScore.row(7.0, f"Correct answer {loose}, but not in \\boxed{{}}.")
    answer = boxed or loose
    working = shows_working(action, answer)
    if answer is not None:
        if working:
            return RubricScore.row(3.0, f"Answer {answer} is wrong; the draft shows working.")
        return RubricScore.row(
            1.0, f"Answer {answer} is wrong, and no working is shown: a bare guess."
        )
    if working:
        return RubricScore.row(
            2.0, f"No answer given{_why_no_answer(action)}, but the draft shows working."
        )
    return RubricScore.row(1.0, f"No answer given{_why_no_answer(action)}, and no working shown.")


@_truth_aware
def _code_executor(request: CoachRequest, truth: tuple[str, ...]) -> RubricScore:
    """The code executor's row of the truth-aware table, then the later-turn pay."""
    action = request.action
    tool = request.tool_result
    if tool is not None:
        first = RubricScore.row(*_code_turn(request, tool, truth))
        return _progress(request, first, _truth_code_turn)
    boxed, loose = _answers(action)
    answer = boxed or loose
    if answer is None:
        return RubricScore.row(1.0, f"No code and no answer{_why_no_answer(action)}.")
    if not _grade(answer, truth):
        return RubricScore.row(2.0, f"Answer {answer} is wrong.")
    earlier = last_number(request.metadata.get("earlier_stdout", ""))
    earlier_code = request.metadata.get("earlier_code", "")
    copied = None if earlier is None else copy_reason(earlier, earlier_code, request.task)
    computed = earlier is not None and copied is None
    if computed and _grade(earlier, truth):
        return RubricScore.row(8.0, f"Correct answer {answer}, backed by its code's output.")
    return RubricScore.row(6.0, f"Correct answer {answer}, but not backed by code output.")


@_truth_aware
def _verifier(request: CoachRequest, truth: tuple[str, ...]) -> RubricScore:
    """The verifier's row of the truth-aware table."""
    action = request.action
    boxed, loose = _answers(action)
    if _grade(boxed, truth):
        return RubricScore.row(10.0, f"Final boxed answer {boxed} is correct.")
    if boxed is None and _grade(loose, truth):
        return RubricScore.row(4.0, f"Correct answer {loose}, but not in \\boxed{{}}.")
    if boxed is not None:
        return RubricScore.row(2.0, f"Final boxed answer {boxed} is wrong.")
    if loose is not None:
        # Each step of the ladder (none < wrong < boxed < correct) is a signal: a
        # verifier scored 0 on every action learns nothing.
        return RubricScore.row(1.0, f"Answer {loose} is wrong and not in \\boxed{{}}.")
    return RubricScore.row(0.0, f"No final answer{_why_no_answer(action)}.")


@_truth_aware
def _unknown_agent(request: CoachRequest, truth: tuple[str, ...]) -> RubricScore:
    raise ValueError(f"no MathChat rubric for agent {request.agent!r}")


_TRUTH_AWARE = AgentRubric(
    {"problem_solver": _problem_solver, "code_executor": _code_executor, "verifier": _verifier},
    fallback=_unknown_agent,
)
"""Score one MathChat-v0 action against the truth; see the module docstring."""


def _blind_basis(number: str, code: str, problem: str, draft: str | None) -> tuple[float, str]:
    """The answer-blind score of code that printed ``number``, and why (a first turn)."""
    copied = copied_literal(number, code, problem)
    if copied is not None:
        return 4.0, f"Copied, not computed: it printed {number}, written in the code ({copied})."
    if not uses_problem_numbers(code, problem):
        return 3.0, (
            f"It printed {number}, but the code writes none of the problem's numbers: it "
            "computes something else."
        )
    if draft is not None:
        held = copied_literal(draft, code, problem)
        if held is not None:
            return 4.0, f"Copied, not computed: the code holds the draft's answer ({held})."
    foreign = foreign_literals(code, problem)
    if foreign:
        return 5.0, (
            f"It printed {number}, computed from the problem's numbers and others it does "
            f"not state ({', '.join(foreign[:3])})."
        )
    return 8.0, (
        f"The code ran and printed a number it computed from the problem's numbers, {number}"
    )


def _blind_code_turn(request: CoachRequest) -> tuple[float, str]:
    """The answer-blind score of a code executor turn whose code ran, as a first turn."""
    tool = request.tool_result or {}
    failure = _tool_failure(tool)
    if failure is not None:
        return 2.0, f"The code {failure}."
    printed = last_number(str(tool.get("stdout") or ""))
    if printed is None:
        return 2.0, "The code ran but printed no number."
    code = "\n".join(extract_code_blocks(request.action))
    draft = _draft(request)
    score, analysis = _blind_basis(printed, code, request.task, draft)
    if score < 8.0:
        return score, analysis
    if draft is None:
        relation = "the draft gave no answer to compare with"
    elif answers_match(printed, draft):
        relation = f"it agrees with the draft's answer {draft} (weak evidence: not independent)"
    else:
        relation = f"it differs from the draft's answer {draft}, for the verifier to settle"
    return score, f"{analysis}; {relation}."


def _draft(request: CoachRequest) -> str | None:
    draft = request.metadata.get("draft_answer")
    return draft if isinstance(draft, str) and draft else None


def _blind_problem_solver(request: CoachRequest) -> RubricScore:
    """The problem solver's row of the answer-blind table."""
    action = request.action
    if not action.strip():
        return RubricScore.row(0.0, "Empty action.")
    boxed, loose = _answers(action)
    answer = boxed or loose
    working = shows_working(action, answer)
    good, bad = checked_steps(action)
    if bad:
        return RubricScore.row(2.0, f"A step does not hold: {bad[0]}.")
    sound = bool(good) and _uses_stated(action, request.task)
    if boxed is not None and sound:
        if any(answers_match(boxed, value) for value in _step_values(good)):
            return RubricScore.row(
                8.0, f"A boxed final answer ({boxed}), reached by steps that check."
            )
        return RubricScore.row(
            6.0, f"A boxed final answer ({boxed}) and steps that check, but no step reaches it."
        )
    if loose is not None and sound:
        return RubricScore.row(
            5.0, f"A final answer ({loose}) with checked steps, but not in \\boxed{{}}."
        )
    if working:
        why = (
            "no step uses the problem's numbers"
            if good
            else "no arithmetic step that can be recomputed"
        )
        return RubricScore.row(
            3.0,
            f"Working in form{'' if answer is None else f' and an answer ({answer})'}, "
            f"but {why}{_why_no_answer(action)}.",
        )
    if answer is not None:
        return RubricScore.row(2.0, f"A final answer ({answer}) without working: a bare guess.")
    return RubricScore.row(1.0, f"Neither a final answer{_why_no_answer(action)} nor working.")


def _blind_code_executor(request: CoachRequest) -> RubricScore:
    """The code executor's row of the answer-blind table, then the later-turn pay."""
    action = request.action
    if not action.strip():
        return RubricScore.row(0.0, "Empty action.")
    tool = request.tool_result
    if tool is not None:
        first = RubricScore.row(*_blind_code_turn(request))
        return _progress(request, first, _blind_code_turn)
    boxed, loose = _answers(action)
    answer = boxed or loose
    if answer is None:
        return RubricScore.row(1.0, f"No code and no answer{_why_no_answer(action)}.")
    earlier = last_number(str(request.metadata.get("earlier_stdout") or ""))
    earlier_code = str(request.metadata.get("earlier_code") or "")
    if earlier is None:
        return RubricScore.row(3.0, f"Answer {answer}, not backed by a number its code computed.")
    basis, _ = _blind_basis(earlier, earlier_code, request.task, _draft(request))
    if not answers_match(answer, earlier):
        return RubricScore.row(
            2.0, f"Answer {answer} contradicts the number its code printed ({earlier})."
        )
    if basis >= 8.0:
        return RubricScore.row(
            7.0, f"Answer {answer}: the number its code computed from the problem."
        )
    if basis >= 5.0:
        return RubricScore.row(
            5.0,
            f"Answer {answer}: the number its code printed, computed partly from numbers "
            "the problem does not state.",
        )
    return RubricScore.row(3.0, f"Answer {answer}, not backed by a number its code computed.")


def _blind_unknown_agent(request: CoachRequest) -> RubricScore:
    raise ValueError(
        f"the answer-blind MathChat rubric judges the problem solver and the code "
        f"executor; {request.agent!r} is judged against the ground truth: use "
        "reveal='last_agent' or 'always'"
    )


_BLIND = AgentRubric(
    {"problem_solver": _blind_problem_solver, "code_executor": _blind_code_executor},
    fallback=_blind_unknown_agent,
)
"""Score a MathChat-v0 problem solver or code executor action without the truth."""


MATHCHAT_BLIND_RUBRIC_VERSION = "mathchat-rules-blind-v2"
"""The answer-blind MathChat-v0 score table (see the module docstring)."""

mathchat_blind_rubric = VersionedRubric(_BLIND, MATHCHAT_BLIND_RUBRIC_VERSION)
"""MathChat-v0's answer-blind rubric, for the problem solver and the code executor."""

MATHCHAT_RUBRIC_VERSION = "mathchat-rules-v5"
"""The truth-aware MathChat-v0 score table above (v5: a copy is an answer derived from a
literal near it, or a small answer from code that writes none of the problem's numbers;
a later code turn is paid what it adds; a false step costs a right draft 2 points)."""

mathchat_rubric = VersionedRubric(
    _TRUTH_AWARE, MATHCHAT_RUBRIC_VERSION, blind=mathchat_blind_rubric
)
"""The MathChat-v0 rubric: ``mathchat_rubric(request) -> (score, analysis)``.

Needs ``request.ground_truth``; its :attr:`~mappa_env.coach.base.VersionedRubric.version`
is :data:`MATHCHAT_RUBRIC_VERSION`. :class:`~mappa_env.coach.rules.RulesCoach` judges the
problem solver and the code executor by :data:`mathchat_blind_rubric` when their actions
arrive without the truth.
"""
