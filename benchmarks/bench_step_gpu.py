"""Whole MAPPA training steps, alone on one GPU, and where their time goes.

Runs ``--steps`` steps of the trainer on MathChat-v0 (three agents, Jupyter sandboxes,
the rules coach, ``process`` credit; SmolLM2-135M unless ``--shape`` names a random
shape or another model) and reports:

- the first step's seconds (it records each agent's decode graphs) and the steady-state
  step: the median of the later steps, split into rollouts, log-prob passes, the
  update, and the rest (``other``: writing rollouts, metrics, the sandbox's cleanup);
- rollout tokens/s next to the policies' own batch throughput on the very same prompts
  (each agent's prompts of the last step, generated again in batches of
  ``rollout_batch_size`` with the same sampling settings, outside the runner);
- update tokens/s next to a plain transformers training step on the very same rows
  (CUDA only; see ``bench_train_gpu``);
- peak GPU memory;
- the decode floor beside the rollout tokens/s (``--decode-floor``, on by default): one
  decode step of the same model at the step's batch (its episodes), captured as a CUDA
  graph and replayed in the same process (:mod:`benchmarks.decode_floor`);
- with ``--sweep-runs R``, a sweep of R runs (the same settings, ``process`` and
  ``outcome`` credit in turn, a seed each) of ``--sweep-steps`` steps in this process
  (:class:`~mappa_train.sweep.Sweep`), timed from building the first run to the end of
  the last: its device minutes, and seconds per run-step.

With ``--rollout-engine vllm`` the agents roll out on in-process vLLM engines (new
weights loaded after every update), and the report adds the compiled Hugging Face
policies' throughput on the same prompts (``hf_same_prompts``), how closely each
engine's log-probs follow its learner's after the last sync (``engine_agreement``) and
whether its weights are the learner's (``engine_weights``).

The ratios compare figures of one process, measured one after the other.

With ``--config FILE`` the steps are a training recipe's (``configs/mathchat-smollm2.yaml``:
its tasks, episodes, token budget, micro-batches, credit and evaluations); the options
given beside it replace the file's values, the others keep them.

Run:  python -m benchmarks.bench_step_gpu --config configs/mathchat-smollm2.yaml --name recipe
      python -m benchmarks.bench_step_gpu                       # SmolLM2, 64 episodes
      python -m benchmarks.bench_step_gpu --micro-batch-tokens 16384 --name step_smollm2_tb
      python -m benchmarks.bench_step_gpu --rollout-engine vllm --name step_smollm2_vllm
      python -m benchmarks.bench_step_gpu --schedule episodes --sweep-runs 4 --name recipe
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import print_table, write_results
from benchmarks.bench_train_gpu import (
    SHAPES,
    free_trainer,
    naive_batches,
    naive_result,
    parameter_counts,
    random_model_dir,
)
from benchmarks.decode_floor import decode_floor


def step_breakdown(wall_s: float, metrics: Mapping[str, Any]) -> dict[str, float]:
    """One step's seconds split into rollout, log-probs, update and the rest.

    ``other = wall - rollout - logprob - update`` (never below 0): what the step spent
    outside generation and the two training phases.
    """
    rollout = float(metrics.get("rollout/seconds") or 0.0)
    logprob = float(metrics.get("train/logprob_seconds") or 0.0)
    update = float(metrics.get("train/update_seconds") or 0.0)
    return {
        "step_s": wall_s,
        "rollout_s": rollout,
        "logprob_s": logprob,
        "update_s": update,
        "other_s": max(0.0, wall_s - rollout - logprob - update),
        "response_tokens": float(metrics.get("rollout/response_tokens") or 0.0),
        "train_tokens": float(metrics.get("train/tokens") or 0.0),
    }


def steady_state(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Medians over the steps after the first (the first records graphs); all steps if one.

    Only the number-valued figures of a step (not its ``compile`` totals).
    """
    later = list(steps[1:]) or list(steps)
    keys = [k for k, v in later[0].items() if isinstance(v, (int, float))]
    return {key: statistics.median(s[key] for s in later) for key in keys}


def compile_totals() -> dict[str, float]:
    """What ``torch.compile`` did in this process so far: graphs traced, seconds spent.

    ``graphs`` counts dynamo's distinct graphs (each is compiled once); ``compile_s`` is
    dynamo's whole frame-compile time (tracing, inductor's codegen and autotuning),
    ``inductor_s`` its inductor part. CUDA graph recordings are not in either.
    """
    from torch._dynamo.utils import calculate_time_spent, counters

    spent = calculate_time_spent()
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "compile_s": round(spent.get("entire_frame_compile", 0.0), 2),
        "inductor_s": round(spent.get("inductor_compile", 0.0), 2),
    }


