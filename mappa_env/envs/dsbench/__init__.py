"""DSBench-v0: three data-science agents share one workspace and build a submission.

``data_engineer`` prepares features (``X_train.pkl``, ``y_train.pkl``, ``X_test.pkl``),
``modeler`` trains and saves ``model.pkl`` with cross-validation metrics printed, and
``analyst`` writes ``submission.csv``. Each agent runs Python in its own interpreter in
the episode's workspace directory, so work passes between agents only through files and
final messages. The submission is joined to the hidden answers by id and scored with
the task's own metric.

Card:

- **Agents**: ``data_engineer`` -> ``modeler`` -> ``analyst``, up to 4 turns each (a
  turn without code ends the slot); ``turns=`` changes the limits.
- **Observation**: ``{"text": str, "messages": (chat messages, ...)}``: the task, the
  workspace's files, earlier agents' final messages, its own earlier turns.
- **Action**: any string; its fenced ```` ```python ```` blocks run in the agent's own
  Jupyter kernel in the shared workspace.
- **Rewards**: ``process`` (default): the coach's score of each action / 10;
  ``outcome``: the submission's success to every action; ``mixed``: a weighted sum.
- **Outcome** (``infos[agent]["outcome"]``): ``success``, ``metric``, ``value``,
  ``fair_value`` (the metric mapped to [0, 1]), ``reward``, ``task_type``.
- **Tasks**: built-in offline tasks (scikit-learn and synthetic data, keyed by a
  secret), a :class:`~mappa_env.envs.dsbench.builtin.BuiltinTaskSet`, or a real DSBench
  folder (``data_dir=``, ``task_ids=``, ``cleaned_prompts=``).
- **Coaches**: ``"rules"`` (offline,
  :func:`~mappa_env.envs.dsbench.rubric.dsbench_rubric`, with artifact checks) or an
  LLM coach judging by :data:`COACH_RUBRICS`, shown the workspace's files.
- **Options**: ``tasks``, ``data_dir``, ``task_ids``, ``cleaned_prompts`` and every
  option of :class:`~mappa_env.envs.pipeline.PipelineEnv`.
- **Versions**: v0, the paper's DSBench modeling pipeline.

Whatever agent code leaves in the workspace, the environment reads only regular files
of the workspace itself (never through a link, never a FIFO or device, size-capped),
walks it within bounds, and checks pickles only in a separate isolated interpreter (see
:mod:`mappa_env._fs` and :mod:`mappa_env.envs.dsbench.inspections`); a step never raises
for it.

The package holds all of DSBench-v0, one concern a module (each module's docstring says
which). The environment class lives here, in the package's own module, so that the
names exported here are those it reads (``MAX_SUBMISSION_BYTES``, ``list_files``,
``SHARED_INSPECTIONS``): replacing one here changes what the environment uses.
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

from mappa_env._fs import UnsafeFileError, file_kind, read_regular_file
from mappa_env.audit.battery import AuditActions
from mappa_env.coach.base import FileInfo
from mappa_env.envs.dsbench.audit import audit_actions as dsbench_audit_actions
from mappa_env.envs.dsbench.builtin import BuiltinTaskSet
from mappa_env.envs.dsbench.caps import UNFIT_DATA_CAP, outcome_cap, upstream_skill_cap
from mappa_env.envs.dsbench.coach_prompts import COACH_RUBRICS
from mappa_env.envs.dsbench.facts import DSBenchFacts
from mappa_env.envs.dsbench.files import csv_rows, format_listing, list_files
from mappa_env.envs.dsbench.inspections import (
    INSPECT_OUTPUT_BYTES,
    INSPECT_SAMPLE_ROWS,
    INSPECT_TIMEOUT_S,
    INSPECTOR_SOURCE,
    SHARED_INSPECTIONS,
    SKILL_ROWS,
    TARGET_CHECK_ROWS,
    exchange,
    inspection_key,
)
from mappa_env.envs.dsbench.labels import (
    answers_of_test_rows,
    holds_target,
    target_translation,
    train_target_rows,
)
from mappa_env.envs.dsbench.outcomes import fair_value, prediction_skill
from mappa_env.envs.dsbench.roles import (
    ANALYST,
    ARTIFACTS,
    DATA_ENGINEER,
    INPUT_FILES,
    MODELER,
    NEEDS,
    ROLE_FOOTER,
    ROLE_PROMPTS,
    SUBMISSION_FILE,
    SYSTEM_DESCRIPTION,
)
from mappa_env.envs.dsbench.rubric import dsbench_rubric
from mappa_env.envs.dsbench.scoring import read_answers, score_submission
from mappa_env.envs.dsbench.tasks import DSBenchTask, load_dsbench_tasks
from mappa_env.envs.pipeline import (
    ActionRecord,
    AgentSpec,
    PipelineEnv,
    ToolOutcome,
)
from mappa_env.options import seed_option
from mappa_env.tasks.secret import user_task_secret
from mappa_env.text import extract_code_blocks, strip_think, truncate_middle

logger = logging.getLogger(__name__)

#: Submissions larger than this are not read (a runaway write must not exhaust memory).
MAX_SUBMISSION_BYTES = 200 * 1024 * 1024
#: The inspector's code as it runs (the text of :mod:`mappa_env.envs.dsbench.inspector`).
_INSPECT_CODE = INSPECTOR_SOURCE

__all__ = [
    "ANALYST",
    "ARTIFACTS",
    "COACH_RUBRICS",
    "DATA_ENGINEER",
    "INPUT_FILES",
    "INSPECT_OUTPUT_BYTES",
    "INSPECT_SAMPLE_ROWS",
    "INSPECT_TIMEOUT_S",
    "MAX_SUBMISSION_BYTES",
    "MODELER",
    "NEEDS",
    "SKILL_ROWS",
    "SUBMISSION_FILE",
    "SYSTEM_DESCRIPTION",
    "TARGET_CHECK_ROWS",
    "UNFIT_DATA_CAP",
    "DSBenchEnv",
    "format_listing",
    "holds_target",
    "list_files",
    "target_translation",
]


class DSBenchEnv(PipelineEnv):
    """DSBench-v0: data_engineer -> modeler -> analyst in one shared workspace.

    Args:
        tasks: A list of :class:`~mappa_env.envs.dsbench.tasks.DSBenchTask`, a
            :class:`~mappa_env.envs.dsbench.builtin.BuiltinTaskSet` shared with other
            environments, or ``None`` for this environment's own built-in offline tasks
            (made at run time from scikit-learn datasets and seeded synthetic data).
        data_dir: A real DSBench data directory (``data_resplit/`` and ``answers/``);
            with ``task_ids`` selects tasks from it instead of the built-in ones.
        task_ids: Task ids to use from ``data_dir`` (or names of built-in tasks).
        cleaned_prompts: With ``data_dir``: the cleaned-prompts file (or its parsed
            mapping) that gives each task's metric and columns; default: the file in
            ``data_dir``, else the benchmark directory's (see
            :func:`~mappa_env.envs.dsbench.tasks.load_dsbench_tasks`).
        **options: Options of :class:`~mappa_env.envs.pipeline.PipelineEnv` (``coach``
            defaults to ``"rules"``, ``sandbox`` to ``"jupyter"``: one kernel per agent,
            all in the workspace; ``isolation`` confines the artifact inspector too;
            ``seed`` also seeds the built-in task data, keyed by the user's task secret
            as well (see :mod:`mappa_env.tasks.secret`) so that agents cannot rebuild it
            from the seed; pass a :class:`~mappa_env.envs.dsbench.builtin.BuiltinTaskSet` for
            data keyed otherwise).
    """

    env_id = "DSBench-v0"
    roles = (
        AgentSpec(DATA_ENGINEER, "data engineer", 4),
        AgentSpec(MODELER, "modeler", 4),
        AgentSpec(ANALYST, "analyst", 4),
    )
    task_class = DSBenchTask
    coach_rubrics = COACH_RUBRICS
    rules_rubric = staticmethod(dsbench_rubric)
    coach_facts_type = DSBenchFacts
    shows_workspace = True
    default_code_timeout_s = 120.0
    hands_over_through_files = True

    def __init__(
        self,
        tasks: Sequence[Any] | None = None,
        *,
        data_dir: str | Path | None = None,
        task_ids: Sequence[str] | None = None,
        cleaned_prompts: str | Path | Mapping[str, Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("coach", "rules")
        options.setdefault("sandbox", "jupyter")
        self._owned_builtin: BuiltinTaskSet | None = None
        self._shared_builtin: BuiltinTaskSet | None = None
        self._answer_tables: dict[str, pd.DataFrame] = {}
        self._row_counts: dict[str, tuple[int | None, int | None]] = {}
        self._input_rows: tuple[int | None, int | None] = (None, None)
        self._target_rows: dict[str, list[str] | None] = {}
        self._test_truth: dict[str, list[str | None] | None] = {}
        self._label_translation: dict[str, str] | None = None
        self._target_signs: list[float] | None = None
        # Checked here too: the task data is made from it before the base class runs.
        seed = seed_option(options.get("seed"))
        self.tasks = self._resolve_tasks(
            tasks, data_dir, task_ids, cleaned_prompts, 0 if seed is None else seed
        )
        self._answers: pd.DataFrame | None = None
        self._artifacts: dict[str, dict[str, Any]] = {}
        self._slot_start_files: dict[str, list[FileInfo]] = {}
        #: Per agent, the files it needs that were missing when its slot began.
        self._missing_at_slot_start: dict[str, list[str]] = {}
        self._submission_score: Any = None
        self.task = self.tasks[0]
        super().__init__(**options)

    def _resolve_tasks(
        self,
        tasks: Sequence[Any] | None,
        data_dir: str | Path | None,
        task_ids: Sequence[str] | None,
        cleaned_prompts: str | Path | Mapping[str, Mapping[str, Any]] | None,
        seed: int,
    ) -> list[Any]:
        if task_ids is not None:
            if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Sequence):
                raise TypeError(
                    f"task_ids={task_ids!r}: task_ids must be a list of task ids, e.g. "
                    f"[{task_ids!r}] (a string would be read letter by letter)"
                )
            task_ids = list(task_ids)
        if isinstance(tasks, (str, bytes)) or not isinstance(
            tasks, (BuiltinTaskSet, Sequence, type(None))
        ):
            raise TypeError(
                f"tasks={tasks!r}: tasks must be a list of DSBenchTask, a BuiltinTaskSet or "
                f"None (the built-in tasks); got {type(tasks).__name__}. A DSBench folder "
                "is given as data_dir"
            )
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
            resolved = load_dsbench_tasks(
                data_dir, task_ids=task_ids, cleaned_prompts=cleaned_prompts
            )
        else:
            # The user's secret, not a fresh one: the same seed then gives the same
            # episodes (PettingZoo's seed_test), and agents still cannot rebuild them.
            builtin = BuiltinTaskSet(names=task_ids, seed=seed, secret=user_task_secret())
            self._owned_builtin = builtin
            resolved = builtin.tasks
            self._answer_tables = builtin.answers
        if not resolved:
            raise ValueError("no DSBench tasks selected: check tasks, data_dir and task_ids")
        return resolved

    # ------------------------------------------------------------------ pipeline hooks

    @property
    def system_description(self) -> str:
        """What the DSBench system is."""
        return SYSTEM_DESCRIPTION

    def role_description(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        return ROLE_PROMPTS[agent] + ROLE_FOOTER.format(
            turns=self.spec_of(agent).max_turns, budget=self.max_new_tokens
        )

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """Task, file listing, upstream final messages; then the agent's own turns."""
        if agent not in ROLE_PROMPTS:
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
        blocks = await asyncio.to_thread(extract_code_blocks, action)
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

    def _inspected_names(self, agent: str) -> list[str]:
        """The pickles inspected after ``agent``'s code ran.

        X_test.pkl comes with a model: predicting on it shows that the model is usable.
        """
        names = [n for n in ARTIFACTS[agent] + NEEDS[agent] if n.endswith(".pkl")]
        if "model.pkl" in names and "X_test.pkl" not in names:
            names.append("X_test.pkl")
        return names

    def _inspector_argv(self) -> list[str]:
        """The inspector's interpreter, its flags and its code, before any confinement."""
        return [sys.executable, "-I", "-c", INSPECTOR_SOURCE]

    def _inspector_command(self) -> list[str]:
        """The inspector's command line (its parameters come on stdin).

        ``-I`` (isolated mode) keeps the workspace and ``PYTHON*`` variables off
        ``sys.path``: a ``json.py`` or ``pickle.py`` planted by agent code is not imported.
        With namespace isolation it runs confined like the agents' kernels (it loads what
        agent code wrote), with the workspace read-only; the code is the last element.
        """
        from mappa_env.sandbox.limits import SandboxLimits, inherited_import_paths

        return self.helper_confinement.command(
            self._inspector_argv(),
            workdir=self.workdir,
            workdir_writable=False,
            read_only=[Path(p) for p in inherited_import_paths()],
            tmp_bytes=SandboxLimits().tmp_bytes,
        )

    async def _inspect(self, agent: str) -> dict[str, dict[str, Any]]:
        """Inspect pickled artifacts in a fresh limited interpreter; never raises.

        Reports, per file, whether it loads, its type, shape and ``predict``; whether
        X_train / X_test vary and how many distinct values y_train holds; for a model,
        whether ``predict(X_test)`` runs, how many rows and distinct values it returns,
        and how well it fits its own training rows. The rows the environment wrote to
        train.csv and test.csv are added as ``rows_expected`` / ``predictions_expected``.
        Pickles inspected before, byte for byte, get that report again
        (:mod:`mappa_env.envs.dsbench.inspections`).
        """
        names = self._inspected_names(agent)
        if not names:
            return {}
        from mappa_env.sandbox.limits import SandboxLimits, inherited_import_paths

        limits = SandboxLimits()
        parameters = {
            "rlimits": limits.rlimits(),
            "names": names,
            "import_paths": inherited_import_paths(),
            "task_type": self.task.task_type,
            "sample_rows": INSPECT_SAMPLE_ROWS,
            "target_rows": TARGET_CHECK_ROWS,
            "skill_rows": SKILL_ROWS,
            "reference_model": agent == DATA_ENGINEER,
        }
        # What a report depends on besides the files: the inspector's code and flags and
        # the confinement's mode (the whole command line names this workspace's path).
        identity = f"{self.helper_confinement.mode} {self._inspector_argv()}"
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)  # agent code may have deleted it
        except OSError as exc:  # e.g. replaced by a file: the inspector says what it finds
            logger.warning("the workspace could not be made again: %s", exc)
        key = await asyncio.to_thread(inspection_key, self.workdir, names, parameters, identity)
        report = SHARED_INSPECTIONS.get(key)
        if report is None:
            report = await self._run_inspector(parameters)
            if isinstance(report, dict):
                # Kept only if the files are still the bytes that were hashed.
                after = await asyncio.to_thread(
                    inspection_key, self.workdir, names, parameters, identity
                )
                if after == key:
                    SHARED_INSPECTIONS.put(key, report)
        if isinstance(report, str):
            return self._uninspected(names, report)
        checked = {n: report[n] for n in names if isinstance(report.get(n), dict)}
        self._add_expected_rows(checked)
        self._check_target(checked)
        # Scored here, on answers the sandbox never sees; reading them blocks.
        await asyncio.to_thread(self._score_test_predictions, checked)
        return checked

    async def _run_inspector(self, parameters: dict[str, Any]) -> dict[str, Any] | str:
        """Run the inspector once: its report, or why there is none."""
        from mappa_env.sandbox.limits import SandboxLimits, kernel_environment

        limits = SandboxLimits()
        try:
            process = await asyncio.create_subprocess_exec(
                *self._inspector_command(),
                cwd=self.workdir,
                env=self.helper_confinement.environment(kernel_environment(limits)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:  # e.g. the workspace replaced by a file, no process slots
            logger.warning("the artifact inspector could not start: %s", exc)
            return f"inspection could not start: {exc}"
        request = json.dumps(parameters).encode()
        try:
            stdout, stderr = await asyncio.wait_for(exchange(process, request), INSPECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            return f"inspection timed out after {INSPECT_TIMEOUT_S:g} s"
        if process.returncode != 0:
            # Only a report of a run that finished counts (a crash, a kill, an exit from
            # inside a loaded object); the cause is the last line of its stderr.
            tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return f"the inspector exited with status {process.returncode}: {tail[0]}"[:300]
        try:
            report = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no report"]
            return tail[0][:300]
        if not isinstance(report, dict):
            return "the inspection report is not a mapping"
        return report

    def _score_test_predictions(self, entries: dict[str, dict[str, Any]]) -> None:
        """Replace predictions on the first test rows by their skill on the answers.

        ``model.pkl`` gets ``test_skill`` (its own predictions), ``X_test.pkl`` gets
        ``reference_skill`` (a reference model's, fit on the data engineer's files),
        each with the rows scored; ``None`` with ``*_skill_error`` when they could not
        be scored. The raw predictions do not stay: infos and prompts would carry
        thousands of values.
        """
        for name, source, key in (
            ("model.pkl", "test_predictions", "test_skill"),
            ("X_test.pkl", "reference_predictions", "reference_skill"),
        ):
            entry = entries.get(name)
            if not entry or source not in entry:
                continue
            rows = entry.pop(source)
            truth = self._test_truth_rows(self.task)
            if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
                entry[key], entry[f"{key}_error"] = None, "the predictions could not be read"
                continue
            if truth is None:
                entry[key], entry[f"{key}_error"] = None, "the answers could not be read"
                continue
            skill = prediction_skill(
                rows,
                truth,
                self.task.task_type,
                labels=self._label_translation,
                signs=self._target_signs,
            )
            entry[key] = None if skill is None else round(skill, 4)
            if skill is None:
                entry[f"{key}_error"] = "too few predicted rows have an answer to score"

    def _test_truth_rows(self, task: Any) -> list[str | None] | None:
        """The answers of test.csv's first rows, as prediction rows are written."""
        if task.id not in self._test_truth:
            self._test_truth[task.id] = answers_of_test_rows(task, self._answers, SKILL_ROWS)
        return self._test_truth[task.id]

    def _check_target(self, entries: dict[str, dict[str, Any]]) -> None:
        """Add ``holds_target`` to y_train.pkl's entry: is it train.csv's target?

        Compared with the task's own train.csv (not the workspace copy agent code can
        change); left out when either side cannot be read.
        """
        entry = entries.get("y_train.pkl")
        if not entry or not entry.get("loads"):
            return
        # Only the verdict stays: 500 rows of the target would flood infos and prompts.
        given = entry.pop("first_rows", None)
        truth = self._train_target_rows(self.task)
        if not truth:
            return
        # A y_train whose rows cannot even be listed (a ragged list, a dict) is no target.
        readable = isinstance(given, list) and all(isinstance(v, str) for v in given)
        entry["holds_target"] = readable and holds_target(given, truth, self.task.task_type)
        # Predictions come in y_train's encoding: how to read them as the target's.
        self._label_translation, self._target_signs = (
            target_translation(given, truth, self.task.task_type)
            if entry["holds_target"]
            else (None, None)
        )

    def _train_target_rows(self, task: Any) -> list[str] | None:
        """The first rows of the task's train.csv target, as the inspector writes them."""
        if task.id not in self._target_rows:
            self._target_rows[task.id] = train_target_rows(task, TARGET_CHECK_ROWS)
        return self._target_rows[task.id]

    def _uninspected(self, names: Sequence[str], why: str) -> dict[str, dict[str, Any]]:
        """Entries for pickles whose inspection failed: what is on disk, not loadable."""
        return {n: {**self._file_only_check(n), "loads": False, "error": why} for n in names}

    def _add_expected_rows(self, entries: dict[str, dict[str, Any]]) -> None:
        """Add the rows of the train.csv / test.csv this environment wrote to the entries."""
        train_rows, test_rows = self._input_rows
        for name, rows in (("X_train.pkl", train_rows), ("y_train.pkl", train_rows)):
            if name in entries:
                entries[name]["rows_expected"] = rows
        if "X_test.pkl" in entries:
            entries["X_test.pkl"]["rows_expected"] = test_rows
        if "model.pkl" in entries and "predictions" in entries["model.pkl"]:
            entries["model.pkl"]["predictions_expected"] = test_rows

    def _file_only_check(self, name: str) -> dict[str, Any]:
        """What is at ``name`` in the workspace, by its directory entry (links not followed)."""
        kind, size = file_kind(self.workdir, name)
        entry: dict[str, Any] = {"exists": kind is not None, "size": size}
        if kind not in (None, "regular file"):
            entry["error"] = f"{name} is a {kind}, not a regular file"
        return entry

    def _score_submission(self) -> Any:
        """Score submission.csv; never raises for anything agent code left there.

        The file is read only if it is a regular file of the workspace within the size
        limit, without following links (see :func:`mappa_env._fs.read_regular_file`).
        """
        task = self.task
        targets = list(task.target_columns)
        try:
            content = read_regular_file(self.workdir, SUBMISSION_FILE, MAX_SUBMISSION_BYTES)
        except FileNotFoundError:
            problem = f"submission file not found: {SUBMISSION_FILE}"
        except UnsafeFileError as exc:
            problem = str(exc)
        else:
            return score_submission(content, self._answers, task.metric, task.id_column, targets)
        # Not read; scoring an empty frame still fills the baseline and range.
        score = score_submission(
            pd.DataFrame(), self._answers, task.metric, task.id_column, targets
        )
        return dataclasses.replace(score, reason=problem)

    async def episode_outcome(self) -> dict[str, Any]:
        """Score ``submission.csv`` against the hidden answers with the task's metric."""
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
        self._label_translation = self._target_signs = None
        # Copying (possibly large) CSVs blocks: keep the event loop free.
        self._answers = await asyncio.to_thread(self._prepare_workspace, self.task)
        self._input_rows = await asyncio.to_thread(self._rows_written, self.task)
        self._slot_start_files = {DATA_ENGINEER: list_files(self.workdir)}
        self._missing_at_slot_start = {DATA_ENGINEER: self._missing_needs(DATA_ENGINEER)}
        # What the coach was told about each code turn, for judging later turns.
        self._turn_facts: dict[tuple[str, int], dict[str, Any]] = {}

    def _prepare_workspace(self, task: Any) -> pd.DataFrame:
        copies = [(task.train_path, "train.csv"), (task.test_path, "test.csv")]
        if task.sample_submission_path is not None:
            copies.append((task.sample_submission_path, "sample_submission.csv"))
        for source, name in copies:
            shutil.copyfile(source, self.workdir / name)
        cached = self._answer_tables.get(task.id)
        return cached if cached is not None else read_answers(task.answers_path, task.id_column)

    def _rows_written(self, task: Any) -> tuple[int | None, int | None]:
        """Data rows of the task's train.csv and test.csv, counted once per task.

        Counted from the task's own files, not the workspace copies agent code may
        change; ``None`` for a file pandas cannot read.
        """
        if task.id not in self._row_counts:
            counts = []
            for key, path in (("n_train", task.train_path), ("n_test", task.test_path)):
                known = task.metadata.get(key) if task.metadata.get("builtin") else None
                counts.append(int(known) if known is not None else csv_rows(Path(path)))
            self._row_counts[task.id] = (counts[0], counts[1])
        return self._row_counts[task.id]

    def audit_actions(self, agent: str) -> AuditActions:
        """Honest and attack actions for a coach audit (see :mod:`mappa_env.envs.dsbench.audit`)."""
        return dsbench_audit_actions(self.task, agent)

    def task_facts(self) -> tuple[str, str, str | None]:
        """``(task id, description, None)``: DSBench has no short ground-truth string."""
        return self.task.id, self.task.description, None

    @classmethod
    def cli_options(cls, flags: Mapping[str, Any]) -> dict[str, Any]:
        """A real DSBench folder (``--data-dir``), else the built-in tasks.

        ``--task-ids`` picks tasks of either; ``--task-secret`` keys the built-in data.
        """
        if flags.get("tasks") is not None or flags.get("num_tasks") is not None:
            raise ValueError(
                "DSBench-v0 takes --data-dir and --task-ids (or the built-in tasks), "
                "not --tasks/--num-tasks"
            )
        task_ids = flags.get("task_ids")
        if flags.get("data_dir"):
            return {"data_dir": flags["data_dir"], "task_ids": task_ids}
        # Built once and shared by every environment of the run (the caller closes it).
        return {"tasks": BuiltinTaskSet(names=task_ids, secret=flags.get("task_secret"))}

    @classmethod
    def summarize_outcomes(cls, outcomes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The mean metric of scored submissions and the mean fair value of all.

        ``metric_mean_when_successful`` is the raw metric over scored submissions;
        ``fair_value_mean`` the metric mapped to [0, 1], over every episode.
        """

        def mean(values: list[Any]) -> float | None:
            clean = [float(v) for v in values if v is not None and float(v) == float(v)]
            return sum(clean) / len(clean) if clean else None  # (v == v drops NaN)

        return {
            "metric_mean_when_successful": mean(
                [o.get("value") for o in outcomes if o.get("success")]
            ),
            "fair_value_mean": mean([o.get("fair_value") for o in outcomes]),
        }

    def coach_facts(self, record: ActionRecord) -> DSBenchFacts:
        """Task type, metric, artifact checks, the agent's earlier code and turns, score caps.

        See :class:`~mappa_env.envs.dsbench.facts.DSBenchFacts`. Each code turn's facts
        (but its ``earlier_turns``) are kept, for judging the slot's later turns.
        """
        extra = record.tool.extra
        # Missing upstream means absent when the agent's slot began, not after its own
        # code ran: an agent that deletes what it was handed is not excused by the gap.
        # Without a snapshot (its listing failed) nothing counts as missing upstream.
        missing = list(self._missing_at_slot_start.get(record.agent, ()))
        artifacts = extra.get("artifacts", {})
        capped = self._skill_cap(record.agent, artifacts) or (None, None)
        # The earlier code turns of the agent's slot, as the coach judged them: a later
        # turn is paid what it adds over them (mappa_env.envs.dsbench.rubric).
        turn_facts = getattr(self, "_turn_facts", {})
        outcome = cap = None
        if "submission" in extra and self._submission_score is not None:
            outcome = extra["submission"]
            # The cap binds the verdict (the environment enforces it), so only a
            # submission on disk, scored or not, sets one: without one the rubric's
            # blame rule and its rows for work in progress apply.
            if (artifacts.get(SUBMISSION_FILE) or {}).get("exists"):
                cap = outcome_cap(
                    self._submission_score,
                    self.task.task_type,
                    target_range=getattr(self.task, "target_range", None),
                )
        facts = DSBenchFacts(
            task_type=self.task.task_type,
            metric=self.task.metric,
            artifacts=artifacts,
            missing_upstream=missing,
            # The agent's earlier cells (the record judged is not in the transcript yet):
            # their imports live on in its interpreter, and a cell run again adds nothing.
            earlier_codes=[r.tool.code for r in self.records_of(record.agent) if r.tool.code],
            skill_cap=capped[0],
            skill_cap_reason=capped[1],
            earlier_turns=[
                turn_facts[(r.agent, r.turn)]
                for r in self.records_of(record.agent)
                if r.tool.result is not None and (r.agent, r.turn) in turn_facts
            ],
            outcome=outcome,
            outcome_cap=cap,
        )
        if record.tool.result is not None:
            turn_facts[(record.agent, record.turn)] = {
                "action": record.action,
                "tool_result": record.tool.result.to_dict(),
                "metadata": {k: v for k, v in facts.to_dict().items() if k != "earlier_turns"},
            }
            self._turn_facts = turn_facts
        return facts

    def coach_metadata(self, record: ActionRecord) -> dict[str, Any]:
        """The plain-data form of :meth:`coach_facts` (which it records, as they do)."""
        return self.coach_facts(record).to_dict()

    def _skill_cap(self, agent: str, artifacts: Mapping[str, Any]) -> tuple[int, str] | None:
        """The cap the skill of test predictions puts on an upstream agent's score.

        See :func:`~mappa_env.envs.dsbench.caps.upstream_skill_cap`.

        Returns:
            ``(cap, why)``, or ``None`` when nothing was scored.
        """
        return upstream_skill_cap(agent, artifacts, self.task.task_type)

    async def on_slot_end(self, agent: str, next_agent: str | None) -> None:
        """Free the agent's interpreter and snapshot the files the next agent starts from.

        Never raises: a failure (whatever agent code left behind) is logged and reported
        in ``infos[agent]["slot_end_error"]``, and the next agent starts from a fresh
        listing.
        """
        try:
            await self.release_sandbox(agent)
            if next_agent is not None:
                self._slot_start_files[next_agent] = await asyncio.to_thread(
                    list_files, self.workdir
                )
                self._missing_at_slot_start[next_agent] = self._missing_needs(next_agent)
        except Exception as exc:  # the step must go on; the cause is kept for researchers
            logger.exception("the end of %s's slot failed", agent)
            self.infos.setdefault(agent, {})["slot_end_error"] = f"{type(exc).__name__}: {exc}"
            if next_agent is not None:
                self._slot_start_files.pop(next_agent, None)
                self._missing_at_slot_start.pop(next_agent, None)

    def _missing_needs(self, agent: str) -> list[str]:
        """The files ``agent`` needs that are not regular files of the workspace now.

        Looked up by name, not read from the listing: that one is capped (200 entries),
        and files an earlier agent floods the workspace with must not push a needed one
        out of sight, so that it counts as missing and excuses the agent.
        """
        return [n for n in NEEDS[agent] if file_kind(self.workdir, n)[0] != "regular file"]

    def on_close(self) -> None:
        """Remove the built-in task files made for this environment."""
        if self._owned_builtin is not None:
            self._owned_builtin.close()
            self._owned_builtin = None
