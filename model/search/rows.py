"""The live rows of a search: `Beams`, and how rows are moved between steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class Beams:
    """The live hypotheses: k rows per live sentence, a sentence's rows adjacent."""

    tokens: Tensor  # (N, t) tokens generated so far
    log_probs: Tensor  # (N,) sum of their log-probabilities
    sentence: Tensor  # (N,) input index of the row's sentence

    @staticmethod
    def start(batch_size: int, device: torch.device) -> Beams:
        """One row per sentence, no token yet, log-probability 0."""
        empty = torch.empty(batch_size, 0, dtype=torch.long, device=device)  # (B, 0)
        zeros = torch.zeros(batch_size, device=device)  # (B,)
        return Beams(empty, zeros, torch.arange(batch_size, device=device))

    def take(self, rows: Tensor) -> Beams:
        """Rows (N',) of these beams."""
        return Beams(self.tokens[rows], self.log_probs[rows], self.sentence[rows])

    def extend(self, tokens: Tensor, log_probs: Tensor) -> Beams:
        """Each row followed by tokens (N,), its sum of log-probabilities now log_probs (N,)."""
        extended = torch.cat([self.tokens, tokens[:, None]], dim=1)  # (N, t + 1)
        return Beams(extended, log_probs, self.sentence)


def in_place_order(kept: list[int]) -> list[int]:
    """The positions `kept` (ascending) of the rows, or groups of rows, that stay live, in the
    order that leaves the most where they are: one below len(kept) keeps its place, the others
    fill the places of those that left, in order. A reorder (`model.attention.rows_to_move`)
    then copies only the rows that fill them, where keeping the order moved every row after
    the first that left. The searches do not depend on the order of their sentences."""
    n = len(kept)
    staying = {p for p in kept if p < n}
    fillers = iter(p for p in kept if p >= n)
    return [p if p in staying else next(fillers) for p in range(n)]


def on_device(
    values: list | np.ndarray, device: torch.device, dtype: torch.dtype = torch.long
) -> Tensor:
    """A tensor of host values on `device`, copied without waiting for the device."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
