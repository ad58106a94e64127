"""Batched rollouts vs one episode at a time, and coach latency hidden by concurrency.

1. Throughput: the same MathChat-v0 episodes with SmolLM2-135M for all three agents, run
   by :class:`~mappa_agents.runner.RolloutRunner` with 8 episodes in flight (one
   generation batch per tick) and with 1 (a plain one-episode-at-a-time loop).
   Target: at least 4x more episodes per second batched.
2. Coach latency: 32 concurrent episodes with the rules coach, then with the same coach
   behind a fixed 200 ms delay per verdict. Target: wall time close to the first.
3. Schedules: ``ticks`` against ``continuous`` on the same episodes, with the code
   executor's Python run in Jupyter kernels and a coach whose latency varies by task
   (50-450 ms, a stand-in for an API judge): uneven steps, which ticks wait out and the
   continuous schedule does not.

Greedy decoding, so both settings generate the same text. Prints tables and writes
``benchmarks/results/runner.json``.

Run:  python -m benchmarks.bench_runner [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import mappa_env
from benchmarks._common import RESULTS_DIR, print_table, write_results
from mappa_agents.models import load_policy
from mappa_agents.policy import SamplingParams
from mappa_agents.runner import RolloutRunner
from mappa_agents.system import AgentSystem
from mappa_env.coach import RulesCoach
from mappa_env.coach.base import CoachRequest, CoachVerdict


class UnevenCoach(RulesCoach):
    """The rules coach, answering after 50-450 ms depending on the task."""

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        digest = sum(map(ord, request.task_id))
        await asyncio.sleep(0.05 + 0.1 * (digest % 5))
        return await super().ascore(request)


class DelayedCoach(RulesCoach):
    """The rules coach, answering after a fixed delay (a stand-in for an API judge)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        await asyncio.sleep(self.delay_s)
        return self.score(request)


def timed_run(
    policy,
    episodes: int,
    concurrency: int,
    max_new_tokens: int,
    coach,
    *,
    schedule: str = "ticks",
    sandbox: str | None = None,
) -> dict:
    system = AgentSystem.shared(policy, ["problem_solver", "code_executor", "verifier"])
    runner = RolloutRunner(
        lambda: mappa_env.make(
            "MathChat-v0", tasks="gen:32:7", sandbox=sandbox, coach=coach, isolation="none"
        ),
        system,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        concurrency=concurrency,
        seed=0,
        progress=False,
        schedule=schedule,
    )
    start = time.perf_counter()
    results = runner.run(episodes)
    wall = time.perf_counter() - start
    tokens = sum(len(a.response_ids) for e in results for a in e.actions)
    return {
        "schedule": schedule,
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
    parser.add_argument("--schedule-episodes", type=int, default=16)
    parser.add_argument(
        "--only-schedules",
        action="store_true",
        help="run only the schedule comparison (other sections of runner.json are kept)",
    )
    args = parser.parse_args()

    policy = load_policy(args.model, dtype=args.dtype, device="cpu")
    timed_run(policy, 1, 1, 8, "rules")  # warm-up
    payload: dict = {}
    previous = RESULTS_DIR / "runner.json"
    if args.only_schedules and previous.is_file():
        payload = {
            k: v
            for k, v in json.loads(previous.read_text()).items()
            if k in ("throughput", "coach_latency")
        }
    else:
        payload.update(throughput_and_latency(policy, args))
    payload["schedules"] = compare_schedules(policy, args)
    write_results("runner", {"settings": vars(args), **payload})


def throughput_and_latency(policy, args) -> dict:
    """Sections 1 and 2: batched vs sequential, and coach latency hidden."""
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
    return {
        "throughput": {
            "sequential": sequential,
            "batched": batched,
            "speedup": speedup,
            "identical_greedy_text": same_text,
        },
        "coach_latency": {"no_delay": no_delay, "delay_200ms": delayed, "added_wall_s": overhead},
    }


def compare_schedules(policy, args) -> dict:
    """Section 3: ticks vs continuous on the same episodes, side by side."""
    runs = {
        name: timed_run(
            policy,
            args.schedule_episodes,
            8,
            args.max_new_tokens,
            UnevenCoach(),
            schedule=name,
            sandbox="jupyter",
        )
        for name in ("ticks", "continuous")
    }
    same_text = runs["ticks"].pop("texts") == runs["continuous"].pop("texts")
    ratio = runs["continuous"]["episodes_per_s"] / runs["ticks"]["episodes_per_s"]
    print_table(
        list(runs.values()),
        title="Schedules: ticks vs continuous (Jupyter sandbox, coach latency 50-450 ms)",
    )
    print(
        f"continuous / ticks episodes per second: {ratio:.2f}x; identical greedy text: {same_text}"
    )
    return {**runs, "continuous_over_ticks": ratio, "identical_greedy_text": same_text}


if __name__ == "__main__":
    main()
