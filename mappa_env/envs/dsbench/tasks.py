"""DSBench tasks: the task record and a loader for the real DSBench data layout.

A task directory tree in DSBench's layout looks like::

    <data_dir>/data_resplit/<task_id>/train.csv
    <data_dir>/data_resplit/<task_id>/test.csv
    <data_dir>/data_resplit/<task_id>/sample_submission.csv   (optional)
    <data_dir>/answers/<task_id>/test_answer.csv              (hidden answers)

Descriptions, metrics, id and target columns come from a "cleaned prompts" JSON file
(an object keyed by task id with ``cleaned_prompt``, ``metric``, ``task_type``,
``target_column`` and ``id_column``); the raw Kaggle prompts come from the task-list
JSON-lines files. By default both are looked up in a benchmark directory: the one named by
the ``MAPPA_BENCH_DIR`` environment variable, else a ``shared/data/bench`` directory found
by walking up from the working directory or from the package
(:mod:`mappa_env.bench_data`).

**Hidden answers.** :attr:`DSBenchTask.answers_path` exists only so that the environment
can score a submission. It must never be copied into an agent's workspace or mentioned in
an observation; :meth:`DSBenchTask.agent_files` lists exactly the files agents may see.

Built-in offline tasks in the same layout are made by
:func:`mappa_env.envs.dsbench.builtin.builtin_tasks`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mappa_env._fs import not_a_regular_file, read_text_file, special_file_kind

# The benchmark directory is shared by every environment; its names stay importable from
# here for one release.
from mappa_env.bench_data import BENCH_DIR_ENV as BENCH_DIR_ENV
from mappa_env.bench_data import find_bench_dir as find_bench_dir
from mappa_env.envs.dsbench.metrics import Metric, Score, get_metric

# The same column matching as the scorer: stripped, then case-insensitive.
from mappa_env.envs.dsbench.scoring import find_column, score_submission
from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)


CLEANED_PROMPTS_FILE = "dsbench_modeling_cleaned_prompts.json"
"""File name of the cleaned DSBench prompts inside the benchmark directory."""

TASK_LIST_FILES: Mapping[str, str] = {
    "train": "dsbench_modeling_train.json",
    "eval": "dsbench_modeling_eval.json",
}
"""Split name -> file name of the DSBench task lists (JSON lines) in the benchmark dir."""

_DSBENCH_FILES = f"{CLEANED_PROMPTS_FILE} and the task lists {', '.join(TASK_LIST_FILES.values())}"
"""What the benchmark folder holds for this loader, as errors about the folder say."""

KNOWN_PROMPT_ISSUES: Mapping[str, str] = {
    "titanic": (
        "the cleaned prompt stored under 'titanic' describes spaceship-titanic (target "
        "'Transported', PassengerId format gggg_pp); the raw Kaggle prompt is used as the "
        "description when available and the target column is read from the answers file"
    ),
}
"""Task id -> a known defect of the published cleaned prompt for that task."""

ANSWERS_FILE = "test_answer.csv"

_DOWNLOAD_HINT = (
    "Download DSBench's data-modelling data (data_resplit/ and answers/ folders) and pass "
    "the folder that contains both as data_dir."
)


@dataclass(frozen=True)
class DSBenchTask:
    """One DSBench data-modelling task.

    Attributes:
        id: Task id, e.g. ``"playground-series-s4e6"``.
        description: The task text agents read (overview, evaluation, submission format,
            files). It never contains answers.
        metric: Canonical metric name (see :mod:`mappa_env.envs.dsbench.metrics`).
        task_type: ``"classification"``, ``"regression"`` or, for text-span tasks such as
            tweet-sentiment-extraction, ``"extraction"``.
        id_column: Column that identifies rows in test.csv and in a submission.
        target_columns: Column(s) a submission must predict.
        train_path: The training CSV (features and targets).
        test_path: The test CSV (features only).
        sample_submission_path: A sample submission CSV, or ``None`` when the task has none.
        answers_path: The hidden answers CSV (id and target columns of the test rows). For
            the environment's scorer only: never show it to agents.
        target_range: ``max - min`` of the test targets (mean over target columns) when
            known, used for the "fair" RMSE as % of range; ``None`` when unknown (the
            scorer then measures it from the answers).
        metadata: Extra facts: the raw Kaggle prompt, its URL, the split, known issues,
            how a built-in task was made. Not compared or hashed.
    """

    id: str
    description: str
    metric: str
    task_type: str
    id_column: str
    target_columns: tuple[str, ...]
    train_path: Path
    test_path: Path
    sample_submission_path: Path | None
    answers_path: Path
    target_range: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def metric_spec(self) -> Metric:
        """The :class:`~mappa_env.envs.dsbench.metrics.Metric` this task is scored with."""
        return get_metric(self.metric)

    def agent_files(self) -> dict[str, Path]:
        """Files agents may see, by the name they get in the workspace.

        Returns:
            ``{"train.csv": ..., "test.csv": ...}`` plus ``"sample_submission.csv"`` when
            the task has one. The answers file is never included.
        """
        files = {"train.csv": self.train_path, "test.csv": self.test_path}
        if self.sample_submission_path is not None:
            files["sample_submission.csv"] = self.sample_submission_path
        return files

    def score(self, submission: pd.DataFrame | str | Path) -> Score:
        """Score a submission against this task's hidden answers (joined by id).

        Args:
            submission: A submission DataFrame or the path of a submission CSV.

        Returns:
            The :class:`~mappa_env.envs.dsbench.metrics.Score`; never raises on a bad submission.
        """
        return score_submission(
            submission, self.answers_path, self.metric, self.id_column, self.target_columns
        )


def read_cleaned_prompts(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a cleaned-prompts JSON file (an object keyed by task id).

    Args:
        path: The JSON file.

    Returns:
        Task id -> its entry (``cleaned_prompt``, ``metric``, ``task_type``,
        ``target_column``, ``id_column``).

    Raises:
        FileNotFoundError: If the file does not exist.
        SettingsError: If the path is a FIFO, socket or device, not a regular file.
        ValueError: If it is not a JSON object of objects.
    """
    path = Path(path)
    special = special_file_kind(path)
    if special is not None:
        raise SettingsError(not_a_regular_file(path, "cleaned prompts file", special))
    if not path.is_file():
        raise FileNotFoundError(
            f"cleaned prompts file not found: {path}. Pass cleaned_prompts= or set "
            f"{BENCH_DIR_ENV} to the directory holding {CLEANED_PROMPTS_FILE}."
        )
    data = json.loads(read_text_file(path, "cleaned prompts file"))
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path} must hold a JSON object mapping task ids to objects")
    return data


