"""What a rollout step costs besides generation, on CPU, with an engine that answers at once.

The rollout phase of ``bench_vs_trl`` (``CharShare-v0``, one writer, one turn, the rules
coach, vLLM rollouts) is driven here the way mappa's trainer drives it: one
:class:`~mappa_agents.runner.RolloutRunner` kept across steps, ``concurrency`` equal to
the samples per step, the ``ticks`` schedule, each step's tasks repeated
``--samples-per-prompt`` times, a seed per step. The policy is the real
:class:`~mappa_agents.vllm_policy.VLLMPolicy` (chat template and tokenisation of every
prompt, sampling settings per request, token ids and log-probs read back from vLLM's
outputs) over a stand-in ``vllm.LLM`` whose ``generate`` returns at once a fixed reply of
``--max-new-tokens`` random ``w<id>`` words with one log-prob per token, shaped like
vLLM's ``RequestOutput``. The tokenizer is the random-weight shapes' word-level one
(:func:`benchmarks.bench_train_gpu.word_level_tokenizer`), so prompts and replies are
those of ``bench_vs_trl --model 0.5b``.

So every second measured is mappa's own work around the engine: environment resets and
steps, the rules coach, prompts, the policy's work before and after ``llm.generate``,
the runner's scheduling, and (after the rollout, as the trainer does) the JSONL write
of the step's actions. Per size it prints and records the median over ``--steps``
timed steps (after ``--warmup-steps``) of:

- ``rollout_s``: the runner's ``run`` (the trainer's ``rollout/seconds`` less the engine),
  and ``best_s`` the fastest step's (a busy machine only slows steps down);
- ``cpu_s``: the process's CPU seconds during the rollout (all its threads);
- ``policy_s``: the policy's ``generate`` around the instant engine (in its worker thread);
- ``env_runner_s``: the rest of the rollout (environments, coach, runner);
- ``jsonl_s``: ``save_jsonl`` of the step's actions (the trainer's, after the rollout);
- ``ms_per_sample``: ``rollout_s`` per sample.

``--profile N`` also prints the ``N`` functions of most own time over one step
(cProfile of the event loop and of the policy's worker thread, merged).

Run:  python -m benchmarks.bench_rollout_overhead [--samples 64,256] [--profile 25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import random
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import mappa_env
from benchmarks._common import RESULTS_DIR, parse_sizes, print_table, write_results
from benchmarks.bench_train_gpu import VOCAB, word_level_tokenizer
from benchmarks.bench_vs_trl import ENV_ENTRY
from mappa_agents.policy import SamplingParams
from mappa_agents.runner import RolloutRunner, derive_seed
from mappa_agents.system import AgentSystem
from mappa_agents.trajectory import EpisodeResult, save_jsonl
from mappa_env.coach import make_coach

#: The first id past the word-level tokenizer's special tokens.
FIRST_WORD_ID = 6


# ------------------------------------------------------------------ the instant engine


class _Logprob:
    """vLLM's ``Logprob``: what ``VLLMPolicy`` reads of it."""

    __slots__ = ("logprob",)

    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


def instant_reply(max_new_tokens: int, vocab: int, seed: int = 0) -> types.SimpleNamespace:
    """A ``CompletionOutput``-shaped reply of ``max_new_tokens`` random words, cut by length.

    One per run, shared by every request: building it is the engine's work, not mappa's.
    """
    rng = random.Random(seed)
    ids = [rng.randrange(FIRST_WORD_ID, vocab) for _ in range(max_new_tokens)]
    return types.SimpleNamespace(
        token_ids=ids,
        logprobs=[{token: _Logprob(-11.9)} for token in ids],
        text=" ".join(f"w{token}" for token in ids),
        finish_reason="length",
        stop_reason=None,
    )


def instant_vllm(tokenizer: Any, reply: types.SimpleNamespace) -> types.ModuleType:
    """A stand-in ``vllm`` module whose ``LLM.generate`` answers every prompt with ``reply``."""

    class InstantLLM:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

        def get_tokenizer(self) -> Any:
            return tokenizer

        def generate(self, requests: Sequence[Any], sampling: Any, use_tqdm: bool = False) -> list:
            return [
                types.SimpleNamespace(outputs=[reply], prompt_token_ids=r["prompt_token_ids"])
                for r in requests
            ]

        def reset_prefix_cache(self) -> None:
            return None

    module = types.ModuleType("vllm")
    module.LLM = InstantLLM  # type: ignore[attr-defined]
    # vLLM's SamplingParams checks its arguments; a plain record of them costs less, so
    # the figures leave out that part of the engine's own work.
    module.SamplingParams = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def vllm_module(module: types.ModuleType) -> Iterator[None]:
    """``module`` as ``vllm`` while a policy is built (it keeps the module it imported)."""
    saved = sys.modules.get("vllm")
    sys.modules["vllm"] = module
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("vllm", None)
        else:
            sys.modules["vllm"] = saved


