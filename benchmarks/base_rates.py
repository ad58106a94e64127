"""Base success rates: how often the untrained system solves each candidate task set.

An arm of a training comparison can only learn from episodes that succeed: under an
outcome-only reward, a task set the untrained system never solves gives every action a
reward of 0 and nothing moves. Before a task set is chosen for training or held out,
this script measures how often the untrained system solves it, with the recipe's real
settings: SmolLM2-135M as all three MathChat-v0 agents, the rules coach, 256 new tokens
per action, the one-line verifier reply, the Jupyter sandbox, and the sampling
temperature of training rollouts (1.0) and of evaluation (0.6).

Each candidate is a generator spec (the ``tasks`` mapping of a recipe); its first
``--episodes`` problems run once each, so an episode is a problem. A row gives the
successes, the rate with a 95% Wilson interval, and per kind the same; besides the
graded outcome, where the chain broke: the code executor's code printed the answer
(``answer_printed``), the verifier boxed a number (``boxed``), and the rate a lenient
grader (``strict_boxed=False``: "the final answer is 42" counts) would give the same
episodes. Every episode is kept (task id, kind, answer, the verifier's answer and the
start of its reply, correct).

``--upstream oracle`` replaces the problem solver and the code executor by scripted
agents whose code prints the right answer: the row then measures the untrained
verifier alone, given a perfect upstream, which bounds what the whole untrained system
can reach on any task set at that temperature.

Rows are merged into ``benchmarks/results/repro/base_rates.json`` by (candidate,
temperature, upstream): measure candidates one command at a time on a small machine,
the file keeps them all, each row with the commit and settings it was measured with.

    python -m benchmarks.base_rates --list
    python -m benchmarks.base_rates --candidates word-easy --episodes 128
    python -m benchmarks.base_rates --candidates word-easy,arithmetic-easy --temperatures 1.0,0.6
    python -m benchmarks.base_rates --candidates word-easy --upstream oracle
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, git_commit, machine_info, parse_variants, print_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS_NAME = "base_rates"
RESULTS_PATH = RESULTS_DIR / "repro" / f"{RESULTS_NAME}.json"
AGENTS = ("problem_solver", "code_executor", "verifier")
WORD_KINDS = ["word_change", "word_sharing", "word_rates", "word_ages", "word_units", "word_totals"]
# Trained on: four families. Held back, for out-of-family held-out problems: ages (time
# relations between people) and units (conversion factors the prompt never states),
# chosen before any measurement as the two that need knowledge the others do not.
TRAIN_WORD_KINDS = ["word_change", "word_sharing", "word_rates", "word_totals"]
HELD_BACK_WORD_KINDS = ["word_ages", "word_units"]


def _spec(kinds: Sequence[str], difficulty: str, seed: int, n: int = 512) -> dict[str, Any]:
    # The empty secret: the tasks follow from the public seed, as in the recipe, so
    # anyone can rebuild the very problems measured here.
    return {"n": n, "seed": seed, "kinds": list(kinds), "difficulty": difficulty, "secret": ""}


CANDIDATES: dict[str, dict[str, Any]] = {
    # The recipe's tasks so far (their prompts are their own solution), for reference.
    "expression-medium": _spec(["expression"], "medium", 1),
    "expression-easy": _spec(["expression"], "easy", 1),
    # One operation per problem: the easiest word problems.
    "one-step-easy": _spec(["word_one_step"], "easy", 1),
    "one-step-easy-heldout": _spec(["word_one_step"], "easy", 2, n=128),
    # Word problems, all six families in turn (per-family rates).
    "word-easy": _spec(WORD_KINDS, "easy", 1),
    "word-medium": _spec(WORD_KINDS, "medium", 1),
    # The proposed split: training set (seed 1), in-family held-out (seed 2, checked
    # disjoint by prompt), out-of-family held-out (the two held-back families).
    "word4-easy": _spec(TRAIN_WORD_KINDS, "easy", 1),
    "word4-easy-heldout": _spec(TRAIN_WORD_KINDS, "easy", 2, n=128),
    "word2-easy-heldout": _spec(HELD_BACK_WORD_KINDS, "easy", 2, n=128),
    # Existing word-problem kind and competition kinds at their easy level.
    "arithmetic-easy": _spec(["arithmetic"], "easy", 2, n=128),
    "competition-easy": _spec(
        ["gcd_lcm", "modular_power", "polynomial_roots", "linear_system"], "easy", 2, n=128
    ),
}
"""Candidate task sets: name -> generator spec (the ``tasks`` mapping of a recipe)."""

ENV_OPTIONS: dict[str, Any] = {"max_new_tokens": 256, "verifier_reply": "one_line"}
"""MathChat-v0 options of the recipe (configs/mathchat-smollm2.yaml) besides its tasks."""


# --------------------------------------------------------------------------------------
# Statistics and records
# --------------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; ``(0, 1)`` when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_row(successes: int, n: int) -> dict[str, Any]:
    """Successes, episodes, rate and its 95% Wilson interval."""
    low, high = wilson_interval(successes, n)
    return {
        "episodes": n,
        "successes": successes,
        "rate": successes / n if n else None,
        "ci95": [low, high],
    }


def _mentions(text: str, answer: str) -> bool:
    """Whether ``answer`` appears in ``text`` as a standalone number."""
    return re.search(rf"(?<![\d.]){re.escape(answer)}(?!\d|\.\d)", text or "") is not None


REPLY_CHARS = 300
"""The verifier's reply is kept up to this many characters, to read what it wrote."""


