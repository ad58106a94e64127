"""Speed of math answer grading: fast path, symbolic path, worker start-up, runaway bound.

Run: python benchmarks/bench_grading.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks._common import print_table, write_results
from mappa_env.grading import SymbolicChecker, answers_match
from mappa_env.tasks import find_bench_dir, load_math_tasks


def median_us(pred: str, truth: str, repeats: int, checker: SymbolicChecker) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        answers_match(pred, truth, checker=checker)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20_000)
    args = parser.parse_args()
    checker = SymbolicChecker(max_workers=1)
    rows = []

    fast_cases = [
        ("aime zero padding", "023", "23"),
        ("amc float", "18.0", "18"),
        ("latex fraction vs decimal", "\\dfrac{3}{4}", "0.75"),
        ("latex units and degrees", "336^\\circ", "336"),
        ("boxed text vs integer", "\\boxed{204}", "204"),
        ("wrong integer", "230", "23"),
    ]
    for name, pred, truth in fast_cases:
        rows.append(
            {
                "case": name,
                "path": "fast",
                "median_us": median_us(pred, truth, args.repeats, checker),
                "calls": args.repeats,
            }
        )

    start = time.perf_counter()
    checker.warm_up()
    answers_match("\\sqrt{4}", "2", checker=checker)
    startup_s = time.perf_counter() - start
    rows.append(
        {
            "case": "worker start + first check",
            "path": "symbolic",
            "median_us": startup_s * 1e6,
            "calls": 1,
        }
    )

    symbolic_times = []
    for k in range(2, 202):
        start = time.perf_counter()
        assert answers_match(f"\\sqrt{{{k}}}", f"{k}^{{1/2}}", checker=checker)
        symbolic_times.append(time.perf_counter() - start)
    rows.append(
        {
            "case": "sqrt{k} vs k^{1/2} (uncached)",
            "path": "symbolic",
            "median_us": statistics.median(symbolic_times) * 1e6,
            "calls": len(symbolic_times),
        }
    )
    rows.append(
        {
            "case": "sqrt{2} vs sqrt 2 (cached)",
            "path": "symbolic",
            "median_us": median_us("\\sqrt{2}", "\\sqrt 2", 2_000, checker),
            "calls": 2_000,
        }
    )

    bench_rows = 0
    try:
        bench_dir = find_bench_dir()
    except FileNotFoundError:
        bench_dir = None
    if bench_dir is not None:
        tasks = [
            task
            for name in ("AIME_1983_2024", "aime_2025", "aime_eval_32", "amc", "amc_eval_32")
            for task in load_math_tasks(name)
        ]
        per_row = []
        for task in tasks:
            start = time.perf_counter()
            answers_match(str(task.metadata["raw_answer"]), task.answer, checker=checker)
            per_row.append(time.perf_counter() - start)
        bench_rows = len(tasks)
        rows.append(
            {
                "case": "self-grade benchmark rows",
                "path": "mixed",
                "median_us": statistics.median(per_row) * 1e6,
                "calls": len(tasks),
            }
        )
    start = time.perf_counter()
    answers_match("10^{10^{10}}", "5", timeout_s=1.0, checker=checker)
    runaway_s = time.perf_counter() - start
    rows.append(
        {
            "case": "10^{10^{10}} vs 5, timeout 1 s",
            "path": "killed",
            "median_us": runaway_s * 1e6,
            "calls": 1,
        }
    )

    checker.close()

    print_table(rows, title="answers_match timings")
    write_results(
        "grading",
        {
            "rows": rows,
            "runaway_wall_s": runaway_s,
            "worker_startup_s": startup_s,
            "bench_rows": bench_rows,
        },
    )


if __name__ == "__main__":
    main()
