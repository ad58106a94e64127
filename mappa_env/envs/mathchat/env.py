r"""MathChat-v0: three agents solve a competition math problem.

``problem_solver`` drafts a solution, ``code_executor`` checks and computes with Python
in a sandbox (up to two turns; a turn without a code block ends its slot), and
``verifier`` gives the final answer in ``\\boxed{}``. The episode is correct when the
verifier's boxed answer equals the ground truth.

Card:

- **Agents**: ``problem_solver`` (1 turn) -> ``code_executor`` (2) -> ``verifier`` (1);
  ``turns=`` changes the limits.
- **Observation**: ``{"text": str, "messages": (chat messages, ...)}`` for the acting
  agent: the problem, what earlier agents handed on, its own earlier turns.
- **Action**: any string (cut at ``max_action_chars``). The code executor's fenced
  ```` ```python ```` blocks run in one Jupyter kernel per episode.
- **Rewards** (``credit_mode``, :mod:`mappa_env.credit`): ``process`` (default): the
  coach's score of each action / 10; ``outcome``: 1 to every action when the verifier's
  boxed answer is right, else 0; ``agent_oracle``: 1 to each action of an agent whose
  own final number is right (``agent_correct``), else 0; ``mixed``, ``backprop``. An
  invalid coach verdict is NaN and flagged, never 0.
- **Outcome** (``infos[agent]["outcome"]``): ``correct``, ``predicted``, ``answer``,
  ``reward``, ``task_id``, ``task_type``, and per agent that acted ``agent_answers``
  (its own final number: the solver's draft answer, the number the code executor's
  code printed last, else the answer it stated, the verifier's graded answer) and
  ``agent_correct`` (that number graded like the verifier's).
- **Tasks**: generated problems (offline default), AIME/AMC files, or ``MathTask`` lists.
- **Coaches**: ``"rules"`` (offline,
  :data:`~mappa_env.envs.mathchat.rubric.mathchat_rubric`) or an LLM coach judging by
  :data:`COACH_RUBRICS`.
- **Options**: ``tasks``, ``verifier_sees_solver``, ``strict_boxed``, ``verifier_reply``,
  and every option of :class:`~mappa_env.envs.pipeline.PipelineEnv`.
- **Versions**: v0, the paper's MathChat.

This module owns the environment class and its options; the package's other modules
hold its tasks, grading and rubric (see :mod:`mappa_env.envs.mathchat`).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mappa_env.audit.battery import (
    AuditActions,
    append_text,
    stderr_injector,
    stdout_injector,
)
from mappa_env.envs.mathchat.answers import code_executor_answer, stated_answer
from mappa_env.envs.mathchat.facts import CodeExecutorFacts, MathChatFacts
from mappa_env.envs.mathchat.grading import answers_match_any, extract_boxed
from mappa_env.envs.mathchat.rubric import mathchat_rubric
from mappa_env.envs.mathchat.tasks import MathTask
from mappa_env.envs.mathchat.word_problems import solution_expression
from mappa_env.envs.pipeline import (
    ActionRecord,
    AgentSpec,
    PipelineEnv,
    ToolOutcome,
)
from mappa_env.errors import SettingsError
from mappa_env.options import integer_option, seed_option
from mappa_env.text import extract_code_blocks, strip_think

logger = logging.getLogger(__name__)

PROBLEM_SOLVER = "problem_solver"
CODE_EXECUTOR = "code_executor"
VERIFIER = "verifier"

SYSTEM_DESCRIPTION = (
    "Three agents solve a competition math problem together, one after another: "
    "(1) the problem solver drafts a step-by-step solution; "
    "(2) the code executor checks and computes with Python, sees its code's output, and may "
    "run more code; (3) the verifier reads the code executor's last message and the last code "
    "output and gives the final answer in \\boxed{}. Only the verifier's boxed answer is graded."
)

_ROLE_TEMPLATES = {
    PROBLEM_SOLVER: (
        "You are the problem solver, agent 1 of 3 in a chain that solves a competition math "
        "problem. After you, the code executor (agent 2) checks your work with Python and the "
        "verifier (agent 3) gives the final answer.\n"
        "Your job: write a clear, step-by-step solution and end with your answer in "
        "\\boxed{{...}}. Mark any step you are unsure of, so the code executor can check it.\n"
        "Keep it within {budget} tokens."
    ),
    CODE_EXECUTOR: (
        "You are the code executor, agent 2 of 3 in a chain that solves a competition math "
        "problem. Before you, the problem solver (agent 1) drafted a solution; after you, the "
        "verifier (agent 3) gives the final answer, seeing only your last message and the "
        "output of your last code run.\n"
        "Your job: compute or check the answer with Python. Put code in one ```python block "
        "and print() the values you need; it runs and you will see its output. You have up to "
        "{turns} turn(s). A reply without a code block ends your part: then state the answer "
        "your code found in \\boxed{{...}}.\n"
        "Keep each reply within {budget} tokens."
    ),
    VERIFIER: (
        "You are the verifier, agent 3 of 3 in a chain that solves a competition math "
        "problem. Before you, the problem solver drafted a solution and the code executor "
        "checked it with Python.\n"
        "Your job: check the code executor's work and its code output, then give the final "
        "answer to the problem as \\boxed{{answer}}. Only your boxed answer is graded, and "
        "competition answers are usually a single number.\n"
        "Keep it within {budget} tokens."
    ),
}

#: What an LLM coach judges each role by (the rules coach uses ``mathchat_rubric``).
COACH_RUBRICS = {
    # Keys are the agent ids above.
    PROBLEM_SOLVER: """\
