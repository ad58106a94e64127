"""LLM coach throughput against a local OpenAI-compatible stub with fixed latency.

64 episodes x 4 actions: each episode's actions are judged in order (as an environment
does), episodes run concurrently. With enough concurrency the whole batch should take
about 4 x latency (the ideal); with one call in flight it takes calls x latency.

Rows: plain ``litellm.acompletion`` calls in the same pattern (the floor any coach built
on litellm can reach), the coach at high concurrency, a rerun from a filled cache (no
HTTP calls at all), and the coach with one call in flight. The stub server runs in a
child process so it does not compete with the coach for the interpreter lock.

Usage:
    python benchmarks/bench_coach.py [--episodes 64] [--actions 4] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from benchmarks._common import print_table, write_results  # noqa: E402
from mappa_env.coach.base import CoachRequest  # noqa: E402
from mappa_env.coach.llm import LLMCoach  # noqa: E402
from tests.openai_stub_server import StubReply, run_stub_server  # noqa: E402

MODEL = "openai/stub-model"


def _serve(latency: float, ready: Any, counter: Any, stop: Any) -> None:
    reply = StubReply("The action is fine.\nPROCESS_SCORE: 7", delay_s=latency)

    def handler(_request: Any) -> StubReply:
        with counter.get_lock():
            counter.value += 1
        return reply

    with run_stub_server(handler) as server:
        ready.put(server.base_url)
        stop.wait()


class ChildServer:
    """The stub server in a child process; ``request_count`` reads a shared counter."""

    def __init__(self, latency: float) -> None:
        context = multiprocessing.get_context("spawn")
        ready = context.Queue()
        self._counter = context.Value("i", 0)
        self._stop = context.Event()
        self._process = context.Process(
            target=_serve, args=(latency, ready, self._counter, self._stop), daemon=True
        )
        self._process.start()
        self.base_url = ready.get(timeout=60)

    @property
    def request_count(self) -> int:
        return self._counter.value

    def close(self) -> None:
        self._stop.set()
        self._process.join(timeout=10)


def make_request(episode: int, action: int) -> CoachRequest:
    agents = ("problem_solver", "code_executor", "code_executor", "verifier")
    return CoachRequest(
        env_id="MathChat-v0",
        task_id=f"bench-{episode}",
        task=f"Problem {episode}: compute {episode} * {action + 7}.",
        agent=agents[action % len(agents)],
        system_description="problem_solver -> code_executor -> verifier.",
        role_description="Do your part of the pipeline.",
        agent_input=[{"role": "user", "content": f"Problem {episode}, step {action}."}],
        action=f"The answer is {episode * (action + 7)}.",
        turn=action,
    )


async def coach_batch(coach: LLMCoach, episodes: int, actions: int) -> list[float]:
    async def episode(index: int) -> list[float]:
        latencies = []
        for action in range(actions):
            verdict = await coach.ascore(make_request(index, action))
            if not verdict.valid:
                raise RuntimeError(f"invalid verdict in benchmark: {verdict.error}")
            latencies.append(verdict.latency_s)
        return latencies

    results = await asyncio.gather(*(episode(i) for i in range(episodes)))
    return [value for per_episode in results for value in per_episode]


async def plain_litellm_batch(base_url: str, episodes: int, actions: int) -> list[float]:
    import litellm

    async def episode(index: int) -> list[float]:
        latencies = []
        for action in range(actions):
            started = time.perf_counter()
            await litellm.acompletion(
                model=MODEL,
                api_base=base_url,
                api_key="bench",
                messages=[{"role": "user", "content": f"episode {index} action {action}"}],
                max_retries=0,
            )
            latencies.append(time.perf_counter() - started)
        return latencies

    results = await asyncio.gather(*(episode(i) for i in range(episodes)))
    return [value for per_episode in results for value in per_episode]


def timed(server: ChildServer, batch: Any) -> tuple[float, list[float], int]:
    before = server.request_count
    started = time.perf_counter()
    latencies = asyncio.run(batch)
    return time.perf_counter() - started, latencies, server.request_count - before


def row(
    label: str, concurrency: Any, measured: tuple[float, list[float], int], args: Any
) -> dict[str, Any]:
    wall, latencies, requests = measured
    ideal = args.actions * args.latency
    return {
        "mode": label,
        "max_concurrency": concurrency,
        "verdicts": len(latencies),
        "http_requests": requests,
        "wall_s": round(wall, 3),
        "ideal_s": ideal,
        "ratio_to_ideal": round(wall / ideal, 2),
        "per_s": round(len(latencies) / wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 4),
        "latency_p95_s": round(statistics.quantiles(latencies, n=20)[18], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--actions", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.2, help="stub reply delay (s)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--skip-sequential", action="store_true", help="skip concurrency 1")
    args = parser.parse_args()

    rows = []
    server = ChildServer(args.latency)
    try:
        common = {"api_base": server.base_url, "api_key": "bench", "structured_output": "text"}
        with LLMCoach(MODEL, **common) as warm:
            warm.score(make_request(-1, 0))  # import litellm and connect before timing

        batch = plain_litellm_batch(server.base_url, args.episodes, args.actions)
        rows.append(row("plain litellm", "-", timed(server, batch), args))

        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp) / "coach.sqlite"
            with LLMCoach(MODEL, max_concurrency=args.concurrency, cache=cache, **common) as coach:
                for label in ("coach", "coach, cached rerun"):
                    batch = coach_batch(coach, args.episodes, args.actions)
                    rows.append(row(label, args.concurrency, timed(server, batch), args))

        if not args.skip_sequential:
            with LLMCoach(MODEL, max_concurrency=1, **common) as coach:
                batch = coach_batch(coach, args.episodes, args.actions)
                rows.append(row("coach", 1, timed(server, batch), args))
    finally:
        server.close()

    title = (
        f"LLM coach: {args.episodes} episodes x {args.actions} sequential actions, "
        f"stub latency {args.latency * 1000:.0f} ms (ideal {args.actions * args.latency:.2f} s)"
    )
    print_table(rows, title=title)
    write_results("bench_coach", {"settings": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
