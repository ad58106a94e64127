"""Moved: ``MathTask`` and the math task loaders live in :mod:`mappa_env.envs.mathchat.tasks`.

For one release this name is that module itself (one module object under two names), not
a copy of its names: code that patches a function here patches the one the loaders use.
Where the benchmark folder is found (``bench_dir_candidates``, ``find_bench_dir``) is
re-exported there from :mod:`mappa_env.bench_data`, which every environment shares: patch
those in that module.
"""

from __future__ import annotations

import sys

from mappa_env.envs.mathchat import tasks

sys.modules[__name__] = tasks
