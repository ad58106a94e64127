"""A plain PettingZoo loop over MathChat-v0 with a scripted "policy" (no model needed).

Run:  python examples/scripted_loop.py

The problem solver hedges, the code executor computes the product with Python in the
episode's Jupyter kernel and boxes what it printed, and the verifier repeats the code
executor's boxed answer. Swap
``scripted_reply`` for your own model: the observation carries the exact chat messages
to prompt it with.
"""

from __future__ import annotations

import re

import mappa_env
from mappa_env.tasks import MathTask

TASKS = [
    MathTask(
        id="product", prompt="What is 123456789 times 987654321?", answer="121932631112635269"
    ),
]


def scripted_reply(agent: str, observation: dict) -> str:
    messages = observation["messages"]
    if agent == "problem_solver":
        return "Let me estimate... I am not sure, so the code executor should compute it."
    if agent == "code_executor":
        if len(messages) == 2:  # first turn: write code for the problem
            problem = messages[1]["content"].split("draft")[0]
            numbers = [int(n) for n in re.findall(r"\d+", problem)][:2]
            return f"```python\nprint({numbers[0]} * {numbers[1]})\n```"
        printed = re.findall(r"-?\d+", messages[-1]["content"])
        return f"The code printed \\boxed{{{printed[0] if printed else '?'}}}"
    last_output = messages[-1]["content"]
    boxed = re.search(r"\\boxed\{([^}]*)\}", last_output)
    return f"Final answer: \\boxed{{{boxed.group(1) if boxed else '?'}}}"


def main() -> None:
    env = mappa_env.make("MathChat-v0", tasks=TASKS, seed=0, render_mode="ansi")
    env.reset(seed=0)
    for agent in env.agent_iter():
        observation, reward, terminated, truncated, _info = env.last()
        if terminated or truncated:
            print(f"{agent:15s} done; return since its last action: {reward:.2f}")
            env.step(None)
            continue
        action = scripted_reply(agent, observation)
        env.step(action)
        coach = env.infos[agent]["coach"]
        print(f"{agent:15s} reward {env.rewards[agent]:.2f}  coach: {coach['analysis']}")
    print(env.render())
    print("outcome:", env.state()["outcome"])
    env.close()


if __name__ == "__main__":
    main()
