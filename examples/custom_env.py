r"""Your own environment in one file: a planner and a coder write a small Python function.

``planner`` reads the task and writes a short plan; ``coder`` writes the function in a
```` ```python ```` block. Its code runs in the sandbox and the coder sees whether it
gives the task's example right and whether it passes a hidden check; it may revise (up
to three turns) and its slot ends once both pass (a custom :meth:`next_agent`). The
episode is graded by running all of the coder's code, in order, in a fresh interpreter
on hidden cases drawn for that episode. Their arguments are random and their expected
values are computed out here by a reference function, so they never enter any
interpreter agents' code runs in and cannot be memorised across episodes: the way to
the outcome reward is a function that computes the right values. (The reference
functions are in this file: under ``isolation="namespaces"`` agents cannot read it as
long as its folder is not on ``PYTHONPATH``, which the kernels see.)

Everything the environment knows lives in this file: roles, prompts, tool, tasks,
grading, the rules coach's rubric and the LLM coach's rubrics. Use it like a built-in::

    import mappa_env
    from examples.custom_env import PlannerCoderEnv  # registers "PlannerCoder-v0"

    env = mappa_env.make("PlannerCoder-v0")

or from the command line, without registering::

    mappa eval --env examples.custom_env:PlannerCoderEnv --episodes 4
    mappa train --env examples.custom_env:PlannerCoderEnv --steps 1 ...
"""

from __future__ import annotations

import ast
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import mappa_env
from mappa_env import ActionRecord, AgentSpec, PipelineEnv, ToolOutcome
from mappa_env.coach.base import CoachRequest
from mappa_env.coach.rubric import AgentRubric, RubricScore
from mappa_env.text import extract_code_blocks, strip_think

PLANNER = "planner"
CODER = "coder"


@dataclass(frozen=True)
class CodingTask:
    """Write ``function``: the prompt shows one example; the graded cases are drawn.

    Attributes:
        id: Task id.
        function: Name of the function to write.
        prompt: What the function must do, with its signature.
        example: Arguments of the example shown to the agents.
        reference: A correct implementation: it gives the expected values.
        draw: ``rng -> arguments`` of one hidden case.
        metadata: Free-form facts (``kind`` groups tasks in reports).
    """

    id: str
    function: str
    prompt: str
    example: tuple[Any, ...]
    reference: Callable[..., Any]
    draw: Callable[[np.random.Generator], tuple[Any, ...]]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def expected(self, args: tuple[Any, ...]) -> str:
        """``repr`` of the right value for ``args``."""
        return repr(self.reference(*args))


def _words(rng: np.random.Generator) -> str:
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 6))) for _ in range(4)]
    gaps = [" " * int(rng.integers(1, 3)) for _ in words]
    return "".join(g + w for g, w in zip(gaps, words[: int(rng.integers(1, 5))]))


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


TASKS = (
    CodingTask(
        "add",
        "add",
        "Write `add(a, b)` that returns the sum of two integers.",
        (2, 3),
        lambda a, b: a + b,
        lambda rng: (int(rng.integers(-1000, 1000)), int(rng.integers(-1000, 1000))),
        {"kind": "arithmetic"},
    ),
    CodingTask(
        "reverse-words",
        "reverse_words",
        "Write `reverse_words(text)` that returns the words of `text` in reverse order, "
        "joined by single spaces.",
        ("hello big world",),
        lambda text: " ".join(reversed(text.split())),
        lambda rng: (_words(rng),),
        {"kind": "strings"},
    ),
    CodingTask(
        "count-vowels",
        "count_vowels",
        "Write `count_vowels(text)` that returns how many of the characters of `text` "
        "are vowels (a, e, i, o, u, either case).",
        ("Banana",),
        lambda text: sum(c in "aeiouAEIOU" for c in text),
        lambda rng: ("".join(rng.choice(list("aEiOuxyzBC "), size=rng.integers(0, 12))),),
        {"kind": "strings"},
    ),
    CodingTask(
        "is-prime",
        "is_prime",
        "Write `is_prime(n)` that returns True when the integer `n` is a prime number.",
        (7,),
        _is_prime,
        lambda rng: (int(rng.integers(-5, 400)),),
        {"kind": "arithmetic"},
    ),
)

#: Hidden cases an episode is graded on.
HIDDEN_CASES = 6

SYSTEM_DESCRIPTION = (
    "Two agents write a small Python function: the planner writes a short plan, then "
    "the coder writes the function in a ```python block; the coder's code runs and it "
    "sees whether the task's example and a hidden check pass. The function is graded "
    "on hidden cases drawn for each episode."
)

_ROLES = {
    PLANNER: (
        "You are the planner. Read the task and write a short plan (at most five "
        "steps) for the coder: the function's name, its edge cases, the approach. "
        "Write no code. Keep it within {budget} tokens."
    ),
    CODER: (
        "You are the coder. Write the requested function in one ```python block. It "
        "runs, and you see whether the task's example and a hidden check give the right "
        "values; you have {turns} turn(s) to get it right. Keep each reply within "
        "{budget} tokens."
    ),
}

