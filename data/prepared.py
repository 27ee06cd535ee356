"""A training corpus ready for batching: cleaned, encoded, filtered, and written once as flat
memory-mapped id files, so that every process reads the ids through the page cache (one copy
per machine, whatever the number of `torchrun` ranks) instead of holding its own.

    CACHE/tf-ids/KEY/src.ids, tgt.ids      piece ids, all rows end to end (uint16 while the
                                           vocabulary allows, else int32: half the pages)
    CACHE/tf-ids/KEY/src.offsets, ...      int64 (N + 1,): row i is ids[offsets[i]:offsets[i+1]]
    CACHE/tf-ids/KEY/counts.json           what was read, removed (by rule) and kept

KEY hashes everything the result depends on (the corpus's `datasets` fingerprint, the
tokenizer's digest, the cleaning and length settings, the dev/test sets, the tag), so a second
start with the same data reads the files and redoes nothing. CACHE is the `datasets` cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Protocol

import datasets
import numpy as np
import pyarrow as pa

from data.batching import RaggedIds
from data.clean import Reference, clean_mask
from data.errors import InputError
from data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_VERSION = "3"  # bump when what is written changes, to invalidate the cached files
_ENCODE_ROWS = 20_000  # sentences per call into SentencePiece
_POOL_ROWS = 200_000  # from this many pairs a pool of processes encodes (its start costs ~1 s)
TOKEN_RULES = ("too_long", "ratio")


class Bar(Protocol):
    """What a stage reports its progress to (a tqdm bar, say)."""

    def update(self, n: int) -> object: ...
    def close(self) -> None: ...


class _Silent:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


Progress = Callable[[str, int], Bar]  # (what the stage does, in words; its total) -> a bar


def silent(stage: str, total: int) -> Bar:
    return _Silent()


@dataclass
class Prepared:
    src: RaggedIds  # memory-mapped
    tgt: RaggedIds
    counts: dict  # {"read": n, "removed": {rule: n}, "kept": n}
    digest: str  # sha256 of the ids kept, both sides: what a resumed run must find again


@dataclass(frozen=True)
class Filters:
    clean: bool  # the text rules of data.clean
    max_len: int | None  # longest side kept, in pieces
    max_len_ratio: float | None  # largest longer/shorter ratio kept
    tags: tuple[str, ...] = ()  # reserved pieces put before every source, in order
    # ... and before every target: its language's token, where the decoder writes it first
    # (`data.lang_token_side: target`)
    target_tags: tuple[str, ...] = ()


def prepare_corpus(
    ds: datasets.Dataset,
    tokenizer: Tokenizer,
    filters: Filters,
    reference: Reference | None,
    name: str,
    progress: Progress = silent,
) -> Prepared:
    """The cleaned, encoded and filtered pairs of `ds` as memory-mapped ids, from the cache
    when they are there.

    Args:
        ds: columns "src" and "tgt" (as from `data.corpus.load_corpus`).
        tokenizer: encodes the sides; `filters.tags` must be among its tags.
        filters: the rules to apply.
        reference: the dev/test sets for the overlap rule (needed when `filters.clean`).
        name: names the corpus in messages (its spec).
        progress: makes a progress bar for a stage (the caller's, e.g. tqdm).

    Raises:
        InputError: no pair is left, or the tag is unknown to the tokenizer.
    """
    tag_ids = [tokenizer.tag_id(tag) for tag in filters.tags]
    directory = _cache_dir(ds, tokenizer, filters, reference)
    if not (directory / "counts.json").is_file():
        _write(ds, tokenizer, filters, reference, tag_ids, name, directory, progress)
    counts = json.loads((directory / "counts.json").read_text(encoding="utf-8"))
    dtype = np.dtype(counts["dtype"])
    digest = counts.pop("digest", None) or ids_digest(directory)  # (older caches: none kept)
    return Prepared(_load(directory, "src", dtype), _load(directory, "tgt", dtype), counts, digest)


def ids_digest(directory: Path) -> str:
    """sha256 of the id and offset files of a prepared corpus: the pairs its batches hold."""
    sha = hashlib.sha256()
    for name in ("src.ids", "src.offsets", "tgt.ids", "tgt.offsets"):
        with open(directory / name, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 22), b""):
                sha.update(block)
    return sha.hexdigest()


def _cache_dir(
    ds: datasets.Dataset, tokenizer: Tokenizer, filters: Filters, reference: Reference | None
) -> Path:
    hashed = hashlib.sha256()
    for part in (_VERSION, ds._fingerprint, tokenizer.digest(), repr(filters)):
        hashed.update(part.encode())
    if filters.clean and reference is not None:
        hashed.update(reference.src.tobytes())
        hashed.update(reference.tgt.tobytes())
    return Path(datasets.config.HF_DATASETS_CACHE) / "tf-ids" / hashed.hexdigest()[:32]


def _write(ds, tokenizer, filters, reference, tag_ids, name, directory, progress) -> None:
    """Clean, encode, filter and write the files of one corpus, atomically (a folder renamed
    into place: a killed start leaves no half-written cache behind)."""
    read = len(ds)
    removed, keep = {}, np.ones(read, dtype=bool)
    if filters.clean:
        log.info("cleaning %s: %d pairs", name, len(ds))
        bar = progress(f"cleaning {name}", len(ds))
        keep, removed = clean_mask(ds, reference or Reference.of([]), bar.update)
        bar.close()
    partial = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    dtype = _id_dtype(tokenizer)
    log.info("encoding %s: %d pairs", name, int(keep.sum()))
    kept, token_removed = _encode_to_files(
        ds, keep, tokenizer, filters, tag_ids, name, partial, progress, dtype
    )
    for rule, n in token_removed.items():  # "empty" is both kinds' (see _token_rules)
        removed[rule] = removed.get(rule, 0) + n
    counts = {"read": read, "removed": removed, "kept": kept, "dtype": np.dtype(dtype).name}
    if kept == 0:
        shutil.rmtree(partial, ignore_errors=True)
        listing = ", ".join(f"{n} {rule}" for rule, n in removed.items())
        hint = "; data.clean: false keeps what the text rules remove" if filters.clean else ""
        raise InputError(f"{name}: no sentence pairs left after filtering ({listing}){hint}")
    counts["digest"] = ids_digest(partial)
    (partial / "counts.json").write_text(json.dumps(counts), encoding="utf-8")
    try:
        os.replace(partial, directory)
    except OSError:  # another process wrote the same files first: theirs serve as well
        shutil.rmtree(partial, ignore_errors=True)


def _id_dtype(tokenizer: Tokenizer) -> type:
    return (
        np.uint16
        if max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) <= 1 << 16
        else np.int32
    )


def _encode_to_files(
    ds, keep, tokenizer, filters, tag_ids, name, out: Path, progress, dtype
) -> tuple[int, dict]:
    """Encode the pairs of `ds` that `keep` marks in blocks, drop those the token rules refuse,
    append the rest to the id files; returns (pairs kept, {rule: pairs removed})."""
    removed = dict.fromkeys(TOKEN_RULES, 0)
    bar = progress(f"encoding {name}", int(keep.sum()))
    lengths = {"src": [], "tgt": []}
    encoder = _Encoder(tokenizer, filters, tag_ids, dtype)
    with open(out / "src.ids", "wb") as src_file, open(out / "tgt.ids", "wb") as tgt_file:
        for block in _encoded_blocks(_text_blocks(ds, keep), int(keep.sum()), encoder):
            block.src.tofile(src_file)
            block.tgt.tofile(tgt_file)
            lengths["src"].append(block.src_len)
            lengths["tgt"].append(block.tgt_len)
            for rule, n in block.removed.items():
                removed[rule] = removed.get(rule, 0) + n
            bar.update(block.rows)
    bar.close()
    for side, parts in lengths.items():
        rows = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        np.concatenate([[0], np.cumsum(rows)]).astype(np.int64).tofile(out / f"{side}.offsets")
    return int(sum(len(p) for p in lengths["src"])), removed


@dataclass
class _Block:
    """One block's pairs that the token rules keep, each side's ids end to end."""

    src: np.ndarray
    src_len: np.ndarray  # (kept,) int64
    tgt: np.ndarray
    tgt_len: np.ndarray
    removed: dict  # {rule: pairs}
    rows: int  # pairs read


@dataclass
class _Encoder:
    tokenizer: Tokenizer
    filters: Filters
    tag_ids: list[int]
    dtype: type

    def __call__(self, src_texts: pa.Array, tgt_texts: pa.Array) -> _Block:
        src_texts, tgt_texts = src_texts.to_pylist(), tgt_texts.to_pylist()
        src = self.tokenizer.encode_src(src_texts)
        tgt = self.tokenizer.encode_tgt(tgt_texts)
        removed = dict.fromkeys(TOKEN_RULES, 0)
        blank = np.fromiter(
            (not (s.strip() and t.strip()) for s, t in zip(src_texts, tgt_texts)), dtype=bool
        )
        keep = _token_rules(src, tgt, self.filters, removed, blank)
        src = [row for row, k in zip(src, keep) if k]
        tgt = [row for row, k in zip(tgt, keep) if k]
        if self.tag_ids:  # where the tokenizer puts them (NLLB's legacy order: last)
            src = [self.tokenizer.tagged_src(self.tag_ids, row) for row in src]
        if self.filters.target_tags:  # (a few pieces: looked up per block)
            head = self.tokenizer.tgt_piece_ids(list(self.filters.target_tags))
            tgt = [[*head, *row] for row in tgt]
        return _Block(*_flat(src, self.dtype), *_flat(tgt, self.dtype), removed, len(keep))


def _text_blocks(ds: datasets.Dataset, keep: np.ndarray) -> Iterator[tuple[pa.Array, pa.Array]]:
    """(sources, targets) of the rows `keep` marks, in blocks of up to _ENCODE_ROWS rows. The
    mask is applied block by block in Arrow: `ds.select(rows)` would gather row by row."""
    start = 0
    for table in ds.select_columns(["src", "tgt"]).with_format("arrow").iter(_ENCODE_ROWS):
        mask = keep[start : start + len(table)]
        start += len(table)
        if not mask.all():
            table = table.filter(pa.array(mask))
        if len(table):
            # Compact copies: a slice of an Arrow array pickles with its whole buffer.
            yield tuple(pa.concat_arrays(table.column(side).chunks) for side in ("src", "tgt"))


def _encoded_blocks(
    blocks: Iterator[tuple[pa.Array, pa.Array]], rows: int, encoder: _Encoder
) -> Iterator[_Block]:
    """`encoder` over `blocks` (of `rows` pairs in all), in order: in this process for a small
    corpus, else in a pool of forked processes, one per core. (SentencePiece's own threads turn
    their output into Python lists under one GIL: a fifth of the work on 2 cores, measured,
    which caps them near 4x however many cores there are.)"""
    processes = _processes(rows)
    if processes < 2:
        yield from (encoder(src, tgt) for src, tgt in blocks)
        return
    global _pool_encoder
    threads = encoder.tokenizer.threads
    _pool_encoder, encoder.tokenizer.threads = encoder, 1  # inherited by the forked workers
    try:
        with ProcessPoolExecutor(
            processes, mp_context=mp.get_context("fork"), initializer=_ignore_interrupts
        ) as pool:
            pending: deque = deque()  # a few blocks ahead, not the whole corpus in the queue
            for src, tgt in blocks:
                pending.append(pool.submit(_encode_in_pool, src, tgt))
                if len(pending) > 2 * processes:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
    finally:
        _pool_encoder, encoder.tokenizer.threads = None, threads


_pool_encoder: _Encoder | None = None  # the encoder a forked worker runs


def _processes(rows: int) -> int:
    """Processes to encode `rows` pairs with: a core each, from _POOL_ROWS pairs, where
    processes are forked (Linux: they inherit the tokenizer instead of loading it again)."""
    if rows < _POOL_ROWS or sys.platform != "linux":
        return 1
    return min(len(os.sched_getaffinity(0)), -(-rows // _ENCODE_ROWS))


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the process that started it, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _encode_in_pool(src: pa.Array, tgt: pa.Array) -> _Block:
    return _pool_encoder(src, tgt)


def _token_rules(src, tgt, filters: Filters, removed: dict, blank: np.ndarray) -> np.ndarray:
    """(B,) bool: the pairs of one block that fit the length rules; counts the others. `blank`:
    the pairs with a side of no text (which cleaning removes first: these come only without
    it), empty whatever ids a tokenizer gives them (Marian's sources are at least an EOS)."""
    src_len = np.fromiter(map(len, src), dtype=np.int64, count=len(src))
    tgt_len = np.fromiter(map(len, tgt), dtype=np.int64, count=len(tgt))
    empty = blank | (src_len == 0) | (tgt_len == 0)  # no text, or spelled by nothing
    too_long = ~empty & (np.maximum(src_len, tgt_len) > (filters.max_len or np.inf))
    longer, shorter = np.maximum(src_len, tgt_len), np.minimum(src_len, tgt_len)
    ratio = ~empty & ~too_long & (longer > (filters.max_len_ratio or np.inf) * shorter)
    removed["empty"] = removed.get("empty", 0) + int(empty.sum())
    removed["too_long"] += int(too_long.sum())
    removed["ratio"] += int(ratio.sum())
    return ~(empty | too_long | ratio)


def _flat(rows: list[list[int]], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(the rows end to end, their lengths)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(chain.from_iterable(rows), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def _load(directory: Path, side: str, dtype: np.dtype) -> RaggedIds:
    offsets = np.memmap(directory / f"{side}.offsets", dtype=np.int64, mode="r")
    ids_path = directory / f"{side}.ids"
    if ids_path.stat().st_size == 0:  # np.memmap refuses an empty file
        return RaggedIds(np.zeros(0, dtype=dtype), offsets)
    return RaggedIds(np.memmap(ids_path, dtype=dtype, mode="r"), offsets)
