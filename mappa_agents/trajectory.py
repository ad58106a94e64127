"""Trajectories: one record per action, with exact token ids, rewards and outcomes.

A record holds everything a policy-gradient trainer needs for one action (the exact
prompt and sampled token ids, their log-probabilities, the finish reason, the coach's
verdict and the step reward) plus the episode's outcome, so other RL code can train on
the JSONL export without touching ``mappa_train``. The JSONL file has one row per action
and loads with :func:`load_trajectories` (rows, or a ``datasets.Dataset``) or
``datasets.load_dataset("json", data_files=path)``.

Each row also carries the OpenAI-style pair other RL code expects: ``messages`` (the
prompt, a list of ``{"role", "content"}`` chat messages) and ``completion`` (the
response text, equal to ``text``). Rows written before ``completion`` existed load the
same way (it is filled from ``text``).

An action's reward that must not be trained on is NaN with ``reward_valid=False`` in
memory and ``null`` in the file; :attr:`ActionSample.trainable_reward` reads every such
form as ``None`` (:func:`mappa_env.envs.outcome.usable_reward`). The episode's outcome is
an :class:`~mappa_env.envs.outcome.EpisodeOutcome`, written as its dict.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mappa_env.envs.outcome import EpisodeOutcome, usable_reward

logger = logging.getLogger(__name__)


#: The per-token fields of :class:`ActionSample` (lists of ints and floats).
_TOKEN_FIELDS = ("prompt_ids", "response_ids", "logprobs")


@dataclass
class ActionSample:
    """One action of one agent.

    Attributes:
        episode_id: Identifier of the episode within its run (e.g. ``"ep-00003"``).
        task_id: The task's id.
        env_id: Environment id, e.g. ``"MathChat-v0"``.
        agent: Agent id.
        turn: 0-based turn of the agent in the episode.
        step: Index of the action within the episode (all agents together).
        policy: Name of the policy that generated it.
        messages: The chat messages the agent was prompted with.
        text: The generated text (reasoning removed, as the environment parsed it).
        reasoning: Reasoning text of thinking models, if any.
        prompt_ids: Exact token ids of the prompt fed to the model.
        response_ids: Exact sampled token ids.
        logprobs: Log-probability of each sampled id at sampling time.
        finish_reason: ``"stop"`` or ``"length"`` (cut by the token limit).
        reward: The action's reward under the environment's credit mode, final once the
            episode has ended (what a trainer trains on; NaN when it must not be trained
            on, see ``reward_valid``).
        reward_valid: False when the reward rests on an invalid coach verdict or the
            episode was aborted before its credit was settled.
        coach: The coach's verdict as a dict (score, reward, valid, analysis, ...).
        tool: The sandbox result as a dict, or None when no code ran.
        code: The code that ran, or None.
        action_truncated: True when the env cut an oversize action.
        outcome: The episode's outcome (filled when the episode ends); a dict given
            here is read with :meth:`EpisodeOutcome.from_dict`.
        sampling: The sampling settings used.
        credit: How the environment made ``reward``: ``{"mode", "outcome_weight",
            "backprop_decay"}`` (:mod:`mappa_env.credit`); ``None`` in rows written
            before it was recorded.
    """

    episode_id: str
    task_id: str
    env_id: str
    agent: str
    turn: int
    step: int
    policy: str
    messages: list[dict[str, str]]
    text: str
    reasoning: str | None
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    reward: float
    reward_valid: bool
    coach: dict[str, Any] | None = None
    tool: dict[str, Any] | None = None
    code: str | None = None
    action_truncated: bool = False
    outcome: EpisodeOutcome | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    credit: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.outcome is not None and not isinstance(self.outcome, EpisodeOutcome):
            self.outcome = EpisodeOutcome.from_dict(self.outcome)

    @property
    def coach_score(self) -> float | None:
        """The coach's 0-10 score, or None when invalid or absent."""
        return None if not self.coach else self.coach.get("score")

    @property
    def trainable_reward(self) -> float | None:
        """The reward to train this action on, or ``None`` when it must be masked.

        ``None`` for a reward that rests on an invalid coach verdict, belongs to an
        aborted episode, or is not a finite number.
        """
        return usable_reward(self.reward, self.reward_valid)

    @property
    def outcome_reward(self) -> float | None:
        """The episode's outcome reward in [0, 1]; ``None`` until known or when it has none."""
        return None if self.outcome is None else self.outcome.reward

    @property
    def used_tool(self) -> bool:
        """True when the action ran code."""
        return self.code is not None

    def to_row(self) -> dict[str, Any]:
        """The JSONL row: every field, plus ``completion`` (= ``text``); NaN reward -> None."""
        # ``asdict`` deep-copies value by value: for the token lists (hundreds of ints and
        # floats a row) that is most of the cost of writing a step's rollouts. Their
        # values are immutable, so a list copy is the same deep copy.
        token_lists = {
            name: values
            for name in _TOKEN_FIELDS
            if isinstance(values := getattr(self, name), list)
        }
        data = asdict(replace(self, outcome=None, **{name: [] for name in token_lists}))
        for name, values in token_lists.items():
            data[name] = list(values)
        if self.outcome is not None:
            # The outcome's dict form, deep-copied as ``asdict`` copies every other field.
            data["outcome"] = copy.deepcopy(self.outcome.to_dict())
        if isinstance(data["reward"], float) and math.isnan(data["reward"]):
            data["reward"] = None
        data["completion"] = self.text
        return data

    def to_json(self) -> str:
        """One JSON line of :meth:`to_row` (NaN rewards are written as null)."""
        return json.dumps(self.to_row(), ensure_ascii=False, default=_json_default)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActionSample:
        """Inverse of :meth:`to_json` (after ``json.loads``); unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "text" not in values and isinstance(data.get("completion"), str):
            values["text"] = data["completion"]
        if values.get("reward") is None:
            values["reward"] = math.nan
        required = [
            f.name
            for f in fields(cls)
            if f.default is MISSING and f.default_factory is MISSING and f.name not in values
        ]
        if required:
            raise ValueError(f"not an action record: missing fields {required}")
        return cls(**values)


@dataclass
class EpisodeResult:
    """A finished episode: its actions and outcome.

    Attributes:
        episode_id: Identifier of the episode within its run (e.g. ``"ep-00003"``).
        task_id: The task's id.
        env_id: Environment id.
        actions: Its actions, in order.
        outcome: How it ended; a dict given here is read with
            :meth:`EpisodeOutcome.from_dict`.
        wall_time_s: Seconds from its start to its end.
    """

    episode_id: str
    task_id: str
    env_id: str
    actions: list[ActionSample]
    outcome: EpisodeOutcome
    wall_time_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.outcome, EpisodeOutcome):
            self.outcome = EpisodeOutcome.from_dict(self.outcome)

    @property
    def aborted(self) -> bool:
        """True when the episode could not be finished (it has no graded outcome)."""
        return bool(self.outcome.aborted)

    @property
    def succeeded(self) -> bool:
        """Whether the episode succeeded (:attr:`EpisodeOutcome.succeeded`)."""
        return self.outcome.succeeded


def save_jsonl(path: str | Path, samples: Iterable[ActionSample]) -> Path:
    """Write one JSON line per action to ``path`` (parents created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # errors="replace": a lone surrogate that slipped into a record must not lose the file.
    with path.open("w", encoding="utf-8", errors="replace") as handle:
        for sample in samples:
            handle.write(sample.to_json() + "\n")
    return path


class EpisodeStream:
    """Writes each episode's actions to a JSONL file as soon as it finishes.

    Each episode is flushed and synced to disk when written, so a run that is killed
    keeps the episodes it finished. A write that fails (a full disk) is cut back to the
    last whole episode and logged; later episodes are not written, and :attr:`error`
    says why. Lines are in finishing order; each names its ``episode_id``.

    Args:
        path: The file to (re)write; parents are created.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("w", encoding="utf-8", errors="replace")
        self.episodes = 0
        """Episodes whose every line is in the file."""
        self.error: str | None = None
        """Why writing stopped (``None`` while every episode has been written)."""

    def write(self, episode: EpisodeResult) -> bool:
        """Append ``episode``'s actions; returns whether it was written whole."""
        if self.error is not None or self._handle.closed:
            return False
        good = self._handle.tell()
        try:
            self._handle.write("".join(a.to_json() + "\n" for a in episode.actions))
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error(
                "writing %s failed after %d episodes (%s): the later episodes are not kept",
                self.path,
                self.episodes,
                self.error,
            )
            self._cut_back(good)
            return False
        self.episodes += 1
        return True

    def close(self) -> None:
        """Close the file (what was written stays)."""
        if self._handle.closed:
            return
        try:
            self._handle.close()
        except OSError as exc:  # buffered bytes of a failed write: the file was cut back
            logger.debug("closing %s: %s", self.path, exc)

    def _cut_back(self, size: int) -> None:
        """Drop a partly written episode; truncating frees space, so it works on a full disk."""
        try:
            self._handle.close()
        except OSError as exc:
            logger.debug("closing %s after a failed write: %s", self.path, exc)
        try:
            os.truncate(self.path, size)
        except OSError as exc:
            logger.error("could not cut %s back to its whole episodes: %s", self.path, exc)


def load_jsonl(path: str | Path) -> list[ActionSample]:
    """Read the records written by :func:`save_jsonl`.

    Raises:
        ValueError: Naming the line that is not valid JSON.
    """
    samples = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                samples.append(ActionSample.from_dict(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: {exc}") from exc
    return samples


def normalize_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A JSONL row with the export fields filled: ``completion`` from ``text`` if missing.

    Rows of older exports (without ``completion``) and of newer ones read the same.
    """
    data = dict(row)
    if "completion" not in data and "text" in data:
        data["completion"] = data["text"]
    if "text" not in data and "completion" in data:
        data["text"] = data["completion"]
    return data


def trajectory_files(path_or_paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The JSONL files named: a file, a directory (its ``*.jsonl``, sorted) or several.

    Raises:
        FileNotFoundError: For a path that does not exist or a directory without JSONL.
    """
    items = [path_or_paths] if isinstance(path_or_paths, (str, Path)) else list(path_or_paths)
    files: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise FileNotFoundError(
                    f"{path} holds no *.jsonl file (mappa eval writes transcripts.jsonl)"
                )
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no trajectory file {path}")
    return files


def load_trajectories(
    path_or_paths: str | Path | Iterable[str | Path], as_dataset: bool = False
) -> list[dict[str, Any]] | Any:
    """Read exported trajectories as plain rows, or as a ``datasets.Dataset``.

    Args:
        path_or_paths: A JSONL file from :func:`save_jsonl` (e.g. ``mappa eval``'s
            ``transcripts.jsonl``), a directory of them, or a list of either.
        as_dataset: Return a ``datasets.Dataset`` (the ``agents`` extra) instead of a
            list of dicts.

    Returns:
        One dict per action, in file order, with every field of :class:`ActionSample`
        plus ``completion`` (see :func:`normalize_row`); or the same rows as a Dataset.

    Raises:
        ValueError: Naming the line that is not valid JSON or not an action record.
        MissingExtraError: For ``as_dataset=True`` without ``datasets`` installed.
    """
    rows: list[dict[str, Any]] = []
    for path in trajectory_files(path_or_paths):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
                if not isinstance(row, dict) or "prompt_ids" not in row:
                    raise ValueError(f"{path}:{number}: not an action record (no prompt_ids)")
                rows.append(normalize_row(row))
    if not as_dataset:
        return rows
    from mappa_env._optional import require

    datasets = require("datasets", "agents", purpose="load_trajectories(as_dataset=True)")
    return datasets.Dataset.from_list(rows)


def group_episodes(samples: Sequence[ActionSample]) -> dict[str, list[ActionSample]]:
    """Actions grouped by episode id, each group in action order."""
    groups: dict[str, list[ActionSample]] = {}
    for sample in samples:
        groups.setdefault(sample.episode_id, []).append(sample)
    for group in groups.values():
        group.sort(key=lambda s: s.step)
    return groups


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # NumPy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
