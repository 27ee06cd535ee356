"""What a run reports as it trains: RUN/metrics.jsonl, one JSON object per log line (training
loss, lr, tokens/s) and per validation, and, with `train.tensorboard`, the same scalars as
TensorBoard event files in RUN/tensorboard (`tensorboard --logdir runs` shows every run).

A resumed run continues both from its checkpoint's step: the records a killed run wrote after
it are dropped from metrics.jsonl, and TensorBoard purges its events after it (`purge_step`),
so neither shows the lost updates twice. A run that starts from update 0 (new, forced, or
killed before its first checkpoint) starts both afresh: an earlier attempt's event files go.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from data.files import atomic_output

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends records to metrics.jsonl and, when `tensorboard`, to TensorBoard's events."""

    def __init__(self, run_path: Path, tensorboard: bool, resumed_at: int | None = None) -> None:
        self.path = run_path / "metrics.jsonl"
        if resumed_at is not None:
            truncate_metrics(self.path, resumed_at)
        else:  # a run from update 0 (new, forced, or killed before a checkpoint): one curve
            shutil.rmtree(run_path / "tensorboard", ignore_errors=True)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning(
                    "train.tensorboard: the tensorboard package is not installed "
                    "(pip install 'tf[tensorboard]'); metrics.jsonl only"
                )
                return
            purge = None if resumed_at is None else resumed_at + 1
            self.writer = SummaryWriter(str(run_path / "tensorboard"), purge_step=purge)

    def write(self, record: dict[str, Any], scalars: Iterable[str]) -> None:
        """Append `record` (its "step" included); its `scalars` also go to TensorBoard, each
        under its own name (a validation's record repeats the epoch, which is drawn once)."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is None:
            return
        for key in scalars:
            self.writer.add_scalar(key, record[key], record["step"])
        self.writer.flush()  # a killed run keeps what it reported

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after `step`: a killed run wrote them; the resumed run writes them anew."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if record_step(line) <= step]
    if len(kept) != len(lines):
        with atomic_output(path) as f:
            f.write("".join(kept))


def record_step(line: str) -> float:
    """The step of a metrics line; a line cut short by a kill counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError):
        return math.inf
