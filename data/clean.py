"""Cleaning rules for parallel corpora, each counted: what crawled data brings and a model should
not learn from (the filters fairseq's and Marian's users run by hand before training).

Text rules, on whitespace-normalised sides; a removed pair is counted under the first that
applies, in this order:

    empty      a side has no text
    junk       a side has no letter, or is mostly digits, punctuation or URLs
    copy       the source equals the target (an untranslated copy)
    overlap    the source occurs among the dev/test sources, or the target among their
               targets: a model trained on them would be scored on what it has seen
    duplicate  the same pair occurred earlier in the corpus

Comparisons are exact after normalising white space: a pair that differs from another in a
letter's case is a different pair. The token rules (too long, length ratio) need the encoding
and live in `data.prepared`. Everything runs in Arrow's kernels, batch by batch in threads
(Arrow releases the GIL), with 64-bit hashes standing in for the texts.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

TEXT_RULES = ("empty", "junk", "copy", "overlap", "duplicate")
LETTER_SHARE = 0.5  # below this share of letters among a side's non-space characters: junk
_URL = r"(?:[a-zA-Z][a-zA-Z0-9+.-]*://|www\.)\S+"
_BATCH = 65_536


def normalize(text: pa.Array) -> pa.Array:
    """Runs of (Unicode) white space as one space, none at the ends: the words joined."""
    return pc.binary_join(pc.utf8_split_whitespace(pc.utf8_trim_whitespace(text)), " ")


def hashes(text: pa.Array) -> np.ndarray:
    """(N,) uint64: one hash per string (pandas' vectorised SipHash)."""
    return pd.util.hash_array(text.to_numpy(zero_copy_only=False), categorize=False)


def is_junk(text: pa.Array) -> np.ndarray:
    """(N,) bool for normalised text: no letter at all, or letters under LETTER_SHARE of the
    non-space characters once URLs are taken out (a URL counts as non-letters)."""
    letters = _per_row(pc.replace_substring_regex(text, _URL, ""), _LETTER_BYTES)
    visible = _per_row(text, _VISIBLE_BYTES)
    return (letters == 0) | (letters < LETTER_SHARE * visible)


def _byte_table(test) -> np.ndarray:
    """A 256-entry uint8 table of `test` over all byte values."""
    return test(np.arange(256, dtype=np.uint8)).astype(np.uint8)


def _is_letter(utf8: np.ndarray) -> np.ndarray:
    """Per byte: an ASCII letter, or the first byte of a non-ASCII character (counted as a
    letter: most are, in any script; a few punctuation marks like « and ¿ are not)."""
    lower = utf8 | 0x20
    return ((lower >= ord("a")) & (lower <= ord("z"))) | (utf8 >= 0xC0)


def _is_visible(utf8: np.ndarray) -> np.ndarray:
    """Per byte: the first byte of a character that is not a space."""
    return ((utf8 > 0x20) & (utf8 < 0x80)) | (utf8 >= 0xC0)


_LETTER_BYTES, _VISIBLE_BYTES = _byte_table(_is_letter), _byte_table(_is_visible)


def _per_row(text: pa.Array, table: np.ndarray) -> np.ndarray:
    """(N,) how many bytes of each string `table` marks: numpy over Arrow's UTF-8 buffer, a
    regex's work without a regex (RE2's Unicode classes ran at a few MB/s here)."""
    text = pc.cast(text, pa.large_string())  # one offset width; a copy only of the offsets
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)
    offsets = offsets[text.offset : text.offset + len(text) + 1]
    data = text.buffers()[2]
    utf8 = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    # A 0 after the last byte keeps every start in range; reduceat gives an empty row the
    # byte at its start, so empty rows are set to 0 after.
    marked = np.append(table.take(utf8), np.uint8(0))
    counts = np.add.reduceat(marked, offsets[:-1], dtype=np.int64)
    counts[offsets[1:] == offsets[:-1]] = 0
    return counts


