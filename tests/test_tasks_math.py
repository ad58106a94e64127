"""Tests for MathTask and load_math_tasks (mappa_env.tasks.math)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
from pathlib import Path

import pytest

import mappa_env.tasks.math as tasks_math
from mappa_env import bench_data
from mappa_env._optional import MissingExtraError
from mappa_env.grading import answers_match, answers_match_any
from mappa_env.tasks import (
    BENCH_DIR_ENV,
    PUBLIC_BENCHMARKS,
    BenchmarkUnavailableError,
    MathTask,
    PublicBenchmark,
    TaskFormatError,
    find_bench_dir,
    load_math_tasks,
    normalize_answer_value,
)

SHARED_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bench"
MATH_FILES = [
    "AIME_1983_2024.json",
    "aime_2025.json",
    "aime_eval_32.json",
    "amc.json",
    "amc_32.json",
    "amc_eval_32.json",
]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------
# MathTask
# --------------------------------------------------------------------------------------


def test_math_task_is_frozen_hashable_and_its_metadata_read_only():
    source = {"year": 2020}
    task = MathTask("t-1", "What is 1+1?", "2", source)
    source["year"] = 1999  # the task keeps its own copy
    assert task.metadata["year"] == 2020
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.answer = "3"
    with pytest.raises(TypeError):
        task.metadata["year"] = 2021
    assert hash(task) == hash(MathTask("t-1", "What is 1+1?", "2", {"other": 1}))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (18.0, "18"),
        (-4.0, "-4"),
        (2.5, "2.5"),
        (7, "7"),
        (" 023 ", "023"),
        ("336^\\circ", "336^\\circ"),
    ],
)
def test_normalize_answer_value(value, expected):
    assert normalize_answer_value(value) == expected


@pytest.mark.parametrize("value", ["", "   ", float("nan"), float("inf"), True, None, [1]])
def test_normalize_answer_value_rejects(value):
    with pytest.raises(ValueError):
        normalize_answer_value(value)


# --------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------


def test_load_json_array_with_ids_floats_and_metadata(tmp_path):
    path = write_json(
        tmp_path / "contest.json",
        [
            {"prompt": "P0", "answer": 18.0, "id": "a", "source": "amc", "year": 2023},
            {"problem": "P1", "final_answer": "023"},
            {"question": "P2", "answer": 5, "id": 7},
        ],
    )
    tasks = load_math_tasks(path)
    assert [t.id for t in tasks] == ["a", "contest-1", "7"]
    assert [t.prompt for t in tasks] == ["P0", "P1", "P2"]
    assert [t.answer for t in tasks] == ["18", "023", "5"]
    assert tasks[0].metadata["raw_answer"] == 18.0
    assert tasks[0].metadata["source"] == "amc"
    assert tasks[0].metadata["year"] == 2023
    assert tasks[1].metadata["source"] == "contest"
    assert tasks[1].metadata["index"] == 1
    assert "prompt" not in tasks[0].metadata
    assert "answer" not in tasks[0].metadata


def test_load_json_lines_and_keyed_object(tmp_path):
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"prompt": "A", "answer": "1"}\n\n{"prompt": "B", "answer": "2"}\n')
    assert [(t.id, t.answer) for t in load_math_tasks(lines)] == [("rows-0", "1"), ("rows-1", "2")]
    keyed = write_json(tmp_path / "keyed.json", {"k1": {"prompt": "A", "answer": 3}})
    assert [(t.id, t.answer) for t in load_math_tasks(keyed)] == [("k1", "3")]


def test_limit_keeps_the_first_rows(tmp_path):
    path = write_json(tmp_path / "f.json", [{"prompt": f"P{i}", "answer": i} for i in range(5)])
    assert [t.answer for t in load_math_tasks(path, limit=2)] == ["0", "1"]
    assert load_math_tasks(path, limit=0) == []
    with pytest.raises(ValueError):
        load_math_tasks(path, limit=-1)


def test_answer_from_boxed_solution(tmp_path):
    path = write_json(
        tmp_path / "f.json", [{"problem": "P", "solution": "so it is $\\boxed{\\frac{1}{2}}$."}]
    )
    (task,) = load_math_tasks(path)
    assert task.answer == "\\frac{1}{2}"
    assert task.metadata["answer_from"] == "solution"


def test_a_reference_solution_boxing_intermediate_results_gives_its_last_box(tmp_path):
    solution = "First $\\boxed{3}$ apples, so in all $\\boxed{17}$."
    path = write_json(tmp_path / "f.json", [{"problem": "P", "solution": solution}])
    (task,) = load_math_tasks(path)
    assert task.answer == "17"


def test_alternative_answers_are_recorded(tmp_path):
    path = write_json(
        tmp_path / "f.json", [{"prompt": "P", "answer": "080 or 081 (both were accepted)"}]
    )
    (task,) = load_math_tasks(path)
    assert task.answer == "080"
    assert task.metadata["accepted_answers"] == ("080", "081")
    assert task.metadata["raw_answer"] == "080 or 081 (both were accepted)"


def test_duplicate_ids_are_made_unique(tmp_path):
    path = write_json(
        tmp_path / "dup.json",
        [{"prompt": "A", "answer": 1, "id": "x"}, {"prompt": "B", "answer": 2, "id": "x"}],
    )
    assert [t.id for t in load_math_tasks(path)] == ["x", "dup-1"]


def test_missing_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_math_tasks(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match="directory"):
        load_math_tasks(tmp_path)


def test_bad_json_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"prompt": "A", "answer": 1}\n{"prompt": oops}\n')
    with pytest.raises(TaskFormatError, match=r"bad\.json.*line 2"):
        load_math_tasks(path)
    single = tmp_path / "single.json"
    single.write_text("[1, 2")
    with pytest.raises(TaskFormatError, match=r"single\.json is not valid JSON"):
        load_math_tasks(single)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"prompt": "A", "answer": 1}, {"prompt": "B"}], r"row 1 has no answer"),
        ([{"answer": 1}], r"row 0 has no problem text"),
        ([{"prompt": "  ", "answer": 1}], r"row 0 has no problem text"),
        ([{"prompt": "A", "answer": None}], r"row 0 has no answer"),
        ([{"prompt": "A", "answer": ""}], r"row 0: answer is an empty string"),
        ([{"prompt": "A", "answer": 1}, 5], r"row 1 is int"),
        ({"prompt": "A"}, r"must map task ids"),
    ],
)
def test_malformed_rows_name_the_row(tmp_path, rows, message):
    path = write_json(tmp_path / "rows.json", rows)
    with pytest.raises(TaskFormatError, match=message):
        load_math_tasks(path)


def test_split_is_rejected_for_files(tmp_path):
    path = write_json(tmp_path / "f.json", [{"prompt": "A", "answer": 1}])
    with pytest.raises(ValueError, match="split"):
        load_math_tasks(path, split="test")


# --------------------------------------------------------------------------------------
# Short names and the benchmark directory
# --------------------------------------------------------------------------------------


def test_short_names_resolve_in_the_configured_directory(tmp_path, monkeypatch):
    write_json(tmp_path / "aime_2099.json", [{"prompt": "A", "answer": "042"}])
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path))
    assert find_bench_dir() == tmp_path
    for name in ("aime_2099", "AIME_2099", "aime_2099.json"):
        (task,) = load_math_tasks(name)
        assert (task.id, task.answer) == ("aime_2099-0", "042")
    # A name the folder lacks and no public dataset serves: the error says both.
    with pytest.raises(BenchmarkUnavailableError, match=r"it holds: aime_2099") as error:
        load_math_tasks("aime_1900")
    assert "no public dataset" in str(error.value)


def test_a_mistyped_task_file_is_a_file_that_does_not_exist(tmp_path, monkeypatch):
    # It used to be reported as a missing benchmark named "missing.json.json".
    (tmp_path / "bench").mkdir()
    write_json(tmp_path / "bench" / "aime_2099.json", [{"prompt": "A", "answer": "042"}])
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path / "bench"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BenchmarkUnavailableError) as error:
        load_math_tasks("missing.json")
    message = str(error.value)
    assert message.startswith(f"task file missing.json does not exist (looked in {tmp_path})")
    assert "holds no missing.json (it holds: aime_2099)" in message
    assert "public benchmarks: aime_2025" in message
    assert ".json.json" not in message
    # A benchmark name with its suffix: the file it names, once.
    with pytest.raises(BenchmarkUnavailableError) as error:
        load_math_tasks("aime_1900")
    assert "holding aime_1900.json," in str(error.value)


def test_mappa_eval_with_a_mistyped_task_file_is_one_line(tmp_path, monkeypatch, capsys):
    from mappa_train.command import main

    monkeypatch.chdir(tmp_path)
    argv = ["eval", "--tasks", "missing.json", "--sandbox", "none", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("mappa eval: task file missing.json does not exist")


def test_bench_dir_env_pointing_nowhere_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=BENCH_DIR_ENV):
        load_math_tasks("aime_2025")


def test_no_bench_dir_error_lists_what_was_tried(tmp_path, monkeypatch):
    tried = [tmp_path / "a" / "shared" / "data" / "bench", tmp_path / "shared" / "data" / "bench"]
    monkeypatch.delenv(BENCH_DIR_ENV, raising=False)
    monkeypatch.setattr(bench_data, "bench_dir_candidates", lambda: tried)
    with pytest.raises(FileNotFoundError) as error:
        find_bench_dir()
    message = str(error.value)
    assert all(str(path) in message for path in tried)
    assert BENCH_DIR_ENV in message


def test_the_bench_folder_lookup_is_one_shared_function_under_its_former_names():
    import mappa_env.dsbench.tasks
    import mappa_env.envs.dsbench.tasks
    import mappa_env.envs.mathchat.tasks
    import mappa_env.tasks

    for former in (
        mappa_env.tasks,
        tasks_math,
        mappa_env.envs.mathchat.tasks,
        mappa_env.envs.dsbench.tasks,
        mappa_env.dsbench.tasks,
    ):
        assert former.find_bench_dir is bench_data.find_bench_dir, former
        assert former.BENCH_DIR_ENV == bench_data.BENCH_DIR_ENV == "MAPPA_BENCH_DIR"
    assert tasks_math.bench_dir_candidates is bench_data.bench_dir_candidates


def test_candidates_start_with_the_env_var_then_walk_up(tmp_path, monkeypatch):
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path))
    nested = tmp_path / "x" / "y"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    candidates = tasks_math.bench_dir_candidates()
    assert candidates[0] == tmp_path
    assert nested / "shared" / "data" / "bench" in candidates
    assert tmp_path / "shared" / "data" / "bench" in candidates


# --------------------------------------------------------------------------------------
# Hugging Face datasets (a stand-in `datasets` module: no network)
# --------------------------------------------------------------------------------------


@pytest.fixture
def fake_datasets(monkeypatch):
    calls = []
    rows = [
        {"problem": "P0", "solution": "thus $\\boxed{12}$", "unique_id": "u0"},
        {"question": "P1", "final_answer": 3.0},
        {"Problem": "P2", "Answer": "7"},
    ]

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return list(rows)

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_hf_datasets_map_common_columns(fake_datasets):
    tasks = load_math_tasks("hf:someone/math-set", split="test")
    assert fake_datasets == [("someone/math-set", None, "test")]
    assert [t.prompt for t in tasks] == ["P0", "P1", "P2"]
    assert [t.answer for t in tasks] == ["12", "3", "7"]
    assert [t.id for t in tasks] == ["u0", "someone_math-set-test-1", "someone_math-set-test-2"]
    assert tasks[1].metadata["source"] == "someone/math-set"


def test_hf_ids_with_a_slash_config_and_limit(fake_datasets):
    tasks = load_math_tasks("someone/math-set", limit=2)
    assert fake_datasets[-1] == ("someone/math-set", None, "train[:2]")
    assert len(tasks) == 2
    load_math_tasks("hf:someone/math-set:algebra")
    assert fake_datasets[-1] == ("someone/math-set", "algebra", "train")


def test_hf_without_datasets_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(MissingExtraError, match=r"mappa-rl\[datasets\]"):
        load_math_tasks("hf:someone/math-set")


# --------------------------------------------------------------------------------------
# Benchmark names: a local folder first, else the public dataset (a local stand-in here)
# --------------------------------------------------------------------------------------


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """The real `datasets` package, refusing the network, caching under tmp_path."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return datasets


