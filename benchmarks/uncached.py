"""Decoding without a cache, the reference that cached decoding is checked and timed against:
every step decodes the whole prefix again (O(t^2) work at step t)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.transformer import Transformer


@dataclass
class PrefixState:
    """The whole prefix decoded so far, with the encoder output it attends to."""

    memory: Tensor  # (N, S, D)
    src_pad_mask: Tensor  # (N, S) True = padding
    tokens: Tensor  # (N, t) tokens fed so far

    def reorder(
        self, index: Tensor, group: int = 1, same_sentences: bool | None = None
    ) -> PrefixState:
        """Row i of the result is row index[i] of this state; index (N',) long (every row
        moves: `group` and `same_sentences` change nothing)."""
        return PrefixState(
            memory=self.memory.index_select(0, index),
            src_pad_mask=self.src_pad_mask.index_select(0, index),
            tokens=self.tokens.index_select(0, index),
        )


def uncached_start(model: Transformer, memory: Tensor, src_pad_mask: Tensor, steps: int = 0):
    """As `cli.inference.decoding.cached_start`: the initial state and the step, uncached
    (`steps` is room a cache would make).

    Shape: memory (N, S, D), src_pad_mask (N, S); the step maps tokens (N,) to logits (N, V).
    """

    def step(tokens: Tensor, state: PrefixState) -> Tensor:
        state.tokens = torch.cat([state.tokens, tokens[:, None]], dim=1)  # (N, t + 1)
        hidden = model.decode(state.tokens, state.memory, state.src_pad_mask, None)  # (N, t+1, D)
        return model.project(hidden[:, -1])  # (N, V)

    tokens = src_pad_mask.new_zeros(memory.size(0), 0, dtype=torch.long)  # (N, 0)
    return PrefixState(memory, src_pad_mask, tokens), step
