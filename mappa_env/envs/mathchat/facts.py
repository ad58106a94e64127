"""What MathChat-v0 tells the coach about an action: :class:`MathChatFacts`.

The environment makes them for each action it judges
(:meth:`~mappa_env.envs.mathchat.MathChatEnv.coach_facts`); the rules coach reads their
plain-data form (``request.metadata``, :func:`~mappa_env.envs.mathchat.rubric.mathchat_rubric`),
an LLM coach their sections: the problem's kind and source, the answers graded correct
(only where the coach sees the truth), and for the code executor the answer the problem
solver stated and the executor's earlier runs. What agents wrote is quoted inside
agent-text fences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mappa_env.coach.facts import PromptSections
from mappa_env.coach.templates import agent_text
from mappa_env.envs.mathchat.rubric import earlier_runs
from mappa_env.text import truncate_middle

#: The task metadata an LLM coach is shown: what kind of problem it is, never its answer
#: (a task file's other fields may hold it: ``raw_answer``, a worked solution, the
#: numbers of a generated problem).
SHOWN_TASK_KEYS: tuple[str, ...] = ("source", "kind", "category", "difficulty", "level", "type")

#: Largest number of characters kept of an earlier run's code, and of its output.
RUN_CHARS = 1_500


@dataclass(frozen=True)
class CodeExecutorFacts:
    """What the code executor's coach is told of the turns before its action.

    Attributes:
        draft_answer: The answer the problem solver stated (read as ``agent_answers``
            reads it); ``None`` when it stated none.
        earlier_stdout: What the executor's previous run printed (``""``: none).
        earlier_code: The code of its previous run (``""``: none); a number it printed
            as a literal was copied, not computed.
        earlier_runs: Every earlier run of its slot,
            ``[{"code": ..., "tool_result": ...}]``: a later turn is paid what it adds
            over them.
    """

    draft_answer: str | None = None
    earlier_stdout: str = ""
    earlier_code: str = ""
    earlier_runs: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class MathChatFacts:
    """MathChat's facts about one action, in the order its plain-data form lists them.

    Attributes:
        task_metadata: The task's metadata, without its accepted answers when the coach
            judges without the truth.
        accepted_answers: Every answer graded correct, only when the coach sees the
            truth for this action (``reveal``); ``None`` otherwise. A prompt shows them
            where there are several.
        code_executor: For the code executor's actions, what came before them;
            ``None`` for the other agents.
    """

    task_metadata: Mapping[str, Any] = field(default_factory=dict)
    accepted_answers: Sequence[str] | None = None
    code_executor: CodeExecutorFacts | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MathChatFacts:
        """Facts read back from their plain-data form (a request built by hand).

        Args:
            data: A mapping with keys of :meth:`to_dict`; other keys are not facts of
                MathChat and are left out.

        Returns:
            The facts ``data`` holds; the others at their defaults.
        """
        executor_keys = ("draft_answer", "earlier_stdout", "earlier_code", "earlier_runs")
        executor = None
        if any(key in data for key in executor_keys):
            executor = CodeExecutorFacts(**{k: data[k] for k in executor_keys if k in data})
        task_metadata = data.get("task_metadata")
        return cls(
            task_metadata=task_metadata if isinstance(task_metadata, Mapping) else {},
            accepted_answers=data.get("accepted_answers"),
            code_executor=executor,
        )

    @property
    def score_cap(self) -> float | None:
        """``None``: MathChat caps no action."""
        return None

    def prompt_sections(self) -> PromptSections:
        """Task facts; the answers graded correct; the solver's answer and earlier runs."""
        facts = []
        shown = [
            f"- {key}: {truncate_middle(str(self.task_metadata[key]), 100)}"
            for key in SHOWN_TASK_KEYS
            if isinstance(self.task_metadata.get(key), (str, int, float))
        ]
        if shown:
            facts.append(("Task facts", "\n".join(shown)))
        evidence = []
        if self.accepted_answers and len(self.accepted_answers) > 1:
            # One accepted answer is the reference answer the prompt already shows.
            evidence.append(
                (
                    "Answers graded correct (any one of them)",
                    "\n".join(f"- {answer}" for answer in self.accepted_answers),
                )
            )
        if self.code_executor is not None:
            draft = self.code_executor.draft_answer
            evidence.append(
                (
                    "The answer the problem solver stated",
                    agent_text(truncate_middle(str(draft), 300))
                    if draft
                    else "(the problem solver stated no answer)",
                )
            )
            runs = earlier_runs(self.to_dict())
            if runs:
                evidence.append(
                    (
                        "Earlier runs of this agent's code (a later turn earns what it adds "
                        "over them; the same code run again adds nothing)",
                        "\n".join(
                            _run_text(number, code, tool)
                            for number, (code, tool) in enumerate(runs, 1)
                        ),
                    )
                )
        return PromptSections(facts=tuple(facts), evidence=tuple(evidence))

    def to_dict(self) -> dict[str, Any]:
        """The plain-data form, with keys as the rules rubric reads them.

        ``task_metadata``, ``accepted_answers`` when shown, and for the code executor
        ``draft_answer``, ``earlier_stdout``, ``earlier_code`` and ``earlier_runs``.
        """
        data: dict[str, Any] = {"task_metadata": self.task_metadata}
        if self.accepted_answers is not None:
            data["accepted_answers"] = self.accepted_answers
        executor = self.code_executor
        if executor is not None:
            data["draft_answer"] = executor.draft_answer
            data["earlier_stdout"] = executor.earlier_stdout
            data["earlier_code"] = executor.earlier_code
            data["earlier_runs"] = executor.earlier_runs
        return data


def _run_text(number: int, code: str, tool: Mapping[str, Any]) -> str:
    """One earlier run: its code and what it printed, each in a fence."""
    output = [str(tool.get("stdout") or "")]
    error = tool.get("error")
    if tool.get("timed_out"):
        output.append("[timed out]")
    elif isinstance(error, Mapping):
        output.append(f"[error] {error.get('name')}: {error.get('value')}")
    printed = "\n".join(part for part in output if part).strip() or "(nothing printed)"
    return (
        f"Run {number}, its code:\n{agent_text(truncate_middle(code.rstrip(), RUN_CHARS))}\n"
        f"What it printed:\n{agent_text(truncate_middle(printed, RUN_CHARS))}"
    )
