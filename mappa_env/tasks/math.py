"""Moved: ``MathTask`` and the math task loaders live in :mod:`mappa_env.envs.mathchat.tasks`.

For one release this name is that module itself (one module object under two names), not
a copy of its names: code that patches a function here (``bench_dir_candidates``, which
``find_bench_dir`` and ``load_math_tasks`` call) patches the one the loaders use.
"""

from __future__ import annotations

import sys

from mappa_env.envs.mathchat import tasks

sys.modules[__name__] = tasks