def _public_stand_in(tmp_path, monkeypatch, name, rows, **fields):
    """Serve `name`'s public dataset from a local dataset directory of `rows`."""
    directory = tmp_path / f"{name}-dataset"
    directory.mkdir()
    table = PUBLIC_BENCHMARKS[name]
    lines = (json.dumps(row) for row in rows)
    (directory / f"{table.split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    stand_in = dataclasses.replace(table, dataset_id=str(directory), **fields)
    monkeypatch.setitem(PUBLIC_BENCHMARKS, name, stand_in)
    return stand_in


def test_the_public_table_names_real_datasets_with_their_columns():
    assert PUBLIC_BENCHMARKS["aime_2025"].dataset_id == "math-ai/aime25"
    assert PUBLIC_BENCHMARKS["AIME_1983_2024"].dataset_id == "di-zhang-fdu/AIME_1983_2024"
    assert PUBLIC_BENCHMARKS["amc"].dataset_id == "AI-MO/aimo-validation-amc"
    for name, table in PUBLIC_BENCHMARKS.items():
        assert isinstance(table, PublicBenchmark)
        assert {"prompt", "answer"} <= set(table.columns), name
        assert table.rows > 0, name


def test_a_name_no_folder_holds_comes_from_its_public_dataset(tmp_path, monkeypatch, offline_hub):
    # The folder is configured but lacks the file: the public dataset serves it, in its
    # own column names, mapped onto ours.
    (tmp_path / "bench").mkdir()
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path / "bench"))
    rows = [
        {
            "ID": "1983-1",
            "Year": 1983,
            "Problem Number": 1,
            "Question": "Q1",
            "Answer": 60,
            "Part": None,
        },
        {
            "ID": "1983-2",
            "Year": 1983,
            "Problem Number": 2,
            "Question": "Q2",
            "Answer": 23,
            "Part": None,
        },
    ]
    _public_stand_in(tmp_path, monkeypatch, "AIME_1983_2024", rows)
    tasks = load_math_tasks("aime_1983_2024")  # names are case-insensitive
    assert [(t.id, t.prompt, t.answer) for t in tasks] == [
        ("1983-1", "Q1", "60"),
        ("1983-2", "Q2", "23"),
    ]
    assert tasks[0].metadata["year"] == 1983
    assert tasks[0].metadata["problem_number"] == 1
    assert tasks[0].metadata["source"] == "AIME_1983_2024"
    assert [t.id for t in load_math_tasks("AIME_1983_2024", limit=1)] == ["1983-1"]
    # A MathChat environment takes the name as its tasks.
    import mappa_env

    env = mappa_env.make("MathChat-v0", tasks="AIME_1983_2024", sandbox=None)
    try:
        assert [t.id for t in env.tasks] == ["1983-1", "1983-2"]
    finally:
        env.close()