class TimedPolicy:
    """Wraps a policy: the seconds each ``generate`` took, and an optional profile of it."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = policy.name
        self.seconds: list[float] = []
        self.profile: cProfile.Profile | None = None

    def generate(self, batch: Sequence[Any], params: SamplingParams) -> list[Any]:
        """The wrapped policy's ``generate``, timed (and profiled when asked)."""
        started = time.perf_counter()
        if self.profile is not None:
            self.profile.enable()
        try:
            return self.policy.generate(batch, params)
        finally:
            if self.profile is not None:
                self.profile.disable()
            self.seconds.append(time.perf_counter() - started)

    async def agenerate(self, batch: Sequence[Any], params: SamplingParams) -> list[Any]:
        """:meth:`generate` in a worker thread, as the vLLM policy runs it."""
        return await asyncio.to_thread(self.generate, batch, params)

    def close(self) -> None:
        """Close the wrapped policy."""
        self.policy.close()


# ------------------------------------------------------------------ the rollouts


def make_policy(vocab: int, max_new_tokens: int) -> TimedPolicy:
    """The vLLM policy over the instant engine, with the shapes' word-level tokenizer."""
    module = instant_vllm(word_level_tokenizer(vocab), instant_reply(max_new_tokens, vocab))
    with vllm_module(module):
        from mappa_agents.vllm_policy import VLLMPolicy

        policy = VLLMPolicy("instant", name="writer:vllm:instant")
    return TimedPolicy(policy)


def make_runner(policy: TimedPolicy, samples: int, num_tasks: int) -> RolloutRunner:
    """The runner as mappa's trainer builds it for ``bench_vs_trl``'s mappa run."""
    coach = make_coach("rules")  # one coach for every environment, as the trainer shares it

    def env_factory() -> Any:
        return mappa_env.make(
            ENV_ENTRY,
            coach=coach,
            credit_mode="process",
            outcome_weight=0.5,
            backprop_decay=0.5,
            isolation="none",
            num_tasks=num_tasks,
            prompt_style="words",
            target="7",
        )

    return RolloutRunner(
        env_factory,
        AgentSystem({"writer": policy}),
        concurrency=samples,
        progress=False,
        keep_envs=True,
        schedule="ticks",
    )


def step_options(step: int, prompts: int, per_prompt: int, num_tasks: int) -> list[dict]:
    """Reset options of one step: ``prompts`` tasks, each ``per_prompt`` times in a row."""
    return [
        {"task_id": f"write-{(step * prompts + j) % num_tasks}"}
        for j in range(prompts)
        for _ in range(per_prompt)
    ]


def measure(
    samples: int,
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    warmup_steps: int,
    steps: int,
    vocab: int,
    profile_top: int = 0,
) -> dict[str, Any]:
    """Time ``warmup_steps + steps`` rollout steps of ``samples`` episodes; medians.

    Returns:
        The row's figures (see the module docstring) and each timed step's.
    """
    if samples % samples_per_prompt:
        raise ValueError(f"{samples} samples are not whole groups of {samples_per_prompt}")
    prompts = samples // samples_per_prompt
    total = warmup_steps + steps + (1 if profile_top else 0)
    num_tasks = prompts * total
    layout = (prompts, samples_per_prompt, num_tasks)
    policy = make_policy(vocab, max_new_tokens)
    runner = make_runner(policy, samples, num_tasks)
    runner.sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0)
    timed: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="mappa-rollout-overhead-") as scratch:
            for step in range(warmup_steps + steps):
                figures = run_step(runner, policy, step, *layout, scratch)
                if step >= warmup_steps:
                    timed.append(figures)
            if profile_top:
                print_profile(runner, policy, total - 1, *layout, profile_top)
    finally:
        runner.close()
        policy.close()
    row: dict[str, Any] = {"samples": samples}
    for key in ("rollout_s", "cpu_s", "policy_s", "env_runner_s", "jsonl_s"):
        row[key] = round(statistics.median(f[key] for f in timed), 4)
    row["best_s"] = round(min(f["rollout_s"] for f in timed), 4)
    row["ms_per_sample"] = round(1000 * row["rollout_s"] / samples, 3)
    return {"row": row, "steps": timed}


