"""Math tasks: the :class:`MathTask` record and loaders for AIME/AMC-style files and datasets.

Supported sources (see :func:`load_math_tasks`):

* a JSON array file, a JSON-lines file, or a JSON object keyed by task id;
* a benchmark name (``"aime_2025"``, ``"AIME_1983_2024"``, ``"amc"``, ``"amc_eval_32"``):
  the file of that name in the benchmark directory
  (:func:`~mappa_env.bench_data.find_bench_dir`) when there is one, else the benchmark's
  public Hugging Face dataset (:data:`PUBLIC_BENCHMARKS`);
* a Hugging Face dataset (``"hf:<id>"``, or any string that is not a file and holds
  a ``/``), when the ``datasets`` package is installed.

The benchmark files are read where they are; nothing is copied. Public datasets are
downloaded once by ``datasets``, which caches them (``HF_DATASETS_CACHE``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mappa_env import bench_data
from mappa_env._fs import not_a_regular_file, read_text_file, special_file_kind
from mappa_env._optional import MissingExtraError, require

# Where the benchmark folder is found serves every environment (mappa_env.bench_data);
# its names stay importable from here for one release.
from mappa_env.bench_data import BENCH_DIR_ENV as BENCH_DIR_ENV
from mappa_env.bench_data import bench_dir_candidates as bench_dir_candidates
from mappa_env.bench_data import find_bench_dir as find_bench_dir
from mappa_env.envs.mathchat.grading import extract_boxed
from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

PROMPT_FIELDS = ("prompt", "problem", "question")
"""Field names read as the problem statement, first present wins (case-insensitive)."""

ANSWER_FIELDS = ("answer", "final_answer", "expected_answer", "target")
"""Field names read as the final answer, first present wins (case-insensitive)."""

SOLUTION_FIELDS = ("solution", "reference_solution")
"""Worked-solution fields; their last ``\\boxed{}`` is the answer when no answer field exists."""

ID_FIELDS = ("id", "unique_id", "problem_id")
"""Field names read as the task id, first present wins (case-insensitive)."""

# "080 or 081 (both were accepted)": a problem whose official answer key took two values.
_ALTERNATIVE_ANSWERS = re.compile(
    r"^\s*(?P<first>\S+)\s+or\s+(?P<second>\S+)\s*\((?:both|all)\b[^)]*\baccepted\)\s*$",
    re.IGNORECASE,
)
_JSON_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class MathTask:
    """One math problem with a single final answer.

    Attributes:
        id: Stable identifier: the source's own id when it has one, else
            ``<file stem>-<row index>``; generated tasks use ``gen-s<seed>-<index>``.
        prompt: The problem statement shown to the agents.
        answer: The final answer as text. Float answers such as ``18.0`` become
            ``"18"``; zero-padded AIME answers (``"023"``) are kept as given:
            :func:`mappa_env.envs.mathchat.grading.answers_match` treats them as numbers.
        metadata: Read-only extra facts: ``source`` (where the task came from),
            ``raw_answer`` (the answer exactly as stored), ``index`` (row number),
            the source's other fields (``year``, ``url``, ...), ``accepted_answers``
            when a problem accepts several answers, and for generated tasks
            ``kind``, ``category``, ``difficulty``, ``needs_code`` and ``params``.
    """

    id: str
    prompt: str
    answer: str
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))


class TaskFormatError(ValueError):
    """A task file or dataset row is malformed; the message says which file and row."""


class BenchmarkUnavailableError(FileNotFoundError, SettingsError):
    """A named benchmark is in no local folder and its public dataset could not be loaded.

    The message says which folder would serve it and which dataset needs network access
    (for a task file that does not exist: which benchmark names do). A
    :class:`~mappa_env.errors.SettingsError` too: the ``mappa`` command prints it as one
    line.
    """


@dataclass(frozen=True)
class PublicBenchmark:
    """Where a named benchmark is published on the Hugging Face Hub, and how to read it.

    Attributes:
        dataset_id: The dataset's id on the Hub (or a local dataset directory).
        split: The split holding the problems.
        columns: Our field -> the dataset's column: ``"prompt"`` and ``"answer"``
            always, ``"id"`` when the dataset has a unique one; any other key copies
            that column into the task's metadata under our name.
        config: The dataset's configuration, when it has several.
        revision: A git revision of the dataset to pin, or ``None`` for its main branch.
        rows: Problems the dataset holds (what a load returns without ``limit``).
        note: How it relates to the file of the same name in the benchmark folder.
    """

    dataset_id: str
    split: str
    columns: Mapping[str, str]
    config: str | None = None
    revision: str | None = None
    rows: int = 0
    note: str = ""


#: Benchmark name -> its public dataset, for names that no local folder holds. Each was
#: checked against the benchmark folder's file of the same name (first rows identical).
PUBLIC_BENCHMARKS: dict[str, PublicBenchmark] = {
    "aime_2025": PublicBenchmark(
        dataset_id="math-ai/aime25",
        split="test",
        columns={"prompt": "problem", "answer": "answer", "id": "id"},
        rows=30,
        note="AIME 2025 I and II, the same 30 problems as aime_2025.json",
    ),
    "AIME_1983_2024": PublicBenchmark(
        dataset_id="di-zhang-fdu/AIME_1983_2024",
        split="train",
        columns={
            "prompt": "Question",
            "answer": "Answer",
            "id": "ID",
            "year": "Year",
            "problem_number": "Problem Number",
            "part": "Part",
        },
        rows=933,
        note="the same 933 problems and ids (1983-1, ...) as AIME_1983_2024.json",
    ),
    "amc": PublicBenchmark(
        dataset_id="AI-MO/aimo-validation-amc",
        split="train",
        # Its `id` restarts at 0 for each year, so tasks are numbered by row instead.
        columns={"prompt": "problem", "answer": "answer", "url": "url"},
        rows=83,
        note="AMC 12 2022 and 2023 rewritten to integer answers: the first 83 of the "
        "117 problems of amc.json",
    ),
}


_MATH_BENCH_FILES = "AIME_1983_2024.json, aime_2025.json, amc*.json"
"""What the benchmark folder holds for these loaders, as errors about the folder say."""


def _stem(name: str) -> str:
    """``"AMC.json"`` -> ``"amc"``: how benchmark names are compared."""
    wanted = name.lower()
    return wanted[: -len(Path(wanted).suffix)] if wanted.endswith(_JSON_SUFFIXES) else wanted


def _local_benchmark(name: str) -> Path | None:
    """The file a benchmark name refers to in the benchmark directory, if there is one."""
    directory = bench_data.find_bench_dir(required=False, holding=_MATH_BENCH_FILES)
    if directory is None:
        return None
    wanted, stem = name.lower(), _stem(name)
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() in _JSON_SUFFIXES)
    for path in files:
        if path.name.lower() == wanted or path.stem.lower() == stem:
            return path
    return None


def public_benchmark(name: str) -> PublicBenchmark | None:
    """The public dataset of a benchmark name (case-insensitive, ``.json`` allowed), if any."""
    stem = _stem(name)
    return next((b for key, b in PUBLIC_BENCHMARKS.items() if key.lower() == stem), None)


def _bench_folder_says(file_name: str) -> str:
    """What the benchmark folder holds, for an error about ``file_name`` it lacks."""
    directory = bench_data.find_bench_dir(required=False, holding=_MATH_BENCH_FILES)
    if directory is not None:
        held = sorted(p.stem for p in directory.iterdir() if p.suffix.lower() in _JSON_SUFFIXES)
        return f"{directory} holds no {file_name} (it holds: {', '.join(held) or 'nothing'})"
    tried = ", ".join(str(c) for c in bench_data.bench_dir_candidates())
    return f"no benchmark folder was found ({BENCH_DIR_ENV} is not set; tried {tried})"


def _unavailable(name: str, why: str) -> str:
    """The part of an error that says where a benchmark would come from."""
    # "AMC.json" names the benchmark amc, in the file AMC.json (not AMC.json.json).
    suffix = Path(name).suffix
    file_name = name if suffix.lower() in _JSON_SUFFIXES else f"{name}.json"
    return (
        f"Benchmark {name!r} is unavailable: {_bench_folder_says(file_name)}, and {why}. "
        f"Either set {BENCH_DIR_ENV} to a folder holding {file_name}, or give this process "
        "network access to the Hugging Face Hub once (the dataset is cached afterwards)."
    )


def _no_task_file(name: str) -> str:
    """The error for a task file name that is neither a file here nor a benchmark's."""
    known = ", ".join(PUBLIC_BENCHMARKS)
    return (
        f"task file {name} does not exist (looked in {Path.cwd()}), and no benchmark is "
        f"named {_stem(name)!r}: {_bench_folder_says(name)}; public benchmarks: {known}. "
        "Pass the path of an existing task file, or one of those benchmark names"
    )