#: What an LLM coach judges each role by.
COACH_RUBRICS = {
    PLANNER: "A good plan names the function, covers the edge cases the hidden tests "
    "may probe (empty input, zero, negatives), and is short. Code in the plan, or a "
    "plan for another function, scores low.",
    CODER: "Judge the code on its tool result: code that defines the function and "
    "passes both the example and the hidden check is good work; passing the example "
    "alone suggests a special case, not the function; code that errors, or a reply "
    "without code, is not. Claims the output does not show count against the coder.",
}


def _planner_score(request: CoachRequest) -> RubricScore:
    """The rules coach's score of the planner's plan, and why.

    6 for a plan that names the function and has no code, 2 for a plan that does not
    name it, 0 for code or nothing (a check of form only: an LLM coach, or the outcome
    in ``mixed`` mode, judges whether the plan helps).
    """
    plan = strip_think(request.action)
    if not plan.strip() or "```" in plan:
        return RubricScore.row(0.0, "No plan (empty, or code instead of a plan).")
    if str(request.metadata.get("function", "")) in plan:
        return RubricScore.row(6.0, "A plan that names the function.")
    return RubricScore.row(2.0, "The plan does not name the function to write.")


def _coder_score(request: CoachRequest) -> RubricScore:
    """The rules coach's score of a coder's turn, and why.

    9 when its code passes the example and the hidden check, 4 when it passes the
    example only (a special case, not the function), 3 when it runs but gets the
    example wrong, 1 when it raises, 0 with no code.
    """
    facts = request.metadata
    if not facts.get("code_ran"):
        return RubricScore.row(0.0, "No code block.")
    if facts.get("code_error"):
        return RubricScore.row(1.0, f"The code raised {facts['code_error']}.")
    if facts.get("example_passed") and facts.get("check_passed"):
        return RubricScore.row(9.0, "The code passes the example and the hidden check.")
    if facts.get("example_passed"):
        return RubricScore.row(4.0, "The code passes the example but not the hidden check.")
    return RubricScore.row(3.0, "The code runs but gives the example a wrong value.")


#: The rules coach's rubric: each agent's scoring function (a score in [0, 10] and why),
#: called for that agent's actions only. A score of more than one part names each
#: (``RubricScore.row(...).adjusted("cap", ...)``); the trainer logs their means.
planner_coder_rubric = AgentRubric({PLANNER: _planner_score, CODER: _coder_score})