def held_resources() -> dict[str, int]:
    """What this process holds now: open files and live child processes (kernels, their
    confinement wrappers), so a step or sweep that leaks sandboxes shows it."""
    import psutil

    me = psutil.Process()
    return {"open_files": me.num_fds(), "child_processes": len(me.children(recursive=True))}


def timed_steps(trainer: Any, count: int) -> tuple[float, list[dict[str, float]]]:
    """Set ``trainer`` up and run ``count`` steps without checkpoints; the setup seconds
    and each step's :func:`step_breakdown` (peak GPU memory counts from the first step)
    with the compile totals after it (:func:`compile_totals`, under ``compile``) and
    what the process holds after it (:func:`held_resources`, under ``held``)."""
    import torch

    trainer.save = lambda: None  # speed only: no checkpoints
    started = time.perf_counter()
    trainer.setup()
    setup_s = time.perf_counter() - started
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    steps: list[dict[str, float]] = []
    for index in range(count):
        started = time.perf_counter()
        metrics = trainer.train_step()
        steps.append(step_breakdown(time.perf_counter() - started, metrics))
        print(f"step {index + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in steps[-1].items()))
        steps[-1]["compile"] = compile_totals()
        steps[-1]["held"] = held_resources()
    return setup_s, steps


def policy_throughput(
    trainer: Any, samples: Sequence[Any], policies: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Generate each agent's prompts of ``samples`` again with its policy, in one call.

    Args:
        trainer: The trainer whose agents acted.
        samples: The actions whose prompts are generated again.
        policies: The policy of each agent (default: the ones the agents acted through).

    Returns:
        Seconds, response tokens and tokens/s over all agents, and per agent.
    """
    from mappa_agents.policy import SamplingParams

    config = trainer.config
    params = SamplingParams(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p
    )
    for learner in trainer.learners.values():
        learner.model.eval()  # as for rollouts; the last update left them in train mode
    per_agent: dict[str, Any] = {}
    total_s, total_tokens = 0.0, 0
    for agent, policy in (trainer.policies if policies is None else policies).items():
        prompts = [s.messages for s in samples if s.agent == agent]
        if not prompts:
            continue
        started = time.perf_counter()
        generations = policy.generate(prompts, params)
        seconds = time.perf_counter() - started
        tokens = sum(len(g.response_ids) for g in generations)
        per_agent[agent] = {
            "prompts": len(prompts),
            "seconds": round(seconds, 3),
            "tokens": tokens,
            "tok_s": round(tokens / seconds) if seconds > 0 else None,
        }
        total_s += seconds
        total_tokens += tokens
    return {
        "seconds": round(total_s, 3),
        "tokens": total_tokens,
        "tok_s": round(total_tokens / total_s) if total_s > 0 else None,
        "per_agent": per_agent,
    }


def engine_agreement(trainer: Any, samples: Sequence[Any], limit: int = 16) -> dict[str, Any]:
    """How closely each agent's rollout engine follows its learner after the last sync.

    The engine samples responses to up to ``limit`` of the agent's prompts; the log-prob
    it reports for each sampled token is compared with the learner's and with the frozen
    reference's (the weights before training) on the same tokens, at temperature 1 (the
    engines report the raw model distribution). It tells a synced engine from a stale
    one only once training has moved the learner further from the reference than the
    engine's kernels differ from transformers' (:func:`engine_weights` does not need
    that).

    Returns:
        Per agent: tokens compared, mean and max absolute log-prob difference to the
        learner, and the mean to the reference.
    """
    import torch

    from mappa_agents.policy import SamplingParams
    from mappa_train.logprobs import response_logprobs
    from mappa_train.update import shard_logprobs

    config = trainer.config
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=1.0)
    result: dict[str, Any] = {}
    for agent, learner in trainer.learners.items():
        if learner.engine is None:
            continue
        chosen = [s for s in samples if s.agent == agent][:limit]
        generations = learner.engine.generate([s.messages for s in chosen], params)
        rows = [
            dataclasses.replace(
                s, prompt_ids=g.prompt_ids, response_ids=g.response_ids, logprobs=g.logprobs
            )
            for s, g in zip(chosen, generations)
            if g.response_ids
        ]
        if not rows:
            continue
        engine = torch.zeros((len(rows), max(len(r.response_ids) for r in rows)))
        mask = torch.zeros_like(engine, dtype=torch.bool)
        for i, row in enumerate(rows):
            engine[i, : len(row.logprobs)] = torch.tensor(row.logprobs)
            mask[i, : len(row.logprobs)] = True

        pad_id = learner.policy.pad_token_id
        with torch.no_grad():
            under_learner, under_reference = (
                shard_logprobs(
                    functools.partial(response_logprobs, model, temperature=1.0),
                    rows,
                    config,
                    pad_id=pad_id,
                    device=trainer.device,
                )
                for model in (learner.model, learner.ref_model)
            )
        to_learner = (under_learner - engine).abs()[mask]
        to_reference = (under_reference - engine).abs()[mask]
        result[agent] = {
            "tokens": int(mask.sum()),
            "mean_abs_diff_learner": round(float(to_learner.mean()), 5),
            "max_abs_diff_learner": round(float(to_learner.max()), 5),
            "mean_abs_diff_reference": round(float(to_reference.mean()), 5),
        }
    return result


def parameter_sums(model: Any) -> dict[str, float]:
    """Float64 sum and sum of squares of every parameter element of ``model``.

    Unchanged when a loader fuses or splits tensors (vLLM's fused q/k/v and gate/up
    projections hold the same elements as transformers' separate ones), so an engine's
    sums equal a model's exactly when both hold the same values. (vLLM's CPU backend
    repacks linear weights outside the parameters: compare GPU engines only.)
    """
    import torch

    total, squares = 0.0, 0.0
    with torch.no_grad():
        for _, parameter in model.named_parameters():
            values = parameter.detach().double()
            total += float(values.sum())
            squares += float((values * values).sum())
    return {"sum": total, "sum_squares": squares}


def _worker_parameter_sums(worker: Any) -> dict[str, float]:
    """:func:`parameter_sums` of the model a vLLM worker runs (for ``collective_rpc``)."""
    return parameter_sums(worker.get_model())


def engine_weights(trainer: Any) -> dict[str, Any]:
    """Each in-process vLLM engine's weights against its learner's and the reference's.

    Returns:
        Per agent: the engine's, the learner's and the frozen reference's
        :func:`parameter_sums`, whether the engine's equal the learner's (to 1e-9
        relative), and how many of the learner's weight elements differ from the
        reference's (0 means the check cannot tell a synced engine from a stale one).
    """
    import torch

    result: dict[str, Any] = {}
    for agent, learner in trainer.learners.items():
        llm = getattr(learner.engine, "llm", None)
        if llm is None:
            continue
        engine = llm.collective_rpc(_worker_parameter_sums)[0]
        mine = parameter_sums(learner.model)
        with torch.no_grad():
            changed = sum(
                int((a != b).sum())
                for a, b in zip(learner.model.parameters(), learner.ref_model.parameters())
            )
        result[agent] = {
            "engine": engine,
            "learner": mine,
            "reference": parameter_sums(learner.ref_model),
            "engine_equals_learner": all(
                abs(engine[k] - mine[k]) <= 1e-9 * max(1.0, abs(mine[k])) for k in mine
            ),
            "elements_changed_by_training": changed,
        }
    return result


def timed_sweep(config: Any, work: Path, runs: int, steps: int) -> dict[str, Any]:
    """Train ``runs`` copies of ``config`` for ``steps`` steps as one sweep, timed whole.

    Runs alternate ``process`` and ``outcome`` credit, each with its own seed and
    folder, as a credit test's arms and seeds do. The seconds count from building the
    first run (model loading included) to the last run's last step: a sweep's device
    time on this machine.

    Returns:
        ``runs``, ``steps``, ``seconds``, ``device_minutes``, ``s_per_run_step`` and
        the runs that failed (``failed``, empty when all finished).
    """
    from mappa_train.sweep import Sweep

    configs = {
        f"run{index}": dataclasses.replace(
            config,
            credit_mode=("process", "outcome")[index % 2],
            seed=index,
            steps=steps,
            output_dir=str(work / "sweep" / f"run{index}"),
        )
        for index in range(runs)
    }
    started = time.perf_counter()
    sweep = Sweep.from_configs(configs)
    outcomes = sweep.run()
    seconds = time.perf_counter() - started
    held = held_resources()
    for trainer in sweep.runs.values():
        if trainer.learners:  # a run that failed to set up holds none
            free_trainer(trainer)
    return {
        "held_before_close": held,
        "runs": runs,
        "steps": steps,
        "seconds": round(seconds, 1),
        "device_minutes": round(seconds / 60, 2),
        "s_per_run_step": round(seconds / (runs * steps), 2),
        "failed": [name for name, outcome in outcomes.items() if not outcome.ok],
    }


BENCH_DEFAULTS = {
    "prompts": 32,
    "samples": 2,
    "max_new_tokens": 384,
    "micro_batch": 4,
    "micro_batch_tokens": 0,
    "schedule": "ticks",
    "sandbox": "jupyter",
    "rollout_engine": "hf",
    "vllm_options": "{}",
    "compile_decode": True,
    "dtype": "auto",
}
"""The benchmark's own settings where neither an option nor ``--config`` gives one."""

# Option name -> TrainConfig field, for the options a recipe may also set.
CONFIG_FIELDS = {
    "prompts": "prompts_per_step",
    "samples": "samples_per_prompt",
    "max_new_tokens": "max_new_tokens",
    "micro_batch": "micro_batch_size",
    "micro_batch_tokens": "micro_batch_tokens",
    "schedule": "rollout_schedule",
    "rollout_engine": "rollout_engine",
    "compile_decode": "compile_decode",
    "dtype": "dtype",
}


def shape_name(args: argparse.Namespace) -> str:
    """The model the report names: ``--shape``, else the config's, else SmolLM2."""
    if args.shape:
        return args.shape
    if args.config:
        from mappa_train.config import read_config_file

        return str(read_config_file(args.config).get("system", "smollm2-135m"))
    return "smollm2-135m"


def step_config(args: argparse.Namespace, work: Path) -> tuple[Any, str]:
    """The :class:`~mappa_train.config.TrainConfig` the timed steps run, and its model.

    Without ``--config``: MathChat-v0 on generated tasks with the rules coach and
    ``process`` credit, every episode in flight at once, the options or
    :data:`BENCH_DEFAULTS`. With it: the file's recipe, the options given replacing its
    values; the timed trainer never checkpoints, logs to TensorBoard or shows progress,
    and its first evaluation is left out (the steps are timed, a sweep keeps the
    recipe's evaluations).
    """
    from mappa_agents.models import resolve_model
    from mappa_train.config import TrainConfig

    shape = shape_name(args)
    random_shape = shape in SHAPES
    system = (
        str(random_model_dir(shape, work / "model")) if random_shape else str(resolve_model(shape))
    )
    given = {option: getattr(args, option) for option in CONFIG_FIELDS}
    if args.vllm_options is not None:
        given["vllm_options"] = args.vllm_options
    fixed: dict[str, Any] = {
        "system": system,
        "steps": args.steps,
        "save_every": 0,
        "tensorboard": False,
        "progress": False,
        "output_dir": str(work / "run"),
    }
    if args.config:
        fields = {CONFIG_FIELDS.get(k, k): v for k, v in given.items() if v is not None}
        if "vllm_options" in fields:
            fields["vllm_options"] = json.loads(fields["vllm_options"])
        config = TrainConfig.from_file(args.config, **fields, **fixed)
        if args.sandbox is not None:
            sandbox = None if args.sandbox == "none" else args.sandbox
            config = dataclasses.replace(
                config, env_options={**config.env_options, "sandbox": sandbox}
            )
        if args.train_truncated:
            config = dataclasses.replace(config, mask_truncated=False)
        return config, system
    settings = {k: BENCH_DEFAULTS[k] if v is None else v for k, v in given.items()}
    settings.setdefault("vllm_options", BENCH_DEFAULTS["vllm_options"])
    sandbox = args.sandbox or BENCH_DEFAULTS["sandbox"]
    episodes = settings["prompts"] * settings["samples"]
    config = TrainConfig(
        env="MathChat-v0",
        env_options={"tasks": "gen:256", "sandbox": None if sandbox == "none" else sandbox},
        coach="rules",
        credit_mode="process",
        prompts_per_step=settings["prompts"],
        samples_per_prompt=settings["samples"],
        concurrency=episodes,
        max_new_tokens=settings["max_new_tokens"],
        # Random weights never emit EOS: train on length-cut responses there.
        mask_truncated=not (random_shape or args.train_truncated),
        micro_batch_size=settings["micro_batch"],
        micro_batch_tokens=settings["micro_batch_tokens"],
        rollout_schedule=settings["schedule"],
        compile_decode=settings["compile_decode"],
        rollout_engine=settings["rollout_engine"],
        vllm_options=json.loads(settings["vllm_options"]),
        gradient_checkpointing=False,
        dtype=settings["dtype"],
        **fixed,
    )
    return config, system


def make_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape",
        default=None,
        help="a model spec or directory, or a random shape: 135m / 0.5b / 1.5b / 4b "
        "(default: the config's system, else smollm2-135m)",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="a training recipe (YAML/JSON) whose steps to time; options given here win",
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="steps to run (the first records graphs)"
    )
    # Left unset (None), these take the config's value, or without one the defaults below.
    parser.add_argument("--prompts", type=int, default=None, help="default 32")
    parser.add_argument("--samples", type=int, default=None, help="default 2")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 384")
    parser.add_argument("--micro-batch", type=int, default=None, help="rows per micro-batch (4)")
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=None, help="token-budget micro-batches (0: rows)"
    )
    parser.add_argument(
        "--schedule", choices=("ticks", "continuous", "episodes"), default=None, help="ticks"
    )
    parser.add_argument(
        "--sandbox", default=None, help="the env's sandbox: jupyter (default), or none (no kernels)"
    )
    parser.add_argument(
        "--train-truncated",
        action="store_true",
        help="train on responses cut by the length limit (always for random-weight shapes)",
    )
    parser.add_argument("--rollout-engine", choices=("hf", "vllm"), default=None, help="hf")
    parser.add_argument(
        "--vllm-options", default=None, help="JSON object of vllm.LLM arguments (vllm engine)"
    )
    parser.add_argument(
        "--no-compile-decode", dest="compile_decode", action="store_const", const=False
    )
    parser.add_argument("--dtype", default=None, help="auto")
    parser.add_argument("--naive-repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=796.0)
    parser.add_argument(
        "--decode-floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the model's decode step at the step's batch (a CUDA graph on a GPU)",
    )
    parser.add_argument("--sweep-runs", type=int, default=0, help="runs of a timed sweep")
    parser.add_argument("--sweep-steps", type=int, default=2, help="steps of each sweep run")
    parser.add_argument("--name", default=None, help="results file name (default step_<shape>)")
    parser.add_argument(
        "--out", default=os.environ.get("OUT", str(Path("benchmarks") / "results" / "gpu"))
    )
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = make_parser().parse_args(argv)

    import torch

    from mappa_agents.trajectory import load_jsonl
    from mappa_train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="mappa-bench-step-"))
    config, system = step_config(args, work)
    shape = shape_name(args)
    episodes = config.prompts_per_step * config.samples_per_prompt
    trainer = Trainer(config)
    setup_s, steps = timed_steps(trainer, args.steps)
    # The last step's actions, read back from the rollouts the step wrote.
    samples = load_jsonl(trainer.out / "rollouts" / f"step-{trainer.step - 1:06d}.jsonl")
    engine = policy_throughput(trainer, samples)
    print(f"policies on the same prompts: {engine['tok_s']} tok/s")
    hf: dict[str, Any] = {}
    agreement: dict[str, Any] = {}
    weights: dict[str, Any] = {}
    if config.rollout_engine == "vllm":
        agreement = engine_agreement(trainer, samples)
        print(f"engine agreement: {agreement}")
        weights = engine_weights(trainer)
        print(f"engine weights: {weights}")
        # The graph-decoding HF policies the agents would act through without vLLM. A
        # call records graphs for the batch shapes it meets, so the same prompts run twice
        # and the second call is the figure (the first call's seconds are kept beside it).
        hf_policies = {a: learner.policy for a, learner in trainer.learners.items()}
        first_call = policy_throughput(trainer, samples, hf_policies)
        hf = policy_throughput(trainer, samples, hf_policies)
        hf["first_call_seconds"] = first_call["seconds"]
        print(f"graph-decoding HF on the same prompts: {hf['tok_s']} tok/s")
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    first_model = next(iter(trainer.learners.values())).model
    floor: dict[str, Any] = {}
    if args.decode_floor:
        # The step's batch: every episode has a turn of each agent in flight at once.
        context = 2 * max(64, config.max_new_tokens)
        floor = decode_floor(first_model, episodes, context)
        print(f"decode floor: {floor}")
    body, head = parameter_counts(first_model)
    del first_model
    agents = list(trainer.agents)
    free_trainer(trainer)
    del trainer

    steady = steady_state(steps)
    rollout_tok_s = steady["response_tokens"] / steady["rollout_s"] if steady["rollout_s"] else None
    update_tok_s = steady["train_tokens"] / steady["update_s"] if steady["update_s"] else None
    naive: dict[str, Any] = {}
    if torch.cuda.is_available():
        rows, tokens = naive_batches(samples, agents, 16, config.mask_truncated)
        naive = naive_result(
            system,
            rows,
            max(1, config.train_batch_size // 16),
            args.naive_repeats,
            tokens,
            body + head,
            args.peak_tflops * 1e12,
        )
    summary = {
        "shape": shape,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        # What the steps ran with (the model's and the run's folders are this machine's).
        "train_config": {
            k: v for k, v in config.to_dict().items() if k not in ("system", "output_dir")
        },
        "episodes_per_step": episodes,
        "setup_s": round(setup_s, 2),
        "first_step_s": round(steps[0]["step_s"], 2),
        # torch.compile's share of the first step, and whether later steps compiled more.
        "first_step_compile": steps[0].get("compile"),
        "last_step_compile": steps[-1].get("compile"),
        "steady_step": {k: round(v, 3) for k, v in steady.items()},
        "steps": steps,
        "rollout_tok_s": round(rollout_tok_s) if rollout_tok_s else None,
        "policy_same_prompts": engine,
        "rollout_vs_policy": round(rollout_tok_s / engine["tok_s"], 3)
        if rollout_tok_s and engine["tok_s"]
        else None,
        "decode_floor": floor or None,
        "rollout_vs_floor": round(rollout_tok_s / floor["tokens_per_s"], 3)
        if rollout_tok_s and floor.get("tokens_per_s")
        else None,
        "sweep": None,
        "hf_same_prompts": hf or None,
        "vllm_vs_hf": round(engine["tok_s"] / hf["tok_s"], 3)
        if hf.get("tok_s") and engine["tok_s"]
        else None,
        "engine_agreement": agreement or None,
        "engine_weights": weights or None,
        "update_tok_s": round(update_tok_s) if update_tok_s else None,
        "naive_same_rows": naive,
        "update_vs_naive": round(update_tok_s / naive["tok_s"], 3)
        if update_tok_s and naive.get("tok_s")
        else None,
        "peak_memory_gib": None if peak_gib is None else round(peak_gib, 2),
    }
    name = args.name or f"step_{Path(shape).name.replace('-135m', '')}"
    # Written before the sweep and again after it: a sweep stopped by a time limit (a GPU
    # call's) still leaves the step figures.
    write_results(name, summary, Path(args.out))
    sweep = timed_sweep(config, work, args.sweep_runs, args.sweep_steps) if args.sweep_runs else {}
    if sweep:
        summary["sweep"] = sweep
        write_results(name, summary, Path(args.out))
    first_compile = steps[0].get("compile") or {}
    print_table(
        [
            {"what": "first step s", "value": summary["first_step_s"]},
            {"what": "  torch.compile s", "value": first_compile.get("compile_s")},
            {"what": "  graphs compiled", "value": first_compile.get("graphs")},
            {"what": "steady step s", "value": round(steady["step_s"], 2)},
            {"what": "  rollout s", "value": round(steady["rollout_s"], 2)},
            {"what": "  log-prob s", "value": round(steady["logprob_s"], 2)},
            {"what": "  update s", "value": round(steady["update_s"], 2)},
            {"what": "  other s", "value": round(steady["other_s"], 2)},
            {"what": "rollout tok/s", "value": summary["rollout_tok_s"]},
            {"what": "policy tok/s, same prompts", "value": engine["tok_s"]},
            {"what": "HF tok/s (graph decoding), same prompts", "value": hf.get("tok_s")},
            {
                "what": f"decode floor tok/s ({floor.get('method', 'off')})",
                "value": floor.get("tokens_per_s"),
            },
            {"what": "  rollout / floor", "value": summary["rollout_vs_floor"]},
            {"what": "sweep device minutes", "value": sweep.get("device_minutes")},
            {"what": "  s per run-step", "value": sweep.get("s_per_run_step")},
            {"what": "update tok/s", "value": summary["update_tok_s"]},
            {"what": "plain step tok/s, same rows", "value": naive.get("tok_s")},
            {"what": "peak GiB", "value": summary["peak_memory_gib"]},
        ],
        title=f"MAPPA step, {shape}, {episodes} episodes",
    )
    shutil.rmtree(work, ignore_errors=True)
    return summary


if __name__ == "__main__":
    main()
