"""Batches: padding, shifted targets, token-budget bucketing and the split across ranks.

Dims: B (sentences in the batch), S (source positions), T (target positions).
A batch's cost is counted with padding, on both sides: B * S <= max_tokens and
B * T <= max_tokens, where T = longest target + 1 (for BOS in `tgt_in`, EOS in `tgt_out`).

Shapes: with a `pad_multiple` m > 1 a training batch has one width W for both sides, max(S, T)
rounded up to a multiple of m, (unless it ends a pool) a multiple of `SIZE_MULTIPLE` sentences,
and its rows of real targets (the output layer's) rounded up to `TARGET_ROWS_MULTIPLE`; W stops
at `max_width`, the model's max_positions (a pair of max_len pieces is max_len + 1 wide with
BOS/EOS, which rounding up would carry past the last position). oneDNN,
which runs the CPU's bf16 and int8 matmuls, builds and keeps a kernel with its scratch memory
per shape. On bible-es-en with `small`'s tokenizer, three epochs held 163 distinct (B, S, T)
shapes, and 58 with m = 2, the padding share 5.6% -> 7.7% (benchmarks/data_bench.py; rounding
each side on its own instead, m = 4 kept 75 shapes, m = 8 46 at 11.8% padding). A 1,000-update
bf16 `demo` run (benchmarks/memory_bench.py) grew from 2.0 GB at update 100 to 3.0 GB at
m = 1; at m = 2 from 1.1 to 1.4 GB, and made 24,200 target tokens/s instead of 19,800.
fairseq's `--required-seq-len-multiple` and `--required-batch-size-multiple` round likewise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from data.errors import counted

SIZE_MULTIPLE = 8  # sentences per batch, where `pad_multiple` > 1 (fairseq's default too)
# Rows of real targets the output layer and the loss take, where `pad_multiple` > 1: their
# number changes with every batch, and so would the shape of the largest matmuls of a step.
TARGET_ROWS_MULTIPLE = 64


@dataclass
class Batch:
    """One padded batch, ready for the model (masks as in `torch.nn.Transformer`).

    Shape:
        src: (B, S) long; tgt_in: (B, T) long, start + y; tgt_out: (B, T) long, y + EOS, where
        start is the decoder's first token (BOS; pad for an imported Marian model).
        src_pad_mask: (B, S) bool, True = padding; tgt_pad_mask: (B, T) bool, True = padding
        (it holds for `tgt_in` and `tgt_out` alike). Without targets T = 0.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    src_pad_mask: Tensor
    tgt_pad_mask: Tensor
    n_src_tokens: int  # real (non-pad) source tokens
    n_tgt_tokens: int  # non-pad positions of tgt_out, EOS included
    indices: list[int]  # dataset rows of the examples, in batch order
    # (N,) long, N >= n_tgt_tokens: the real target positions in the flattened (B*T) order, then
    # (with `pad_multiple` > 1) position 0 again up to a multiple of TARGET_ROWS_MULTIPLE, rows
    # that `real_targets` marks as ignored. Found here, on the host, so that training selects
    # them with `index_select`, which never waits for the GPU as boolean indexing does.
    tgt_index: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on `device`."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy in page-locked host memory, so that a copy to the GPU can run asynchronously."""
        return self._map(lambda t: t.pin_memory())

    def real_targets(self, ignore_index: int = -100) -> Tensor:
        """(N,) the target ids at `tgt_index`: the real positions' ids, then `ignore_index` on
        the rows that only round their number up."""
        targets = self.tgt_out.reshape(-1).index_select(0, self.tgt_index)
        if len(targets) > self.n_tgt_tokens:
            targets[self.n_tgt_tokens :] = ignore_index
        return targets

    def halves(self) -> tuple[Batch, Batch]:
        """The first and the second half of the rows, each a batch of its own, on the same
        device (an update that ran out of memory is retried on them: see Trainer.update)."""
        cut = self.src.size(0) // 2

        def part(rows: slice) -> Batch:
            tgt_pad = self.tgt_pad_mask[rows]
            return Batch(
                src=self.src[rows],
                tgt_in=self.tgt_in[rows],
                tgt_out=self.tgt_out[rows],
                src_pad_mask=self.src_pad_mask[rows],
                tgt_pad_mask=tgt_pad,
                n_src_tokens=int((~self.src_pad_mask[rows]).sum()),
                n_tgt_tokens=int((~tgt_pad).sum()),
                indices=self.indices[rows],
                tgt_index=(~tgt_pad).reshape(-1).nonzero().squeeze(1),
            )

        return part(slice(0, cut)), part(slice(cut, None))

    def _map(self, fn) -> Batch:
        return replace(
            self,
            src=fn(self.src),
            tgt_in=fn(self.tgt_in),
            tgt_out=fn(self.tgt_out),
            src_pad_mask=fn(self.src_pad_mask),
            tgt_pad_mask=fn(self.tgt_pad_mask),
            tgt_index=None if self.tgt_index is None else fn(self.tgt_index),
        )