def read_task_list(path: str | Path) -> list[dict[str, Any]]:
    """Read a DSBench task list: JSON lines (or a JSON array) of ``prompt`` + ``metadata``.

    Args:
        path: The task-list file.

    Returns:
        The entries, each with ``metadata["task_id"]``.

    Raises:
        FileNotFoundError: If the file does not exist.
        SettingsError: If the path is a FIFO, socket or device, not a regular file.
        ValueError: If an entry has no ``metadata.task_id``.
    """
    path = Path(path)
    special = special_file_kind(path)
    if special is not None:
        raise SettingsError(not_a_regular_file(path, "DSBench task list", special))
    if not path.is_file():
        raise FileNotFoundError(f"DSBench task list not found: {path}")
    text = read_text_file(path, "DSBench task list").strip()
    if text.startswith("["):
        entries = json.loads(text)
    else:
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or "task_id" not in entry.get("metadata", {}):
            raise ValueError(f"{path}: entry {number} has no metadata.task_id")
    return entries


def _task_list_paths(
    task_list: str | Path | Sequence[str | Path], bench_dir: Path | None
) -> list[Path]:
    items = [task_list] if isinstance(task_list, (str, Path)) else list(task_list)
    paths = []
    for item in items:
        if isinstance(item, str) and item in (*TASK_LIST_FILES, "all"):
            if bench_dir is None:
                raise FileNotFoundError(
                    f"task_list={item!r} names a split, but no benchmark directory was found; "
                    f"set {BENCH_DIR_ENV} or pass the task-list file path"
                )
            splits = list(TASK_LIST_FILES) if item == "all" else [item]
            paths += [bench_dir / TASK_LIST_FILES[split] for split in splits]
        else:
            paths.append(Path(item))
    return paths


def _resolve_data_dir(data_dir: str | Path) -> Path:
    root = Path(data_dir).expanduser()
    for candidate in (root, root / "data"):
        if (candidate / "data_resplit").is_dir():
            return candidate
    raise FileNotFoundError(
        f"no DSBench data in {root}: expected {root}/data_resplit/<task>/train.csv and "
        f"{root}/answers/<task>/{ANSWERS_FILE}. {_DOWNLOAD_HINT}"
    )