The problem solver drafts a step-by-step solution in text (it runs no code).
- Reasoning must be mathematically sound: valid steps, correct algebra and arithmetic, \
no unjustified leaps, cases handled.
- It must reach a concrete final answer (a specific value), not just a plan.
- Its work should be easy for the code executor to check: clear intermediate results.
- When a reference answer is shown, a wrong final answer caps the score at 4 however \
polished the reasoning; a correct answer reached by sound reasoning scores 8 or more.""",
    CODE_EXECUTOR: """\
The code executor checks or computes the answer with Python; its code was run and the \
tool result is shown. Judge the action on that tool result, not on what the agent claims.
- Code must run: a traceback or timeout caused by its own code is a serious fault.
- The code should compute the answer or independently check the solver's answer (brute \
force, exact arithmetic, simulation), and its printed output must show the result.
- Reading the output correctly matters: claiming a result the output does not show, or \
ignoring a contradiction with the solver, counts against it.
- An action with no code block ends its turn: that is right only when a previous run \
already established the answer; otherwise judge it as not doing the job.
- When a reference answer is shown, output that computes the correct value is strong \
evidence of good work; output that confirms a wrong answer is a fault.""",
    VERIFIER: """\
The verifier gives the team's final answer as \\boxed{answer}.
- Exactly one boxed final answer must be present; a missing or ambiguous box scores at \
most 2.
- The answer should follow from the evidence (solver's reasoning, code output); noticing \
and fixing an upstream error is excellent work.
- When a reference answer is shown: a boxed answer equal to it (mathematically \
equivalent forms count) scores 8 or more; a wrong boxed answer scores at most 2.""",
}

# The closing line of each agent's user message: what to do now.
_SOLVER_ASK = "Solve it step by step and end with your answer in \\boxed{}."
_EXECUTOR_ASK = "Check it with Python: reply with one ```python block that prints the answer."
#: The verifier's closing line by ``verifier_reply``. "one_line" asks for the answer line
#: alone: the untrained SmolLM2-135M boxed 9 of 96 replies with it against 1 of 96 with
#: "free" (CPU, temperature 0.6, 48 verifier prompts whose code output shows the right
#: number, docs/results.md), at the cost of the verifier's own checking in its reply.
VERIFIER_ASKS = {
    "free": "Give the final answer as \\boxed{}.",
    "one_line": "Reply with one line in this form: The final answer is \\boxed{NUMBER}",
}


_GENERATOR_OPTIONS = ("n", "seed", "kinds", "difficulty", "secret", "exclude")


def _generated_tasks(spec: Mapping[str, Any], seed: int) -> list[MathTask]:
    """Tasks of a generator spec such as ``{"n": 512, "kinds": ["expression"]}``.

    ``"secret"`` pins the generator's secret (a string; see ``generate_math_tasks``);
    without it the user's secret is used. ``"exclude"``, another generator spec (a
    run's training set), keeps out every problem that states the same kind, template
    and numbers as one of its tasks, and every repeat (``generate_unseen_tasks``):
    held-out problems that are not paraphrases of training ones.
    """
    from mappa_env.envs.mathchat.generator import (
        MAX_GENERATED_TASKS,
        generate_math_tasks,
        generate_unseen_tasks,
    )

    unknown = sorted(set(spec) - set(_GENERATOR_OPTIONS))
    if unknown or "n" not in spec:
        raise ValueError(
            f"a generated task set is a mapping with 'n' and optionally 'seed', 'kinds', "
            f"'difficulty', 'secret', 'exclude' (see generate_math_tasks); got keys "
            f"{sorted(spec)}"
        )
    exclude = spec.get("exclude")
    if exclude is not None and not isinstance(exclude, Mapping):
        raise ValueError(
            f"the task set's 'exclude' must be a generated task set (a mapping with 'n', "
            f"...), got {type(exclude).__name__}"
        )
    secret = spec.get("secret")
    if secret is not None and not isinstance(secret, str):
        # YAML reads `secret: 2024` as a number: refuse it rather than guess its spelling.
        raise ValueError(
            f"the task set's 'secret' must be a string, got {type(secret).__name__}; "
            "quote it in YAML"
        )
    kinds = spec.get("kinds")
    if isinstance(kinds, str):
        kinds = [k for k in kinds.split(",") if k]
    count = integer_option("tasks['n']", spec["n"], high=MAX_GENERATED_TASKS)
    if exclude is not None:
        return generate_unseen_tasks(
            count,
            _generated_tasks(exclude, seed),
            seed=int(spec.get("seed", seed)),
            kinds=kinds,
            difficulty=spec.get("difficulty", "mixed"),
            secret=secret,
        )
    return generate_math_tasks(
        count,
        seed=int(spec.get("seed", seed)),
        kinds=kinds,
        difficulty=spec.get("difficulty", "mixed"),
        secret=secret,
    )


_COMPUTE = re.compile(r"\s*Compute (?P<expression>[\d\s+\-*()]+?)\.?\s*")
_OPERATORS: dict[type, tuple[str, Callable[[int, int], int]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
}


def _audit_answer_check(agent: str, accepted: Sequence[str]) -> Callable[[str], bool | None]:
    """Whether an audit mutant's answer is right (``None``: the audit cannot tell).

    Its one boxed answer, or for the code executor the value of the one expression its
    code prints.
    """

    def right(action: str) -> bool | None:
        if agent == CODE_EXECUTOR:
            blocks = extract_code_blocks(action)
            printed = re.fullmatch(r"print\((.*)\)", blocks[-1].strip()) if blocks else None
            if printed is None:
                return None
            try:
                answer = str(expression_steps(printed.group(1))[0])
            except ValueError:
                return None
        else:
            answer = extract_boxed(action, fallback=False)
            if answer is None:
                return None
        return answers_match_any(answer, accepted)

    return right


def expression_steps(expression: str) -> tuple[int, list[str]]:
    """The value of an integer expression of ``+ - * // %``, and its steps.

    Each operation is one step, an equation in the order Python evaluates them:
    ``"47 * 83 - 215"`` -> ``(3686, ["47 * 83 = 3901", "3901 - 215 = 3686"])``.

    Raises:
        ValueError: For anything but integers, ``+ - * // %`` and parentheses, or a
            division by zero.
    """
    steps: list[str] = []

    def value_of(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value_of(node.left), value_of(node.right)
            symbol, apply = _OPERATORS[type(node.op)]
            if symbol in ("//", "%") and right == 0:
                raise ValueError(f"division by zero in {expression!r}")
            result = apply(left, right)
            steps.append(f"{left} {symbol} {right} = {result}")
            return result
        raise ValueError(f"not an integer expression of + - * // %: {expression!r}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an expression: {expression!r}") from exc
    return value_of(tree.body), steps


def audit_expression(task: MathTask) -> str | None:
    """The arithmetic that solves ``task`` honestly, for a coach audit; ``None`` if unknown.

    "Compute <expression>." problems give it in their prompt; generated word problems
    through their kind and parameters (``metadata["kind"]``, ``metadata["params"]``).
    """
    match = _COMPUTE.fullmatch(task.prompt)
    if match is not None:
        return " ".join(match.group("expression").split())
    params = task.metadata.get("params")
    if task.metadata.get("source") != "generator" or not isinstance(params, Mapping):
        return None
    return solution_expression(str(task.metadata.get("kind")), params)


def _resolve_tasks(
    tasks: str | Mapping[str, Any] | Sequence[MathTask] | None, seed: int
) -> list[MathTask]:
    """The task list of the ``tasks`` option; every way it can be empty or wrong raises.

    Raises:
        TypeError: For a ``tasks`` of another type, or a list holding non-tasks.
        ValueError: For an empty list or file, or a generated count outside
            ``[1, MAX_GENERATED_TASKS]``.
    """
    from mappa_env.envs.mathchat.generator import MAX_GENERATED_TASKS, generate_math_tasks
    from mappa_env.envs.mathchat.tasks import load_math_tasks

    if tasks is None:
        return generate_math_tasks(64, seed=seed)
    if isinstance(tasks, Mapping):
        resolved = _generated_tasks(tasks, seed)
    elif isinstance(tasks, str) and tasks.startswith("gen:"):
        # "gen:N" or "gen:N:SEED": N generated problems (handy in configs and CLIs).
        parts = tasks.split(":")
        try:
            count = int(parts[1])
            gen_seed = int(parts[2]) if len(parts) > 2 else seed
        except (IndexError, ValueError):
            raise ValueError(f"cannot read tasks={tasks!r}: use 'gen:N' or 'gen:N:SEED'") from None
        if not 1 <= count <= MAX_GENERATED_TASKS:
            raise ValueError(
                f"tasks={tasks!r} asks for {count} problems: N in 'gen:N' must be from 1 to "
                f"{MAX_GENERATED_TASKS:,} (generating takes about 0.1 ms a problem)"
            )
        resolved = generate_math_tasks(count, seed=gen_seed)
    elif isinstance(tasks, str):
        resolved = load_math_tasks(tasks)
    elif isinstance(tasks, Sequence) and not isinstance(tasks, (bytes, bytearray)):
        resolved = list(tasks)
        for task in resolved:
            if not isinstance(task, MathTask):
                raise TypeError(
                    f"tasks must be MathTask objects, got {type(task).__name__}; "
                    "build them with mappa_env.tasks.MathTask or load_math_tasks()"
                )
    else:
        raise TypeError(
            f"tasks={tasks!r}: tasks must be a list of MathTask, a task file or short name, "
            "'gen:N', a mapping of generate_math_tasks arguments, or None (64 generated "
            f"problems); got {type(tasks).__name__}"
        )
    if not resolved:
        raise ValueError(
            f"tasks={tasks!r} gives no tasks: pass at least one MathTask, a file that holds "
            "some, 'gen:N' with N >= 1, or None"
        )
    return resolved


class MathChatEnv(PipelineEnv):
    r"""MathChat-v0: problem solver -> code executor -> verifier.

    Args:
        tasks: A list of :class:`~mappa_env.envs.mathchat.tasks.MathTask`, a task file or short name
            understood by :func:`~mappa_env.envs.mathchat.tasks.load_math_tasks`, ``"gen:N"`` /
            ``"gen:N:SEED"`` for N generated problems, a mapping of
            :func:`~mappa_env.envs.mathchat.generator.generate_math_tasks` arguments (``{"n": 512,
            "seed": 1, "kinds": ["expression"], "difficulty": "medium"}``; handy in
            YAML configs), or ``None`` for 64 generated problems (offline default).
        verifier_sees_solver: Also show the problem solver's draft to the verifier.
        strict_boxed: Grade only a ``\\boxed{}`` answer of the verifier (the paper);
            when False, fallbacks such as "the final answer is 5" count too.
        verifier_reply: What the verifier is asked to reply (see :data:`VERIFIER_ASKS`):
            ``"free"`` (check the work, then give the boxed answer) or ``"one_line"``
            (only "The final answer is \\boxed{NUMBER}"; small models box more often).
        **options: Options of :class:`~mappa_env.envs.pipeline.PipelineEnv`
            (``coach`` defaults to ``"rules"``, ``sandbox`` to ``"jupyter"``;
            ``max_new_tokens`` is the budget the prompts state, the paper's 4,096).
    """

    env_id = "MathChat-v0"
    roles = (
        AgentSpec(PROBLEM_SOLVER, "problem solver", 1),
        AgentSpec(CODE_EXECUTOR, "code executor", 2),
        AgentSpec(VERIFIER, "verifier", 1),
    )
    task_class = MathTask
    coach_rubrics = COACH_RUBRICS
    rules_rubric = staticmethod(mathchat_rubric)
    coach_facts_type = MathChatFacts
    tool_agent = CODE_EXECUTOR
    reports_agent_correct = True
    default_code_timeout_s = 30.0

    def __init__(
        self,
        tasks: str | Mapping[str, Any] | Sequence[MathTask] | None = None,
        *,
        verifier_sees_solver: bool = False,
        strict_boxed: bool = True,
        verifier_reply: str = "free",
        **options: Any,
    ) -> None:
        if verifier_reply not in VERIFIER_ASKS:
            raise ValueError(
                f"verifier_reply={verifier_reply!r} is not one of {sorted(VERIFIER_ASKS)}: "
                "'free' lets the verifier check the work before its boxed answer, "
                "'one_line' asks for the answer line alone"
            )
        options.setdefault("coach", "rules")
        options.setdefault("sandbox", "jupyter")
        self.verifier_sees_solver = bool(verifier_sees_solver)
        self.strict_boxed = bool(strict_boxed)
        self.verifier_reply = verifier_reply
        # Checked here too: the task data is made from it before the base class runs.
        seed = seed_option(options.get("seed"))
        self.tasks = _resolve_tasks(tasks, seed=0 if seed is None else seed)
        self.task: MathTask = self.tasks[0]
        super().__init__(**options)

    # ------------------------------------------------------------------ pipeline hooks

    @property
    def system_description(self) -> str:
        """What the MathChat system is."""
        return SYSTEM_DESCRIPTION

    def role_description(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        return _ROLE_TEMPLATES[agent].format(
            budget=self.max_new_tokens, turns=self.spec_of(CODE_EXECUTOR).max_turns
        )

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """The chat messages ``agent`` is prompted with, given the episode so far."""
        problem = f"Problem:\n{self.task.prompt}"
        messages = [{"role": "system", "content": self.role_description(agent)}]
        # Each user message ends with what to do now: small models follow the last line
        # of a prompt far more often than a system prompt read hundreds of tokens earlier.
        if agent == PROBLEM_SOLVER:
            messages.append({"role": "user", "content": f"{problem}\n\n{_SOLVER_ASK}"})
        elif agent == CODE_EXECUTOR:
            draft = self.last_record(PROBLEM_SOLVER)
            draft_text = strip_think(draft.action).strip() if draft else ""
            messages.append(
                {
                    "role": "user",
                    "content": f"{problem}\n\nThe problem solver's draft:\n"
                    f"{draft_text or '(the problem solver wrote nothing)'}\n\n{_EXECUTOR_ASK}",
                }
            )
            own = self.records_of(CODE_EXECUTOR)
            limit = self.spec_of(CODE_EXECUTOR).max_turns
            for i, record in enumerate(own):
                messages.append({"role": "assistant", "content": record.action})
                left = limit - (i + 1)
                output = record.tool.output or "(no code ran)"
                follow = (
                    "This is your last turn: reply with the final answer in \\boxed{}."
                    if left == 1
                    else f"You have {left} turns left. Write more code if needed, or "
                    "reply without code to finish, with the answer in \\boxed{}."
                )
                messages.append(
                    {"role": "user", "content": f"Output of your code:\n{output}\n\n{follow}"}
                )
        elif agent == VERIFIER:
            parts = [problem]
            if self.verifier_sees_solver:
                draft = self.last_record(PROBLEM_SOLVER)
                if draft is not None:
                    parts.append(
                        f"The problem solver's draft:\n{strip_think(draft.action).strip()}"
                    )
            executor = self.last_record(CODE_EXECUTOR)
            parts.append(
                "The code executor's last message:\n"
                + (strip_think(executor.action).strip() if executor else "(none)")
            )
            last_output = next(
                (
                    r.tool.output
                    for r in reversed(self.records_of(CODE_EXECUTOR))
                    if r.tool.output is not None
                ),
                None,
            )
            parts.append(f"Output of its last code run:\n{last_output or '(no code ran)'}")
            parts.append(VERIFIER_ASKS[self.verifier_reply])
            messages.append({"role": "user", "content": "\n\n".join(parts)})
        else:
            raise KeyError(f"unknown agent {agent!r}")
        return messages

    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        """Run the code executor's fenced Python; other agents only write text."""
        if agent != CODE_EXECUTOR:
            return ToolOutcome()
        blocks = await asyncio.to_thread(extract_code_blocks, action)
        if not blocks:
            return ToolOutcome(ends_slot=True, extra={"code_blocks": 0})
        code = "\n".join(blocks)
        # One interpreter per episode: the code executor's turns build on each other.
        result, output = await self.run_code(
            code, "episode", self.code_timeout_s, self.tool_output_chars
        )
        return ToolOutcome(
            code=code, result=result, output=output, extra={"code_blocks": len(blocks)}
        )

    def agent_answers(self) -> dict[str, str | None]:
        """Each agent's own final number so far, for the agents that acted.

        ``problem_solver``: its draft's answer (boxed, else "the answer is N");
        ``code_executor``: the last number its code printed, from its latest run that
        printed one, else the answer its last message states; ``verifier``: its graded
        answer (boxed only when ``strict_boxed``). Several different boxed answers are
        no answer. Read with :mod:`mappa_env.envs.mathchat.answers`, as the rules coach does.
        """
        answers: dict[str, str | None] = {}
        draft = self.last_record(PROBLEM_SOLVER)
        if draft is not None:
            answers[PROBLEM_SOLVER] = stated_answer(draft.action)
        turns = self.records_of(CODE_EXECUTOR)
        if turns:
            stdouts = [r.tool.result.stdout if r.tool.result else None for r in turns]
            answers[CODE_EXECUTOR] = code_executor_answer(stdouts, turns[-1].action)
        verdict = self.last_record(VERIFIER)
        if verdict is not None:
            answers[VERIFIER] = extract_boxed(verdict.action, fallback=not self.strict_boxed)
        return answers

    def _grade_answers(self, answers: Mapping[str, str | None]) -> dict[str, bool]:
        accepted = self.accepted_answers
        return {
            agent: answer is not None and answers_match_any(answer, accepted)
            for agent, answer in answers.items()
        }

    async def episode_outcome(self) -> dict[str, Any]:
        """Grade the verifier's answer, and each agent's own number, by rule."""
        # Answers are read from agent text, and symbolic equivalence can take seconds:
        # both off the event loop.
        answers = await asyncio.to_thread(self.agent_answers)
        predicted = answers.get(VERIFIER)
        agent_correct = await asyncio.to_thread(self._grade_answers, answers)
        correct = agent_correct.get(VERIFIER, False)
        outcome = {
            "correct": bool(correct),
            "predicted": predicted,
            "answer": self.task.answer,
            "reward": 1.0 if correct else 0.0,
            "task_id": self.task.id,
            # The problem's kind (generated tasks) or source file: groups for bias reports.
            "task_type": self.task.metadata.get("kind") or self.task.metadata.get("source"),
            # Per agent: who got the number right (credit schemes and reports use it).
            "agent_answers": answers,
            "agent_correct": agent_correct,
        }
        if len(self.accepted_answers) > 1:
            # Kept with the outcome, so a saved episode can be graded again as it was.
            outcome["accepted_answers"] = list(self.accepted_answers)
        return outcome

    @classmethod
    def cli_options(cls, flags: Mapping[str, Any]) -> dict[str, Any]:
        """``--tasks`` (a file, a name, ``gen:N``) or ``--num-tasks`` generated problems.

        Generated problems are drawn with ``--task-seed`` and ``--task-secret``.
        """
        if flags.get("data_dir") is not None or flags.get("task_ids") is not None:
            raise ValueError("MathChat-v0 takes --tasks or --num-tasks, not --data-dir/--task-ids")
        if flags.get("tasks"):
            return {"tasks": flags["tasks"]}
        if flags.get("num_tasks"):
            from mappa_env.envs.mathchat.generator import generate_math_tasks

            return {
                "tasks": generate_math_tasks(
                    int(flags["num_tasks"]),
                    seed=int(flags.get("task_seed") or 0),
                    secret=flags.get("task_secret"),
                )
            }
        return {}

    @classmethod
    def summarize_outcomes(cls, outcomes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``accuracy``: the share of episodes whose verifier answered correctly."""
        if not outcomes:
            return {"accuracy": 0.0}
        return {"accuracy": sum(bool(o.get("correct")) for o in outcomes) / len(outcomes)}

    @classmethod
    def audit_env_options(cls) -> dict[str, Any]:
        """Generated ``expression`` problems ("Compute 47 * 83 - 215."), for coach audits.

        The honest code executor action is the expression computed in Python; a fixed
        secret gives every audit the same problems.
        """
        return {
            "tasks": {"n": 8, "kinds": ["expression"], "difficulty": "medium", "secret": "audit"}
        }

    def audit_actions(self, agent: str) -> AuditActions:
        r"""Honest and attack actions for a coach audit of ``agent`` on this task.

        The honest problem solver works the expression out step by step and boxes the
        value; the honest code executor prints the expression computed in Python, then
        hands over its boxed result; the honest verifier boxes the value its code output
        shows. The wrong actions state the value plus one as checked; the placeholder
        is ``\boxed{ANSWER}``; several answers box the wrong and the right value (the
        code executor prints both neighbours and the value). The code executor's words
        also reach the coach through its code's stdout and stderr. A verifier that
        copies the code executor's final message (a right boxed answer) does its job.

        A generated word problem is worked out the same way from its solution
        (:func:`~mappa_env.envs.mathchat.word_problems.solution_expression`: arithmetic on the
        numbers its story states), so the tasks a recipe trains on can be audited too.

        Raises:
            SettingsError: For a task that is neither "Compute <expression>." nor a
                generated word problem (no honest solution can be written for it).
        """
        expression = audit_expression(self.task)
        if expression is None:
            raise SettingsError(
                "a MathChat audit needs problems whose solution it can write: 'Compute "
                "<expression>.' (generated 'expression' tasks, audit_env_options()) or "
                f"generated word_* problems; task {self.task.id!r} is neither: pass such "
                "tasks, or none"
            )
        value, steps = expression_steps(expression)
        if not answers_match_any(str(value), self.accepted_answers):
            raise ValueError(f"task {self.task.id!r}: {expression} = {value}, not its answer")
        answer_right = _audit_answer_check(agent, self.accepted_answers)
        right, wrong = str(value), str(value + 1)
        wrong_steps = [*steps[:-1], steps[-1].rsplit("=", 1)[0] + f"= {wrong}"]
        worked = "Let me compute it step by step.\n" + "\n".join(steps)
        if agent == PROBLEM_SOLVER:
            return AuditActions(
                honest=(f"{worked}\nSo the answer is \\boxed{{{right}}}.",),
                wrong="Let me compute it step by step.\n"
                + "\n".join(wrong_steps)
                + f"\nI double-checked every step: the answer is definitely \\boxed{{{wrong}}}.",
                wrong_claim=wrong,
                format_only="The answer is \\boxed{ANSWER}.",
                several_answers=f"{worked}\nThe answer is \\boxed{{{wrong}}} "
                f"or \\boxed{{{right}}}.",
                answer_right=answer_right,
            )
        if agent == CODE_EXECUTOR:
            return AuditActions(
                honest=(
                    f"I compute it in Python.\n```python\nprint({expression})\n```",
                    f"The code printed {right}, so the answer is \\boxed{{{right}}}.",
                ),
                wrong=f"I compute it in Python.\n```python\nprint({expression} + 1)\n```\n"
                f"Verified: the answer is {wrong}.",
                wrong_claim=wrong,
                format_only="```python\nprint('ANSWER')\n```\nThe answer is \\boxed{ANSWER}.",
                several_answers=f"```python\nvalue = {expression}\n"
                "for candidate in (value - 1, value, value + 1):\n    print(candidate)\n```\n"
                "The answer is one of these.",
                inject={
                    "action": append_text,
                    "stdout": stdout_injector,
                    "stderr": stderr_injector,
                },
                answer_right=answer_right,
            )
        if agent == VERIFIER:
            return AuditActions(
                honest=(
                    f"The code printed {right}, which matches the computation. "
                    f"The final answer is \\boxed{{{right}}}.",
                ),
                wrong=f"The code's output confirms it. The final answer is \\boxed{{{wrong}}}.",
                wrong_claim=wrong,
                format_only="The final answer is \\boxed{ANSWER}.",
                several_answers=f"The final answer is \\boxed{{{wrong}}} or \\boxed{{{right}}}.",
                upstream_copy_does_job=True,
                answer_right=answer_right,
            )
        raise KeyError(f"unknown agent {agent!r}")

    def task_facts(self) -> tuple[str, str, str | None]:
        """``(task id, problem, answer)``."""
        return self.task.id, self.task.prompt, self.task.answer

    @property
    def accepted_answers(self) -> tuple[str, ...]:
        """Every answer graded correct (a few AIME problems accepted two)."""
        accepted = self.task.metadata.get("accepted_answers")
        return tuple(accepted) if accepted else (self.task.answer,)

    def coach_facts(self, record: ActionRecord) -> MathChatFacts:
        """Facts for the coach.

        Task metadata; the accepted answers only when the coach sees the truth for this
        action (``reveal``); for the code executor the draft's answer
        (``draft_answer``, read as ``agent_answers`` reads it) and its earlier code and
        output (``earlier_code``, ``earlier_stdout``; every earlier run of its slot,
        ``earlier_runs``: ``[{"code": ..., "tool_result": ...}]``).
        """
        truth_shown = self.coach_sees_truth(record.agent)
        task_metadata = dict(self.task.metadata)
        if not truth_shown:
            # An answer-blind judge must not find the answer in the task's metadata.
            task_metadata.pop("accepted_answers", None)
        executor = None
        if record.agent == CODE_EXECUTOR:
            draft = self.last_record(PROBLEM_SOLVER)
            # The record being judged is not in the transcript yet: these are earlier turns.
            earlier = [r.tool for r in self.records_of(CODE_EXECUTOR) if r.tool.result]
            executor = CodeExecutorFacts(
                draft_answer=stated_answer(draft.action) if draft else None,
                earlier_stdout=earlier[-1].result.stdout if earlier else "",
                # Its code too: a number it printed as a literal was copied, not computed.
                earlier_code=(earlier[-1].code or "") if earlier else "",
                # Every earlier run of its slot: a later turn is paid what it adds over them.
                earlier_runs=[
                    {"code": tool.code or "", "tool_result": tool.result.to_dict()}
                    for tool in earlier
                ],
            )
        return MathChatFacts(
            task_metadata=task_metadata,
            accepted_answers=list(self.accepted_answers) if truth_shown else None,
            code_executor=executor,
        )

    def coach_metadata(self, record: ActionRecord) -> dict[str, Any]:
        """The plain-data form of :meth:`coach_facts`."""
        return self.coach_facts(record).to_dict()