def episode_record(episode: Any) -> dict[str, Any]:
    """What one episode shows about the chain: the outcome, and where it broke.

    Besides the strict grade (a boxed answer, MathChat-v0's default), ``lenient_*``
    grades the verifier's reply as ``strict_boxed=False`` would: a box, else "the final
    answer is X" and the like. The sampled text does not depend on the grader, so this
    is what a run with the lenient grader would have counted on the same episodes.
    """
    from mappa_env.grading.math import answers_match_any, extract_boxed

    outcome = episode.outcome
    answer = str(outcome.facts.get("answer", ""))
    code_turns = [a for a in episode.actions if a.agent == "code_executor"]
    printed = any(_mentions((a.tool or {}).get("stdout") or "", answer) for a in code_turns)
    reply = next((a.text for a in reversed(episode.actions) if a.agent == "verifier"), "")
    lenient = extract_boxed(reply, fallback=True) if reply else None
    return {
        "task_id": episode.task_id,
        "kind": outcome.task_type,
        "answer": answer,
        "predicted": outcome.facts.get("predicted"),
        "correct": bool(outcome.correct),
        "aborted": episode.aborted,
        "code_turns": len(code_turns),
        "code_turns_with_code": sum(a.code is not None for a in code_turns),
        "answer_printed": printed,
        "boxed": outcome.facts.get("predicted") is not None,
        "verifier_states_answer": _mentions(reply, answer),
        "lenient_predicted": lenient,
        "lenient_correct": bool(lenient) and answers_match_any(lenient, [answer]),
        "truncated_actions": sum(a.finish_reason == "length" for a in episode.actions),
        "verifier_reply": reply[:REPLY_CHARS],
        # The code executor's last code that ran, and what it printed.
        "last_code": next((a.code for a in reversed(code_turns) if a.code), "")[:REPLY_CHARS],
        "last_stdout": next(
            ((a.tool or {}).get("stdout") or "" for a in reversed(code_turns) if a.code), ""
        )[:REPLY_CHARS],
    }