def test_amc_rows_are_numbered_by_row_and_float_answers_read_as_integers(
    tmp_path, monkeypatch, offline_hub
):
    (tmp_path / "bench").mkdir()
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path / "bench"))
    rows = [  # the dataset's own id restarts each year: two rows share id 0
        {"id": 0, "problem": "P2022", "answer": 142.0, "url": "u1"},
        {"id": 0, "problem": "P2023", "answer": 18.0, "url": "u2"},
    ]
    _public_stand_in(tmp_path, monkeypatch, "amc", rows)
    tasks = load_math_tasks("amc")
    assert [(t.id, t.answer) for t in tasks] == [("amc-0", "142"), ("amc-1", "18")]
    assert tasks[1].metadata["url"] == "u2"


def test_a_local_file_wins_over_the_public_dataset(tmp_path, monkeypatch, offline_hub):
    write_json(tmp_path / "aime_2025.json", [{"prompt": "local", "answer": "1"}])
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path))
    _public_stand_in(tmp_path, monkeypatch, "aime_2025", [{"problem": "hub", "answer": "2"}])
    (task,) = load_math_tasks("aime_2025")
    assert task.prompt == "local"


def test_neither_folder_nor_network_says_which_is_needed(tmp_path, monkeypatch, offline_hub):
    tried = [tmp_path / "shared" / "data" / "bench"]
    monkeypatch.delenv(BENCH_DIR_ENV, raising=False)
    monkeypatch.setattr(bench_data, "bench_dir_candidates", lambda: tried)
    with pytest.raises(BenchmarkUnavailableError) as error:
        load_math_tasks("aime_2025")
    message = str(error.value)
    assert str(tried[0]) in message  # where a folder was looked for
    assert BENCH_DIR_ENV in message  # the folder to set ...
    assert "aime_2025.json" in message
    assert "math-ai/aime25" in message  # ... or the dataset that needs the network
    assert "network access" in message
    assert isinstance(error.value, FileNotFoundError)


