"""Adam with the paper's settings and the learning-rate schedules.

`noam` and `inverse_sqrt` never finish decaying; `linear` and `cosine` know the run's budget
(max_steps, max_epochs or max_time, whichever is nearest) and reach zero when it is spent, as
budgeted-training studies recommend (Li et al., 2020, "Budgeted Training"): at a fixed budget
the last updates are worth more at a small lr than at inverse_sqrt's still-high one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from cli.config import TrainConfig


def noam(step: int, d_model: int, warmup: int) -> float:
    """The paper's schedule (section 5.3): d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    step = max(step, 1)
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt(step: int, warmup: int) -> float:
    """fairseq's inverse_sqrt as a multiplier of the peak: linear warmup, then sqrt(warmup/step)."""
    step = max(step, 1)
    if step < warmup:
        return step / warmup
    return math.sqrt(warmup / step)


def budget_decay(step: int, warmup: int, used: float, shape: str) -> float:
    """Linear warmup to the peak, times a decay from 1 to 0 over the budget's fraction `used`."""
    warm = min(max(step, 1) / warmup, 1.0)
    used = min(max(used, 0.0), 1.0)
    if shape == "cosine":
        return warm * 0.5 * (1.0 + math.cos(math.pi * used))
    return warm * (1.0 - used)


def budget_used(train: TrainConfig, step: int, elapsed: float, epochs: float) -> float:
    """The fraction of the run's budget spent at update `step`: the largest of its limits."""
    fractions = [0.0]
    if train.max_steps:
        fractions.append(step / train.max_steps)
    if train.max_epochs:
        fractions.append(epochs / train.max_epochs)
    if train.max_time:
        fractions.append(elapsed / train.max_time)
    return min(1.0, max(fractions))


BudgetUsed = Callable[[int], float]  # update number -> fraction of the budget spent


def lr_multiplier(
    train: TrainConfig, d_model: int, used: BudgetUsed | None = None
) -> Callable[[int], float]:
    """Multiplier of `train.lr` for update number `step` (1-based). `used` tells the budget
    schedules how much of the budget that update finds spent (by default: steps only)."""
    if train.schedule == "noam":
        return lambda step: noam(step, d_model, train.warmup_steps)
    if train.schedule == "inverse_sqrt":
        return lambda step: inverse_sqrt(step, train.warmup_steps)
    if used is None:
        used = lambda step: budget_used(train, step, 0.0, 0.0)  # noqa: E731
    return lambda step: budget_decay(step, train.warmup_steps, used(step), train.schedule)


def build_optimizer(
    params, train: TrainConfig, d_model: int, device: torch.device, used: BudgetUsed | None = None
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam(0.9, 0.98, eps 1e-9) and a LambdaLR whose k-th `step()` sets the lr of update k+1."""
    # One fused kernel per parameter instead of six element-wise passes (what it saves:
    # docs/performance.md). CPU and CUDA have it; elsewhere None.
    fused = True if device.type in ("cpu", "cuda") else None
    optimizer = torch.optim.Adam(
        params,
        lr=train.lr,
        betas=tuple(train.betas),
        eps=train.adam_eps,
        weight_decay=train.weight_decay,
        fused=fused,
    )
    multiplier = lr_multiplier(train, d_model, used)
    # LambdaLR evaluates at 0 on creation: shift by one so the first update uses step 1.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: multiplier(k + 1))
    return optimizer, scheduler


def apply_settings(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    train: TrainConfig,
    d_model: int,
    used: BudgetUsed | None = None,
) -> None:
    """Make `train`'s optimiser settings those of the next update, over any that a resumed
    checkpoint's optimiser and scheduler state brought back (a run resumed with a new lr,
    betas, eps or weight decay uses them from its next update on)."""
    multiplier = lr_multiplier(train, d_model, used)
    for group in optimizer.param_groups:
        group.update(
            initial_lr=train.lr,
            betas=tuple(train.betas),
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
        )
        group["lr"] = train.lr * multiplier(scheduler.last_epoch + 1)
    scheduler.base_lrs = [train.lr] * len(optimizer.param_groups)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
