"""Reading the checkpoints ``mappa train`` writes: which weights each agent acts with.

Layout of a run directory (see :mod:`mappa_train.checkpoint`, which writes it)::

    runs/x/checkpoints/step-000010/
        agents/<agent>/        HF model dir (or, with LoRA, the agent's peft adapter)
        trainer_state.json     step and the training config (its ``system`` spec)
        COMPLETE               written last: only marked directories are checkpoints

These helpers only read, and need neither torch nor :mod:`mappa_train`, so
:func:`mappa_agents.system.parse_system_spec` can turn ``--system runs/x`` into one
weights directory per agent.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

CHECKPOINT_MARKER = "COMPLETE"
"""File written last into a checkpoint; a directory without it is not one."""

CHECKPOINTS_DIR = "checkpoints"
"""Sub-directory of a run directory holding its checkpoints."""

AGENTS_DIR = "agents"
"""Sub-directory of a checkpoint holding one weights directory per trained agent."""

TRAINER_STATE = "trainer_state.json"
"""File of a checkpoint with its step and training config."""

RUN_METRICS = "metrics.jsonl"
"""File every ``mappa train`` run directory has: it marks a run dir as one."""

_STEP_NAME = re.compile(r"^step-(\d{6,})$")


class CheckpointError(SettingsError):
    """A checkpoint spec that cannot be resolved (no checkpoint, or an agent missing).

    The ``mappa`` command prints its message, which says what to pass, as one line.
    """


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint directories (``step-NNNNNN`` with the marker) under ``root``.

    Returns:
        The directories, oldest (lowest step) first; ``[]`` when ``root`` is no directory.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_NAME.match(path.name)
        if match and (path / CHECKPOINT_MARKER).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None``."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is one complete checkpoint directory."""
    path = Path(path)
    return (path / CHECKPOINT_MARKER).is_file() and (path / AGENTS_DIR).is_dir()


def looks_like_checkpoint_dir(path: str | Path) -> bool:
    """Whether ``path`` is shaped like one checkpoint, complete or not.

    That is a directory named ``step-NNNNNN``, or one holding ``agents/`` or
    ``trainer_state.json``.
    """
    path = Path(path)
    return path.is_dir() and (
        bool(_STEP_NAME.match(path.name))
        or (path / AGENTS_DIR).is_dir()
        or (path / TRAINER_STATE).is_file()
    )


def looks_like_checkpoint_spec(path: str | Path) -> bool:
    """Whether ``path`` is a run dir, a checkpoints dir or a checkpoint (not a model dir).

    A checkpoint still being written (no marker yet) counts, so that resolving it says
    it is incomplete. A model directory (an HF ``config.json`` or an
    ``adapter_config.json``) is never taken for a checkpoint spec; the ``config.json``
    that ``mappa train`` writes into its run directory (the training config) does not
    make one a model directory.
    """
    path = Path(path)
    if not path.is_dir() or is_model_dir(path):
        return False
    return (
        is_checkpoint(path)
        or looks_like_checkpoint_dir(path)
        or (path / CHECKPOINTS_DIR).is_dir()
        or (path / RUN_METRICS).is_file()  # a run dir, even one that saved no checkpoint
        or any(_STEP_NAME.match(p.name) for p in path.iterdir())
    )


def is_model_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a model transformers or peft loads.

    That is an ``adapter_config.json``, or a ``config.json`` that is a model's (it names
    a ``model_type`` or ``architectures``), not the training config of a run directory.
    """
    path = Path(path)
    if (path / "adapter_config.json").is_file():
        return True
    config_path = path / "config.json"
    if not config_path.is_file():
        return False
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True  # unreadable: let the model loader say what is wrong with it
    if not isinstance(config, dict):
        return True
    if "model_type" in config or "architectures" in config:
        return True
    # A run directory's config.json is its TrainConfig; a run has metrics or checkpoints.
    return not ((path / RUN_METRICS).is_file() or (path / CHECKPOINTS_DIR).is_dir())


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint a spec path names.

    Args:
        path: A checkpoint (``runs/x/checkpoints/step-000010``), a checkpoints
            directory (``runs/x/checkpoints``: its newest) or a run directory
            (``runs/x``: the newest checkpoint of ``runs/x/checkpoints``).

    Returns:
        The complete checkpoint directory.

    Raises:
        CheckpointError: When ``path`` holds no complete checkpoint, or is one checkpoint
            without its marker (naming the newest complete one beside it, if any).
    """
    path = Path(path)
    if is_checkpoint(path):
        return path
    if looks_like_checkpoint_dir(path) and latest_checkpoint(path / CHECKPOINTS_DIR) is None:
        newest = latest_checkpoint(path.parent)
        hint = (
            f"; the newest complete checkpoint beside it is {newest}"
            if newest is not None
            else "; there is no complete checkpoint beside it"
        )
        raise CheckpointError(
            f"{path} is an incomplete checkpoint (no {CHECKPOINT_MARKER} marker: training "
            f"may still be writing it, or stopped while saving it){hint}. Pass a complete "
            "checkpoint, or the run directory for its newest one"
        )
    for root in (path / CHECKPOINTS_DIR, path):
        newest = latest_checkpoint(root)
        if newest is not None:
            return newest
    raise CheckpointError(
        f"{path} holds no complete checkpoint (a step-NNNNNN directory with a "
        f"{CHECKPOINT_MARKER} file, directly or under {CHECKPOINTS_DIR}/): pass a run "
        "directory of `mappa train` that saved at least one checkpoint, one of its "
        "checkpoints, or a model directory"
    )


def checkpoint_agents(checkpoint: str | Path) -> list[str]:
    """The agents whose weights ``checkpoint`` holds, sorted."""
    agents_dir = Path(checkpoint) / AGENTS_DIR
    return sorted(p.name for p in agents_dir.iterdir() if p.is_dir()) if agents_dir.is_dir() else []


def checkpoint_system_spec(checkpoint: str | Path) -> str | dict[str, str] | None:
    """The ``system`` spec the run was trained with (from ``trainer_state.json``), if any."""
    state_path = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(state_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    config = state.get("config") if isinstance(state, dict) else None
    system = config.get("system") if isinstance(config, dict) else None
    return system if isinstance(system, (str, dict)) else None


def agent_weights(checkpoint: str | Path, agent: str) -> Path:
    """The weights directory of ``agent`` in ``checkpoint``.

    Raises:
        CheckpointError: Naming the agents the checkpoint does hold.
    """
    weights = Path(checkpoint) / AGENTS_DIR / agent
    if not weights.is_dir():
        raise CheckpointError(
            f"checkpoint {checkpoint} has no weights for agent {agent!r} (it holds "
            f"{checkpoint_agents(checkpoint)}; agents frozen during training are not "
            f"saved): give that agent a model of its own, e.g. --system "
            f"'{agent}=smollm2-135m,<other agent>={checkpoint}'"
        )
    return weights