def collate(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]] | None,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    indices: Sequence[int],
    src_pad_id: int | None = None,
) -> Batch:
    """Pad token ids into a `Batch`; targets gain the start token (`tgt_in`) and EOS
    (`tgt_out`).

    Args:
        src: source ids of each example, without BOS/EOS.
        tgt: target ids of each example, without BOS/EOS; None for inference, which gives
            empty (B, 0) target tensors.
        pad_id, bos_id, eos_id: the tokenizer's special ids; bos_id is the decoder's start
            token (`Tokenizer.decoder_start_id`: BOS, or pad for Marian's models).
        indices: the dataset row of each example, kept in `Batch.indices`.
        src_pad_id: the source vocabulary's padding id where it is not pad_id (a Marian
            model's two vocabularies, `Tokenizer.src_pad_id`).

    Returns:
        The batch; row i holds example i.
    """
    src_rows = [np.asarray(row, dtype=np.int64) for row in src]
    tgt_rows = None if tgt is None else [np.asarray(row, dtype=np.int64) for row in tgt]
    return _collate_rows(
        src_rows, tgt_rows, pad_id, bos_id, eos_id, list(indices), src_pad_id=src_pad_id
    )


def _collate_rows(
    src_rows: list[np.ndarray],
    tgt_rows: list[np.ndarray] | None,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    indices: list[int],
    pad_multiple: int = 1,
    max_width: int | None = None,
    src_pad_id: int | None = None,
) -> Batch:
    """`collate` on numpy rows (the iterator's fast path). With `pad_multiple` > 1 both sides
    are padded to one width, the longer side's rounded up to a multiple of it but not past
    `max_width` (the model's positions; None: no limit)."""
    n = len(src_rows)
    src_lens = torch.tensor([len(row) for row in src_rows], dtype=torch.long)
    tgt_lens = torch.zeros(n, dtype=torch.long)
    if tgt_rows is not None:
        tgt_lens = torch.tensor([len(row) + 1 for row in tgt_rows], dtype=torch.long)  # + BOS/EOS
    src_width = int(src_lens.max()) if n else 0
    tgt_width = int(tgt_lens.max()) if n else 0
    if pad_multiple > 1:
        src_width = tgt_width = padded_width(max(src_width, tgt_width), pad_multiple, max_width)
    src = _pad(src_rows, src_width, pad_id if src_pad_id is None else src_pad_id)  # (B, S)
    if tgt_rows is None:
        tgt_in = tgt_out = torch.empty(n, 0, dtype=torch.long)
    else:
        tgt_in = _pad(tgt_rows, tgt_width, pad_id, first=bos_id)  # (B, T)
        tgt_out = _pad(tgt_rows, tgt_width, pad_id, last=eos_id)  # (B, T)
    # Masks come from the lengths, not from `== pad_id`: correct whatever the ids hold.
    tgt_pad_mask = _pad_mask(tgt_lens, tgt_in.shape[1])
    tgt_index = (~tgt_pad_mask).reshape(-1).nonzero().squeeze(1)  # (N,)
    if pad_multiple > 1 and len(tgt_index):
        extra = _round_up(len(tgt_index), TARGET_ROWS_MULTIPLE) - len(tgt_index)
        tgt_index = torch.cat([tgt_index, tgt_index.new_zeros(extra)])
    return Batch(
        src=src,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        src_pad_mask=_pad_mask(src_lens, src.shape[1]),
        tgt_pad_mask=tgt_pad_mask,
        n_src_tokens=int(src_lens.sum()),
        n_tgt_tokens=int(tgt_lens.sum()) if tgt_rows is not None else 0,
        indices=indices,
        tgt_index=tgt_index,
    )


