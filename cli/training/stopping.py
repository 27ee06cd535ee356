"""When training stops: its budget spent (max_steps, max_epochs: every rank at the same step), a
reason one rank may see alone (a signal, max_time, early stopping's patience: under DDP it
travels to the others with the next update), or too many non-finite updates in a row; and the
best validation so far, which best.pt and patience follow."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cli.config import TrainConfig
from cli.training.run import TrainingError
from cli.training.state import Progress

log = logging.getLogger(__name__)


def budget_spent(t: TrainConfig, p: Progress, epochs: float) -> str | None:
    """max_steps or max_epochs reached (`epochs` done, with the fraction of the current one):
    the same answer on every rank at the same step."""
    if t.max_steps and p.step >= t.max_steps:
        return "max_steps"
    if t.max_epochs and epochs >= t.max_epochs:
        return "max_epochs"
    return None


def stop_wanted(t: TrainConfig, p: Progress, signalled: bool) -> str | None:
    """A reason this rank alone may see (a signal, its clock, the main rank's validation)."""
    if signalled:
        return "signal"
    if t.max_time and p.elapsed >= t.max_time:
        return "max_time"
    if t.patience and p.evals_since_best >= t.patience:
        return "early_stop"
    return None


def record_validation(t: TrainConfig, p: Progress, metrics: dict[str, float]) -> bool:
    """Update best/patience from a validation; True if it is the best so far."""
    value = metrics["dev_loss" if t.early_stop_metric == "loss" else f"dev_{t.early_stop_metric}"]
    sign = -1.0 if t.early_stop_metric == "loss" else 1.0  # higher is better after the sign
    if p.best is None or sign * value > sign * p.best:
        p.best, p.evals_since_best = value, 0
        return True
    p.evals_since_best += 1
    return False


def count_skipped(why: str, p: Progress, t: TrainConfig, last: Path) -> None:
    """Log an update that was skipped; stop after `max_bad_steps` non-finite ones in a row
    (`last`: the last good checkpoint, named in the error)."""
    if why == "overflow":
        log.debug("step %d: fp16 gradient overflow, loss scale lowered", p.step + 1)
        return
    p.bad_steps += 1
    log.warning(
        "step %d: non-finite loss or gradient, update skipped (%d in a row)",
        p.step + 1,
        p.bad_steps,
    )
    if p.bad_steps >= t.max_bad_steps:
        raise TrainingError(
            f"{p.bad_steps} non-finite losses in a row at step "
            f"{p.step + 1}; lower train.lr or use train.precision=fp32 "
            f"(last good checkpoint: {last})"
        )


class Signals:
    """SIGINT and SIGTERM, while `caught()`: the first asks training to stop (`requested`)
    once the current update is done and last.pt saved; a second stops it at once."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def caught(self) -> Iterator[None]:
        """Inside the block the signals are caught; the previous handlers come back after it
        (they would keep the trainer alive)."""

        def request_stop(signum, frame):
            if self.requested:  # a second signal: stop now
                raise KeyboardInterrupt
            log.warning("%s: saving a checkpoint, then stopping", signal.Signals(signum).name)
            self.requested = True

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, signal.SIG_DFL if handler is None else handler)
