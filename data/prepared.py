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
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Protocol

import datasets
import numpy as np

from data.batching import RaggedIds
from data.clean import Reference, clean_mask
from data.errors import InputError
from data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_VERSION = "2"  # bump when what is written changes, to invalidate the cached files
_ENCODE_ROWS = 20_000  # sentences per call into SentencePiece
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


def _silent(stage: str, total: int) -> Bar:
    return _Silent()


@dataclass
class Prepared:
    src: RaggedIds  # memory-mapped
    tgt: RaggedIds
    counts: dict  # {"read": n, "removed": {rule: n}, "kept": n}


@dataclass(frozen=True)
class Filters:
    clean: bool  # the text rules of data.clean
    max_len: int | None  # longest side kept, in pieces
    max_len_ratio: float | None  # largest longer/shorter ratio kept
    tag: str | None = None  # a tag id prepended to every source


def prepare_corpus(
    ds: datasets.Dataset,
    tokenizer: Tokenizer,
    filters: Filters,
    reference: Reference | None,
    name: str,
    progress: Progress = _silent,
) -> Prepared:
    """The cleaned, encoded and filtered pairs of `ds` as memory-mapped ids, from the cache
    when they are there.

    Args:
        ds: columns "src" and "tgt" (as from `data.corpus.load_corpus`).
        tokenizer: encodes the sides; `filters.tag` must be one of its tags.
        filters: the rules to apply.
        reference: the dev/test sets for the overlap rule (needed when `filters.clean`).
        name: names the corpus in messages (its spec).
        progress: makes a progress bar for a stage (the caller's, e.g. tqdm).

    Raises:
        InputError: no pair is left, or the tag is unknown to the tokenizer.
    """
    tag_id = tokenizer.tag_id(filters.tag) if filters.tag else None
    directory = _cache_dir(ds, tokenizer, filters, reference)
    if not (directory / "counts.json").is_file():
        _write(ds, tokenizer, filters, reference, tag_id, name, directory, progress)
    counts = json.loads((directory / "counts.json").read_text(encoding="utf-8"))
    dtype = np.dtype(counts["dtype"])
    return Prepared(_load(directory, "src", dtype), _load(directory, "tgt", dtype), counts)


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


def _write(ds, tokenizer, filters, reference, tag_id, name, directory, progress) -> None:
    """Clean, encode, filter and write the files of one corpus, atomically (a folder renamed
    into place: a killed start leaves no half-written cache behind)."""
    read = len(ds)
    removed = {}
    if filters.clean:
        log.info("cleaning %s: %d pairs", name, len(ds))
        bar = progress(f"cleaning {name}", len(ds))
        keep, removed = clean_mask(ds, reference or Reference.of([]), bar.update)
        bar.close()
        if not keep.all():
            ds = ds.select(np.flatnonzero(keep))
    partial = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    dtype = _id_dtype(tokenizer)
    log.info("encoding %s: %d pairs", name, len(ds))
    kept, token_removed = _encode_to_files(
        ds, tokenizer, filters, tag_id, name, partial, progress, dtype
    )
    removed.update(token_removed)
    counts = {"read": read, "removed": removed, "kept": kept, "dtype": np.dtype(dtype).name}
    if kept == 0:
        shutil.rmtree(partial, ignore_errors=True)
        listing = ", ".join(f"{n} {rule}" for rule, n in removed.items())
        hint = "; data.clean: false keeps what the text rules remove" if filters.clean else ""
        raise InputError(f"{name}: no sentence pairs left after filtering ({listing}){hint}")
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
    ds, tokenizer, filters, tag_id, name, out: Path, progress, dtype
) -> tuple[int, dict]:
    """Encode `ds` in blocks, drop the pairs the token rules refuse, append the rest to the id
    files; returns (pairs kept, {rule: pairs removed})."""
    removed = dict.fromkeys(TOKEN_RULES, 0)
    bar = progress(f"encoding {name}", len(ds))
    lengths = {"src": [], "tgt": []}
    with open(out / "src.ids", "wb") as src_file, open(out / "tgt.ids", "wb") as tgt_file:
        for start in range(0, len(ds), _ENCODE_ROWS):
            block = ds[start : start + _ENCODE_ROWS]
            src, tgt = tokenizer.encode_src(block["src"]), tokenizer.encode_tgt(block["tgt"])
            keep = _token_rules(src, tgt, filters, removed)
            src = [row for row, k in zip(src, keep) if k]
            tgt = [row for row, k in zip(tgt, keep) if k]
            if tag_id is not None:
                src = [[tag_id, *row] for row in src]
            lengths["src"].append(_append(src, src_file, dtype))
            lengths["tgt"].append(_append(tgt, tgt_file, dtype))
            bar.update(len(keep))
    bar.close()
    for side, parts in lengths.items():
        rows = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        np.concatenate([[0], np.cumsum(rows)]).astype(np.int64).tofile(out / f"{side}.offsets")
    return int(sum(len(p) for p in lengths["src"])), removed


def _token_rules(src, tgt, filters: Filters, removed: dict) -> np.ndarray:
    """(B,) bool: the pairs of one block that fit the length rules; counts the others."""
    src_len = np.fromiter(map(len, src), dtype=np.int64, count=len(src))
    tgt_len = np.fromiter(map(len, tgt), dtype=np.int64, count=len(tgt))
    empty = (src_len == 0) | (tgt_len == 0)  # spelled by nothing: only without cleaning
    too_long = ~empty & (np.maximum(src_len, tgt_len) > (filters.max_len or np.inf))
    longer, shorter = np.maximum(src_len, tgt_len), np.minimum(src_len, tgt_len)
    ratio = ~empty & ~too_long & (longer > (filters.max_len_ratio or np.inf) * shorter)
    removed["empty"] = removed.get("empty", 0) + int(empty.sum())
    removed["too_long"] += int(too_long.sum())
    removed["ratio"] += int(ratio.sum())
    return ~(empty | too_long | ratio)


def _append(rows: list[list[int]], f, dtype: type) -> np.ndarray:
    """Write `rows` end to end; returns their lengths."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = chain.from_iterable(rows)
    np.fromiter(flat, dtype=dtype, count=int(lengths.sum())).tofile(f)
    return lengths


def _load(directory: Path, side: str, dtype: np.dtype) -> RaggedIds:
    offsets = np.memmap(directory / f"{side}.offsets", dtype=np.int64, mode="r")
    ids_path = directory / f"{side}.ids"
    if ids_path.stat().st_size == 0:  # np.memmap refuses an empty file
        return RaggedIds(np.zeros(0, dtype=dtype), offsets)
    return RaggedIds(np.memmap(ids_path, dtype=dtype, mode="r"), offsets)