def _resolve_columns(
    task_id: str, id_column: str, targets: Sequence[str], answers_path: Path
) -> tuple[str, tuple[str, ...]]:
    """Check the id/target columns against the answers header; fix placeholder targets."""
    header = [str(column).strip() for column in pd.read_csv(answers_path, nrows=0).columns]
    found_id = find_column(header, id_column)
    if found_id is None:
        raise ValueError(
            f"task {task_id}: id column {id_column!r} is not in {answers_path} "
            f"(columns: {header[:20]})"
        )
    found = [find_column(header, target) for target in targets]
    if all(column is not None for column in found):
        return found_id, tuple(column for column in found if column is not None)
    others = tuple(column for column in header if column != found_id)
    if all(column is None for column in found) and others:
        # The prompt names a placeholder (e.g. "30_labels") or the wrong task's target:
        # the answers file is the authority on what is scored.
        logger.warning(
            "task %s: target column(s) %s are not in the answers; scoring all answer "
            "columns instead: %s",
            task_id,
            list(targets),
            list(others),
        )
        return found_id, others
    missing = [target for target, column in zip(targets, found, strict=True) if column is None]
    raise ValueError(
        f"task {task_id}: target column(s) {missing} are not in {answers_path} "
        f"(columns: {header[:20]})"
    )


def load_dsbench_tasks(
    data_dir: str | Path,
    task_ids: Iterable[str] | None = None,
    task_list: str | Path | Sequence[str | Path] | None = None,
    cleaned_prompts: str | Path | Mapping[str, Mapping[str, Any]] | None = None,
) -> list[DSBenchTask]:
    """Load DSBench tasks from the real DSBench directory layout.

    Args:
        data_dir: The folder holding ``data_resplit/`` and ``answers/`` (or its parent
            with a ``data/`` folder inside).
        task_ids: Which tasks to load, in this order. Default: the tasks of ``task_list``
            if given, else every task of the cleaned prompts.
        task_list: Task-list file(s) (JSON lines with the raw prompts), or a split name of
            the benchmark directory: ``"train"``, ``"eval"`` or ``"all"``. Tasks listed
            there without a cleaned prompt (unknown metric) are skipped with a warning.
        cleaned_prompts: The cleaned-prompts file or its parsed mapping. Default: a
            ``dsbench_modeling_cleaned_prompts.json`` in ``data_dir`` (or the folder it
            resolves to, or that folder's parent), else the one in the benchmark
            directory (see :func:`~mappa_env.bench_data.find_bench_dir`).

    Returns:
        The tasks.

    Raises:
        FileNotFoundError: If the data directory, a task's files, the cleaned prompts or a
            task list is missing; the message names the missing paths.
        KeyError: If an explicitly requested task has no cleaned prompt.
        ValueError: If a task's metric is unknown or its columns are not in its answers.
    """
    root = _resolve_data_dir(data_dir)
    bench_dir = find_bench_dir(required=False, holding=_DSBENCH_FILES)
    # A DSBench folder that carries its own prompts file describes its own tasks: it
    # comes before the benchmark directory's file, which may list other tasks.
    local_prompts = next(
        (
            folder / CLEANED_PROMPTS_FILE
            for folder in dict.fromkeys((Path(data_dir).expanduser(), root, root.parent))
            if (folder / CLEANED_PROMPTS_FILE).is_file()
        ),
        None,
    )
    given = cleaned_prompts is not None
    bench_prompts = None if bench_dir is None else (bench_dir / CLEANED_PROMPTS_FILE).resolve()
    if not given and local_prompts is not None and local_prompts.resolve() != bench_prompts:
        cleaned_prompts = local_prompts
    if cleaned_prompts is None:
        if bench_dir is None:
            raise FileNotFoundError(
                f"no cleaned prompts given, none in {data_dir} and no benchmark directory "
                f"found; pass cleaned_prompts= or put {CLEANED_PROMPTS_FILE} in the data "
                f"directory or in the directory {BENCH_DIR_ENV} names"
            )
        prompts: Mapping[str, Mapping[str, Any]] = read_cleaned_prompts(
            bench_dir / CLEANED_PROMPTS_FILE
        )
    elif isinstance(cleaned_prompts, Mapping):
        prompts = cleaned_prompts
    else:
        prompts = read_cleaned_prompts(cleaned_prompts)

    raw_entries: dict[str, dict[str, Any]] = {}
    listed: list[str] = []
    if task_list is not None:
        for path in _task_list_paths(task_list, bench_dir):
            for entry in read_task_list(path):
                task_id = entry["metadata"]["task_id"]
                raw_entries[task_id] = {**entry, "split_file": path.name}
                listed.append(task_id)
    elif not given and bench_dir is not None:
        # Raw prompts are extra metadata (and correct known faults of cleaned ones, see
        # KNOWN_PROMPT_ISSUES); read them when the default files are there.
        for name in TASK_LIST_FILES.values():
            if (bench_dir / name).is_file():
                for entry in read_task_list(bench_dir / name):
                    raw_entries[entry["metadata"]["task_id"]] = {**entry, "split_file": name}

    if task_ids is not None:
        wanted = list(task_ids)
        unknown = [task_id for task_id in wanted if task_id not in prompts]
        if unknown:
            raise KeyError(f"no cleaned prompt (metric, columns) for task(s): {unknown}")
    elif task_list is not None:
        wanted = list(dict.fromkeys(listed))
        skipped = [task_id for task_id in wanted if task_id not in prompts]
        if skipped:
            logger.warning(
                "skipping %d listed task(s) without a cleaned prompt (metric unknown): %s",
                len(skipped),
                skipped,
            )
        wanted = [task_id for task_id in wanted if task_id in prompts]
    else:
        wanted = sorted(prompts)

    missing_files: list[str] = []
    for task_id in wanted:
        for path in (
            root / "data_resplit" / task_id / "train.csv",
            root / "data_resplit" / task_id / "test.csv",
            root / "answers" / task_id / ANSWERS_FILE,
        ):
            if not path.is_file():
                missing_files.append(str(path))
    if missing_files:
        shown = "\n  ".join(missing_files[:20])
        more = f"\n  ... and {len(missing_files) - 20} more" if len(missing_files) > 20 else ""
        raise FileNotFoundError(
            f"{len(missing_files)} DSBench file(s) missing:\n  {shown}{more}\n{_DOWNLOAD_HINT}"
        )

    return [
        _make_task(root, task_id, prompts[task_id], raw_entries.get(task_id)) for task_id in wanted
    ]


