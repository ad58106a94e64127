"""Recorded training runs that a change to the trainer must reproduce.

Each configuration trains the tiny in-process model for two steps on a toy pipeline and
keeps every logged number (timings aside), a summary of how far each trained agent's
weights moved (the norm of each tensor's update and one random projection of the whole
update), and a digest of the final weights. ``tests/golden/metrics.json`` holds these
figures as the trainer produced them before a change; ``tests/test_golden_metrics.py``
trains again and compares.

Floating-point results are not bit-exact across CPUs: torch picks its vector kernels
(AVX2, AVX-512) and MKL its code path by the processor, which reorders sums. Figures are
therefore compared with a tolerance measured between such kernels on one machine
(``--spread``, written to ``tests/golden/spread.json``): wider than any difference seen
there, far narrower than what a change to the algorithm moves. Bit-exactness is checked
where it means something: between two runs on the same machine (a killed and resumed
run against an uninterrupted one in the same test), and by ``--check --exact`` on the
machine that recorded the file.

    python -m tests.golden_runs --write        # record (after a deliberate change)
    python -m tests.golden_runs --check        # compare within the tolerance
    python -m tests.golden_runs --check --exact
    python -m tests.golden_runs --spread       # measure differences between CPU kernels

A change that alters training on purpose records the file again in the same commit and
says why; any other difference is a bug.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

GOLDEN_FILE = Path(__file__).resolve().parent / "golden" / "metrics.json"
SPREAD_FILE = GOLDEN_FILE.with_name("spread.json")
CREDIT_MODES = ("process", "outcome", "mixed", "backprop")
#: Metric names holding wall-clock measurements: never equal between two runs.
_TIMING_MARKERS = ("seconds", "per_s")


def _settings(out: Path, model_dir: Path, **changes: Any) -> Any:
    from mappa_train.config import TrainConfig

    settings: dict[str, Any] = {
        "env": "LetterPair-v0",
        "system": str(model_dir),
        "steps": 2,
        "prompts_per_step": 2,
        "samples_per_prompt": 4,
        "concurrency": 8,
        "max_new_tokens": 8,
        "lr": 1e-2,
        "kl_coef": 0.05,
        "mask_truncated": False,
        "train_batch_size": 4,
        "micro_batch_size": 2,
        "warmup_ratio": 0.0,
        "gradient_checkpointing": False,
        "save_every": 0,
        "keep_checkpoints": 1,
        "tensorboard": False,
        "progress": False,
        "device": "cpu",
        "dtype": "float32",
        "output_dir": str(out),
        "seed": 3,
    }
    settings.update(changes)
    return TrainConfig(**settings)


#: Relative and absolute tolerance of a recorded figure: ``|a - b| <= RTOL * max(|a|, |b|)
#: + ATOL``. Measured with ``--spread`` on one Intel Xeon (AVX-512), every configuration
#: under torch's AVX2 and AVX-512 kernels, MKL's AVX2 path and one or two OpenMP threads
#: (``spread.json``): the largest relative difference of any figure was 2.2e-3, a step-2
#: loss under ``backprop`` (a sum of terms that cancel); every other figure differed by
#: at most 2.3e-4, and no count or sampled token changed. A step-1 gradient norm differed
#: by 1.8e-5 between these kernels and by 1.1e-5 between two machines (an Intel Xeon and an
#: AMD EPYC). The tolerance leaves a factor of 4.6 above the largest measured difference; a
#: 1% change of the learning rate moves more than 20 figures by 1e-2 to 1
#: (``test_a_one_percent_change_of_the_learning_rate_is_far_outside_the_tolerance``).
RTOL = 1e-2
ATOL = 1e-5


def weights_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 over a state dict's tensors (name, dtype, shape, bytes), in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(-1).view(dtype=_byte_dtype()).numpy().tobytes())
    return digest.hexdigest()


def _byte_dtype() -> Any:
    import torch

    return torch.uint8


def update_summary(state: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float]:
    """How far training moved each tensor, as numbers a tolerance can compare.

    For every tensor ``w`` (name order) with base value ``w0`` (zero where the base has no
    such tensor, as for LoRA adapters) the update is ``d = w - w0``; the summary holds
    ``||d||_2`` per tensor and ``<d, r>`` over all tensors, ``r`` a fixed standard-normal
    direction (seed 0), so an update of the right size in a wrong direction shows too.
    """
    import torch

    generator = torch.Generator().manual_seed(0)
    summary: dict[str, float] = {}
    projection = 0.0
    for name in sorted(state):
        weight = state[name].detach().to("cpu", torch.float64)
        start = base.get(name)
        update = weight - start.to(torch.float64) if start is not None else weight
        summary[f"norm/{name}"] = float(update.norm())
        direction = torch.randn(update.shape, generator=generator, dtype=torch.float64)
        projection += float((update * direction).sum())
    summary["projection"] = projection
    return summary


def comparable(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A step's metrics without timings (numbers, ``None`` and strings kept as logged)."""
    return {
        key: value
        for key, value in metrics.items()
        if not any(marker in key for marker in _TIMING_MARKERS)
    }


