"""A full DSBench-v0 episode with scripted agents running a real scikit-learn pipeline.

Each agent runs its reference action (:mod:`mappa_env.dsbench.reference`) in its own
Jupyter kernel in the shared workspace, then hands over; the submission is scored with
the task's metric. Target: under 10 s per episode on 2 cores. Prints a table and writes
``benchmarks/results/dsbench_episode.json``.

Run:  python -m benchmarks.bench_dsbench [--tasks iris diabetes ...]
"""

from __future__ import annotations

import argparse
import time

import mappa_env
from benchmarks._common import print_table, write_results
from mappa_env.dsbench.reference import reference_script


def play(env, task_id: str) -> dict:
    task = next(t for t in env.tasks if t.id == task_id)
    script = reference_script(task)
    start = time.perf_counter()
    env.reset(options={"task_id": task_id})
    for agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else script[agent].pop(0))
    wall = time.perf_counter() - start
    outcome = env.state()["outcome"]
    return {
        "task": task_id,
        "metric": outcome["metric"],
        "value": outcome["value"],
        "success": outcome["success"],
        "mean_reward": sum(r.reward for r in env.transcript) / len(env.transcript),
        "episode_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks", nargs="+", default=["iris", "breast_cancer", "diabetes", "synthetic_houses"]
    )
    args = parser.parse_args()
    env = mappa_env.make("DSBench-v0", task_ids=args.tasks, sandbox="jupyter")
    rows = [play(env, task_id) for task_id in args.tasks]
    env.close()
    print_table(rows, title="DSBench-v0 episode with reference agents (Jupyter kernels)")
    write_results("dsbench_episode", {"rows": rows, "target_s": 10.0})


if __name__ == "__main__":
    main()
