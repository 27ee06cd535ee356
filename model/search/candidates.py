"""A beam search step's candidates read on the host: which end, which stay live, and the rows
the live ones take (`model.search.beam` makes the decisions that need its finished hypotheses
in between).

The same rules are read two ways: in plain Python, faster for a few sentences a step (numpy's
calls on tiny arrays cost more than the work), and in numpy, faster for many; a step of fewer
than `NUMPY_SENTENCES` live sentences is read in Python. (Read as tensor ops they had taken as
many ops as the model's step.) The measurements are in docs/performance.md.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

# Live sentences a step from which numpy reads the candidates (the measured crossing).
NUMPY_SENTENCES = 64


def read_candidates(
    host: Tensor, eos_id: int, beam_size: int, k_next: int
) -> PythonCandidates | NumpyCandidates:
    """The candidates of a step, `host` (B', 3C) on the CPU: each live sentence's C best
    extensions' log-probabilities, the rows they extend and their tokens, side by side (as
    doubles), best first. -> `PythonCandidates` or `NumpyCandidates`, by B'."""
    if host.size(0) < NUMPY_SENTENCES:
        return PythonCandidates(host.tolist(), eos_id, beam_size, k_next)
    return NumpyCandidates(host.numpy(), eos_id, beam_size, k_next)


class PythonCandidates:
    """The candidates read in plain Python, one sentence after another.

    After construction: `ended`, the (sentence's position, row extended, log-probability) of
    each candidate that ends (EOS among a sentence's first `beam_size`, as fairseq: one ranked
    lower would not have made the beam), in rank order; `best_live`, each sentence's best
    log-probability not ending in EOS.
    """

    def __init__(self, host: list[list[float]], eos_id: int, beam_size: int, k_next: int):
        C = len(host[0]) // 3
        self.found = [(h[:C], h[C : 2 * C], h[2 * C :]) for h in host]  # (scores, rows, ids)
        self.ended = [
            (i, int(rows[j]), scores[j])
            for i, (scores, rows, ids) in enumerate(self.found)
            for j in range(min(beam_size, C))
            if ids[j] == eos_id and math.isfinite(scores[j])
        ]
        # Each sentence's k_next best candidates not ending in EOS (there are at least k_next).
        self.live = [[j for j in range(C) if ids[j] != eos_id][:k_next] for *_, ids in self.found]
        self.best_live = [s[live[0]] for (s, *_), live in zip(self.found, self.live, strict=True)]

    def take(self, keep: list[int], k: int) -> tuple[list, list, list, list | None]:
        """The live candidates of the sentences at positions `keep`, in that order: the rows
        they extend, their tokens and log-probabilities, k_next a sentence. With k (> 0, the
        sentences' rows before, equal to k_next), each in its parent's row where it can
        (`children_in_place`), and also, per sentence, the row of each by rank; else best
        first, and None."""
        rows_out, ids_out, scores_out, placed = [], [], [], []
        for i in keep:
            (scores, rows, ids), live = self.found[i], self.live[i]
            if k:
                place = children_in_place([int(rows[j]) % k for j in live])
                live = [live[j] for j in sorted(range(k), key=place.__getitem__)]  # by row
                placed.append(place)
            rows_out += [int(rows[j]) for j in live]
            ids_out += [int(ids[j]) for j in live]
            scores_out += [scores[j] for j in live]
        return rows_out, ids_out, scores_out, placed if k else None


class NumpyCandidates:
    """The candidates read in numpy, every sentence at once; the same attributes and `take`
    as `PythonCandidates`."""

    def __init__(self, host: np.ndarray, eos_id: int, beam_size: int, k_next: int):
        C = host.shape[1] // 3
        self.scores = host[:, :C]  # (B', C) each
        self.rows, self.ids = host[:, C : 2 * C].astype(np.int64), host[:, 2 * C :].astype(np.int64)
        is_eos = self.ids == eos_id
        ends = is_eos[:, :beam_size] & np.isfinite(self.scores[:, :beam_size])
        i, j = ends.nonzero()  # in rank order, a sentence's best first
        self.ended = list(zip(i.tolist(), self.rows[i, j].tolist(), self.scores[i, j].tolist()))
        self.live = np.argsort(is_eos, axis=1, kind="stable")[:, :k_next]  # (B', k') best first
        self.best_live = self.scores[np.arange(len(host)), self.live[:, 0]].tolist()

    def take(
        self, keep: list[int], k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        # Indexed by (sentence, candidate) pairs: cheaper than take_along_axis's calls.
        kept, live = np.asarray(keep)[:, None], self.live[keep]  # (B'', 1), (B'', k')
        placed = None
        if k:
            placed = children_in_place_rows(self.rows[kept, live] % k)  # (B'', k)
            live[np.arange(len(keep))[:, None], placed] = live.copy()  # by row
        return (
            self.rows[kept, live].reshape(-1),
            self.ids[kept, live].reshape(-1),
            self.scores[kept, live].reshape(-1),
            placed,
        )


def children_in_place(parents: list[int]) -> list[int]:
    """Rows for a sentence's new hypotheses (best first) that put each in its parent's row
    where it can: a parent's first child in its row, the others, in order, in the rows of
    parents that have none. A beam reorder then copies only those others' caches (a quarter
    of the rows at beam 5).

    parents: each hypothesis's parent among its sentence's k rows -> the row of each.
    """
    rows = [-1] * len(parents)
    has_child = [False] * len(parents)
    for j, parent in enumerate(parents):
        if not has_child[parent]:
            rows[j], has_child[parent] = parent, True
    childless = iter(r for r, has in enumerate(has_child) if not has)
    return [r if r >= 0 else next(childless) for r in rows]


def children_in_place_rows(parents: np.ndarray) -> np.ndarray:
    """`children_in_place` of every sentence at once: parents (B', k) -> rows (B', k)."""
    B, k = parents.shape
    sentences = np.arange(B)[:, None]
    earlier = np.tri(k, k, -1, dtype=bool)  # j' < j
    first = ~((parents[:, :, None] == parents[:, None, :]) & earlier).any(axis=2)  # (B', k)
    has_child = np.zeros((B, k), dtype=bool)
    has_child[sentences, parents] = True
    childless = np.argsort(has_child, axis=1, kind="stable")  # those rows first, in order
    rank = np.maximum(np.cumsum(~first, axis=1) - 1, 0)  # among those not first children
    return np.where(first, parents, childless[sentences, rank])
