"""Progress off means the model libraries' bars too: loading weights, writing checkpoints.

Each case runs in a fresh interpreter, where transformers is first imported inside the
block as it is in ``mappa eval`` (the libraries keep one switch per process).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]

LOAD_AND_SAVE = """
import sys
from mappa_agents.progress import library_progress_bars

with library_progress_bars({enabled}):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
    model.save_pretrained(sys.argv[2])
print("--- after the block ---", file=sys.stderr, flush=True)
transformers.AutoModelForCausalLM.from_pretrained(sys.argv[2])
"""


def _stderr(tmp_path: Path, *, enabled: bool) -> tuple[str, str]:
    model = tiny_model_dir(tmp_path / "model")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_SAVE.format(enabled=enabled),
            str(model),
            str(tmp_path / f"saved-{enabled}"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "", "HF_HUB_OFFLINE": "1"},
    )
    inside, after = result.stderr.split("--- after the block ---")
    return inside, after


def test_bars_off_hide_loading_and_saving_weights_and_come_back_after(tmp_path):
    inside, after = _stderr(tmp_path, enabled=False)
    assert "Loading weights" not in inside
    assert "Writing model shards" not in inside
    # Restored, since the switch was on before the block; this also shows that the
    # model loaded above would have drawn a bar.
    assert "Loading weights" in after
