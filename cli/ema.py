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
    """`model` is the average: a frozen copy of the trained model, updated after each step."""

    def __init__(self, trained: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(trained).requires_grad_(False).eval()
        self._params = list(self.model.parameters())

    def decay_at(self, step: int) -> float:
        return min(self.decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def update(self, trained: nn.Module, step: int) -> None:
        """Fold in the weights of `trained` after update `step` (1 for the first)."""
        weight = 1.0 - self.decay_at(step)
        torch._foreach_lerp_(self._params, [p.detach() for p in trained.parameters()], weight)