class PlannerCoderEnv(PipelineEnv):
    """PlannerCoder-v0: planner -> coder on small Python functions.

    Args:
        tasks: :class:`CodingTask` objects; the four built-in ones by default.
        **options: Options of :class:`~mappa_env.envs.pipeline.PipelineEnv`
            (``coach`` defaults to the rules coach, ``sandbox`` to ``"jupyter"``).
    """

    env_id = "PlannerCoder-v0"
    roles = (AgentSpec(PLANNER, "planner", 1), AgentSpec(CODER, "coder", 3))
    task_class = CodingTask
    coach_rubrics = COACH_RUBRICS
    rules_rubric = planner_coder_rubric
    tool_agent = CODER

    def __init__(self, tasks: Sequence[CodingTask] | None = None, **options: Any) -> None:
        options.setdefault("coach", "rules")
        options.setdefault("sandbox", "jupyter")
        self.tasks = list(tasks or TASKS)
        if not self.tasks:
            raise ValueError("tasks is empty: pass at least one CodingTask")
        self.task: CodingTask = self.tasks[0]
        super().__init__(**options)

    # Required hooks ----------------------------------------------------------------

    @property
    def system_description(self) -> str:
        """What the system is."""
        return SYSTEM_DESCRIPTION

    def role_description(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        return _ROLES[agent].format(budget=self.max_new_tokens, turns=self.spec_of(CODER).max_turns)

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """The task (and for the coder the plan and its own earlier turns)."""
        args = self.task.example
        task = (
            f"Task: {self.task.prompt}\n"
            f"Example: {self.task.function}{_call(args)} == {self.task.expected(args)}"
        )
        system = {"role": "system", "content": self.role_description(agent)}
        turns = {PLANNER: self._planner_turns, CODER: self._coder_turns}[agent]
        return [system, *turns(task)]

    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        """Run the coder's code, then the example and a hidden check in that interpreter."""
        if agent != CODER:
            return ToolOutcome()
        blocks = extract_code_blocks(action)
        if not blocks:
            return ToolOutcome(extra={"code_ran": False})
        code = "\n".join(blocks)
        result, output = await self.run_code(
            code, "coder", self.code_timeout_s, self.tool_output_chars
        )
        facts: dict[str, Any] = {
            "code_ran": result is not None,
            "example_passed": False,
            "check_passed": False,
        }
        if result is not None and result.error is not None:
            facts["code_error"] = result.error.name
        elif result is not None:
            example = self.task.example
            check = self.task.draw(self.np_random)  # a fresh case each turn
            got = await self._call_function("coder", [example, check])
            if len(got) == 2:
                facts["example_passed"] = got[0] == self.task.expected(example)
                facts["check_passed"] = got[1] == self.task.expected(check)
            output += (
                f"\n[example] {self.task.function}{_call(example)} -> "
                f"{got[0] if got else 'no value'}: "
                f"{'passes' if facts['example_passed'] else 'FAILS'} "
                f"(expected {self.task.expected(example)})"
                f"\n[hidden check] {'passes' if facts['check_passed'] else 'FAILS'}"
            )
        return ToolOutcome(code=code, result=result, output=output, extra=facts)

    async def episode_outcome(self) -> dict[str, Any]:
        """Grade all of the coder's code on this episode's hidden cases, afresh."""
        blocks = [r.tool.code for r in self.records_of(CODER) if r.tool.code]
        cases = [self.task.draw(self.np_random) for _ in range(HIDDEN_CASES)]
        passed = 0
        if blocks:
            # A new interpreter: what the coder's runs left in memory does not count,
            # but its turns may build on each other, so they all run, in order.
            await self.release_sandbox("grader")
            result, _ = await self.run_code("\n".join(blocks), "grader", self.code_timeout_s, 1000)
            if result is not None and result.error is None:
                got = await self._call_function("grader", cases)
                expected = [self.task.expected(args) for args in cases]
                passed = sum(g == e for g, e in zip(got, expected))
        return {
            "correct": passed == HIDDEN_CASES,
            "passed": passed,
            "cases": HIDDEN_CASES,
            "reward": 1.0 if passed == HIDDEN_CASES else 0.0,
            "task_id": self.task.id,
            "task_type": self.task.metadata.get("kind"),
        }

    def task_facts(self) -> tuple[str, str, str | None]:
        """``(task id, task, None)``: there is no single reference answer to reveal."""
        return self.task.id, self.task.prompt, None

    # Optional hooks ----------------------------------------------------------------

    def next_agent(self, agent: str, record: ActionRecord) -> str | None:
        """The coder's slot ends as soon as its code passes the example and the check."""
        extra = record.tool.extra
        if extra.get("example_passed") and extra.get("check_passed"):
            return None  # only the coder's actions carry these facts
        return super().next_agent(agent, record)

    def coach_metadata(self, record: ActionRecord) -> dict[str, Any]:
        """The function's name and what the coder's code did."""
        return {"function": self.task.function, **record.tool.extra}

    @classmethod
    def summarize_outcomes(cls, outcomes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``cases_passed``: the share of hidden cases passed, over all episodes."""
        total = sum(int(o.get("cases", 0)) for o in outcomes)
        passed = sum(int(o.get("passed", 0)) for o in outcomes)
        return {"cases_passed": passed / total if total else 0.0}

    # Helpers -----------------------------------------------------------------------

    def _planner_turns(self, task: str) -> list[dict[str, str]]:
        """The planner's prompt after its system message: the task."""
        return [{"role": "user", "content": f"{task}\n\nWrite the plan."}]

    def _coder_turns(self, task: str) -> list[dict[str, str]]:
        """The coder's prompt after its system message: task, plan, its earlier turns."""
        plan = self.last_record(PLANNER)
        plan_text = strip_think(plan.action).strip() if plan else "(no plan)"
        messages = [
            {
                "role": "user",
                "content": f"{task}\n\nThe planner's plan:\n{plan_text}\n\n"
                f"Write `{self.task.function}` in one ```python block.",
            }
        ]
        for record in self.records_of(CODER):
            messages.append({"role": "assistant", "content": record.action})
            messages.append({"role": "user", "content": record.tool.output or "(no code ran)"})
        return messages

    async def _call_function(self, owner: str, calls: Sequence[tuple[Any, ...]]) -> list[str]:
        """``repr`` of the function's value for each argument tuple ([] when it fails).

        Only arguments go into the interpreter; the values are compared out here. The
        reply is read from the line that starts with a marker agents' code never saw.
        """
        marker = f"RESULT-{secrets.token_hex(8)}"
        lines = [f"_results = []\nfor _args in {list(calls)!r}:"]
        lines.append(
            "    try:\n"
            f"        _results.append(repr({self.task.function}(*_args)))\n"
            "    except Exception as _error:\n"
            "        _results.append('raised ' + type(_error).__name__)"
        )
        lines.append(f"print({marker!r}, repr(_results))")
        result, _ = await self.run_code("\n".join(lines), owner, self.code_timeout_s, 100_000)
        if result is None:
            return []
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(marker + " "):
                try:
                    values = ast.literal_eval(line[len(marker) + 1 :])
                except (ValueError, SyntaxError):
                    return []
                if isinstance(values, list) and all(isinstance(v, str) for v in values):
                    return values
        return []


def _call(args: tuple[Any, ...]) -> str:
    return "(" + ", ".join(repr(a) for a in args) + ")"


# Registering makes it "PlannerCoder-v0" for mappa_env.make and PettingZoo's registry.
if not mappa_env.is_registered(PlannerCoderEnv.env_id):
    mappa_env.register(PlannerCoderEnv.env_id, PlannerCoderEnv)
