"""``bench_generate_gpu`` runs its variants on a tiny model (on the CPU: no compilation)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.bench_generate_gpu import VARIANTS, main
from mappa_agents.tiny_models import tiny_model_dir


def test_the_static_cache_variants_run_and_write_their_rows(tmp_path):
    assert "graphs" in VARIANTS
    out = tmp_path / "out"
    summary = main(
        [
            "--shape", str(tiny_model_dir(tmp_path / "model")),
            "--variants", "static,graphs,recorded,recorded-copied",
            "--batch", "2", "--prompt-tokens", "8", "--max-new-tokens", "4", "--repeats", "1",
            "--out", str(out), "--name", "generate_tiny",
        ]
    )  # fmt: skip
    rows = {row["variant"]: row for row in summary["rows"]}
    assert set(rows) == {"static", "graphs", "recorded", "recorded-copied"}
    for row in rows.values():
        assert "error" not in row, row
        assert row["tok_s"] > 0
        assert row["first_call_s"] > 0
        assert row["cudagraph_skips"] >= 0
    assert json.loads((out / "generate_tiny.json").read_text())["rows"] == summary["rows"]
    decoders = summary["decoders"]
    assert decoders["recorded-copied"]["pack_heads"] is False
    assert decoders["recorded"]["fallbacks"] == decoders["recorded-copied"]["fallbacks"] == {}
