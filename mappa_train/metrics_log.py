"""Where a run's per-step metrics go: ``metrics.jsonl``, TensorBoard, Weights & Biases."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from mappa_train.config import TrainConfig

logger = logging.getLogger(__name__)

__all__ = ["MetricsLog", "plain"]


def plain(value: Any) -> Any:
    """A metric as JSON holds it: NumPy scalars as Python numbers, NaN as ``None``."""
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


class MetricsLog:
    """Appends each step's metrics to ``metrics.jsonl`` and the configured loggers.

    Args:
        path: The JSONL file (one record per logged step).
        config: The run's settings (``tensorboard``, ``wandb_project``).
        tensorboard_dir: Where TensorBoard event files go.
    """

    def __init__(self, path: Path, config: TrainConfig, tensorboard_dir: Path) -> None:
        self.path = path
        self.config = config
        self.tensorboard_dir = tensorboard_dir
        self._tb: Any = None
        self._wandb: Any = None

    def truncate(self, step: int) -> list[dict[str, Any]]:
        """Drop the records after ``step`` (they will be redone); the records kept.

        A line torn by a kill mid-write is dropped too.
        """
        if not self.path.exists():
            return []
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(record)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return kept

    def open(self) -> None:
        """Start the TensorBoard writer and the Weights & Biases run, as configured."""
        if self.config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                logger.warning("tensorboard is not installed: metrics go to metrics.jsonl only")
            else:
                self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir))
        if self.config.wandb_project:
            from mappa_env._optional import require

            wandb = require("wandb", "wandb", purpose="Weights & Biases logging")
            self._wandb = wandb.init(
                project=self.config.wandb_project, config=self.config.to_dict(), resume="allow"
            )

    def write(self, record: dict[str, Any]) -> None:
        """Append one step's record (already :func:`plain`) everywhere."""
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and value is not None and key != "step":
                    self._tb.add_scalar(key, value, record["step"])
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(record, step=record["step"])
        logger.info("step %s: %s", record["step"], {k: record[k] for k in list(record)[:8]})

    def close(self) -> None:
        """Close the TensorBoard writer and finish the Weights & Biases run."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