def _trainer(root: Path, name: str, model_dir: Path, **changes: Any) -> Any:
    """A trainer of the toy pair (environments paid under the config's credit)."""
    from mappa_train.trainer import make_trainer
    from tests.toy_env import LetterPairEnv

    config = _settings(root / name, model_dir, **changes)
    envs = functools.partial(LetterPairEnv, credit_mode=config.credit_mode)
    return make_trainer(config, env_factory=envs, eval_env_factory=envs)


def _train(trainer: Any, model_dir: Path) -> dict[str, Any]:
    """Train to the end; the figures and each trained agent's final weights.

    The weights are read just before the trainer closes: engines and learner groups
    are gone after. Where an agent acts through engines its group's weights are read,
    else the trainer's own copy (which after each sync equals its group's). Updates are
    measured from the base model every agent starts from.
    """
    from safetensors.torch import load_file

    base = load_file(str(Path(model_dir) / "model.safetensors"))
    weights: dict[str, str] = {}
    updates: dict[str, dict[str, float]] = {}
    close = trainer.close

    def read_then_close() -> None:
        for agent, learner in sorted(trainer.learners.items()):
            group = getattr(learner, "group", None)
            state = group.weights() if learner.model is None else learner.model.state_dict()
            weights[agent] = weights_digest(state)
            updates[agent] = update_summary(state, base)
        close()

    trainer.close = read_then_close
    history = trainer.train()
    return {
        "metrics": [comparable(m) for m in history],
        "weights": weights,
        "updates": updates,
    }


def train_once(root: Path, name: str, model_dir: Path, **changes: Any) -> dict[str, Any]:
    """Train one configuration of the recorded settings with ``changes`` in ``root/name``."""
    return _train(_trainer(root, name, model_dir, **changes), model_dir)


def _one_process(mode: str, root: Path, model_dir: Path) -> dict[str, Any]:
    return _train(_trainer(root, f"one-{mode}", model_dir, credit_mode=mode), model_dir)


def _ray(mode: str, root: Path, model_dir: Path) -> dict[str, Any]:
    ray = {"distributed": "ray", "ranks_per_agent": 2}
    return _train(_trainer(root, f"ray-{mode}", model_dir, credit_mode=mode, **ray), model_dir)


def _resumed(root: Path, model_dir: Path) -> dict[str, Any]:
    """Killed after its first step's checkpoint (as ``train(until=1)`` leaves it), resumed."""
    first = _trainer(root, "resume", model_dir, save_every=1)
    first.train(until=1)
    first.close()
    return _train(_trainer(root, "resume", model_dir, save_every=1), model_dir)


