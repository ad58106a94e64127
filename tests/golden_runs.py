"""Recorded training runs that a change to the trainer must reproduce exactly.

Each configuration trains the tiny in-process model for two steps on a toy pipeline and
keeps every logged number (timings aside) and a digest of each trained agent's final
weights. ``tests/golden/metrics.json`` holds these figures as the trainer produced them
before a change; ``tests/test_golden_metrics.py`` trains again and compares.

    python -m tests.golden_runs --write        # record (after a deliberate change)
    python -m tests.golden_runs --check        # compare, print what differs

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


def _train(trainer: Any) -> dict[str, Any]:
    """Train to the end; the figures and each trained agent's final weights.

    The weights are read just before the trainer closes: engines and learner groups
    are gone after. Where an agent acts through engines its group's weights are read,
    else the trainer's own copy (which after each sync equals its group's).
    """
    weights: dict[str, str] = {}
    close = trainer.close

    def read_then_close() -> None:
        for agent, learner in sorted(trainer.learners.items()):
            group = getattr(learner, "group", None)
            state = group.weights() if learner.model is None else learner.model.state_dict()
            weights[agent] = weights_digest(state)
        close()

    trainer.close = read_then_close
    history = trainer.train()
    return {"metrics": [comparable(m) for m in history], "weights": weights}


def _one_process(mode: str, root: Path, model_dir: Path) -> dict[str, Any]:
    return _train(_trainer(root, f"one-{mode}", model_dir, credit_mode=mode))


def _ray(mode: str, root: Path, model_dir: Path) -> dict[str, Any]:
    ray = {"distributed": "ray", "ranks_per_agent": 2}
    return _train(_trainer(root, f"ray-{mode}", model_dir, credit_mode=mode, **ray))


def _resumed(root: Path, model_dir: Path) -> dict[str, Any]:
    """Killed after its first step's checkpoint (as ``train(until=1)`` leaves it), resumed."""
    first = _trainer(root, "resume", model_dir, save_every=1)
    first.train(until=1)
    first.close()
    return _train(_trainer(root, "resume", model_dir, save_every=1))


RUNS: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    **{
        f"one_process/{mode}": (lambda root, model, m=mode: _one_process(m, root, model))
        for mode in CREDIT_MODES
    },
    **{f"ray/{mode}": (lambda root, model, m=mode: _ray(m, root, model)) for mode in CREDIT_MODES},
    "one_process/lora": lambda root, model: _train(_trainer(root, "lora", model, lora_rank=4)),
    "one_process/frozen_writer": lambda root, model: _train(
        _trainer(root, "frozen", model, train_agents=["editor"])
    ),
    "one_process/resumed": _resumed,
    "ray/engines": lambda root, model: _train(
        _trainer(root, "engines", model, distributed="ray", ranks_per_agent=2, engines_per_agent=1)
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


def differences(got: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Every figure of ``got`` that is not exactly its recorded value, as readable lines."""
    problems: list[str] = []
    for name, want in expected.items():
        have = got.get(name)
        if have is None:
            problems.append(f"{name}: not run")
            continue
        if have["weights"] != want["weights"]:
            problems.append(f"{name}: final weights differ: {have['weights']} vs {want['weights']}")
        if len(have["metrics"]) != len(want["metrics"]):
            problems.append(f"{name}: {len(have['metrics'])} steps vs {len(want['metrics'])}")
        for step, (mine, theirs) in enumerate(zip(have["metrics"], want["metrics"]), start=1):
            for key in sorted(set(mine) | set(theirs)):
                a, b = mine.get(key, "<absent>"), theirs.get(key, "<absent>")
                both_nan = all(isinstance(v, float) and math.isnan(v) for v in (a, b))
                same = a == b or both_nan
                if not same:
                    problems.append(f"{name} step {step} {key}: {a!r} vs recorded {b!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="record the golden file")
    action.add_argument("--check", action="store_true", help="compare with the golden file")
    parser.add_argument("--only", action="append", help="a configuration name (repeatable)")
    args = parser.parse_args(argv)
    results = run(args.only)
    if args.write:
        recorded = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.exists() else {}
        recorded.update(results)
        GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN_FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"recorded {sorted(results)} in {GOLDEN_FILE.name}")
        return 0
    expected = json.loads(GOLDEN_FILE.read_text())
    problems = differences(results, {k: v for k, v in expected.items() if k in results})
    print("\n".join(problems) or f"{len(results)} configurations equal their recorded figures")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