def _pad(
    rows: list[np.ndarray],
    width: int,
    pad_id: int,
    first: int | None = None,
    last: int | None = None,
) -> Tensor:
    """Rows into a (B, width) long tensor: optionally `first` before and `last` after each row."""
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    start = 0 if first is None else 1
    for i, row in enumerate(rows):
        out[i, start : start + len(row)] = row
        if last is not None:
            out[i, start + len(row)] = last
    if first is not None:
        out[:, 0] = first
    return torch.from_numpy(out)


def _round_up(x, multiple: int):
    """x (an int or an array) rounded up to a multiple of `multiple`."""
    return -(-x // multiple) * multiple


def padded_width(width: int, multiple: int, max_width: int | None = None) -> int:
    """`width` rounded up to a multiple of `multiple`, capped at `max_width` (never below
    `width` itself): a position past the model's `max_positions` has no embedding, so padding
    there would fail the forward pass."""
    rounded = _round_up(width, multiple)
    return rounded if max_width is None else max(width, min(rounded, max_width))


def _pad_mask(lengths: Tensor, width: int) -> Tensor:
    """(B, width) bool, True at positions at or past each row's length."""
    return torch.arange(width)[None, :] >= lengths[:, None]


def batch_by_tokens(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int] | None,
    max_tokens: int,
    max_sentences: int | None = None,
) -> list[list[int]]:
    """Group examples into batches under a padded-token budget, sorted by length, unshuffled.

    Used for translation: sorting puts sentences of similar length together, so little of each
    batch is padding. The caller restores the input order with the returned indices.

    Args:
        src_lens: source length of each example.
        tgt_lens: target length of each example (counted + 1 for BOS/EOS), or None.
        max_tokens: budget per side: batch size * longest (padded) length <= max_tokens.
        max_sentences: at most this many examples per batch (None: no limit).

    Returns:
        Batches of example indices, in ascending length (see `_by_length`); ties keep input
        order. An example over the budget on its own gets a batch of its own.
    """
    src_cost = np.asarray(src_lens, dtype=np.int64)
    tgt_cost = (
        np.zeros_like(src_cost) if tgt_lens is None else np.asarray(tgt_lens, dtype=np.int64) + 1
    )
    order = _by_length(np.arange(len(src_cost)), src_cost, tgt_cost)
    batches = _cut_batches(order, src_cost, tgt_cost, max_tokens, max_sentences or sys.maxsize)
    return [batch.tolist() for batch in batches]


def _by_length(
    indices: np.ndarray, src_cost: np.ndarray, tgt_cost: np.ndarray, pad_multiple: int = 1
) -> np.ndarray:
    """`indices` sorted by padded width max(src, tgt) (rounded up to `pad_multiple`), then
    source length; stable.

    The width decides how many examples fit the budget, so it leads; measured on
    bible-es-en, this pads less than sorting by (source, target) length.
    """
    src, tgt = src_cost[indices], tgt_cost[indices]
    width = np.maximum(src, tgt)
    if pad_multiple > 1:  # a batch's width is its bucket's: fill the bucket before the next
        width = _round_up(width.astype(np.int64), pad_multiple)
    return indices[np.lexsort((tgt, src, width))]