def _make_task(
    root: Path, task_id: str, prompt: Mapping[str, Any], raw_entry: Mapping[str, Any] | None
) -> DSBenchTask:
    task_dir = root / "data_resplit" / task_id
    answers_path = root / "answers" / task_id / ANSWERS_FILE
    metric_name = prompt.get("metric")
    try:
        metric = get_metric(str(metric_name))
    except KeyError as exc:
        raise ValueError(f"task {task_id}: {exc.args[0]}") from None
    targets = prompt.get("target_column")
    target_list = [targets] if isinstance(targets, str) else list(targets or [])
    id_column = prompt.get("id_column")
    if not id_column or not target_list:
        raise ValueError(f"task {task_id}: the cleaned prompt lacks id_column or target_column")
    id_column, target_columns = _resolve_columns(task_id, str(id_column), target_list, answers_path)

    metadata: dict[str, Any] = {"source": "dsbench"}
    description = str(prompt.get("cleaned_prompt", ""))
    if raw_entry is not None:
        raw_meta = raw_entry.get("metadata", {})
        metadata["raw_prompt"] = raw_entry.get("prompt")
        metadata["url"] = raw_meta.get("url")
        metadata["split_file"] = raw_entry.get("split_file")
        splits = {file_name: split for split, file_name in TASK_LIST_FILES.items()}
        metadata["split"] = splits.get(str(raw_entry.get("split_file")))
    if task_id in KNOWN_PROMPT_ISSUES:
        metadata["known_issue"] = KNOWN_PROMPT_ISSUES[task_id]
        logger.warning("task %s: %s", task_id, KNOWN_PROMPT_ISSUES[task_id])
        if metadata.get("raw_prompt"):
            description = str(metadata["raw_prompt"])
    if not description:
        raise ValueError(f"task {task_id}: no description (cleaned_prompt is empty)")
    sample = task_dir / "sample_submission.csv"
    return DSBenchTask(
        id=task_id,
        description=description,
        metric=metric.name,
        task_type=str(prompt.get("task_type") or metric.kind),
        id_column=id_column,
        target_columns=target_columns,
        train_path=task_dir / "train.csv",
        test_path=task_dir / "test.csv",
        sample_submission_path=sample if sample.is_file() else None,
        answers_path=answers_path,
        target_range=None,
        metadata=metadata,
    )