RUNS: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    **{
        f"one_process/{mode}": (lambda root, model, m=mode: _one_process(m, root, model))
        for mode in CREDIT_MODES
    },
    **{f"ray/{mode}": (lambda root, model, m=mode: _ray(m, root, model)) for mode in CREDIT_MODES},
    "one_process/lora": lambda root, model: _train(
        _trainer(root, "lora", model, lora_rank=4), model
    ),
    "one_process/frozen_writer": lambda root, model: _train(
        _trainer(root, "frozen", model, train_agents=["editor"]), model
    ),
    "one_process/resumed": _resumed,
    "ray/engines": lambda root, model: _train(
        _trainer(root, "engines", model, distributed="ray", ranks_per_agent=2, engines_per_agent=1),
        model,
    ),
}
"""Every recorded configuration, by name: ``"<backend>/<credit mode>"``."""


def run(names: list[str] | None = None) -> dict[str, Any]:
    """Train the named configurations (all by default) and return their figures."""
    from mappa_agents.tiny_models import tiny_model_dir

    chosen = list(RUNS) if names is None else names
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mappa-golden-") as tmp:
        root = Path(tmp)
        model_dir = tiny_model_dir(root / "model")
        needs_ray = any(name.startswith("ray/") for name in chosen)
        if needs_ray:
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            for name in chosen:
                results[name] = RUNS[name](root, model_dir)
        finally:
            if needs_ray:
                ray.shutdown()
    return results