def _cut_batches(
    order: np.ndarray,
    src_cost: np.ndarray,
    tgt_cost: np.ndarray,
    max_tokens: int,
    max_sentences: int,
    pad_multiple: int = 1,
) -> list[np.ndarray]:
    """Cut `order` (already sorted by length) greedily into batches under the budget.

    A batch grows while (size + 1) * longest padded length stays within `max_tokens` on both
    sides; an example that alone exceeds the budget becomes a batch of one. With
    `pad_multiple` > 1 the length is rounded up to it, and a batch that stops growing keeps a
    multiple of `SIZE_MULTIPLE` examples (the rest open the next batch).
    """
    widths = np.maximum(src_cost[order], tgt_cost[order]).astype(np.int64)
    if pad_multiple > 1:
        widths = _round_up(widths, pad_multiple)
    width_of = widths.tolist()  # Python ints: a fast loop
    batches, start, width, i = [], 0, 0, 0
    while i < len(order):
        new_width = max(width, width_of[i])
        size = i - start + 1
        if size > 1 and (size > max_sentences or size * new_width > max_tokens):
            size -= 1
            if pad_multiple > 1 and size > SIZE_MULTIPLE:
                size -= size % SIZE_MULTIPLE
            batches.append(order[start : start + size])
            start = i = start + size
            width = width_of[i]
        else:
            width = new_width
        i += 1
    if start < len(order):
        batches.append(order[start:])
    return batches


@dataclass(frozen=True)
class RaggedIds:
    """Token-id sequences of varying length stored flat: row i is values[offsets[i]:offsets[i+1]].

    The training corpus is loaded into this form once (see `data.corpus.token_ids`), so that
    building a batch is a few numpy slices rather than per-row `datasets` look-ups.
    """

    values: np.ndarray  # (total tokens,) int
    offsets: np.ndarray  # (N + 1,) int64, offsets[0] == 0

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]]) -> RaggedIds:
        """Pack Python lists of ids."""
        lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = np.fromiter((i for row in rows for i in row), dtype=np.int64, count=offsets[-1])
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        """(N,) int64 length of each row."""
        return np.diff(self.offsets)


class RaggedConcat:
    """Several `RaggedIds` (e.g. one memory-mapped file set per corpus) read as one, in order:
    nothing is copied, a row is looked up in its part."""

    def __init__(self, parts: Sequence[RaggedIds]) -> None:
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [len(part) for part in self.parts])  # (P + 1,)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        part = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[part][i - int(self.starts[part])]

    def lengths(self) -> np.ndarray:
        """(N,) int64 length of each row."""
        return np.concatenate([part.lengths() for part in self.parts])


Ragged = RaggedIds | RaggedConcat


