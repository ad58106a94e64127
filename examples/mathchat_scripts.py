r"""Rule-based MathChat agents: each a function from the chat messages to a reply.

No model: they stand in for agents a run keeps fixed, beside a model being trained or
evaluated. A policy spec names one as ``script:mathchat_scripts:<agent>`` (run from this
folder, or with it on ``PYTHONPATH``), e.g.::

    mappa serve --env MathChat-v0 --ego verifier --tasks product_tasks.json \
        --others "problem_solver=script:mathchat_scripts:problem_solver,\
code_executor=script:mathchat_scripts:code_executor"

The problem solver hedges; the code executor multiplies the first two numbers of the
problem with Python in the episode's Jupyter kernel, then boxes what its code printed;
the verifier repeats the last boxed answer it was shown. They solve "What is A times
B?" problems, which is what the examples and tests give them.
"""

from __future__ import annotations

import re


def problem_solver(messages: list[dict[str, str]]) -> str:
    """Hand the work on without an answer."""
    return "Let me estimate... I am not sure, so the code executor should compute it."


def code_executor(messages: list[dict[str, str]]) -> str:
    """First turn: code multiplying the problem's first two numbers; then box its output."""
    if len(messages) == 2:  # system prompt + the problem: write the code
        problem = messages[1]["content"].split("draft")[0]
        numbers = [int(n) for n in re.findall(r"\d+", problem)][:2]
        return f"```python\nprint({numbers[0]} * {numbers[1]})\n```"
    printed = re.findall(r"-?\d+", messages[-1]["content"])
    return f"The code printed \\boxed{{{printed[0] if printed else '?'}}}"


def verifier(messages: list[dict[str, str]]) -> str:
    """Repeat the last boxed answer in the prompt (the prompt's own empty ``\\boxed{}`` aside)."""
    boxed = [b for b in re.findall(r"\\boxed\{([^}]*)\}", messages[-1]["content"]) if b]
    return f"Final answer: \\boxed{{{boxed[-1] if boxed else '?'}}}"
