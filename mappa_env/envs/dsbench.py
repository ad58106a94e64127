"""DSBench-v0: three data-science agents share one workspace and build a submission.

``data_engineer`` prepares features (``X_train.pkl``, ``y_train.pkl``, ``X_test.pkl``),
``modeler`` trains and saves ``model.pkl`` with cross-validation metrics printed, and
``analyst`` writes ``submission.csv``. Each agent runs Python in its own interpreter in
the episode's workspace directory, so work passes between agents only through files and
final messages. The submission is joined to the hidden answers by id and scored with
the task's own metric.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from mappa_env.coach.base import Coach, FileInfo, RevealPolicy
from mappa_env.dsbench.builtin import BuiltinTaskSet
from mappa_env.dsbench.tasks import DSBenchTask
from mappa_env.envs.pipeline import (
    ActionRecord,
    AgentSpec,
    PipelineEnv,
    RewardMode,
    ToolOutcome,
    parse_turn_limits,
)
from mappa_env.sandbox.base import SandboxFactory
from mappa_env.text import extract_code_blocks, strip_think, truncate_middle

logger = logging.getLogger(__name__)

DATA_ENGINEER = "data_engineer"
MODELER = "modeler"
ANALYST = "analyst"

#: Files each agent must leave in the workspace.
ARTIFACTS: dict[str, tuple[str, ...]] = {
    DATA_ENGINEER: ("X_train.pkl", "y_train.pkl", "X_test.pkl"),
    MODELER: ("model.pkl",),
    ANALYST: ("submission.csv",),
}
#: Artifacts an agent needs from upstream.
NEEDS: dict[str, tuple[str, ...]] = {
    DATA_ENGINEER: (),
    MODELER: ("X_train.pkl", "y_train.pkl"),
    ANALYST: ("model.pkl", "X_test.pkl"),
}
INPUT_FILES = ("train.csv", "test.csv", "sample_submission.csv")
#: Submissions larger than this are not read (a runaway write must not exhaust memory).
MAX_SUBMISSION_BYTES = 200 * 1024 * 1024
_LISTING_LIMIT = 200
#: Wall-clock limit of one artifact inspection.
INSPECT_TIMEOUT_S = 60.0

SYSTEM_DESCRIPTION = (
    "Three agents solve a Kaggle-style data-modelling task together, one after another, in "
    "one shared working directory that holds train.csv, test.csv and sample_submission.csv: "
    "(1) the data engineer prepares the data and saves X_train.pkl, y_train.pkl and X_test.pkl "
    "(plus any fitted transformers) with a short summary; (2) the modeler trains a model on "
    "them, prints cross-validation metrics and saves model.pkl; (3) the analyst predicts on "
    "X_test.pkl with model.pkl and writes submission.csv in the task's submission format. "
    "Each agent runs Python in its own interpreter: work passes between agents only through "
    "files and their final messages. The submission is scored with the task's metric."
)

_ROLES = {
    DATA_ENGINEER: (
        "You are the data engineer, agent 1 of 3 in a data-science team working in one shared "
        "directory. After you, the modeler trains a model and the analyst writes the submission."
        "\nYour job: load train.csv and test.csv, clean and encode the features (handle missing "
        "values and categorical columns, keep the row order of test.csv), and save with pickle:"
        " X_train.pkl (features), y_train.pkl (target) and X_test.pkl (test features, same "
        "columns as X_train). Save any fitted transformers too."
    ),
    MODELER: (
        "You are the modeler, agent 2 of 3 in a data-science team working in one shared "
        "directory. Before you, the data engineer saved X_train.pkl, y_train.pkl and X_test.pkl;"
        " after you, the analyst uses your model to write the submission.\nYour job: load "
        "X_train.pkl and y_train.pkl, train a good model for the task's metric, print its "
        "cross-validation score, and save the fitted model with pickle as model.pkl."
    ),
    ANALYST: (
        "You are the analyst, agent 3 of 3 in a data-science team working in one shared "
        "directory. Before you, the data engineer saved X_test.pkl and the modeler saved "
        "model.pkl.\nYour job: load them, predict for every row of test.csv, and write "
        "submission.csv exactly in the format of sample_submission.csv (same id column and "
        "target column names, one row per test id)."
    ),
}
_ROLE_FOOTER = (
    "\nRun Python by writing one ```python block per reply; it runs in the shared directory and "
    "you will see its output. Your variables persist between your own turns, but the other "
    "agents cannot see them: only files. You have up to {turns} turns. A reply without a code "
    "block ends your part: make it a short summary for the next agent of what you saved. "
    "Keep each reply within {budget} tokens."
)

# Runs in a fresh, short-lived interpreter in the workspace: agent-written pickles are
# never unpickled in the environment's process (unpickling runs arbitrary code), and not in
# the agent's own interpreter either, where earlier agent code could forge the report.
_INSPECT_CODE = """
import json, os, pickle, resource
for name, (soft, hard) in %(rlimits)r.items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
report = {}
for name in %(names)r:
    entry = {"exists": os.path.isfile(name)}
    if entry["exists"]:
        entry["size"] = os.path.getsize(name)
        obj, errors = None, []
        try:
            with open(name, "rb") as handle:
                obj = pickle.load(handle)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            try:
                import joblib
                obj = joblib.load(name)
                errors = []
            except Exception as exc2:
                errors.append(f"{type(exc2).__name__}: {exc2}"[:200])
        entry["loads"] = not errors
        if errors:
            entry["error"] = errors[0]
        else:
            entry["type"] = type(obj).__module__ + "." + type(obj).__qualname__
            shape = getattr(obj, "shape", None)
            if shape is None and hasattr(obj, "__len__"):
                try:
                    shape = (len(obj),)
                except Exception:
                    shape = None
            entry["shape"] = [int(s) for s in shape] if shape is not None else None
            entry["has_predict"] = callable(getattr(obj, "predict", None))
    report[name] = entry