def close_enough(a: Any, b: Any, *, exact: bool = False) -> bool:
    """Whether two recorded values agree: floats within the tolerance, the rest equal."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b if exact else abs(a - b) <= RTOL * max(abs(a), abs(b)) + ATOL
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not exact:
        # A count logged as int on one run and float on another still agrees when equal.
        return a == b
    return a == b and type(a) is type(b)


def _figures(run_result: Mapping[str, Any]) -> dict[str, Any]:
    """Every comparable figure of one run, keyed ``step N key`` and ``update agent key``."""
    figures: dict[str, Any] = {}
    for step, metrics in enumerate(run_result["metrics"], start=1):
        for key, value in metrics.items():
            figures[f"step {step} {key}"] = value
    for agent, summary in run_result.get("updates", {}).items():
        for key, value in summary.items():
            figures[f"update {agent} {key}"] = value
    return figures


def differences(
    got: Mapping[str, Any], expected: Mapping[str, Any], *, exact: bool = False
) -> list[str]:
    """Every figure of ``got`` that disagrees with its recorded value, as readable lines.

    Args:
        got: Results of :func:`run`, by configuration name.
        expected: Recorded results, by configuration name.
        exact: Compare bit for bit, final-weight digests included (the same machine);
            otherwise floats within ``RTOL``/``ATOL`` and the digests are not compared.
    """
    problems: list[str] = []
    for name, want in expected.items():
        have = got.get(name)
        if have is None:
            problems.append(f"{name}: not run")
            continue
        if exact and have["weights"] != want["weights"]:
            problems.append(f"{name}: final weights differ: {have['weights']} vs {want['weights']}")
        if len(have["metrics"]) != len(want["metrics"]):
            problems.append(f"{name}: {len(have['metrics'])} steps vs {len(want['metrics'])}")
        if sorted(have.get("updates", {})) != sorted(want.get("updates", {})):
            problems.append(f"{name}: trained agents {sorted(have.get('updates', {}))} vs "
                            f"recorded {sorted(want.get('updates', {}))}")  # fmt: skip
        mine, theirs = _figures(have), _figures(want)
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key, "<absent>"), theirs.get(key, "<absent>")
            if not close_enough(a, b, exact=exact):
                problems.append(f"{name} {key}: {a!r} vs recorded {b!r}")
    return problems


#: Ways one machine computes as another CPU would: torch's kernel choice
#: (``ATEN_CPU_CAPABILITY``), MKL's code path and the OpenMP thread count.
CPU_VARIANTS: dict[str, dict[str, str]] = {
    "default, 1 thread": {"OMP_NUM_THREADS": "1"},
    "default, 2 threads": {"OMP_NUM_THREADS": "2"},
    "torch AVX2": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"},
    "torch and MKL AVX2": {
        "OMP_NUM_THREADS": "1",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "MKL AVX2": {"OMP_NUM_THREADS": "1", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def spread(names: list[str]) -> dict[str, Any]:
    """Train ``names`` under every CPU variant (a child process each) and compare.

    Returns the runs' largest relative and absolute difference of any float figure
    from the first variant's, per configuration and overall, and any figure that was
    not a float and differed (a count, a flipped sample).
    """
    import os
    import subprocess

    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mappa-golden-spread-") as tmp:
        for label, env in CPU_VARIANTS.items():
            out = Path(tmp) / "run.json"
            only = [arg for name in names for arg in ("--only", name)]
            subprocess.run(
                [sys.executable, "-m", "tests.golden_runs", "--dump", str(out), *only],
                env={**os.environ, **env},
                check=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
            runs[label] = json.loads(out.read_text())
    reference_label = next(iter(runs))
    per_config: dict[str, dict[str, Any]] = {}
    for name in names:
        base = _figures(runs[reference_label][name])
        worst = {"relative": 0.0, "absolute": 0.0, "figure": None, "discrete": []}
        for label, results in runs.items():
            for key, value in _figures(results[name]).items():
                ref = base.get(key)
                if isinstance(value, float) and isinstance(ref, float):
                    diff = abs(value - ref)
                    rel = diff / max(abs(value), abs(ref)) if diff else 0.0
                    worst["absolute"] = max(worst["absolute"], diff)
                    if rel > worst["relative"]:
                        worst["relative"], worst["figure"] = rel, f"{label}: {key}"
                elif value != ref:
                    worst["discrete"].append(f"{label}: {key} {value!r} vs {ref!r}")
        per_config[name] = worst
    return {
        "variants": CPU_VARIANTS,
        "reference": reference_label,
        "configurations": per_config,
        "largest_relative": max(w["relative"] for w in per_config.values()),
        "largest_absolute": max(w["absolute"] for w in per_config.values()),
        "tolerance": {"rtol": RTOL, "atol": ATOL},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="record the golden file")
    action.add_argument("--check", action="store_true", help="compare with the golden file")
    action.add_argument("--dump", type=Path, help="write the runs' figures to this file")
    action.add_argument(
        "--spread", action="store_true", help="measure differences between CPU kernels"
    )
    parser.add_argument("--exact", action="store_true", help="with --check: bit for bit")
    parser.add_argument("--only", action="append", help="a configuration name (repeatable)")
    args = parser.parse_args(argv)
    if args.spread:
        measured = spread(args.only or list(RUNS))
        SPREAD_FILE.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        for name, worst in measured["configurations"].items():
            discrete = len(worst["discrete"])
            print(f"{name:28s} relative {worst['relative']:.2e}  absolute "
                  f"{worst['absolute']:.2e}  discrete {discrete}  ({worst['figure']})")  # fmt: skip
        print(f"largest relative difference {measured['largest_relative']:.2e} "
              f"(tolerance rtol {RTOL:g}, atol {ATOL:g}); wrote {SPREAD_FILE.name}")  # fmt: skip
        return 0
    results = run(args.only)
    if args.dump:
        args.dump.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        return 0
    if args.write:
        recorded = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.exists() else {}
        recorded.update(results)
        GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN_FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"recorded {sorted(results)} in {GOLDEN_FILE.name}")
        return 0
    expected = json.loads(GOLDEN_FILE.read_text())
    problems = differences(
        results, {k: v for k, v in expected.items() if k in results}, exact=args.exact
    )
    print("\n".join(problems) or f"{len(results)} configurations equal their recorded figures")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