# --------------------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------------------


def _read_rows(path: Path) -> list[tuple[Any, dict[str, Any]]]:
    """Rows of a JSON array / JSON-lines / keyed-object file as (key or None, row)."""
    try:
        text = read_text_file(path, "task file")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(f"{path} is not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as whole_error:
        data = list(_json_lines(path, text, whole_error))
    if isinstance(data, dict):
        if all(isinstance(value, dict) for value in data.values()):
            return [(key, value) for key, value in data.items()]
        raise TaskFormatError(f"{path}: a JSON object must map task ids to rows (objects)")
    if not isinstance(data, list):
        raise TaskFormatError(f"{path}: expected a JSON array of rows, got {type(data).__name__}")
    rows = []
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            raise TaskFormatError(
                f"{path}: row {index} is {type(row).__name__}, expected an object"
            )
        rows.append((None, row))
    return rows


def _json_lines(path: Path, text: str, whole_error: json.JSONDecodeError) -> Iterator[Any]:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if len(lines) < 2:
        raise TaskFormatError(f"{path} is not valid JSON: {whole_error}") from whole_error
    for number, line in lines:
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFormatError(
                f"{path} is neither a JSON document ({whole_error.msg}) nor JSON lines: "
                f"line {number}: {exc.msg}"
            ) from exc


def _field(row: Mapping[str, Any], names: Iterable[str]) -> tuple[str | None, Any]:
    """First present, non-null field among ``names`` (case-insensitive): (key, value)."""
    lowered = {str(key).lower(): key for key in row}
    for name in names:
        key = lowered.get(name)
        if key is not None and row[key] is not None:
            return key, row[key]
    return None, None


def normalize_answer_value(value: Any) -> str:
    """Turn a stored answer into text: ``18.0`` -> ``"18"``, ``2.5`` -> ``"2.5"``, strings stripped.

    Args:
        value: The answer as stored (str, int or float).

    Returns:
        The answer as a non-empty string.

    Raises:
        ValueError: For empty strings, NaN/infinite floats, booleans or other types.
    """
    if isinstance(value, bool):
        raise ValueError(f"answer is a boolean ({value})")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"answer is {value}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("answer is an empty string")
        return text
    raise ValueError(f"answer has unsupported type {type(value).__name__}")


def _row_to_task(
    row: Mapping[str, Any], *, index: int, key: Any, source: str, where: str
) -> MathTask:
    """Build a task from one row; ``where`` names the row in error messages."""
    prompt_key, prompt = _field(row, PROMPT_FIELDS)
    answer_key, raw_answer = _field(row, ANSWER_FIELDS)
    solution_key = None
    if raw_answer is None:
        solution_key, solution = _field(row, SOLUTION_FIELDS)
        if isinstance(solution, str):
            # A reference solution may box intermediate results too: its last box is
            # its answer (an agent's reply gets no such reading).
            raw_answer = extract_boxed(solution, fallback=False, last_box_wins=True)
    fields = ", ".join(map(str, row)) or "none"
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskFormatError(
            f"{where} has no problem text: expected one of {PROMPT_FIELDS} (fields: {fields})"
        )
    if raw_answer is None:
        raise TaskFormatError(
            f"{where} has no answer: expected one of {ANSWER_FIELDS}, or a boxed answer in "
            f"one of {SOLUTION_FIELDS} (fields: {fields})"
        )
    try:
        answer = normalize_answer_value(raw_answer)
    except ValueError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc
    id_key, own_id = _field(row, ID_FIELDS)
    if own_id is None and key is not None:
        own_id = key
    task_id = str(own_id).strip() if own_id is not None and str(own_id).strip() else ""
    consumed = {prompt_key, answer_key, id_key}
    metadata: dict[str, Any] = {k: v for k, v in row.items() if k not in consumed}
    metadata.setdefault("source", source)
    metadata["index"] = index
    metadata["raw_answer"] = raw_answer
    if solution_key is not None:
        metadata["answer_from"] = solution_key
    alternatives = _ALTERNATIVE_ANSWERS.match(answer)
    if alternatives:
        answer = alternatives.group("first")
        metadata["accepted_answers"] = (alternatives.group("first"), alternatives.group("second"))
    return MathTask(id=task_id, prompt=prompt.strip(), answer=answer, metadata=metadata)


def _assign_ids(tasks: list[MathTask], prefix: str) -> list[MathTask]:
    """Fill missing ids with ``<prefix>-<index>`` and make duplicate ids unique."""
    seen: set[str] = set()
    result = []
    for task in tasks:
        task_id = task.id or f"{prefix}-{task.metadata['index']}"
        if task_id in seen:
            fallback = f"{prefix}-{task.metadata['index']}"
            logger.warning("duplicate task id %r; using %r", task_id, fallback)
            task_id = fallback
        seen.add(task_id)
        result.append(MathTask(task_id, task.prompt, task.answer, task.metadata))
    return result


# --------------------------------------------------------------------------------------
# Public loader
# --------------------------------------------------------------------------------------


def load_math_tasks(
    path_or_name: str | Path,
    split: str | None = None,
    *,
    limit: int | None = None,
) -> list[MathTask]:
    """Load math tasks from a file, a benchmark short name, or a Hugging Face dataset.

    How ``path_or_name`` is read, first rule that applies:

    1. An existing file: JSON array of rows, JSON lines, or an object keyed by id.
    2. ``"hf:<dataset id>"`` (optionally ``"hf:<id>:<config>"``): a Hugging Face
       dataset (needs the ``datasets`` package).
    3. A name without a ``/`` (``"aime_2025"``, ``"AMC_EVAL_32.json"``): the file of
       that stem in the benchmark folder
       (:func:`~mappa_env.bench_data.find_bench_dir`), case-insensitive, when that folder
       holds one; otherwise the benchmark's public Hugging Face dataset from
       :data:`PUBLIC_BENCHMARKS` (``aime_2025``, ``amc``, ``AIME_1983_2024``), read
       through ``datasets`` with its columns mapped (downloaded once, then cached).
    4. Any other string with a ``/`` that does not end in ``.json``/``.jsonl``: a
       Hugging Face dataset id.

    Each row needs a problem (``prompt``/``problem``/``question``) and an answer
    (``answer``/``final_answer``/..., or a solution whose last ``\\boxed{}`` holds
    it). Ids come from the row's ``id`` when present, else ``<file stem>-<index>``.

    Args:
        path_or_name: File path, benchmark short name or dataset id.
        split: Dataset split for Hugging Face datasets (default ``"train"``). Local
            files have no splits; passing one for a file raises ``ValueError``.
        limit: Keep only the first ``limit`` rows.

    Returns:
        The tasks, in file order.

    Raises:
        FileNotFoundError: If the file or name cannot be found (the message lists
            what was tried); for a benchmark name in no local folder whose public
            dataset cannot be loaded, :class:`BenchmarkUnavailableError`, naming the
            folder and the dataset.
        TaskFormatError: For malformed JSON and rows without problem or answer
            (the message names the row).
        ValueError: For a ``split`` given with a local file or a benchmark name, or a
            negative ``limit``; :class:`~mappa_env.errors.SettingsError` for a path that
            is a FIFO, socket or device, not a regular file.
        mappa_env._optional.MissingExtraError: For a dataset id (or a benchmark name
            that no local folder holds) without ``datasets``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    text = str(path_or_name)
    if text.startswith("hf:"):
        return _load_hf(text[3:], split, limit)
    path = Path(text).expanduser()
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a directory; pass one task file or a short name")
    special = special_file_kind(path)
    if special is not None:
        # is_file() is False for it too: without this it read as "not found".
        raise SettingsError(not_a_regular_file(path, "task file", special))
    if not path.is_file():
        looks_like_file = isinstance(path_or_name, Path) or text.lower().endswith(_JSON_SUFFIXES)
        if "/" in text and not looks_like_file:
            return _load_hf(text, split, limit)
        if looks_like_file and ("/" in text or os.sep in text):
            raise FileNotFoundError(f"Task file not found: {path}")
        if split is not None:
            raise ValueError(
                f"split={split!r} applies to Hugging Face dataset ids; the benchmark name "
                f"{text!r} picks its own"
            )
        local = _local_benchmark(text)
        if local is None and looks_like_file and public_benchmark(text) is None:
            raise BenchmarkUnavailableError(_no_task_file(text))
        if local is None:
            return _load_public(text, limit)
        path = local
    if split is not None:
        raise ValueError(f"split={split!r} applies to Hugging Face datasets; {path} is a file")
    rows = _read_rows(path)
    if limit is not None:
        rows = rows[:limit]
    tasks = [
        _row_to_task(row, index=i, key=key, source=path.stem, where=f"{path.name} row {i}")
        for i, (key, row) in enumerate(rows)
    ]
    logger.debug("loaded %d math tasks from %s", len(tasks), path)
    return _assign_ids(tasks, path.stem)


def _load_public(name: str, limit: int | None) -> list[MathTask]:
    """A benchmark name that no local folder holds, from its public dataset."""
    benchmark = public_benchmark(name)
    if benchmark is None:
        known = ", ".join(PUBLIC_BENCHMARKS)
        raise BenchmarkUnavailableError(
            _unavailable(name, f"it has no public dataset in mappa's table (those: {known})")
        )
    try:
        datasets = require("datasets", "datasets", purpose=f"the public dataset of {name!r}")
    except MissingExtraError as exc:
        raise MissingExtraError(
            f"{exc} (or set {BENCH_DIR_ENV} to a folder holding {name}.json)"
        ) from exc
    split_spec = benchmark.split if limit is None else f"{benchmark.split}[:{limit}]"
    try:
        dataset = datasets.load_dataset(
            benchmark.dataset_id,
            benchmark.config,
            split=split_spec,
            revision=benchmark.revision,
        )
    except (OSError, ValueError) as exc:  # no network, offline mode, a moved dataset
        raise BenchmarkUnavailableError(
            _unavailable(
                name,
                f"its public dataset {benchmark.dataset_id} could not be loaded "
                f"({type(exc).__name__}: {exc})",
            )
        ) from exc
    source = _canonical(name)
    where = f"{benchmark.dataset_id} [{benchmark.split}]"
    tasks = []
    for index, row in enumerate(dataset):
        fields = {ours: row.get(theirs) for ours, theirs in benchmark.columns.items()}
        fields["source"] = source
        fields["dataset"] = benchmark.dataset_id
        tasks.append(
            _row_to_task(fields, index=index, key=None, source=source, where=f"{where} row {index}")
        )
    logger.info("loaded %d %s tasks from the dataset %s", len(tasks), name, benchmark.dataset_id)
    return _assign_ids(tasks, source)


def _canonical(name: str) -> str:
    """The table's spelling of a benchmark name (``"AIME_1983_2024"`` for ``"aime_1983_2024"``)."""
    stem = _stem(name)
    return next(key for key in PUBLIC_BENCHMARKS if key.lower() == stem)


def _load_hf(dataset_id: str, split: str | None, limit: int | None) -> list[MathTask]:
    """Load tasks from a Hugging Face dataset, mapping the common column names."""
    datasets = require("datasets", "datasets", purpose="loading math tasks from Hugging Face")
    name, _, config = dataset_id.partition(":")
    split = split or "train"
    split_spec = f"{split}[:{limit}]" if limit is not None else split
    dataset = datasets.load_dataset(name, config or None, split=split_spec)
    prefix = f"{name.replace('/', '_')}-{split}"
    tasks = []
    for index, row in enumerate(dataset):
        if limit is not None and index >= limit:
            break
        tasks.append(
            _row_to_task(
                dict(row), index=index, key=None, source=name, where=f"{name} [{split}] row {index}"
            )
        )
    return _assign_ids(tasks, prefix)
