"""Which checkpoint a run resumes from: the newest intact one of the same run settings.

Before a run loads a checkpoint of its ``output_dir``:

- **integrity** (:func:`checkpoint_damage`): every file is checked for the damage a
  kill or a full disk leaves (a ``trainer_state.json`` that is not JSON, a safetensors
  file shorter than its header says, a torch file whose zip directory is cut). A damaged
  newest checkpoint is named, with the newest intact one beside it; with
  ``TrainConfig.resume_intact`` the run takes that one and renames the damaged one aside.
- **compatibility** (:func:`resume_mismatches`): the checkpoint's environment, trained
  agents, LoRA rank and each trained agent's model must be the run's. A difference stops
  the run naming the setting, both values and the flags that fix it, instead of training
  the old weights against a new reference model and saving checkpoints that name a model
  they do not hold.

Both are cheap: they read headers and zip directories, not the tensors.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mappa_agents.checkpoints import AGENTS_DIR, TRAINER_STATE, complete_checkpoints
from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

__all__ = [
    "ARCHITECTURE_KEYS",
    "DAMAGED_SUFFIX",
    "ResumeError",
    "checkpoint_damage",
    "checkpoint_to_resume",
    "resume_mismatches",
]

DAMAGED_SUFFIX = ".damaged"
"""Appended to a damaged checkpoint's name when the run resumes from an older one."""

ARCHITECTURE_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
"""Model config entries that must agree for a checkpoint's weights to fit a model."""


class ResumeError(SettingsError):
    """A checkpoint this run cannot resume (damaged, or of other settings).

    The message says what differs and what to pass.
    """


def checkpoint_to_resume(
    root: Path,
    config: Any,
    specs: Mapping[str, str],
    trained_agents: Sequence[str],
) -> Path | None:
    """The checkpoint a run resumes from, after checking it is whole and the run's own.

    Args:
        root: The run's checkpoints directory.
        config: The run's :class:`~mappa_train.config.TrainConfig`.
        specs: Each agent's model spec (``parse_system_spec`` of ``config.system``).
        trained_agents: The agents the run trains.

    Returns:
        The newest complete, intact checkpoint, or ``None`` when there is none (a new run).

    Raises:
        ResumeError: When the newest checkpoint is damaged (unless
            ``config.resume_intact``), or its settings differ from the run's.
    """
    done = complete_checkpoints(root)
    if not done:
        return None
    newest = done[-1]
    damage = checkpoint_damage(newest)
    if damage is not None:
        intact = next((c for c in reversed(done[:-1]) if checkpoint_damage(c) is None), None)
        if intact is None:
            raise ResumeError(
                f"the newest checkpoint {newest} is damaged ({damage}) and no older intact "
                "checkpoint is left: start a new run with another --output-dir (or remove "
                f"{root})"
            )
        if not getattr(config, "resume_intact", False):
            raise ResumeError(
                f"the newest checkpoint {newest} is damaged ({damage}); the newest intact "
                f"one is {intact}. Pass --resume-intact to resume from it (the damaged one "
                f"is renamed {newest.name}{DAMAGED_SUFFIX})"
            )
        aside = newest.with_name(newest.name + DAMAGED_SUFFIX)
        os.replace(newest, aside)
        logger.warning(
            "checkpoint %s is damaged (%s): resuming from %s; the damaged one is kept as %s",
            newest,
            damage,
            intact,
            aside,
        )
        newest = intact
    problems = resume_mismatches(newest, config, specs, trained_agents)
    if problems:
        raise ResumeError(
            f"{config.output_dir} holds a checkpoint of other settings ({newest}): "
            + "; ".join(problems)
            + ". Resume it with its settings, or start a new run with another --output-dir"
        )
    return newest


def checkpoint_damage(path: Path) -> str | None:
    """The first damaged file of a checkpoint, or ``None`` when every file reads whole.

    Checked: ``trainer_state.json`` (JSON with a step), ``rng.pt`` and each agent's
    ``optimizer.pt`` (zip directories), every ``*.safetensors`` (size against its header)
    and every ``*.json`` of the agents.

    Returns:
        ``"<file>: <what is wrong>"`` relative to ``path``.
    """
    state = path / TRAINER_STATE
    try:
        data = json.loads(state.read_text())
        if not isinstance(data, dict) or "step" not in data:
            raise ValueError("no step in it")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{TRAINER_STATE}: {_reason(exc)}"
    files = [path / "rng.pt"] if (path / "rng.pt").exists() else []
    agents_dir = path / AGENTS_DIR
    if agents_dir.is_dir():
        files += sorted(p for p in agents_dir.rglob("*") if p.is_file())
    for file in files:
        problem = _file_damage(file)
        if problem is not None:
            return f"{file.relative_to(path)}: {problem}"
    return None


