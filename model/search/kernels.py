"""The searches' selections over a step's (N, V) log-probabilities: each row's n best
(`row_best`, of equal values the lowest columns) and its argmax, on a CPU read in blocks
(`row_topk`, `row_argmax`) where a whole-row top-k or argmax is slow; GPUs keep torch's.
The measurements behind the blocks and thresholds are in docs/performance.md."""

from __future__ import annotations

import torch
from torch import Tensor

TOPK_BLOCK = 64  # columns a block of `row_topk`: the fastest of 32, 64 and 128
# Below these many elements the plain top-k and argmax are faster than reading blocks, whose
# handful of ops cost a fixed time however small x is.
TOPK_MIN_ELEMENTS = 80_000
ARGMAX_MIN_ELEMENTS = 16_000


def row_best(x: Tensor, n: int, blocks: bool = True) -> tuple[Tensor, Tensor]:
    """Each row's n largest values of a 2-D x, largest first, and their columns: of equal
    values those of the lower columns (the n a stable sort in descending order puts first).
    Top-k chooses among values equal to its n-th as it likes (on a CPU, at bf16 logits' ties,
    other than the lowest columns in most rows; so that a beam of 1 could miss greedy's argmax
    at a tie of three at the top): one more is taken, and where the n-th and (n+1)-th values
    are equal, `lowest_columns` puts the right columns in. Equal values among the n come in
    any order. `blocks`: each row's best by `row_topk`, else by top-k over the whole row."""
    m = min(n + 1, x.size(1))
    top, columns = row_topk(x, m) if blocks else x.topk(m, dim=1)
    if m == n:  # every column
        return top, columns
    tied = top[:, n - 1] == top[:, n]  # (N,); NaN, which top-k ranks first, is never equal
    top, columns = top[:, :n], columns[:, :n]
    if x.device.type != "cpu":  # every row, masked: a search step's one wait stays its only one
        return top, lowest_columns(x, top, columns, tied)
    if tied.any():  # on a CPU, the tied rows alone
        rows = tied.nonzero().squeeze(1)
        x, tied = x.index_select(0, rows), tied[rows]
        columns[rows] = lowest_columns(x, top[rows], columns[rows], tied)
    return top, columns


def lowest_columns(x: Tensor, top: Tensor, columns: Tensor, tied: Tensor) -> Tensor:
    """`columns` (N, n) of the n largest values of each row of x (`top`, largest first), with
    those holding the n-th value (the last ones) replaced, in the rows where `tied` (N,) (the
    n-th value recurs after them), by the lowest columns that hold it. Over every row, without
    `nonzero` or `any`, so that on a GPU the host never waits for it."""
    V, n = x.size(1), top.size(1)
    nth = top[:, -1:]
    taken = (top == nth) & tied[:, None]  # (N, n): the last `count` of a tied row
    count = taken.sum(dim=1, keepdim=True)
    descending = V - torch.arange(V, device=x.device)  # a larger key for a lower column
    keys = torch.where((x == nth) & tied[:, None], descending, 0)  # (N, V)
    lowest = V - keys.topk(n, dim=1).values  # (N, n): the lowest columns holding it, ascending
    at = (torch.arange(n, device=x.device) - (n - count)).clamp(min=0)  # (N, n)
    return torch.where(taken, lowest.gather(1, at), columns)


def row_topk(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """`x.topk(n, dim=1)` of a wide 2-D x on a CPU, the same values and columns, reading most
    of x once instead of sorting it. The n largest of a row lie in the n blocks of
    `TOPK_BLOCK` columns with the largest maxima (a block holding one of them has a maximum at
    least as large, and at most n blocks can), so the top-k runs over those blocks and the
    columns past the last whole block. Where equal values could make the choice or the order
    of columns differ from top-k's (its own, implementation-defined), the row is taken again
    by `x.topk`: rare in float32 (`SearchSettings.half_logits`), and so are
    rows with -inf among their best (a forced EOS) or NaN. Beam search's (N, V) top-k was a
    measurable part of its step on CPUs (docs/performance.md); GPUs keep top-k, fast there.
    """
    N, V = x.shape
    whole = V // TOPK_BLOCK
    if x.device.type != "cpu" or x.numel() < TOPK_MIN_ELEMENTS or whole < 4 * (n + 1):
        return x.topk(n, dim=1)
    m = n + 1  # one more: a tie at the n-th value shows
    block_max = x[:, : whole * TOPK_BLOCK].view(N, whole, TOPK_BLOCK).amax(dim=2)  # (N, W)
    blocks = block_max.topk(m, dim=1).indices.sort(dim=1).values  # (N, m), in column order
    offsets = torch.arange(TOPK_BLOCK, device=x.device)
    columns = (blocks[:, :, None] * TOPK_BLOCK + offsets).view(N, m * TOPK_BLOCK)
    if whole * TOPK_BLOCK < V:  # the last, partial block is always a candidate
        tail = torch.arange(whole * TOPK_BLOCK, V, device=x.device)
        columns = torch.cat([columns, tail.expand(N, -1)], dim=1)
    top, at = x.gather(1, columns).topk(m, dim=1)  # (N, m), largest first
    tied = ~(top[:, 1:] < top[:, :-1]).all(dim=1)  # (N,): equal values, -inf or NaN among them
    top, columns = top[:, :n], columns.gather(1, at[:, :n])
    if tied.any():
        rows = tied.nonzero().squeeze(1)
        top[rows], columns[rows] = x[rows].topk(n, dim=1)
    return top, columns


def row_argmax(x: Tensor) -> Tensor:
    """`x.argmax(dim=1)` of a wide 2-D x on a CPU, the same columns (the first largest, or the
    first NaN), from the maxima of blocks of `TOPK_BLOCK` columns: the first block whose
    maximum is the row's holds its first largest value, so argmax runs over the blocks' maxima
    and then within that block. On a CPU argmax reads a row element by element, many times as
    slow as amax (docs/performance.md); GPUs keep argmax.
    """
    N, V = x.shape
    whole = V // TOPK_BLOCK
    if x.device.type != "cpu" or x.numel() < ARGMAX_MIN_ELEMENTS or whole < 2:
        return x.argmax(dim=1)
    block_max = x[:, : whole * TOPK_BLOCK].view(N, whole, TOPK_BLOCK).amax(dim=2)  # (N, W)
    if whole * TOPK_BLOCK < V:  # the columns past the last whole block, as one more block
        block_max = torch.cat([block_max, x[:, whole * TOPK_BLOCK :].amax(dim=1, keepdim=True)], 1)
    # The chosen block's TOPK_BLOCK columns; the last block's end at V, overlapping the one
    # before, which then holds no largest value (else argmax would have chosen it).
    start = (block_max.argmax(dim=1) * TOPK_BLOCK).clamp_(max=V - TOPK_BLOCK)  # (N,)
    columns = start[:, None] + torch.arange(TOPK_BLOCK, device=x.device)  # (N, TOPK_BLOCK)
    return start + x.gather(1, columns).argmax(dim=1)
