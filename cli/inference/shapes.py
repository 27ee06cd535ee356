"""Decoding shapes from a small set, where the CPU builds a kernel per shape.

oneDNN, which runs PyTorch's half-precision matmuls on a CPU and our packed linear layers
(`model.packed`), builds and keeps a kernel (with its scratch memory) for every shape it meets,
up to 1,024 of them. A search's row count changes whenever a sentence finishes, and a batch's
size and source width with every batch, so a long `tf translate` in bf16 met hundreds of
shapes, and its memory grew with them (docs/performance.md). There each count is rounded
up to one of a few sizes (`bucket`): a batch's sources gain columns of padding (masked) and
copies of its last sentence, the search's rows copies of its last sentence's rows. The search
never sees them: their tokens are the last sentence's, their outputs are dropped, and a
sentence's rows never mix with another's (every op is per row but cross-attention, per
sentence). Where MKL's sgemm runs the matmuls (fp32 without packed layers) and on GPUs nothing
is padded: no kernel is kept per shape there, and the added rows would only cost time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from data.batching import Batch, padded_width
from model.packed import is_packed

WIDTH_MULTIPLE = 8  # source columns, rounded up to a multiple of this


def bucket(n: int) -> int:
    """n rounded up to one of eight sizes per doubling: exact below 16, then multiples of 2,
    4, 8...: at most 1/8 more rows, about 1/24 more on average."""
    step = 1 << max(0, n.bit_length() - 4)
    return -(-n // step) * step


def shapes_matter(model, device: torch.device) -> bool:
    """Whether decoding `model` here runs matmuls that build a kernel per shape: under CPU
    autocast, or with linear layers packed for oneDNN (`model.packed`)."""
    return device.type == "cpu" and (torch.is_autocast_enabled("cpu") or is_packed(model))


def pad_batch(batch: Batch, max_positions: int) -> tuple[Tensor, Tensor]:
    """The batch's sources (B, S) and padding mask as (bucket(B), S') with S' a multiple of
    WIDTH_MULTIPLE, or the model's `max_positions` where that is less: the new columns are
    padding, the new rows copies of the last source."""
    src, mask = batch.src, batch.src_pad_mask
    B, S = src.shape
    rows, width = bucket(B) - B, padded_width(S, WIDTH_MULTIPLE, max_positions) - S
    if width:
        src = torch.nn.functional.pad(src, (0, width), value=0)
        mask = torch.nn.functional.pad(mask, (0, width), value=True)
    if rows:
        src = torch.cat([src, src[-1:].expand(rows, -1)])
        mask = torch.cat([mask, mask[-1:].expand(rows, -1)])
    return src, mask


@dataclass
class Padded:
    """A search state whose first `rows` rows are the search's and the rest copies of its last
    sentence's `group` rows (the state's own reorder moves them all alike)."""

    state: Any  # DecoderCache, EnsembleCache: anything with reorder(index, group)
    rows: int  # the search's rows
    padded: int  # the state's rows, rows included
    group: int  # rows per sentence

    def reorder(self, index: Tensor, group: int = 1) -> Padded:
        """As the state's reorder, `index` (N',) naming the search's rows only: the result's
        sentences are rounded up to `bucket` with copies of the last one."""
        rows, sentences = index.numel(), index.numel() // group
        same = sentences == self.rows // self.group  # the searches drop sentences, never add
        extra = bucket(sentences) - sentences
        if extra:
            index = torch.cat([index, index[rows - group :].repeat(extra)])
        return Padded(self.state.reorder(index, group, same), rows, index.numel(), group)


def padded_step(decode_step: Callable[[Tensor, Any], Tensor]) -> Callable[[Tensor, Padded], Tensor]:
    """`decode_step` over a `Padded` state: the search's tokens (N,) fed with copies of the last
    sentence's for the added rows, the logits of the search's rows returned (N, V)."""

    def step(tokens: Tensor, padded: Padded) -> Tensor:
        extra = padded.padded - padded.rows
        if extra:
            last = tokens[padded.rows - padded.group :]
            tokens = torch.cat([tokens, last.repeat(extra // padded.group)])
        return decode_step(tokens, padded.state)[: padded.rows]

    return step