def resume_mismatches(
    path: Path, config: Any, specs: Mapping[str, str], trained_agents: Sequence[str]
) -> list[str]:
    """What differs between checkpoint ``path`` and the run's settings, each with its fix.

    Compared: the environment, the trained agents, the LoRA rank and, per trained agent,
    the model: its spec and, where both are local directories, its architecture
    (:data:`ARCHITECTURE_KEYS`). A spec that names the same architecture at another path
    (a moved model directory) only warns.

    Returns:
        One sentence per difference; ``[]`` when the run may resume ``path``. A
        checkpoint without a saved config (an older format) is only checked for the
        trained agents' weights.
    """
    state = json.loads((path / TRAINER_STATE).read_text())
    saved = state.get("config") if isinstance(state.get("config"), dict) else {}
    problems = []
    if "env" in saved and saved["env"] != config.env:
        problems.append(
            f"it was trained on {saved['env']!r}, this run asks for {config.env!r} "
            f"(--env {saved['env']})"
        )
    saved_agents = sorted(p.name for p in (path / AGENTS_DIR).iterdir() if p.is_dir())
    if not problems and sorted(trained_agents) != saved_agents:
        problems.append(
            f"it holds trained weights of {saved_agents}, this run trains "
            f"{sorted(trained_agents)} (--train-agents {','.join(saved_agents)})"
        )
    if "lora_rank" in saved and saved["lora_rank"] != config.lora_rank:
        problems.append(
            f"it was trained with lora_rank {saved['lora_rank']}, this run has "
            f"{config.lora_rank} (--lora-rank {saved['lora_rank']})"
        )
    if problems or "system" not in saved:
        return problems
    from mappa_agents.system import parse_system_spec

    try:
        saved_specs = parse_system_spec(saved["system"], list(specs))
    except ValueError as exc:
        return [f"its system {saved['system']!r} does not fit this run's agents ({exc})"]
    differ = []
    for agent in trained_agents:
        before, now = saved_specs[agent], specs[agent]
        if before == now:
            continue
        shape = _architecture_difference(path / AGENTS_DIR / agent, now)
        if shape == "":
            logger.warning(
                "resuming %s: the checkpoint was trained from %s, this run names %s, a "
                "model of the same architecture (its initial weights become the reference)",
                agent,
                before,
                now,
            )
            continue
        differ.append(f"{agent} was trained from {before!r}, this run names {now!r}{shape}")
    if differ:
        saved_system = saved["system"]
        flag = saved_system if isinstance(saved_system, str) else json.dumps(saved_system)
        problems.append("; ".join(differ) + f" (--system {flag!r})")
    return problems


# ---------------------------------------------------------------------- internals


def _architecture_difference(weights: Path, spec: str) -> str | None:
    """How the architectures of ``weights`` and the model ``spec`` names differ.

    Returns:
        ``""`` when they agree, a clause naming what differs, or ``None`` when either
        cannot be read (no local model config).
    """
    from mappa_agents.models import SMOLLM2_ALIASES

    if spec.strip().lower() in SMOLLM2_ALIASES:
        return None
    mine = _model_config(weights)
    theirs = _model_config(Path(spec))
    if mine is None or theirs is None:
        return None
    keys = [k for k in ARCHITECTURE_KEYS if mine.get(k) != theirs.get(k)]
    if not keys:
        return ""
    return " (" + ", ".join(f"{k} {mine.get(k)} vs {theirs.get(k)}" for k in keys) + ")"


def _model_config(directory: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) and "model_type" in config else None


def _file_damage(file: Path) -> str | None:
    """What is wrong with one checkpoint file, by its kind (``None``: it reads whole)."""
    try:
        if file.suffix == ".safetensors":
            return _safetensors_damage(file)
        if file.suffix in (".pt", ".bin"):
            return _zip_damage(file)
        if file.suffix == ".json":
            json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return _reason(exc)
    return None


def _safetensors_damage(file: Path) -> str | None:
    """A safetensors file is 8 bytes of header length, the JSON header, then the data."""
    size = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes, no header)"
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            return f"truncated ({size} bytes, the header alone needs {8 + header_len})"
        header = json.loads(handle.read(header_len))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"truncated ({size} of {expected} bytes)"
    return None


def _zip_damage(file: Path) -> str | None:
    """A torch file is a zip archive: its directory sits at the end, so a cut loses it."""
    size = file.stat().st_size
    try:
        with zipfile.ZipFile(file) as archive:
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"truncated ({size} bytes; {info.filename} ends past it)"
    except zipfile.BadZipFile as exc:
        return f"not a whole torch file ({exc}; {size} bytes)"
    return None


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
