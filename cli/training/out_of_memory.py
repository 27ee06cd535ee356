"""Out of memory in an update. In a forward or backward pass the batches are cut in halves and
their gradients computed again (the loss is a sum over a constant divisor, so the update is the
same), until they fit or a batch is one sentence; under DDP a rank cannot redo its part of a
collective alone, so there the error stops the run, from its last checkpoint. In the optimizer
step (the weights, their gradients and Adam's moments) smaller batches do not help: an error.
"""

from __future__ import annotations

import logging

import torch

from cli.training.distributed import Dist
from cli.training.run import TrainingError
from cli.training.state import Progress
from data.batching import Batch

log = logging.getLogger(__name__)


def halved(batches: list[Batch], p: Progress, dd: Dist, device: torch.device) -> list[Batch]:
    """The batches of an update that ran out of memory in a forward or backward pass, each
    cut in halves (counted in `p.oom_splits`); an error where that cannot help."""
    if dd.active:
        raise TrainingError(
            f"step {p.step + 1}: out of memory under torchrun; resume "
            "with a lower train.max_tokens (and a higher train.update_freq)"
        ) from None
    if all(b.src.size(0) == 1 for b in batches):
        raise TrainingError(
            f"step {p.step + 1}: out of memory on a single sentence; lower data.max_len"
        ) from None
    batches = [half for b in batches for half in b.halves() if half.src.size(0)]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    p.oom_splits += 1
    log.warning(
        "step %d: out of memory; retrying as %d smaller batches (%d splits so far)",
        p.step + 1,
        len(batches),
        p.oom_splits,
    )
    return batches


def in_optimizer_step(p: Progress) -> TrainingError:
    """The error of an update that ran out of memory after its backward passes."""
    return TrainingError(
        f"step {p.step + 1}: out of memory in the optimiser step (the "
        "weights, their gradients and Adam's two moments), which smaller batches do not "
        "shrink; train a smaller model or on a device with more free memory"
    )
