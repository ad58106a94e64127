"""The three rollout schedules side by side over a continuously batching stand-in engine.

MathChat-v0 episodes (three agents, no sandbox, the rules coach behind a few ms of
latency per verdict: the environment work of a step) run through one
:class:`~mappa_agents.runner.RolloutRunner` per schedule, all three agents acting through
one :class:`~mappa_agents.standin.StandInEngine`: a decode tick of ``--token-latency-ms``
serves one token to every active request, and replies have lengths of their own
(heavy-tailed, 8 to ``--max-new-tokens`` tokens, a pure function of the prompt, so every
schedule decodes the same replies). The ``ticks`` and ``continuous`` schedules hand the
engine whole batches, which end with their longest reply and take turns (as
``vllm.LLM.generate`` calls do); ``episodes`` sends each turn as one request into the
running batch.

Per schedule it prints and records the median over ``--steps`` steps of: wall seconds per
step, the engine's decode ticks, its mean batch size (tokens per tick), and its
sequential waits (batch calls, or the most requests one episode waited for); then the
ratio of each schedule's seconds per step to ``episodes``'s. Writes
``benchmarks/results/async_rollouts.json``.

Run:  python -m benchmarks.bench_async_rollouts [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mappa_env
from benchmarks._common import RESULTS_DIR, print_table, write_results
from mappa_agents.policy import SamplingParams
from mappa_agents.runner import SCHEDULES, RolloutRunner
from mappa_agents.standin import StandInEngine
from mappa_agents.system import AgentSystem
from mappa_env.coach import RulesCoach
from mappa_env.coach.base import CoachRequest, CoachVerdict

AGENTS = ["problem_solver", "code_executor", "verifier"]
SHORTEST_REPLY = 8


class SlowRulesCoach(RulesCoach):
    """The rules coach after ``delay_s`` to ``2 * delay_s`` seconds (by task): env work."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        share = int(hashlib.blake2b(request.task_id.encode(), digest_size=2).hexdigest(), 16)
        await asyncio.sleep(self.delay_s * (1 + share / 0xFFFF))
        return await super().ascore(request)


def heavy_tailed(longest: int):
    """Reply lengths from ``SHORTEST_REPLY`` to ``longest``, most short, a few long."""

    def length(prompt_ids: Sequence[int]) -> int:
        digest = hashlib.blake2b(bytes(prompt_ids), digest_size=4).digest()
        u = int.from_bytes(digest, "little") / 0xFFFFFFFF
        return SHORTEST_REPLY + int((longest - SHORTEST_REPLY) * u**3)

    return length


def measure(schedule: str, args: argparse.Namespace) -> dict[str, Any]:
    """``args.steps`` rollout steps of one schedule; the medians of each figure."""
    engine = StandInEngine(
        token_latency_s=args.token_latency_ms / 1000,
        reply_tokens=heavy_tailed(args.max_new_tokens),
    )
    runner = RolloutRunner(
        lambda: mappa_env.make(
            "MathChat-v0",
            tasks=f"gen:{args.episodes}:7",
            sandbox=None,
            coach=SlowRulesCoach(args.env_ms / 1000),
            isolation="none",
        ),
        AgentSystem.shared(engine, AGENTS),
        SamplingParams(max_new_tokens=args.max_new_tokens),
        concurrency=args.episodes,
        seed=0,
        progress=False,
        keep_envs=True,
        schedule=schedule,  # type: ignore[arg-type]
    )
    steps = []
    with runner:
        for step in range(args.steps):
            engine.reset_counters()
            started = time.perf_counter()
            episodes = runner.run(args.episodes, seed=step)
            wall = time.perf_counter() - started
            steps.append(
                {
                    "wall_s": wall,
                    "decode_ticks": engine.decode_ticks,
                    "mean_batch_size": engine.mean_batch_size,
                    "sequential_waits": engine.sequential_waits,
                    "tokens": engine.tokens,
                    "actions": sum(len(e.actions) for e in episodes),
                    "aborted": sum(e.aborted for e in episodes),
                }
            )
    row: dict[str, Any] = {"schedule": schedule}
    for key in steps[0]:
        row[key] = statistics.median(step[key] for step in steps)
    row["all_wall_s"] = [step["wall_s"] for step in steps]
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64, help="episodes per step, all in flight")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per schedule")
    parser.add_argument("--token-latency-ms", type=float, default=2.0)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--env-ms", type=float, default=4.0, help="coach latency per verdict")
    parser.add_argument("--quick", action="store_true", help="a small run (tests)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.steps, args.max_new_tokens = 8, 1, 24
        args.token_latency_ms, args.env_ms = 0.5, 1.0
    rows = [measure(schedule, args) for schedule in SCHEDULES]
    by_name = {row["schedule"]: row for row in rows}
    for row in rows:
        row["s_per_step_over_episodes"] = row["wall_s"] / by_name["episodes"]["wall_s"]
    print_table(
        [{k: v for k, v in row.items() if k != "all_wall_s"} for row in rows],
        title=f"Rollout schedules over the stand-in engine ({args.episodes} episodes a step)",
    )
    for name in ("ticks", "continuous"):
        print(f"episodes is {by_name[name]['s_per_step_over_episodes']:.2f}x faster than {name}")
    settings = {k: v for k, v in vars(args).items() if k != "out"}  # no machine paths
    payload = {"settings": settings, "rows": rows}
    write_results("async_rollouts", payload, args.out)
    return payload


if __name__ == "__main__":
    main()
