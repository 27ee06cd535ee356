"""What a run reports as it trains: RUN/metrics.jsonl, one JSON object per log line (training
loss, lr, tokens/s) and per validation, and, with `train.tensorboard`, the same scalars as
TensorBoard event files in RUN/tensorboard (`tensorboard --logdir runs` shows every run); on a
terminal, a progress bar, else the same records as log lines (`TrainingLog`).

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
import sys
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


class TrainingLog:
    """What the updates report: a progress bar on the main rank's terminal (without one, a log
    line at each record), and records of the updates since the last one (their mean loss, lr,
    tokens/s) in metrics.jsonl (`metrics`: the main rank's `MetricsLog`, None elsewhere)."""

    def __init__(
        self, metrics: MetricsLog | None, main: bool, total: int | None, step: int
    ) -> None:
        self.metrics, self.main = metrics, main
        self.bar = progress_bar(total, step) if main else None
        self.window = empty_window()

    @property
    def pending(self) -> int:
        """Updates added since the last record."""
        return self.window["updates"]

    def add(self, result: dict[str, Any], took: float, lr: float) -> None:
        """Count an update (`result`: its mean loss and NLL, its tokens) that took `took` s."""
        window = self.window
        for k in ("loss", "nll", "tokens"):
            window[k] += result[k] * (result["tokens"] if k != "tokens" else 1)
        window["updates"] += 1
        window["time"] += took
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                loss=f"{result['loss']:.3f}",
                lr=f"{lr:.2e}",
                tok_s=f"{result['tokens'] / took:.0f}",
                refresh=False,
            )

    def record(self, step: int, epochs: float, lr: float, elapsed: float) -> dict[str, Any]:
        """Write the averages of the updates since the last record, reset the window."""
        window, tokens = self.window, self.window["tokens"]
        record = {
            "step": step,
            "epoch": round(epochs, 3),
            "loss": window["loss"] / tokens,
            "nll": window["nll"] / tokens,
            "ppl": math.exp(min(window["nll"] / tokens, 50)),
            "lr": lr,
            "tokens_per_s": tokens / window["time"],
            "wall": round(elapsed, 1),
        }
        if self.metrics is not None:
            self.metrics.write(record, scalars=[k for k in record if k not in ("step", "wall")])
        self.window = empty_window()
        return record

    def say(self, record: dict[str, Any]) -> None:
        """A record as a log line, where no progress bar shows it (no terminal)."""
        if self.main and (self.bar is None or self.bar.disable):
            log.info(
                "step %d: loss %.3f  nll %.3f  lr %.2e  %.0f tokens/s",
                record["step"],
                record["loss"],
                record["nll"],
                record["lr"],
                record["tokens_per_s"],
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def empty_window() -> dict[str, float]:
    return {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "updates": 0, "time": 0.0}


def progress_bar(total: int | None, step: int):
    """A bar of the updates from `step`, on stderr where it is a terminal (else off)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=step,
        unit="step",
        desc="train",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None,
    )  # None: off when stderr is no terminal


def report_validation(
    metrics: MetricsLog | None, record: dict[str, Any], scores: dict[str, float]
) -> None:
    """A validation's `scores` in metrics.jsonl (`record`: with its step, epoch, best and
    wall time) and as a log line."""
    if metrics is not None:
        metrics.write(record, scalars=scores)
    log.info("step %d: %s", record["step"], "  ".join(f"{k} {v:.2f}" for k, v in scores.items()))
