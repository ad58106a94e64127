"""Checkpoints: per-agent HF directories, optimizer, RNG and step; atomic.

Layout of ``<output_dir>/checkpoints/step-000010/``::

    agents/<agent>/            model (safetensors) + tokenizer, loadable by transformers
                               (with LoRA: the agent's adapter, loadable by peft)
    agents/<agent>/optimizer.pt
    rng.pt                     Python, NumPy and torch generator states
    trainer_state.json         step and config
    COMPLETE                   written last

A checkpoint is built in a temporary sibling directory and renamed into place only
after ``COMPLETE`` is written, so a run killed mid-save leaves no directory that could
be taken for a complete checkpoint; :func:`latest_checkpoint` also ignores any directory
without the marker.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mappa_agents.checkpoints import CHECKPOINT_MARKER as MARKER
from mappa_agents.checkpoints import complete_checkpoints, latest_checkpoint
from mappa_train.precision import MasterWeightAdamW

logger = logging.getLogger(__name__)

__all__ = [
    "MARKER",
    "checkpoint_dir",
    "complete_checkpoints",
    "latest_checkpoint",
    "load_optimizer_states",
    "load_trainer_state",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]


def checkpoint_dir(root: Path, step: int) -> Path:
    """Directory of the checkpoint taken after ``step`` steps."""
    return root / f"step-{step:06d}"


def rng_state() -> dict[str, Any]:
    """The state of every random generator the trainer uses."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore generators saved by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    step: int,
    learners: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    keep: int = 2,
) -> Path:
    """Write a complete checkpoint atomically and prune old ones.

    Args:
        root: The checkpoints directory.
        step: Steps completed.
        learners: Agent -> learner with ``model``, ``tokenizer`` and ``optimizer``.
        trainer_state: JSON-serialisable trainer state.
        keep: Complete checkpoints to keep (the newest); 0 keeps all.

    Returns:
        The checkpoint directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    staging = root / f".tmp-step-{step:06d}-{os.getpid()}"
    # Staging folders left by killed saves are never complete: clear those whose
    # process is gone (another live process may be saving into its own).
    for stale in root.glob(".tmp-step-*"):
        if not _pid_alive(stale.name.rsplit("-", 1)[-1]):
            shutil.rmtree(stale, ignore_errors=True)
    for agent, learner in learners.items():
        agent_dir = staging / "agents" / agent
        if getattr(learner, "adapter", None):
            # Only the agent's adapter: peft writes it to <agents dir>/<adapter name>/.
            learner.model.save_pretrained(staging / "agents", selected_adapters=[learner.adapter])
        else:
            learner.model.save_pretrained(agent_dir, safe_serialization=True)
        learner.tokenizer.save_pretrained(agent_dir)
        torch.save(learner.optimizer.state_dict(), agent_dir / "optimizer.pt")
    torch.save(rng_state(), staging / "rng.pt")
    (staging / "trainer_state.json").write_text(
        json.dumps(dict(trainer_state), indent=2, default=str) + "\n"
    )
    (staging / MARKER).write_text(f"step {step}\n")
    _fsync_tree(staging)
    if final.exists():  # a re-run of the same step replaces it
        shutil.rmtree(final)
    os.replace(staging, final)
    logger.info("saved checkpoint %s", final)
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(path: Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint."""
    return json.loads((path / "trainer_state.json").read_text())


def load_optimizer_states(path: Path, learners: Mapping[str, Any]) -> None:
    """Restore the optimizer state of every learner and the RNG from checkpoint ``path``."""
    for agent, learner in learners.items():
        agent_dir = path / "agents" / agent
        state = torch.load(agent_dir / "optimizer.pt", map_location="cpu", weights_only=False)
        if "master" in state and not isinstance(learner.optimizer, MasterWeightAdamW):
            raise ValueError(
                f"{path} holds float32 master weights (saved in bf16 with "
                "mixed_precision=True): resume with the same dtype and mixed_precision"
            )
        saved_groups = (state.get("optimizer") or state)["param_groups"]
        for saved, live in zip(saved_groups, learner.optimizer.param_groups):
            # The kernel choice follows this run's device, not the saving run's; torch
            # also places Adam's step counters by it while loading.
            for key in ("fused", "foreach"):
                if key in live:
                    saved[key] = live[key]
        learner.optimizer.load_state_dict(state)
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))


def _pid_alive(text: str) -> bool:
    try:
        pid = int(text)
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
