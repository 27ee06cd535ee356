"""An exponential moving average of the weights (Polyak averaging), for short, noisy runs.

A run of ~1,000 updates ends at a high learning rate, where the weights still jump around the
minimum they are heading for; their running average sits nearer to it (the paper averages its
last checkpoints for the same reason, section 6.1). The decay warms up as
min(decay, (1 + step) / (10 + step)), so the random initial weights are forgotten within the
first hundred updates instead of lingering in the average for thousands.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class WeightAverage:
    """`model` is the average: a frozen copy of `trained`, folded in after each of its steps."""

    def __init__(self, trained: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(trained).requires_grad_(False).eval()
        # Both lists once: the parameters are the same tensors for the whole run.
        self._averaged = list(self.model.parameters())
        self._trained = [p.detach() for p in trained.parameters()]

    def decay_at(self, step: int) -> float:
        return min(self.decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold in the trained weights as update `step` (1 for the first) left them."""
        torch._foreach_lerp_(self._averaged, self._trained, 1.0 - self.decay_at(step))
