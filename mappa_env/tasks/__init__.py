"""Task sources: math problems from files, named benchmarks, datasets or a seeded generator.

The math task sources live in :mod:`mappa_env.envs.mathchat` (``tasks``, ``generator``,
``word_problems``, ``checks``) and are re-exported here, as is where the benchmark folder
is found (:mod:`mappa_env.bench_data`); the user's task secret
(:mod:`mappa_env.tasks.secret`) and the code timeout a task implies
(:mod:`mappa_env.tasks.timeouts`) serve every environment and live here.

Names are looked up on first use: importing the secret or the timeouts (as every
environment does) imports no MathChat module, and MathChat's generator, which reads the
secret, can import it while this package is half-imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa_env.bench_data import (
        BENCH_DIR_ENV,
        bench_dir_candidates,
        find_bench_dir,
    )
    from mappa_env.envs.mathchat.checks import (
        arithmetic_value,
        is_own_solution,
    )
    from mappa_env.envs.mathchat.generator import (
        DEFAULT_KINDS,
        DIFFICULTY_LEVELS,
        KINDS,
        MAX_GENERATED_TASKS,
        generate_math_tasks,
        generate_unseen_tasks,
        problem_identity,
    )
    from mappa_env.envs.mathchat.tasks import (
        PUBLIC_BENCHMARKS,
        BenchmarkUnavailableError,
        MathTask,
        PublicBenchmark,
        TaskFormatError,
        load_math_tasks,
        normalize_answer_value,
    )
    from mappa_env.tasks.secret import (
        TASK_SECRET_ENV,
        task_secret_path,
        user_task_secret,
    )
    from mappa_env.tasks.timeouts import (
        KIND_CODE_TIMEOUT_S,
        task_code_timeout_s,
    )

EXPORTS: dict[str, str] = {
    "BENCH_DIR_ENV": "mappa_env.bench_data",
    "BenchmarkUnavailableError": "mappa_env.envs.mathchat.tasks",
    "DEFAULT_KINDS": "mappa_env.envs.mathchat.generator",
    "DIFFICULTY_LEVELS": "mappa_env.envs.mathchat.generator",
    "KINDS": "mappa_env.envs.mathchat.generator",
    "KIND_CODE_TIMEOUT_S": "mappa_env.tasks.timeouts",
    "MAX_GENERATED_TASKS": "mappa_env.envs.mathchat.generator",
    "MathTask": "mappa_env.envs.mathchat.tasks",
    "PUBLIC_BENCHMARKS": "mappa_env.envs.mathchat.tasks",
    "PublicBenchmark": "mappa_env.envs.mathchat.tasks",
    "TASK_SECRET_ENV": "mappa_env.tasks.secret",
    "TaskFormatError": "mappa_env.envs.mathchat.tasks",
    "arithmetic_value": "mappa_env.envs.mathchat.checks",
    "bench_dir_candidates": "mappa_env.bench_data",
    "find_bench_dir": "mappa_env.bench_data",
    "generate_math_tasks": "mappa_env.envs.mathchat.generator",
    "generate_unseen_tasks": "mappa_env.envs.mathchat.generator",
    "is_own_solution": "mappa_env.envs.mathchat.checks",
    "load_math_tasks": "mappa_env.envs.mathchat.tasks",
    "normalize_answer_value": "mappa_env.envs.mathchat.tasks",
    "problem_identity": "mappa_env.envs.mathchat.generator",
    "task_code_timeout_s": "mappa_env.tasks.timeouts",
    "task_secret_path": "mappa_env.tasks.secret",
    "user_task_secret": "mappa_env.tasks.secret",
}
"""Each name of this package and the module that holds it."""


def __getattr__(name: str) -> Any:
    home = EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


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
