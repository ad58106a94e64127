"""Batched rollouts vs one episode at a time, and coach latency hidden by concurrency.

1. Throughput: the same MathChat-v0 episodes with SmolLM2-135M for all three agents, run
   by :class:`~mappa_agents.runner.RolloutRunner` with 8 episodes in flight (one
   generation batch per tick) and with 1 (a plain one-episode-at-a-time loop).
   Target: at least 4x more episodes per second batched.
2. Coach latency: 32 concurrent episodes with the rules coach, then with the same coach
   behind a fixed 200 ms delay per verdict. Target: wall time close to the first.

Greedy decoding, so both settings generate the same text. Prints tables and writes
``benchmarks/results/runner.json``.

Run:  python -m benchmarks.bench_runner [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import mappa_env
from benchmarks._common import print_table, write_results
from mappa_agents.models import load_policy
from mappa_agents.policy import SamplingParams
from mappa_agents.runner import RolloutRunner
from mappa_agents.system import AgentSystem
from mappa_env.coach import RulesCoach
from mappa_env.coach.base import CoachRequest, CoachVerdict


class DelayedCoach(RulesCoach):
    """The rules coach, answering after a fixed delay (a stand-in for an API judge)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        await asyncio.sleep(self.delay_s)
        return self.score(request)


def timed_run(policy, episodes: int, concurrency: int, max_new_tokens: int, coach) -> dict:
    system = AgentSystem.shared(policy, ["problem_solver", "code_executor", "verifier"])
    runner = RolloutRunner(
        lambda: mappa_env.make("MathChat-v0", tasks="gen:32:7", sandbox=None, coach=coach),
        system,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        concurrency=concurrency,
        seed=0,
        progress=False,
    )
    start = time.perf_counter()
    results = runner.run(episodes)
    wall = time.perf_counter() - start
    tokens = sum(len(a.response_ids) for e in results for a in e.actions)
    return {
        "episodes": episodes,
        "concurrency": concurrency,
        "coach": type(coach).__name__ if not isinstance(coach, str) else coach,
        "wall_s": wall,
        "episodes_per_s": episodes / wall,
        "response_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "texts": [a.text for e in results for a in e.actions],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--latency-episodes", type=int, default=32)
    args = parser.parse_args()

    policy = load_policy(args.model, dtype=args.dtype, device="cpu")
    timed_run(policy, 1, 1, 8, "rules")  # warm-up
    sequential = timed_run(policy, args.episodes, 1, args.max_new_tokens, "rules")
    batched = timed_run(policy, args.episodes, 8, args.max_new_tokens, "rules")
    same_text = sequential.pop("texts") == batched.pop("texts")
    speedup = batched["episodes_per_s"] / sequential["episodes_per_s"]
    print_table([sequential, batched], title="Batched runner vs one episode at a time")
    print(f"speed-up: {speedup:.2f}x (target >= 4x); identical greedy text: {same_text}")

    n = args.latency_episodes
    no_delay = timed_run(policy, n, n, args.max_new_tokens, RulesCoach())
    delayed = timed_run(policy, n, n, args.max_new_tokens, DelayedCoach(0.2))
    no_delay.pop("texts"), delayed.pop("texts")
    overhead = delayed["wall_s"] - no_delay["wall_s"]
    print_table([no_delay, delayed], title="32 concurrent episodes: coach with 0 vs 200 ms latency")
    print(
        f"added wall time: {overhead:.2f} s for {delayed['episodes']} episodes x 4 verdicts "
        f"of 200 ms ({n * 4 * 0.2:.1f} s if they ran one after another)"
    )
    write_results(
        "runner",
        {
            "settings": vars(args),
            "throughput": {
                "sequential": sequential,
                "batched": batched,
                "speedup": speedup,
                "identical_greedy_text": same_text,
            },
            "coach_latency": {
                "no_delay": no_delay,
                "delay_200ms": delayed,
                "added_wall_s": overhead,
            },
        },
    )


if __name__ == "__main__":
    main()
