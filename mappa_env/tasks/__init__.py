"""Task sources: math problems from files, named benchmarks, datasets or a seeded generator."""

from mappa_env.tasks.checks import arithmetic_value, is_own_solution
from mappa_env.tasks.generator import (
    DEFAULT_KINDS,
    DIFFICULTY_LEVELS,
    KINDS,
    MAX_GENERATED_TASKS,
    generate_math_tasks,
    generate_unseen_tasks,
    problem_identity,
)
from mappa_env.tasks.math import (
    BENCH_DIR_ENV,
    PUBLIC_BENCHMARKS,
    BenchmarkUnavailableError,
    MathTask,
    PublicBenchmark,
    TaskFormatError,
    bench_dir_candidates,
    find_bench_dir,
    load_math_tasks,
    normalize_answer_value,
)
from mappa_env.tasks.secret import TASK_SECRET_ENV, task_secret_path, user_task_secret
from mappa_env.tasks.timeouts import KIND_CODE_TIMEOUT_S, task_code_timeout_s

__all__ = [
    "BENCH_DIR_ENV",
    "DEFAULT_KINDS",
    "DIFFICULTY_LEVELS",
    "KINDS",
    "KIND_CODE_TIMEOUT_S",
    "MAX_GENERATED_TASKS",
    "PUBLIC_BENCHMARKS",
    "TASK_SECRET_ENV",
    "BenchmarkUnavailableError",
    "MathTask",
    "PublicBenchmark",
    "TaskFormatError",
    "arithmetic_value",
    "bench_dir_candidates",
    "find_bench_dir",
    "generate_math_tasks",
    "generate_unseen_tasks",
    "is_own_solution",
    "load_math_tasks",
    "normalize_answer_value",
    "problem_identity",
    "task_code_timeout_s",
    "task_secret_path",
    "user_task_secret",
]