def run_step(
    runner: RolloutRunner,
    policy: TimedPolicy,
    step: int,
    prompts: int,
    per_prompt: int,
    num_tasks: int,
    scratch: str,
) -> dict[str, float]:
    """One step: the rollout, then the JSONL write of its actions (as the trainer does)."""
    options = step_options(step, prompts, per_prompt, num_tasks)
    policy.seconds.clear()
    started, cpu_started = time.perf_counter(), time.process_time()
    episodes = runner.run(len(options), options, seed=derive_seed(0, "rollout", step))
    rollout_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    check_episodes(episodes, len(options))
    started = time.perf_counter()
    save_jsonl(Path(scratch) / f"step-{step:06d}.jsonl", [a for e in episodes for a in e.actions])
    jsonl_s = time.perf_counter() - started
    policy_s = sum(policy.seconds)
    return {
        "rollout_s": rollout_s,
        "cpu_s": cpu_s,
        "policy_s": policy_s,
        "env_runner_s": rollout_s - policy_s,
        "jsonl_s": jsonl_s,
    }


def check_episodes(episodes: Sequence[EpisodeResult], expected: int) -> None:
    """Every episode ran one scored action: a broken run must not pass for a fast one."""
    actions = [a for e in episodes for a in e.actions]
    if len(episodes) != expected or len(actions) != expected:
        raise RuntimeError(f"{len(episodes)} episodes, {len(actions)} actions for {expected}")
    if any(e.aborted or a.trainable_reward is None for e in episodes for a in e.actions):
        raise RuntimeError("an episode aborted or an action has no valid reward")


def print_profile(
    runner: RolloutRunner,
    policy: TimedPolicy,
    step: int,
    prompts: int,
    per_prompt: int,
    num_tasks: int,
    top: int,
) -> None:
    """Profile one more step (event loop and the policy's thread) and print the top ``top``."""
    options = step_options(step, prompts, per_prompt, num_tasks)
    loop_profile, policy.profile = cProfile.Profile(), cProfile.Profile()
    loop_profile.enable()
    try:
        runner.run(len(options), options, seed=derive_seed(0, "rollout", step))
    finally:
        loop_profile.disable()
    stats = pstats.Stats(loop_profile).add(policy.profile)
    policy.profile = None
    print(f"--- profile of one step of {len(options)} samples (own time)")
    stats.sort_stats("tottime").print_stats(top)


# ------------------------------------------------------------------ the command


def make_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--samples", default="64,256", help="samples per step, comma-separated sizes")
    add("--samples-per-prompt", type=int, default=8)
    add("--max-new-tokens", type=int, default=256, help="tokens of the instant reply")
    add("--warmup-steps", type=int, default=1)
    add("--steps", type=int, default=5, help="timed steps (median)")
    add("--vocab", type=int, default=VOCAB, help="the word-level vocabulary (the shapes')")
    add("--profile", type=int, default=0, metavar="N", help="print the top N functions")
    add("--name", default="rollout_overhead", help="results file name")
    add("--out", default=str(RESULTS_DIR), help="results directory")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure every size, print the table and write the JSON; returns it."""
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 0:
        parser.error("--steps must be >= 1 and --warmup-steps >= 0")
    runs = [
        measure(
            samples,
            samples_per_prompt=args.samples_per_prompt,
            max_new_tokens=args.max_new_tokens,
            warmup_steps=args.warmup_steps,
            steps=args.steps,
            vocab=args.vocab,
            profile_top=args.profile,
        )
        for samples in parse_sizes(parser, args.samples)
    ]
    rows = [run["row"] for run in runs]
    summary = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "engine": "instant stand-in of vllm.LLM (no generation): mappa's work only",
        "rows": rows,
        "steps": {str(row["samples"]): run["steps"] for row, run in zip(rows, runs)},
    }
    write_results(args.name, summary, Path(args.out))
    print_table(rows, title="Rollout step without the engine (CharShare-v0, rules coach, ticks)")
    return summary


if __name__ == "__main__":
    main()