@dataclass
class Reference:
    """The dev and test sets, hashed side by side: training pairs that overlap them go."""

    src: np.ndarray  # (M,) uint64 hashes of the normalised sources
    tgt: np.ndarray  # (M,) uint64 hashes of the normalised targets

    @classmethod
    def of(cls, corpora: list[datasets.Dataset]) -> Reference:
        src, tgt = [], []
        for ds in corpora:
            for table in _tables(ds):
                src.append(hashes(normalize(table.column("src"))))
                tgt.append(hashes(normalize(table.column("tgt"))))
        return cls(np.concatenate(src or [[]]), np.concatenate(tgt or [[]]))


def _tables(ds: datasets.Dataset):
    return ds.select_columns(["src", "tgt"]).with_format("arrow").iter(batch_size=_BATCH)


def _batch_rules(table: pa.Table, reference: Reference) -> dict[str, np.ndarray]:
    """One Arrow batch: a bool column per rule but `duplicate`, and the pairs' hashes."""
    src, tgt = normalize(table.column("src")), normalize(table.column("tgt"))
    src_len, tgt_len = pc.utf8_length(src).to_numpy(), pc.utf8_length(tgt).to_numpy()
    src_hash, tgt_hash = hashes(src), hashes(tgt)
    return {
        "empty": (src_len == 0) | (tgt_len == 0),
        "junk": is_junk(src) | is_junk(tgt),
        "copy": pc.equal(src, tgt).to_numpy(zero_copy_only=False),
        "overlap": np.isin(src_hash, reference.src) | np.isin(tgt_hash, reference.tgt),
        # Normalised text holds no tab: joined by one, the two sides cannot run together.
        "pair": hashes(pc.binary_join_element_wise(src, tgt, "\t")),
    }


def clean_mask(
    ds: datasets.Dataset, reference: Reference, advance: Callable[[int], object] | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Which pairs of `ds` (columns "src", "tgt") the text rules keep; `advance(n)` is told
    of each batch of n pairs done (a progress bar's `update`).

    Returns:
        (keep, removed): keep is (N,) bool in row order; removed counts the pairs each rule
        took, every removed pair under the first rule of TEXT_RULES that applies.
    """
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        parts = []
        for part in pool.map(lambda t: _batch_rules(t, reference), _tables(ds)):
            parts.append(part)
            if advance:
                advance(len(part["pair"]))
    rules = {name: np.concatenate([p[name] for p in parts]) for name in (*TEXT_RULES[:4], "pair")}
    _, first = np.unique(rules.pop("pair"), return_index=True)
    rules["duplicate"] = np.ones(len(ds), dtype=bool)
    rules["duplicate"][first] = False
    keep, removed = np.ones(len(ds), dtype=bool), {}
    for name in TEXT_RULES:
        hit = keep & rules[name]
        removed[name] = int(hit.sum())
        keep &= ~hit
    return keep, removed


def first_row_holding(ds: datasets.Dataset, pieces: Sequence[str]) -> tuple[int, str] | None:
    """The first row of `ds` one of whose text columns (its sides, or the one side read) holds
    one of the texts `pieces`, and which, or None (a corpus tag must be a piece no sentence
    holds: `data.pipeline.check_tags`; no text holds a NUL: `data.corpus.load_corpus`). One
    pass over the corpus for them all: a multilingual import has hundreds of tokens."""
    pattern = "|".join(re.escape(piece) for piece in pieces)
    start = 0
    for table in ds.with_format("arrow").iter(batch_size=_BATCH):
        if len(pieces) == 1:
            hits = [pc.match_substring(column, pieces[0]) for column in table.columns]
        else:
            hits = [pc.match_substring_regex(column, pattern) for column in table.columns]
        hit = functools.reduce(pc.or_, hits).to_numpy(zero_copy_only=False)
        if hit.any():
            row = int(np.argmax(hit))
            text = " ".join(column[row].as_py() for column in table.columns)
            return start + row, next(piece for piece in pieces if piece in text)
        start += len(table)
    return None