def summarize_records(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Success overall and per kind, and the share of episodes at each link of the chain."""
    finished = [r for r in records if not r["aborted"]]
    summary = rate_row(sum(r["correct"] for r in finished), len(finished))
    summary["aborted"] = len(records) - len(finished)
    by_kind: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in finished:
        by_kind[str(record["kind"])].append(record)
    lenient = sum(r.get("lenient_correct", False) for r in finished)
    summary["lenient"] = rate_row(lenient, len(finished))
    summary["per_kind"] = {
        kind: rate_row(sum(r["correct"] for r in rows), len(rows))
        for kind, rows in sorted(by_kind.items())
    }
    n = max(1, len(finished))
    code_turns = sum(r["code_turns"] for r in finished)
    summary["chain"] = {
        "answer_printed": sum(r["answer_printed"] for r in finished) / n,
        "boxed": sum(r["boxed"] for r in finished) / n,
        "verifier_states_answer": sum(r.get("verifier_states_answer", False) for r in finished) / n,
        "code_turn_share_with_code": (
            sum(r["code_turns_with_code"] for r in finished) / code_turns if code_turns else None
        ),
    }
    return summary


# --------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------


def oracle_upstream(tasks: Sequence[Any]) -> dict[str, Any]:
    """Scripted problem solver and code executor whose code prints each task's answer.

    The code executor's first turn is ``print(<answer>)``; its second turn has no code,
    which ends its slot, and does not restate the number: the verifier has to take it
    from the code and its output, as it would from a good code executor.
    """
    from mappa_agents.scripted import ScriptedPolicy

    answers = {task.prompt: task.answer for task in tasks}

    def answer_of(messages: Sequence[Mapping[str, str]]) -> str:
        user = next(m["content"] for m in messages if m["role"] == "user")
        problem = user.split("Problem:\n", 1)[1].split("\n\n", 1)[0]
        return answers[problem]

    def code_executor(messages: list[dict[str, str]]) -> str:
        if len(messages) <= 2:  # system prompt and the problem: its first turn
            return f"```python\nprint({answer_of(messages)})\n```"
        return "The code above computes the answer."

    return {
        "problem_solver": ScriptedPolicy(
            lambda _messages: "Let us compute the answer with Python.", name="oracle-solver"
        ),
        "code_executor": ScriptedPolicy(code_executor, name="oracle-executor"),
    }


def measure(
    system: Any,
    name: str,
    spec: Mapping[str, Any],
    temperature: float,
    args: argparse.Namespace,
    commit: str | None,
) -> dict[str, Any]:
    """Run the first ``args.episodes`` tasks of ``spec`` once each; one result row.

    ``commit`` is the code's commit when the command started: a commit made while
    a long measurement runs must not be recorded as the code it ran.
    """
    import mappa_env
    from mappa_agents.policy import SamplingParams
    from mappa_agents.runner import RolloutRunner
    from mappa_env.coach import make_coach
    from mappa_env.tasks import is_own_solution

    coach = make_coach("rules")
    env_options = {**ENV_OPTIONS, "tasks": dict(spec), "coach": coach}
    probe = mappa_env.make("MathChat-v0", **env_options)
    try:
        tasks = list(probe.tasks)
    finally:
        probe.close()
    if args.episodes > len(tasks):
        raise SystemExit(f"{name}: --episodes {args.episodes} exceeds its {len(tasks)} tasks")
    chosen = tasks[: args.episodes]
    if args.upstream == "oracle":
        from mappa_agents.system import AgentSystem

        system = AgentSystem({**oracle_upstream(tasks), "verifier": system.policy_for("verifier")})
    runner = RolloutRunner(
        lambda: mappa_env.make("MathChat-v0", **env_options),
        system,
        SamplingParams(max_new_tokens=ENV_OPTIONS["max_new_tokens"], temperature=temperature),
        concurrency=args.concurrency,
        seed=args.seed,
        progress=not args.no_progress,
    )
    start = time.perf_counter()
    episodes = runner.run(len(chosen), [{"task_id": task.id} for task in chosen])
    wall = time.perf_counter() - start
    records = [episode_record(e) for e in episodes]
    return {
        "candidate": name,
        "temperature": temperature,
        "upstream": args.upstream,
        "tasks": dict(spec),
        **summarize_records(records),
        "own_solution_tasks": sum(is_own_solution(task) for task in chosen),
        "wall_s": wall,
        "settings": {
            "system": args.system,
            "coach": "rules",
            "env": "MathChat-v0",
            "env_options": ENV_OPTIONS,
            "max_new_tokens": ENV_OPTIONS["max_new_tokens"],
            "temperature": temperature,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "dtype": args.dtype,
        },
        "commit": commit,
        "machine": machine_info(),
        "episodes_detail": records,
    }


def load_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of an earlier results file (none when it does not exist)."""
    if not path.is_file():
        return []
    return list(json.loads(path.read_text()).get("rows", []))


def merge_rows(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict]:
    """``old`` with the rows of ``new`` in place of those with the same candidate,
    temperature and upstream, the rest appended."""
    key = lambda row: (  # noqa: E731
        row["candidate"],
        float(row["temperature"]),
        row.get("upstream", "model"),
    )
    replaced = {key(row): row for row in new}
    merged = [replaced.pop(key(row), row) for row in old]
    return merged + [row for row in new if key(row) in replaced]


def table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Printable lines: one per row and, indented, one per kind."""
    lines = []
    for row in rows:
        low, high = row["ci95"]
        lines.append(
            {
                "candidate": row["candidate"]
                + ("" if row.get("upstream", "model") == "model" else " (oracle upstream)"),
                "T": row["temperature"],
                "episodes": row["episodes"],
                "solved": row["successes"],
                "rate %": f"{100 * row['rate']:.1f}",
                "95% CI %": f"{100 * low:.1f}-{100 * high:.1f}",
                "printed %": f"{100 * row['chain']['answer_printed']:.0f}",
                "boxed %": f"{100 * row['chain']['boxed']:.0f}",
                "lenient %": _percent(row.get("lenient", {}).get("rate")),
                "wall s": f"{row['wall_s']:.0f}",
                "commit": (row.get("commit") or "")[:7],
            }
        )
        for kind, sub in row["per_kind"].items() if len(row["per_kind"]) > 1 else ():
            low, high = sub["ci95"]
            lines.append(
                {
                    "candidate": f"  {kind}",
                    "T": "",
                    "episodes": sub["episodes"],
                    "solved": sub["successes"],
                    "rate %": f"{100 * sub['rate']:.1f}",
                    "95% CI %": f"{100 * low:.1f}-{100 * high:.1f}",
                    "printed %": "",
                    "boxed %": "",
                    "lenient %": "",
                    "wall s": "",
                    "commit": "",
                }
            )
    return lines


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", default="word-easy", help="comma-separated names")
    parser.add_argument("--list", action="store_true", help="print the candidates and exit")
    parser.add_argument("--episodes", type=int, default=64, help="problems per candidate")
    parser.add_argument("--temperatures", default="1.0", help="comma-separated, e.g. 1.0,0.6")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the runner")
    parser.add_argument("--system", default="smollm2-135m")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto: bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), "
        "else float32, as `make demo` chooses; or a dtype name",
    )
    parser.add_argument(
        "--upstream",
        choices=["model", "oracle"],
        default="model",
        help="oracle: scripted problem solver and code executor that print the answer, "
        "to measure the verifier alone",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH, help="results file")
    args = parser.parse_args(argv)

    if args.list:
        for name, spec in CANDIDATES.items():
            print(f"{name}: {json.dumps(spec)}")
        return
    names = parse_variants(parser, args.candidates, list(CANDIDATES))
    temperatures = [float(t) for t in args.temperatures.split(",") if t]
    if args.dtype == "auto":
        args.dtype = native_dtype()

    from mappa_agents.system import AgentSystem

    commit = git_commit()
    system = AgentSystem.from_spec(args.system, list(AGENTS), device="cpu", dtype=args.dtype)
    rows = []
    try:
        for name in names:
            for temperature in temperatures:
                row = measure(system, name, CANDIDATES[name], temperature, args, commit)
                rows.append(row)
                title = f"{name} at temperature {temperature}, {args.upstream} upstream"
                print_table(table([row]), title=title)
                # Written after every row: a long session cut short keeps what it measured.
                write_rows(args.out, merge_rows(load_rows(args.out), [row]))
    finally:
        system.close()
    print_table(table(load_rows(args.out)), title="\nAll rows of " + args.out.name)


def native_dtype() -> str:
    """bfloat16 where the CPU computes it natively, else float32 (as the Makefile does)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) else "float32"


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """The results file: every row measured so far, and the candidate definitions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": RESULTS_NAME,
        "candidates": CANDIDATES,
        "rows": list(rows),
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