def test_a_public_benchmark_without_datasets_names_the_extra_and_the_folder(tmp_path, monkeypatch):
    (tmp_path / "bench").mkdir()
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path / "bench"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(MissingExtraError, match=r"mappa-rl\[datasets\]") as error:
        load_math_tasks("amc")
    assert BENCH_DIR_ENV in str(error.value)


def test_a_split_is_refused_for_benchmark_names(tmp_path, monkeypatch):
    monkeypatch.setenv(BENCH_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="picks its own"):
        load_math_tasks("aime_2025", split="test")


# --------------------------------------------------------------------------------------
# The shared benchmark files (skipped where they are absent)
# --------------------------------------------------------------------------------------


def _leading_integer(answer: str) -> int:
    number = re.match(r"-?\d+", answer)
    assert number, f"no leading integer in {answer!r}"
    return int(number.group())


@pytest.mark.skipif(not SHARED_BENCH.is_dir(), reason="shared benchmark files not present")
@pytest.mark.parametrize("file_name", MATH_FILES)
def test_every_row_of_the_shared_files_loads_and_grades_itself(file_name, monkeypatch):
    path = SHARED_BENCH / file_name
    raw_rows = json.loads(path.read_text(encoding="utf-8"))
    tasks = load_math_tasks(path)
    assert len(tasks) == len(raw_rows)
    assert len({t.id for t in tasks}) == len(tasks)
    monkeypatch.setenv(BENCH_DIR_ENV, str(SHARED_BENCH))
    assert [t.id for t in load_math_tasks(path.stem)] == [t.id for t in tasks]
    for task, row in zip(tasks, raw_rows):
        assert task.prompt == row["prompt"].strip()
        assert task.metadata["raw_answer"] == row["answer"]
        accepted = task.metadata.get("accepted_answers", (task.answer,))
        assert task.answer in accepted
        assert answers_match(task.answer, task.answer), task.id
        if len(accepted) == 1:  # the stored value itself (e.g. the float 18.0) matches
            assert answers_match(row["answer"], task.answer), task.id
        for answer in accepted:
            assert answers_match_any(answer, accepted), task.id
        wrong = str(max(_leading_integer(a) for a in accepted) + 1)
        assert not answers_match_any(wrong, accepted), (task.id, wrong)
