"""Environment overhead per step, without coach, sandbox and policy (target: < 1 ms).

Runs MathChat-v0 episodes with fixed text actions (no code blocks), the sandbox off and
no coach (outcome rewards only), through the synchronous PettingZoo API; then the same
with the rules coach, to show what rule-based scoring adds. Prints a table and writes
``benchmarks/results/env_overhead.json``.
"""

from __future__ import annotations

import statistics
import time

import mappa_env
from benchmarks._common import print_table, write_results
from mappa_env.tasks import MathTask

TASKS = [MathTask(id=f"t{i}", prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(50)]
ACTIONS = {
    "problem_solver": "Adding gives the result. \\boxed{10}",
    "code_executor": "No code needed: \\boxed{10}",
    "verifier": "The answer is \\boxed{10}.",
}


def run(coach, episodes: int) -> dict:
    env = mappa_env.make(
        "MathChat-v0",
        tasks=TASKS,
        sandbox=None,
        coach=coach,
        credit_mode="process" if coach else "outcome",
    )
    step_times = []
    for i in range(episodes):
        env.reset(seed=i)
        for agent in env.agent_iter():
            _, _, terminated, truncated, _ = env.last()
            action = None if terminated or truncated else ACTIONS[agent]
            start = time.perf_counter()
            env.step(action)
            if action is not None:
                step_times.append(time.perf_counter() - start)
    env.close()
    step_times.sort()
    return {
        "coach": coach or "none",
        "steps": len(step_times),
        "median_ms": statistics.median(step_times) * 1e3,
        "p90_ms": step_times[int(0.9 * len(step_times))] * 1e3,
        "mean_ms": statistics.fmean(step_times) * 1e3,
    }


def main() -> None:
    run(None, 20)  # warm-up: imports, first grading worker
    rows = [run(None, 300), run("rules", 300)]
    print_table(rows, title="MathChat-v0 step() wall time (policy, sandbox excluded)")
    write_results("env_overhead", {"rows": rows, "target_ms": 1.0})


if __name__ == "__main__":
    main()