print(json.dumps(report))
"""


def list_files(root: Path, limit: int = _LISTING_LIMIT) -> list[FileInfo]:
    """Files under ``root`` (relative names, sizes), hidden files and folders skipped.

    At most ``limit`` files are listed, so a flood of files cannot blow up prompts.
    """
    found: list[FileInfo] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        try:
            if path.is_file():
                # Names that are not valid UTF-8 (bytes written by agent code) would break
                # prompts and JSON exports: show them with the bad bytes replaced.
                name = str(rel).encode("utf-8", "replace").decode("utf-8")
                found.append(FileInfo(name, path.stat().st_size))
        except OSError:  # deleted while listing
            continue
        if len(found) >= limit:
            break
    return found


def format_listing(files: Sequence[FileInfo | Mapping[str, Any]]) -> str:
    """A file listing for prompts: one ``name (size)`` per line."""
    if not files:
        return "(the directory is empty)"
    rows = [f if isinstance(f, FileInfo) else FileInfo(f["name"], f["size"]) for f in files]
    return "\n".join(f"- {f.name} ({_human_size(f.size)})" for f in rows)


def _human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


class DSBenchEnv(PipelineEnv):
    """DSBench-v0: data_engineer -> modeler -> analyst in one shared workspace.

    Args:
        tasks: A list of :class:`~mappa_env.dsbench.tasks.DSBenchTask`, a
            :class:`~mappa_env.dsbench.builtin.BuiltinTaskSet` shared with other
            environments, or ``None`` for this environment's own built-in offline tasks
            (made at run time from scikit-learn datasets and seeded synthetic data).
        data_dir: A real DSBench data directory (``data_resplit/`` and ``answers/``);
            with ``task_ids`` selects tasks from it instead of the built-in ones.
        task_ids: Task ids to use from ``data_dir`` (or names of built-in tasks).
        coach: A coach, a spec string (``"rules"``, ``"llm:<model>"``), or ``None`` (only
            with ``reward_mode="outcome"``).
        sandbox: ``"jupyter"`` (default: one kernel per agent, all in the workspace), a
            callable ``workdir -> Sandbox``, or ``None`` (no code runs).
        seed: Seeds task order and the built-in task data.
        turns: Per-agent turn limits; default 4 each.
        max_new_tokens: Token budget per action stated in the prompts.
        code_timeout_s: Wall-clock limit of one code run.
        tool_output_chars: Code output longer than this is cut from the middle.
        shuffle: Visit tasks in a seeded random order.
        reward_mode: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
        outcome_weight: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
        reveal: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
        max_action_chars: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
        max_cycles: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
        invalid_reward: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
        render_mode: See :class:`~mappa_env.envs.pipeline.PipelineEnv`.
    """

    metadata = {  # noqa: RUF012 - PettingZoo reads this as a class attribute
        "render_modes": ["human", "ansi"],
        "name": "dsbench_v0",
        "is_parallelizable": False,
    }
    env_id = "DSBench-v0"
    task_class = DSBenchTask

    def __init__(
        self,
        tasks: Sequence[Any] | None = None,
        *,
        data_dir: str | Path | None = None,
        task_ids: Sequence[str] | None = None,
        coach: Coach | str | None = "rules",
        sandbox: str | SandboxFactory | None = "jupyter",
        seed: int | None = None,
        turns: Mapping[str, int] | None = None,
        max_new_tokens: int = 4096,
        code_timeout_s: float = 120.0,
        tool_output_chars: int = 4000,
        shuffle: bool = True,
        reward_mode: RewardMode = "process",
        outcome_weight: float = 0.5,
        reveal: RevealPolicy | None = None,
        max_action_chars: int = 32_768,
        max_cycles: int | None = None,
        invalid_reward: float = float("nan"),
        render_mode: str | None = None,
    ) -> None:
        self._turn_limits = parse_turn_limits({DATA_ENGINEER: 4, MODELER: 4, ANALYST: 4}, turns)
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
        if code_timeout_s <= 0:
            raise ValueError(f"code_timeout_s must be positive, got {code_timeout_s}")
        self.max_new_tokens = int(max_new_tokens)
        self.code_timeout_s = float(code_timeout_s)
        self.tool_output_chars = int(tool_output_chars)
        self._owned_builtin: BuiltinTaskSet | None = None
        self._shared_builtin: BuiltinTaskSet | None = None
        self._answer_tables: dict[str, pd.DataFrame] = {}
        self.tasks = self._resolve_tasks(tasks, data_dir, task_ids, 0 if seed is None else seed)
        self._answers: pd.DataFrame | None = None
        self._artifacts: dict[str, dict[str, Any]] = {}
        self._slot_start_files: dict[str, list[FileInfo]] = {}
        self._submission_score: Any = None
        self.task = self.tasks[0]
        super().__init__(
            coach=coach,
            reward_mode=reward_mode,
            outcome_weight=outcome_weight,
            reveal=reveal,
            max_action_chars=max_action_chars,
            max_cycles=max_cycles,
            invalid_reward=invalid_reward,
            render_mode=render_mode,
            seed=seed,
            shuffle=shuffle,
            sandbox=sandbox,
        )

    def _resolve_tasks(
        self,
        tasks: Sequence[Any] | None,
        data_dir: str | Path | None,
        task_ids: Sequence[str] | None,
        seed: int,
    ) -> list[Any]:
        from mappa_env.dsbench.tasks import DSBenchTask, load_dsbench_tasks

        if isinstance(tasks, BuiltinTaskSet):
            # Shared with other environments: its answers are already in memory.
            known = {t.id for t in tasks.tasks}
            unknown = sorted(set(task_ids or ()) - known)
            if unknown:
                raise ValueError(f"task_ids {unknown} are not in the task set: {sorted(known)}")
            wanted = None if task_ids is None else set(task_ids)
            resolved = [t for t in tasks.tasks if wanted is None or t.id in wanted]
            self._answer_tables = tasks.answers
            self._shared_builtin = tasks  # keeps its files alive as long as this env
        elif tasks is not None:
            resolved = list(tasks)
            bad = [t for t in resolved if not isinstance(t, DSBenchTask)]
            if bad:
                raise TypeError(
                    f"tasks must be DSBenchTask objects, got {type(bad[0]).__name__}; "
                    "load them with mappa_env.dsbench.load_dsbench_tasks()"
                )
        elif data_dir is not None:
            resolved = load_dsbench_tasks(data_dir, task_ids=task_ids)
        else:
            builtin = BuiltinTaskSet(names=task_ids, seed=seed)
            self._owned_builtin = builtin
            resolved = builtin.tasks
            self._answer_tables = builtin.answers
        if not resolved:
            raise ValueError("no DSBench tasks selected: check tasks, data_dir and task_ids")
        return resolved

    # ------------------------------------------------------------------ pipeline hooks

    def agent_specs(self) -> Sequence[AgentSpec]:
        """data_engineer -> modeler -> analyst, 4 turns each by default."""
        return (
            AgentSpec(DATA_ENGINEER, "data engineer", self._turn_limits[DATA_ENGINEER]),
            AgentSpec(MODELER, "modeler", self._turn_limits[MODELER]),
            AgentSpec(ANALYST, "analyst", self._turn_limits[ANALYST]),
        )

    @property
    def system_description(self) -> str:
        """What the DSBench system is."""
        return SYSTEM_DESCRIPTION

    def role_description(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        return _ROLES[agent] + _ROLE_FOOTER.format(
            turns=self.spec_of(agent).max_turns, budget=self.max_new_tokens
        )

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """Task, file listing, upstream final messages; then the agent's own turns."""
        if agent not in _ROLES:
            raise KeyError(f"unknown agent {agent!r}")
        files = self._slot_start_files.get(agent) or list_files(self.workdir)
        upstream = []
        for other in self.possible_agents[: self.possible_agents.index(agent)]:
            last = self.last_record(other)
            if last is not None:
                text = truncate_middle(strip_think(last.action).strip(), 4000)
                upstream.append(f"[{other}]\n{text or '(empty message)'}")
        first = [
            f"Task:\n{self.task.description}",
            f"Files in the working directory:\n{format_listing(files)}",
        ]
        if upstream:
            first.append("Final messages of the agents before you:\n" + "\n\n".join(upstream))
        must = ", ".join(ARTIFACTS[agent])
        first.append(f"You must leave in the working directory: {must}.")
        messages = [
            {"role": "system", "content": self.role_description(agent)},
            {"role": "user", "content": "\n\n".join(first)},
        ]
        own = self.records_of(agent)
        limit = self.spec_of(agent).max_turns
        for i, record in enumerate(own):
            messages.append({"role": "assistant", "content": record.action})
            left = limit - (i + 1)
            now = record.tool.extra.get("files", ())
            follow = (
                "This is your last turn: finish your work, or reply without code to hand over."
                if left == 1
                else f"You have {left} turns left. Write more code, or reply without code "
                "to hand over with a short summary."
            )
            messages.append(
                {
                    "role": "user",
                    "content": f"Output of your code:\n{record.tool.output or '(no code ran)'}"
                    f"\n\nFiles now:\n{format_listing(now)}\n\n{follow}",
                }
            )
        return messages

    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        """Run the action's Python in the agent's own interpreter; inspect artifacts."""
        blocks = extract_code_blocks(action)
        extra: dict[str, Any] = {"code_blocks": len(blocks)}
        code = "\n".join(blocks) if blocks else None
        result = None
        output = None
        if code is not None:
            # Each agent has its own interpreter: work passes between agents only as files.
            result, output = await self.run_code(
                code, agent, self.code_timeout_s, self.tool_output_chars
            )
            if result is not None:
                self._artifacts.update(await self._inspect(agent))
        # Plain dicts: infos must stay JSON-serialisable.
        extra["files"] = [asdict(f) for f in list_files(self.workdir)]
        extra["upstream_files"] = [
            asdict(f) for f in self._slot_start_files.get(agent, []) if f.name not in INPUT_FILES
        ]
        extra["artifacts"] = {
            name: self._artifacts.get(name, self._file_only_check(name))
            for name in ARTIFACTS[agent] + NEEDS[agent]
        }
        if agent == ANALYST:
            # Reading and scoring a large CSV blocks: keep the event loop free.
            self._submission_score = await asyncio.to_thread(self._score_submission)
            extra["submission"] = self._submission_score.to_dict()
        outcome = ToolOutcome(code=code, result=result, output=output, ends_slot=not blocks)
        outcome.extra = extra
        return outcome

    async def _inspect(self, agent: str) -> dict[str, dict[str, Any]]:
        """Check that pickled artifacts load, in a fresh limited interpreter."""
        names = [n for n in ARTIFACTS[agent] + NEEDS[agent] if n.endswith(".pkl")]
        if not names:
            return {}
        from mappa_env.sandbox.limits import SandboxLimits, kernel_environment

        limits = SandboxLimits()
        code = _INSPECT_CODE % {"rlimits": limits.rlimits(), "names": names}
        self.workdir.mkdir(parents=True, exist_ok=True)  # agent code may have deleted it
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            cwd=self.workdir,
            env=kernel_environment(limits),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), INSPECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            why = f"inspection timed out after {INSPECT_TIMEOUT_S:g} s"
            return {n: {**self._file_only_check(n), "loads": False, "error": why} for n in names}
        try:
            report = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no report"]
            return {
                n: {**self._file_only_check(n), "loads": False, "error": tail[0]} for n in names
            }
        return report if isinstance(report, dict) else {}

    def _file_only_check(self, name: str) -> dict[str, Any]:
        path = self.workdir / name
        exists = path.is_file()
        return {"exists": exists, "size": path.stat().st_size if exists else 0}

    def _score_submission(self) -> Any:
        from mappa_env.dsbench.metrics import score_submission

        path = self.workdir / "submission.csv"
        task = self.task
        targets = list(task.target_columns)
        size = path.stat().st_size if path.is_file() else 0
        if size > MAX_SUBMISSION_BYTES:
            # Not read at all; scoring an empty frame still fills the baseline and range.
            score = score_submission(
                pd.DataFrame(), self._answers, task.metric, task.id_column, targets
            )
            reason = f"submission.csv is {size} bytes, over the {MAX_SUBMISSION_BYTES} limit"
            return dataclasses.replace(score, reason=reason)
        # A missing file is scored too: the failure then carries the baseline and range.
        return score_submission(path, self._answers, task.metric, task.id_column, targets)

    async def episode_outcome(self) -> dict[str, Any]:
        """Score ``submission.csv`` against the hidden answers with the task's metric."""
        from mappa_env.dsbench.metrics import fair_value

        score = self._submission_score
        if score is None:  # the analyst never acted (truncated episode)
            score = self._score_submission()
        target_range = getattr(self.task, "target_range", None)
        return {
            "success": bool(score.success),
            "metric": score.metric,
            "value": score.value,
            "normalized": score.normalized if score.success else 0.0,
            "fair_value": fair_value(score, score.metric, target_range=target_range),
            "reason": score.reason,
            "task_id": self.task.id,
            "task_type": self.task.task_type,
            "reward": float(score.normalized) if score.success else 0.0,
        }

    async def on_episode_start(self) -> None:
        """Copy the task's inputs into a fresh workspace; load the hidden answers."""
        self._artifacts = {}
        self._submission_score = None
        # Copying (possibly large) CSVs blocks: keep the event loop free.
        self._answers = await asyncio.to_thread(self._prepare_workspace, self.task)
        self._slot_start_files = {DATA_ENGINEER: list_files(self.workdir)}

    def _prepare_workspace(self, task: Any) -> pd.DataFrame:
        from mappa_env.dsbench.metrics import read_answers

        copies = [(task.train_path, "train.csv"), (task.test_path, "test.csv")]
        if task.sample_submission_path is not None:
            copies.append((task.sample_submission_path, "sample_submission.csv"))
        for source, name in copies:
            shutil.copyfile(source, self.workdir / name)
        cached = self._answer_tables.get(task.id)
        return cached if cached is not None else read_answers(task.answers_path, task.id_column)

    def task_facts(self) -> tuple[str, str, str | None]:
        """``(task id, description, None)``: DSBench has no short ground-truth string."""
        return self.task.id, self.task.description, None

    def coach_metadata(self, record: ActionRecord) -> dict[str, Any]:
        """Task type, metric, artifact checks and (for the analyst) the submission score."""
        extra = record.tool.extra
        missing = [
            name
            for name in NEEDS[record.agent]
            if not extra.get("artifacts", {}).get(name, {}).get("exists", False)
        ]
        metadata: dict[str, Any] = {
            "task_type": self.task.task_type,
            "metric": self.task.metric,
            "artifacts": extra.get("artifacts", {}),
            "missing_upstream": missing,
        }
        if "submission" in extra and self._submission_score is not None:
            from mappa_env.dsbench.metrics import outcome_cap

            metadata["outcome"] = extra["submission"]
            metadata["outcome_cap"] = outcome_cap(
                self._submission_score,
                self.task.task_type,
                target_range=getattr(self.task, "target_range", None),
            )
        return metadata

    async def on_slot_end(self, agent: str, next_agent: str | None) -> None:
        """Free the agent's interpreter and snapshot the files the next agent starts from."""
        await self.release_sandbox(agent)
        if next_agent is not None:
            self._slot_start_files[next_agent] = list_files(self.workdir)

    def on_close(self) -> None:
        """Remove the built-in task files made for this environment."""
        if self._owned_builtin is not None:
            self._owned_builtin.close()
            self._owned_builtin = None