class BatchIterator:
    """Shuffled token-budget batches of a parallel corpus, resumable, split across ranks.

    Each epoch, deterministically for (seed, epoch): shuffle the examples, cut the order into
    pools of about `pool_batches` batches, sort each pool by length (padded width, then
    source length), cut it into batches under the budget (see the module docstring), shuffle
    the order of all the batches. Sorting inside pools keeps padding low; shuffling before
    pooling and after cutting keeps the batches and their order random.

    Corpora: with `corpora` [(rows, weight), ...] (the examples in that order), an epoch holds
    each corpus's rows `weight` times: whole copies, and for a fractional part a window of a
    fixed permutation of the corpus that moves on each epoch (a different subset each epoch,
    covering the corpus over epochs). One corpus of weight 1 is the plain case.

    Ranks: the largest batches are split in two until the number of batches divides `split`
    (by default `world_size`; a training run's is its batches per update over all ranks);
    rank r then takes batches r, r + world_size, ... Every rank gets the same number of
    batches, and together they cover every example exactly once per epoch. The plan depends on
    `split`, not on the world size: a state saved by N ranks resumes in any number of ranks
    that divides its `split`, at the same place of the same plan (`load_state_dict`).

    An example over the budget on its own is not dropped: it gets a batch of its own (filter
    such pairs out beforehand, e.g. with `data.corpus.filter_pairs(max_len=...)`).

    Iterating yields the batches of the current epoch from the current position on and
    advances the position as it goes; when the epoch is exhausted, `epoch` += 1 and the
    position returns to 0. One iteration at a time: the state lives in the iterator.

    Args:
        src, tgt: token ids of each example, without BOS/EOS (`RaggedIds` or lists); batch
            indices are positions in these.
        max_tokens: padded-token budget per side and batch.
        pad_id, bos_id, eos_id: the tokenizer's special ids.
        src_pad_id: the source's padding id where it is not pad_id (`collate`).
        max_sentences: at most this many examples per batch (None: no limit).
        seed: with the epoch number, determines the shuffles.
        shuffle: False gives one length-sorted pass in a fixed order (for validation).
        pool_batches: pool size, in (estimated) batches; larger pads less, shuffles less.
        rank, world_size: this process's share of each epoch.
        split: the epoch's batch count is made a multiple of this (a multiple of world_size;
            None: world_size).
        corpora: [(rows, weight), ...] of the examples in order (None: one corpus, weight 1).
        pad_multiple: batch width rounded up to a multiple of this (see the module docstring).
        max_width: the model's max_positions: no rounded width goes past it (None: no limit).

    Attributes:
        epoch, position: the next batch to yield is batch `position` of epoch `epoch`.
    """

    def __init__(
        self,
        src: Ragged | Sequence[Sequence[int]],
        tgt: Ragged | Sequence[Sequence[int]],
        *,
        max_tokens: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        seed: int,  # no default here: `train.seed` is the one default
        max_sentences: int | None = None,
        shuffle: bool = True,
        pool_batches: int = 100,
        rank: int = 0,
        world_size: int = 1,
        corpora: Sequence[tuple[int, float]] | None = None,
        pad_multiple: int = 1,
        max_width: int | None = None,
        src_pad_id: int | None = None,
        split: int | None = None,
    ) -> None:
        self.src = src if isinstance(src, (RaggedIds, RaggedConcat)) else RaggedIds.from_lists(src)
        self.tgt = tgt if isinstance(tgt, (RaggedIds, RaggedConcat)) else RaggedIds.from_lists(tgt)
        if len(self.src) != len(self.tgt):
            raise ValueError(f"{len(self.src)} sources but {len(self.tgt)} targets")
        if len(self.src) == 0:
            raise ValueError("no examples to batch")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, not {max_tokens}")
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple must be positive, not {pad_multiple}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        split = split or world_size
        if split % world_size:
            raise ValueError(f"split {split} is not a multiple of world size {world_size}")
        self.corpora = [(int(n), float(w)) for n, w in corpora or [(len(self.src), 1.0)]]
        if sum(n for n, _ in self.corpora) != len(self.src) or any(w <= 0 for _, w in self.corpora):
            raise ValueError(f"corpora {self.corpora} do not cover {len(self.src)} examples")
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.pad_multiple = pad_multiple
        self.max_width = max_width  # shapes the tensors only, never the plan: not in the state
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.src_pad_id = src_pad_id
        self.seed, self.shuffle = seed, shuffle
        self.rank, self.world_size, self.split = rank, world_size, split
        self.epoch = 0
        self.position = 0  # batches of this epoch already yielded to this rank

        # What each process holds of a corpus of any size: 2 bytes a pair and side while the
        # lengths fit (4 beyond), and a 4-byte row index a pair in the epoch's plan.
        src_cost, tgt_cost = self.src.lengths(), self.tgt.lengths() + 1  # + 1: BOS/EOS
        cost_type = np.uint16 if max(src_cost.max(), tgt_cost.max()) < 2**16 else np.int32
        self._src_cost, self._tgt_cost = src_cost.astype(cost_type), tgt_cost.astype(cost_type)
        self.pool_size = _pool_size(
            self._src_cost, self._tgt_cost, max_tokens, max_sentences, pool_batches
        )
        self._plan: tuple[int, list[np.ndarray]] | None = None  # (epoch, this rank's batches)
        self._ranks_alone = False  # the last epoch planned was cut for the ranks alone

    def __len__(self) -> int:
        """Batches per rank in the current epoch."""
        return len(self._batches(self.epoch))

    def __iter__(self) -> Iterator[Batch]:
        if self.position >= len(self):  # the last epoch ended but was not iterated past
            self.epoch, self.position = self.epoch + 1, 0
        batches = self._batches(self.epoch)
        while self.position < len(batches):
            rows = batches[self.position]
            self.position += 1  # before yielding: a state saved now resumes at the next batch
            yield self._collate(rows)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        """Where to resume: the next batch to yield, plus the settings it depends on."""
        epoch, position = self.epoch, self.position
        if position >= len(self):
            epoch, position = epoch + 1, 0
        return {"epoch": epoch, "position": position, **self._settings()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at `state` (from `state_dict`), saved by this or another number of ranks.

        The plan is the state's (its `split`): the ranks continue it from the batches all of
        them had taken, shared out among this iterator's `world_size`.

        Raises:
            ValueError: the state comes from an iterator with other data or settings (its
                positions would name other batches), or its place in the plan cannot be
                shared out equally among `world_size` ranks.
        """
        settings = self._settings()
        placement = {"epoch", "position", "rank", "world_size", "split"}
        keys = (set(settings) | set(state)) - placement
        changed = sorted(key for key in keys if state.get(key) != settings.get(key))
        if changed:
            raise ValueError(f"batch iterator state does not match: {', '.join(changed)} differ")
        saved_world = int(state["world_size"])
        split = int(state.get("split", saved_world))  # states before `split` cut by world size
        taken = int(state["position"]) * saved_world  # the plan's batches all ranks had taken
        if split % self.world_size or taken % self.world_size:
            raise ValueError(
                f"its epochs are cut for {counted(saved_world, 'rank')} taking "
                f"{counted(split, 'batch', 'batches')} together; "
                f"{counted(self.world_size, 'rank')} cannot share them equally"
            )
        if split != self.split:
            self.split, self._plan = split, None
        self.epoch, self.position = int(state["epoch"]), taken // self.world_size
        if not 0 <= self.position <= len(self):
            raise ValueError(f"position {self.position} is outside epoch of {len(self)} batches")
        if saved_world != self.world_size and self._ranks_alone:
            raise ValueError(
                f"an epoch holds fewer examples than one update's "
                f"{counted(split, 'batch', 'batches')}, so its "
                f"batches depend on the number of ranks: resume in {saved_world}"
            )

    def epoch_indices(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches of `epoch` (default: the current one) as dataset row indices."""
        return [rows.tolist() for rows in self._batches(self.epoch if epoch is None else epoch)]

    def _settings(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "n_examples": len(self.src),
            "max_tokens": self.max_tokens,
            "max_sentences": self.max_sentences or 0,
            "pool_size": self.pool_size,
            "shuffle": int(self.shuffle),
            "rank": self.rank,
            "world_size": self.world_size,
            # Only where it differs: a state saved before `split` existed stays what it was.
            **({"split": self.split} if self.split != self.world_size else {}),
            # Only for a weighted mix: a plain corpus's state stays what it always was.
            **({"corpora": [list(c) for c in self.corpora]} if self._weighted() else {}),
            **({"pad_multiple": self.pad_multiple} if self.pad_multiple > 1 else {}),
        }

    def _batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch` (cached for the latest epoch asked)."""
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, self._plan_epoch(epoch)[self.rank :: self.world_size])
        return self._plan[1]

    def _plan_epoch(self, epoch: int) -> list[np.ndarray]:
        """All ranks' batches of `epoch`, in order; see the class docstring."""
        rng = np.random.default_rng([self.seed, epoch])
        order = self._epoch_examples(epoch)
        if self.shuffle:
            order = rng.permutation(len(self.src) if order is None else order)
        elif order is None:
            order = np.arange(len(self.src))
        order = order.astype(np.int32 if len(self.src) < 2**31 else np.int64)
        n = len(order)
        max_sentences = self.max_sentences or sys.maxsize
        batches = []
        for start in range(0, n, self.pool_size):
            pool = order[start : start + self.pool_size]
            pool = _by_length(pool, self._src_cost, self._tgt_cost, self.pad_multiple)
            batches += _cut_batches(
                pool,
                self._src_cost,
                self._tgt_cost,
                self.max_tokens,
                max_sentences,
                self.pad_multiple,
            )
        # An epoch with fewer examples than one update takes is cut for the ranks alone (its
        # updates then run across epochs, as before `split`): that plan depends on the number
        # of ranks, so `load_state_dict` refuses it in another.
        divisor = self.split if _reachable(batches, self.split) else self.world_size
        self._ranks_alone = divisor != self.split
        batches = _split_until_divisible(batches, divisor, self._src_cost, self._tgt_cost)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _weighted(self) -> bool:
        return any(weight != 1 for _, weight in self.corpora)

    def _epoch_examples(self, epoch: int) -> np.ndarray | None:
        """The rows of `epoch` before shuffling, a row once per time it is seen; None when every
        weight is 1 (every row once: the plain case, shuffled exactly as a single corpus)."""
        if not self._weighted():
            return None
        parts, start = [], 0
        for i, (rows, weight) in enumerate(self.corpora):
            whole, fraction = divmod(weight, 1.0)
            parts += [np.arange(start, start + rows, dtype=np.int64)] * int(whole)
            window = round(fraction * rows)
            if window:
                fixed = np.random.default_rng([self.seed, 1 + i, 0]).permutation(rows)
                first = epoch * window % rows
                parts.append(start + fixed.take(np.arange(first, first + window), mode="wrap"))
            start += rows
        return np.concatenate(parts)

    def _collate(self, rows: np.ndarray) -> Batch:
        return _collate_rows(
            [self.src[i] for i in rows],
            [self.tgt[i] for i in rows],
            self.pad_id,
            self.bos_id,
            self.eos_id,
            rows.tolist(),
            self.pad_multiple,
            self.max_width,
            self.src_pad_id,
        )


def _pool_size(
    src_cost: np.ndarray,
    tgt_cost: np.ndarray,
    max_tokens: int,
    max_sentences: int | None,
    pool_batches: int,
) -> int:
    """Examples per pool: `pool_batches` batches of the average example's size."""
    if len(src_cost) == 0:
        return 1
    mean_width = max(1.0, float(np.maximum(src_cost, tgt_cost).mean()))
    per_batch = max(1, int(max_tokens / mean_width))
    if max_sentences:
        per_batch = min(per_batch, max_sentences)
    return max(1, pool_batches * per_batch)


def _reachable(batches: list[np.ndarray], split: int) -> bool:
    """Whether halving batches can make their number a multiple of `split`: each halving adds
    one, up to one example a batch."""
    examples = sum(len(rows) for rows in batches)
    return -(-len(batches) // split) * split <= examples


def _split_until_divisible(
    batches: list[np.ndarray], split: int, src_cost: np.ndarray, tgt_cost: np.ndarray
) -> list[np.ndarray]:
    """Split the largest batches in two until their number is a multiple of `split`.

    Halves of a batch fit its budget, so the split batches still do.

    Raises:
        ValueError: fewer examples than `split` (the ranks, where it is their number).
    """

    def padded_tokens(rows: np.ndarray) -> int:
        if len(rows) < 2:
            return -1  # cannot be split
        return len(rows) * int(max(src_cost[rows].max(), tgt_cost[rows].max()))

    batches = list(batches)
    while len(batches) % split:
        sizes = [padded_tokens(rows) for rows in batches]
        i = int(np.argmax(sizes))
        if sizes[i] < 0:
            raise ValueError(
                f"cannot split {counted(len(batches), 'example')} into equal shares for "
                f"{counted(split, 'rank')}"
            )
        half = len(batches[i]) // 2
        batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
    return batches
