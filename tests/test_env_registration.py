"""The built-in ids are registered whichever of mappa_env and pettingzoo comes first.

Each case runs in a fresh interpreter: in this process the registry is long imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = ["mappa/DSBench-v0", "mappa/MathChat-v0"]

REPORT = (
    "import json, sys\n"
    "ids = sorted(k for k in pettingzoo.aec_registry if k.startswith('mappa/'))\n"
    "par = sorted(k for k in pettingzoo.parallel_registry if k.startswith('mappa/'))\n"
    "env = pettingzoo.make('aec', 'mappa/MathChat-v0', sandbox=None)\n"
    "print(json.dumps({'aec': ids, 'parallel': par, 'made': type(env).__name__}))\n"
)


def _run(code: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "imports",
    ["import mappa_env\nimport pettingzoo\n", "import pettingzoo\nimport mappa_env\n"],
    ids=["mappa_env-first", "pettingzoo-first"],
)
def test_the_documented_ids_are_in_pettingzoos_registries_after_import_mappa_env(imports):
    found = _run(imports + REPORT)
    assert found == {"aec": DOCUMENTED, "parallel": DOCUMENTED, "made": "MathChatEnv"}


def test_import_mappa_env_alone_loads_no_pettingzoo_and_its_ids_are_known():
    code = (
        "import json, sys\n"
        "import mappa_env\n"
        "light = 'pettingzoo' not in sys.modules and 'torch' not in sys.modules\n"
        "print(json.dumps({'light': light, 'ids': mappa_env.registered_ids()}))\n"
    )
    assert _run(code) == {"light": True, "ids": ["DSBench-v0", "MathChat-v0"]}
