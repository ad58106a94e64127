"""Speed of the Jupyter sandbox: kernel start, cell round trip, pooled hand-out.

The round trip of a trivial cell (``1 + 1``) is measured through :class:`JupyterSandbox`
and through a bare jupyter-client kernel (execute, read iopub until idle, read the
reply), interleaved call by call so that both see the same machine load; their ratio is
the wrapper's overhead (limits, process-tree check, file tracking, output handling).

Run: python -m benchmarks.bench_sandbox [--calls 200] [--starts 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from queue import Empty
from typing import Any

from benchmarks._common import print_table, write_results
from mappa_env.sandbox import JupyterSandbox, KernelPool

TARGETS = {"round_trip_median_ms": 5.0, "start_median_s": 0.6}


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


def measure_starts(count: int) -> tuple[list[float], list[float]]:
    ours, raw = [], []
    for _ in range(count):
        started = time.perf_counter()
        sandbox = JupyterSandbox()
        sandbox.start()
        ours.append(time.perf_counter() - started)
        sandbox.close()
        kernel = RawKernel()
        raw.append(kernel.start_s)
        kernel.close()
    return ours, raw


def measure_round_trips(calls: int) -> tuple[list[float], list[float]]:
    sandbox = JupyterSandbox()
    kernel = RawKernel()
    try:
        for _ in range(20):  # warm both up
            sandbox.run("1 + 1")
            kernel.run("1 + 1")
        ours, raw = [], []
        for _ in range(calls):
            started = time.perf_counter()
            result = sandbox.run("1 + 1")
            ours.append(time.perf_counter() - started)
            assert result.stdout == "2\n", result
            started = time.perf_counter()
            kernel.run("1 + 1")
            raw.append(time.perf_counter() - started)
    finally:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()

    start_ours, start_raw = measure_starts(args.starts)
    trip_ours, trip_raw = measure_round_trips(args.calls)
    handouts, first_calls = measure_pool(args.starts)

    ms = 1000.0
    rows: list[dict[str, Any]] = [
        {
            "measure": "kernel start (s, median)",
            "mappa": statistics.median(start_ours),
            "raw jupyter-client": statistics.median(start_raw),
            "ratio": statistics.median(start_ours) / statistics.median(start_raw),
        },
        {
            "measure": "round trip 1+1 (ms, median)",
            "mappa": statistics.median(trip_ours) * ms,
            "raw jupyter-client": statistics.median(trip_raw) * ms,
            "ratio": statistics.median(trip_ours) / statistics.median(trip_raw),
        },
        {
            "measure": "round trip 1+1 (ms, p90)",
            "mappa": quantile(trip_ours, 0.9) * ms,
            "raw jupyter-client": quantile(trip_raw, 0.9) * ms,
            "ratio": quantile(trip_ours, 0.9) / quantile(trip_raw, 0.9),
        },
        {
            "measure": "pooled hand-out (ms, median)",
            "mappa": statistics.median(handouts) * ms,
            "raw jupyter-client": "",
            "ratio": "",
        },
        {
            "measure": "first call after hand-out (ms, median)",
            "mappa": statistics.median(first_calls) * ms,
            "raw jupyter-client": "",
            "ratio": "",
        },
    ]
    print_table(rows, title="Jupyter sandbox")
    summary = {
        "start_median_s": statistics.median(start_ours),
        "start_raw_median_s": statistics.median(start_raw),
        "round_trip_median_ms": statistics.median(trip_ours) * ms,
        "round_trip_p90_ms": quantile(trip_ours, 0.9) * ms,
        "round_trip_raw_median_ms": statistics.median(trip_raw) * ms,
        "round_trip_raw_p90_ms": quantile(trip_raw, 0.9) * ms,
        "round_trip_overhead_ratio": statistics.median(trip_ours) / statistics.median(trip_raw),
        "pooled_handout_median_ms": statistics.median(handouts) * ms,
        "pooled_first_call_median_ms": statistics.median(first_calls) * ms,
    }
    met = {name: summary[name] <= bound for name, bound in TARGETS.items()}
    print("targets met:", met)
    write_results(
        "sandbox",
        {
            "settings": {"calls": args.calls, "starts": args.starts},
            "summary": summary,
            "targets": TARGETS,
            "targets_met": met,
            "raw": {
                "start_s": start_ours,
                "start_raw_s": start_raw,
                "handout_s": handouts,
            },
        },
    )


if __name__ == "__main__":
    main()
