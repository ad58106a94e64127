"""Speed of the Jupyter sandbox: kernel start, cell round trip, pooled hand-out.

The round trip of a trivial cell (``1 + 1``) is measured through :class:`JupyterSandbox`
unconfined (``isolation="none"``), confined in namespaces (``"namespaces"``, where
bubblewrap works) and through a bare jupyter-client kernel (execute, read iopub until
idle, read the reply), interleaved call by call so that all see the same machine load:
the ratios are the wrapper's overhead (limits, process-tree check, file tracking, output
handling) and the cost of the namespaces. Kernel starts are interleaved the same way.

The time from an episode's reset to its first code result is measured through
MathChat-v0 with its sandbox started ahead (``prestart_sandbox=True``; the default on 4
or more CPUs) and without, episode by episode in turn, confined in namespaces where
bubblewrap works. The agents' thinking before the code (``--think-s`` between the reset
and the code step) is not counted: it is what a start ahead overlaps with.

Run: python -m benchmarks.bench_sandbox [--calls 200] [--starts 5] [--episodes 10]
     python -m benchmarks.bench_sandbox --prestart-only   (writes sandbox_prestart.json)
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import tempfile
import time
from queue import Empty
from typing import Any

import mappa_env
from benchmarks._common import print_table, write_results
from mappa_env.sandbox import JupyterSandbox, KernelPool

TARGETS = {"round_trip_median_ms": 5.0, "start_median_s": 0.6}
#: Namespace isolation against the unconfined sandbox, measured side by side.
ISOLATION_TARGETS = {"start_ratio": 1.5, "round_trip_extra_ms": 2.0}


class RawKernel:
    """A kernel driven by jupyter-client alone, the baseline for the round trip."""

    def __init__(self) -> None:
        from jupyter_client import KernelManager

        started = time.perf_counter()
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = self.manager.client()
        self.client.start_channels(hb=False, stdin=False)
        self.client.wait_for_ready(timeout=60)
        self.start_s = time.perf_counter() - started

    def run(self, code: str) -> None:
        msg_id = self.client.execute(code, store_history=False, allow_stdin=False)
        while True:
            try:
                message = self.client.iopub_channel.get_msg(timeout=30)
            except Empty as exc:
                raise RuntimeError("raw kernel did not answer") from exc
            if (
                message["parent_header"].get("msg_id") == msg_id
                and message["msg_type"] == "status"
                and message["content"]["execution_state"] == "idle"
            ):
                break
        self.client.shell_channel.get_msg(timeout=30)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def namespaces_available() -> str:
    """ "" when namespace isolation works here, else why not."""
    from mappa_env.sandbox.isolation import IsolationUnavailableError, resolve_confinement

    try:
        resolve_confinement("namespaces")
    except IsolationUnavailableError as exc:
        return str(exc)
    return ""


def measure_starts(count: int, modes: list[str]) -> tuple[dict[str, list[float]], list[float]]:
    ours: dict[str, list[float]] = {mode: [] for mode in modes}
    raw = []
    for _ in range(count):
        for mode in modes:
            started = time.perf_counter()
            sandbox = JupyterSandbox(isolation=mode)
            sandbox.start()
            ours[mode].append(time.perf_counter() - started)
            sandbox.close()
        kernel = RawKernel()
        raw.append(kernel.start_s)
        kernel.close()
    return ours, raw


def measure_round_trips(calls: int, modes: list[str]) -> tuple[dict[str, list[float]], list[float]]:
    sandboxes = {mode: JupyterSandbox(isolation=mode) for mode in modes}
    kernel = RawKernel()
    try:
        for _ in range(20):  # warm all up
            for sandbox in sandboxes.values():
                sandbox.run("1 + 1")
            kernel.run("1 + 1")
        ours: dict[str, list[float]] = {mode: [] for mode in modes}
        raw = []
        for _ in range(calls):
            for mode, sandbox in sandboxes.items():
                started = time.perf_counter()
                result = sandbox.run("1 + 1")
                ours[mode].append(time.perf_counter() - started)
                assert result.stdout == "2\n", result
            started = time.perf_counter()
            kernel.run("1 + 1")
            raw.append(time.perf_counter() - started)
    finally:
        for sandbox in sandboxes.values():
            sandbox.close()
        kernel.close()
    return ours, raw


def measure_pool(count: int) -> tuple[list[float], list[float]]:
    """Hand-out time from a full pool, and the first call on the handed-out sandbox."""
    handouts, first_calls = [], []
    with KernelPool(2) as pool, tempfile.TemporaryDirectory() as root:
        for i in range(count):
            if not pool.wait_ready(timeout=120):
                raise RuntimeError("the pool did not fill")
            started = time.perf_counter()
            sandbox = pool(root + f"/{i}")
            handouts.append(time.perf_counter() - started)
            started = time.perf_counter()
            sandbox.run("1 + 1")
            first_calls.append(time.perf_counter() - started)
            sandbox.close()
    return handouts, first_calls


def measure_prestart(episodes: int, isolation: str, think_s: float) -> dict[str, list[float]]:
    """Seconds from each reset to its first code result, started ahead and not, in turn.

    Counted: the reset and the code step (the think time between them is not).
    """
    envs = {
        prestart: mappa_env.make(
            "MathChat-v0",
            tasks=f"gen:{episodes}",
            isolation=isolation,
            prestart_sandbox=prestart,
        )
        for prestart in (True, False)
    }
    times: dict[str, list[float]] = {"on": [], "off": []}
    # One kernel first, so that neither side's first episode pays the imports alone.
    with JupyterSandbox(isolation=isolation) as warm:
        warm.start()
    try:
        for episode in range(episodes):
            for prestart, env in envs.items():
                started = time.perf_counter()
                env.reset(seed=0 if episode == 0 else None)
                reset_s = time.perf_counter() - started
                time.sleep(think_s)
                env.step("I think the answer is 3.")
                started = time.perf_counter()
                env.step("```python\nprint(6 * 7)\n```")
                code_s = time.perf_counter() - started
                tool = env.infos["code_executor"]["tool"]
                if tool.get("stdout") != "42\n":
                    raise RuntimeError(f"the code step failed: {tool}")
                times["on" if prestart else "off"].append(reset_s + code_s)
    finally:
        for env in envs.values():
            env.close()
    return times


def prestart_rows(times: dict[str, list[float]], isolation: str) -> tuple[list[dict], dict]:
    """Table rows and summary of :func:`measure_prestart` (the first episode apart)."""
    median = statistics.median
    first_on, first_off = times["on"][0], times["off"][0]
    later_on = median(times["on"][1:] or times["on"])
    later_off = median(times["off"][1:] or times["off"])
    rows = [
        {
            "measure": f"reset to first code, first episode, isolation={isolation} (s)",
            "started ahead": first_on,
            "on demand": first_off,
            "ratio": first_off / first_on,
        },
        {
            "measure": f"reset to first code, later episodes, isolation={isolation} (s, median)",
            "started ahead": later_on,
            "on demand": later_off,
            "ratio": later_off / later_on,
        },
    ]
    summary = {
        "isolation": isolation,
        "first_episode_started_ahead_s": first_on,
        "first_episode_on_demand_s": first_off,
        "later_median_started_ahead_s": later_on,
        "later_median_on_demand_s": later_off,
        "later_speedup": later_off / later_on,
    }
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--think-s", type=float, default=0.5)
    parser.add_argument("--prestart-only", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    unavailable = namespaces_available()
    isolation = "none" if unavailable else "namespaces"
    prestart = measure_prestart(args.episodes, isolation, args.think_s)
    rows, prestart_summary = prestart_rows(prestart, isolation)
    print_table(rows, title="Sandbox started ahead of an episode (MathChat-v0)")
    prestart_payload = {
        "settings": {"episodes": args.episodes, "think_s": args.think_s},
        "namespaces_unavailable": unavailable or None,
        "summary": prestart_summary,
        "raw": {"started_ahead_s": prestart["on"], "on_demand_s": prestart["off"]},
    }
    if args.prestart_only:
        write_results("sandbox_prestart", prestart_payload)
        return

    modes = ["none"] if unavailable else ["none", "namespaces"]
    if unavailable:
        print(f"namespace isolation is not measured: {unavailable}")
    starts, start_raw = measure_starts(args.starts, modes)
    trips, trip_raw = measure_round_trips(args.calls, modes)
    handouts, first_calls = measure_pool(args.starts)

    ms = 1000.0
    median = statistics.median
    rows: list[dict[str, Any]] = []
    for mode in modes:
        rows += [
            {
                "measure": f"kernel start, isolation={mode} (s, median)",
                "mappa": median(starts[mode]),
                "raw jupyter-client": median(start_raw),
                "ratio": median(starts[mode]) / median(start_raw),
            },
            {
                "measure": f"round trip 1+1, isolation={mode} (ms, median)",
                "mappa": median(trips[mode]) * ms,
                "raw jupyter-client": median(trip_raw) * ms,
                "ratio": median(trips[mode]) / median(trip_raw),
            },
            {
                "measure": f"round trip 1+1, isolation={mode} (ms, p90)",
                "mappa": quantile(trips[mode], 0.9) * ms,
                "raw jupyter-client": quantile(trip_raw, 0.9) * ms,
                "ratio": quantile(trips[mode], 0.9) / quantile(trip_raw, 0.9),
            },
        ]
    rows += [
        {
            "measure": "pooled hand-out (ms, median)",
            "mappa": median(handouts) * ms,
            "raw jupyter-client": "",
            "ratio": "",
        },
        {
            "measure": "first call after hand-out (ms, median)",
            "mappa": median(first_calls) * ms,
            "raw jupyter-client": "",
            "ratio": "",
        },
    ]
    print_table(rows, title="Jupyter sandbox")
    summary: dict[str, Any] = {
        "start_median_s": median(starts["none"]),
        "start_raw_median_s": median(start_raw),
        "round_trip_median_ms": median(trips["none"]) * ms,
        "round_trip_p90_ms": quantile(trips["none"], 0.9) * ms,
        "round_trip_raw_median_ms": median(trip_raw) * ms,
        "round_trip_raw_p90_ms": quantile(trip_raw, 0.9) * ms,
        "round_trip_overhead_ratio": median(trips["none"]) / median(trip_raw),
        "pooled_handout_median_ms": median(handouts) * ms,
        "pooled_first_call_median_ms": median(first_calls) * ms,
    }
    met = {name: summary[name] <= bound for name, bound in TARGETS.items()}
    if "namespaces" in modes:
        summary.update(
            {
                "namespaces_start_median_s": median(starts["namespaces"]),
                "namespaces_round_trip_median_ms": median(trips["namespaces"]) * ms,
                "namespaces_round_trip_p90_ms": quantile(trips["namespaces"], 0.9) * ms,
                "start_ratio": median(starts["namespaces"]) / median(starts["none"]),
                "round_trip_extra_ms": (median(trips["namespaces"]) - median(trips["none"])) * ms,
            }
        )
        met.update({name: summary[name] <= bound for name, bound in ISOLATION_TARGETS.items()})
    print("targets met:", met)
    write_results(
        "sandbox",
        {
            "settings": {"calls": args.calls, "starts": args.starts, "modes": modes},
            "prestart": prestart_payload,
            "namespaces_unavailable": unavailable or None,
            "summary": summary,
            "targets": {**TARGETS, **ISOLATION_TARGETS},
            "targets_met": met,
            "raw": {
                "start_s": starts,
                "start_raw_s": start_raw,
                "handout_s": handouts,
            },
        },
    )


if __name__ == "__main__":
    main()
