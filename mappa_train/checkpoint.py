"""Checkpoints: per-agent HF directories, optimizer, RNG and step; atomic.

Layout of ``<output_dir>/checkpoints/step-000010/``::

    agents/<agent>/            model (safetensors) + tokenizer, loadable by transformers
                               (with LoRA: the agent's adapter, loadable by peft)
    agents/<agent>/optimizer.pt  parameters by position (one process) or by name
                               (a Ray learner group); either run resumes from either
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
import re
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
    "load_optimizer_state",
    "load_optimizer_states",
    "load_trainer_state",
    "named_optimizer_state",
    "os_error_of",
    "positional_optimizer_state",
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


#: How Rust's I/O errors end their message ("No space left on device (os error 28)"),
#: which libraries written in Rust (safetensors, tokenizers) raise as their own types.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(exc: BaseException, filename: str | Path) -> OSError | None:
    """The operating-system error a library's own exception type carries, as an ``OSError``.

    safetensors raises ``SafetensorError("Error while serializing: I/O error: No space
    left on device (os error 28)")``, not an ``OSError``.

    Args:
        exc: The exception raised.
        filename: What was being written, for the message.

    Returns:
        An ``OSError`` with the error number, its description and ``filename``; ``None``
        for an ``OSError`` already, or an exception that names no operating-system error.
    """
    if isinstance(exc, OSError):
        return None
    match = _RUST_OS_ERROR.search(str(exc))
    if match is None:
        return None
    code = int(match.group(1))
    return OSError(code, os.strerror(code), str(filename))


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
        learners: Agent -> learner, which writes its state into ``agents/<agent>/``
            (:meth:`mappa_train.learner.Learner.save`).
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
        agent_dir.mkdir(parents=True, exist_ok=True)
        try:
            learner.save(agent_dir)
        except Exception as exc:
            # safetensors reports a full disk as its own error type: made an OSError
            # here, it reaches the full-disk handling of `mappa train` like any other.
            wrapped = os_error_of(exc, agent_dir)
            if wrapped is None:
                raise
            raise wrapped from exc
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
    """Restore the optimizer state of every learner and the RNG from checkpoint ``path``.

    Each learner needs ``model`` and ``optimizer`` (see :func:`load_optimizer_state`).
    """
    for agent, learner in learners.items():
        load_optimizer_state(
            path / "agents" / agent, getattr(learner, "model", None), learner.optimizer
        )
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))


def load_optimizer_state(agent_dir: Path, model: Any, optimizer: Any) -> None:
    """Restore one agent's optimizer from its checkpoint directory ``agent_dir``.

    A state keyed by parameter name (saved by a Ray learner group, whose weights are
    the float32 masters) is mapped onto ``model``'s parameters by position; under
    mixed precision its masters are read from the checkpoint's float32 weights.

    Raises:
        ValueError: When the checkpoint holds float32 masters and ``optimizer`` keeps none.
    """
    state = torch.load(agent_dir / "optimizer.pt", map_location="cpu", weights_only=False)
    if is_named_optimizer_state(state):
        names = [name for name, _ in model.named_parameters()]
        state = positional_optimizer_state(state, names, prefix=NAMED_PREFIX)
        if isinstance(optimizer, MasterWeightAdamW):
            state = {"optimizer": state, "master": _float32_weights(agent_dir, names)}
    if "master" in state and not isinstance(optimizer, MasterWeightAdamW):
        raise ValueError(
            f"{agent_dir.parent.parent} holds float32 master weights (saved in bf16 with "
            "mixed_precision=True): resume with the same dtype and mixed_precision"
        )
    saved_groups = (state.get("optimizer") or state)["param_groups"]
    for saved, live in zip(saved_groups, optimizer.param_groups):
        # The kernel choice follows this run's device, not the saving run's; torch
        # also places Adam's step counters by it while loading.
        for key in ("fused", "foreach"):
            if key in live:
                saved[key] = live[key]
    optimizer.load_state_dict(state)


NAMED_PREFIX = "model."
"""How a learner group names a parameter: its path in the model the group shards through
(:class:`~mappa_train.fsdp.ResponseScorer`, which holds the model as ``model``)."""


def is_named_optimizer_state(state: Mapping[str, Any]) -> bool:
    """Whether an optimizer state keys its parameters by name (not by position)."""
    groups = state.get("param_groups") or []
    params = [p for group in groups for p in group.get("params", [])]
    return bool(params) and all(isinstance(p, str) for p in params)


def named_optimizer_state(
    state: Mapping[str, Any], names: list[str], *, prefix: str = ""
) -> dict[str, Any]:
    """A torch optimizer state with parameters by position, keyed by name instead.

    Args:
        state: ``optimizer.state_dict()``: ``state`` and ``param_groups["params"]`` hold
            positions in the optimizer's parameter list.
        names: The parameter name of each position (the model's ``named_parameters``).
        prefix: Put before every name.
    """
    by_position = {i: prefix + name for i, name in enumerate(names)}
    return {
        "state": {by_position[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [by_position[int(i)] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def positional_optimizer_state(
    state: Mapping[str, Any], names: list[str], *, prefix: str = ""
) -> dict[str, Any]:
    """The inverse of :func:`named_optimizer_state`.

    Raises:
        ValueError: When the state names a parameter that ``names`` lacks.
    """
    position = {prefix + name: i for i, name in enumerate(names)}
    missing = sorted({p for g in state["param_groups"] for p in g["params"]} - set(position))
    if missing:
        raise ValueError(
            f"the optimizer state names parameters this model does not have, e.g. "
            f"{missing[:3]}: it was saved for another model"
        )
    return {
        "state": {position[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def _float32_weights(agent_dir: Path, names: list[str]) -> list[torch.Tensor]:
    """The checkpoint's weights in float32, in the order of ``names``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(agent_dir, dtype=torch.float32)
    params = dict(model.named_parameters())
    return [params[name].detach().clone() for name in names]


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
