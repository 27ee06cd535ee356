"""Beam search: one loop (`search_beams`) over a step function, and the strategies that choose
each step's hypotheses (`BeamStrategy`): the best extensions of every beam (`BestExtensions`,
`beam_search`), or lexically constrained ones (`model.search.constraints`).

Each step the loop applies the step rules, hands the log-probabilities to its strategy, which
sets aside the hypotheses that end (`Finished`, which also says when a sentence stops) and
names the rows that go on, and reorders the state to them. A finished sentence leaves the live
rows through `reorder`, so it costs nothing further.

Scores: beam search ranks finished hypotheses by GNMT's length-normalised score
log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, eq. 14), or by
log P(Y) / |Y| ** alpha, transformers' and CTranslate2's (`LengthPenalty`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from model.search.candidates import read_candidates
from model.search.kernels import row_best
from model.search.rows import Beams, in_place_order, on_device
from model.search.rules import Prefix, StepRules
from model.search.settings import (
    BeamStop,
    Hypothesis,
    LengthPenalty,
    ReorderFn,
    SearchSettings,
    State,
    StepFn,
)


@dataclass
class Extension:
    """The rows a step goes on with: row i of the new beams extends row `rows[i]` of the old
    ones by `tokens[i]`, its log-probability now `log_probs[i]`; `group` rows a live sentence,
    adjacent."""

    rows: Tensor  # (N',) long
    tokens: Tensor  # (N',) long
    log_probs: Tensor  # (N',)
    group: int


class Finished:
    """Each sentence's finished hypotheses (its `kept` best by score, earlier ones winning ties)
    and the count of all that finished, and the rule by which it stops (`done`).

    `widths`: the beam each sentence is searched at (its `kept` and its patience count from it).
    """

    def __init__(self, settings: SearchSettings, max_lens: list[int], widths: list[int]):
        self.lp: LengthPenalty = settings.length_penalty
        self.beam_stop, self.nbest, self.max_lens = settings.beam_stop, settings.nbest, max_lens
        self.kept = [finished_kept(settings.beam_stop, w, settings.nbest) for w in widths]
        # hypotheses a sentence may finish before it stops; 0: no such stop
        patience, nbest = settings.patience, settings.nbest
        self.enough = [max(nbest, round(w * patience)) if patience > 0 else 0 for w in widths]
        self.hyps: list[list[Hypothesis]] = [[] for _ in widths]
        self.count = [0] * len(widths)  # hypotheses finished, kept or not

    def add(self, b: int, tokens: list[int], log_prob: float) -> None:
        """Sentence b's hypothesis `tokens` (no EOS) ended, with this log-probability."""
        hyps = self.hyps[b]
        hyps.append(Hypothesis(tokens, log_prob / self.lp(len(tokens) + 1), log_prob))  # |Y|: EOS
        hyps.sort(key=lambda h: h.score, reverse=True)  # stable: earlier ones win ties
        del hyps[self.kept[b] :]
        self.count[b] += 1

    def done(self, b: int, t: int, best_live: float) -> bool:
        """Whether sentence b stops after step t, its best live hypothesis's log-probability
        `best_live`: at its max length, once `enough` (> 0) of its hypotheses have finished,
        or once it holds `kept` finished ones and the best live one's bound is no better
        than the worst (`best_length_penalty`)."""
        max_len, hyps = self.max_lens[b], self.hyps[b]
        bound = best_live / best_length_penalty(t, max_len, self.lp, self.beam_stop)
        return (
            t >= max_len
            or 0 < self.enough[b] <= self.count[b]
            or (len(hyps) >= self.kept[b] and bound <= hyps[-1].score)
        )

    def best(self) -> list[list[Hypothesis]]:
        """Each sentence's nbest, best score first."""
        return [hyps[: self.nbest] for hyps in self.hyps]


def finished_kept(beam_stop: BeamStop, beam_size: int, nbest: int) -> int:
    """The finished hypotheses a sentence keeps, best first, for its stopping rule: its nbest,
    or beam_size of them with "current_length" (transformers compares with its beam_size-th)."""
    return max(nbest, beam_size) if beam_stop == "current_length" else nbest


def best_length_penalty(
    t: int, max_len: int, lp: LengthPenalty, beam_stop: BeamStop = "bound"
) -> float:
    """The divisor of a live hypothesis's bound after step t. "bound": the largest lp(|Y|) it
    can still reach: it has t + 1 tokens, so finished its |Y| lies between t + 2 and
    max_len + 1, and lp is largest at max_len + 1 for alpha >= 0 (either form grows with
    length), at t + 2 for alpha < 0. Its log-probability can only fall (every step adds a
    log-probability <= 0), so its score is at most its log-probability now over this (with
    alpha = 0, the log-probability itself). "current_length": lp at its t + 1 tokens, no
    bound but transformers' estimate (its `early_stopping: false`)."""
    if beam_stop == "current_length":
        return lp(t + 1)
    return lp(max_len + 1 if lp.alpha >= 0 else t + 2)


class BeamStrategy(Protocol):
    """How the beam loop chooses each step's hypotheses."""

    widths: list[int]  # the beam each sentence is searched at

    def choose(
        self, log_probs: Tensor, t: int, beams: Beams, finished: Finished
    ) -> Extension | None:
        """From step t's log-probabilities (N, V) of the rows of `beams` (the step rules
        applied), the hypotheses that end go to `finished`, and the rows that go on are
        returned; None once every sentence is done (`Finished.done`)."""
        ...


def search_beams(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    settings: SearchSettings,
    rules: StepRules,
    strategy: BeamStrategy,
) -> list[list[Hypothesis]]:
    """The beam loop: step, step rules, the strategy's choice, reorder, until every sentence
    is done. The first step sees one row per sentence (state holds B rows); the strategy's
    first extension expands each to its beams. Returns each sentence's nbest, best first."""
    if not 1 <= settings.nbest <= settings.beam_size:
        nbest, beam = settings.nbest, settings.beam_size
        raise ValueError(f"need 1 <= nbest <= beam_size, got nbest {nbest}, beam {beam}")
    device, batch_size = rules.max_lens.device, len(rules.host_max_lens)
    finished = Finished(settings, rules.host_max_lens, strategy.widths)
    beams = Beams.start(batch_size, device)
    tokens = torch.full((batch_size,), settings.bos_id, dtype=torch.long, device=device)
    for t in itertools.count():
        log_probs, state = step(tokens, state)  # (N, V)
        chosen = strategy.choose(rules(log_probs, t, beams), t, beams, finished)
        if chosen is None:
            break
        beams = beams.take(chosen.rows).extend(chosen.tokens, chosen.log_probs)
        state = reorder(state, chosen.rows, chosen.group)
        tokens = chosen.tokens
    return finished.best()


def beam_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    settings: SearchSettings,
    max_lens: Tensor,
    prefix: Tensor | Prefix | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for B sentences at once.

    Each step, every live sentence ranks the 2 * beam_size best extensions of its beams by
    log-probability. Those ending in EOS among the first beam_size are finished (as fairseq: an
    EOS ranked lower would not have made the beam); the best beam_size not ending in EOS stay
    live. A sentence keeps its nbest best finished hypotheses by length-penalised score and
    stops at its max length, as soon as no live hypothesis can beat the worst of them
    (`Finished.done`; with `beam_stop` "current_length", transformers' rule: its beam_size
    best, and the live one scored at its current length), or once beam_size x patience of its
    hypotheses have finished (fairseq's rule at patience 1). With length_penalty 0, beam_size 1
    is greedy search exactly.

    Args:
        step, state, reorder: as in `model.search`; state holds B rows (one per sentence).
        settings: `SearchSettings`, the beam's included.
        max_lens: (B,) long, the most tokens of each sentence's output (EOS not counted), on
            the device of the step's tensors.
        prefix: as in `greedy_search`; while it is forced a sentence has one live hypothesis.

    Returns:
        For each sentence in input order, up to nbest hypotheses, best score first (fewer only
        when max_len leaves fewer possible outputs).
    """
    rules = StepRules(settings, max_lens, prefix)
    strategy = BestExtensions(settings, max_lens.numel(), max_lens.device)
    return search_beams(step, state, reorder, settings, rules, strategy)


class BestExtensions:
    """`beam_search`'s strategy: each live sentence's best extensions, ranked on the device and
    read on the host after one transfer (on a GPU, the step's one wait:
    `model.search.candidates`), its rows kept in place where they can."""

    def __init__(self, settings: SearchSettings, batch_size: int, device: torch.device):
        self.settings, self.device = settings, device
        self.widths = [settings.beam_size] * batch_size
        self.groups = list(range(batch_size))  # the sentence of each live group of k rows
        self.k = 1  # rows per live sentence: one before the first step, then up to beam_size
        self.ranked: Tensor | None = None  # (B', k) each group's rows by rank; None: in order

    def choose(
        self, log_probs: Tensor, t: int, beams: Beams, finished: Finished
    ) -> Extension | None:
        k, beam_size, eos_id = self.k, self.settings.beam_size, self.settings.eos_id
        blocks = not self.settings.half_logits
        top, rows, words = best_extensions(
            log_probs, beams.log_probs, k, 2 * beam_size, self.ranked, blocks
        )
        # At most k candidates end in EOS (one per row), so C - k of them do not.
        k_next = min(beam_size, top.size(1) - k)
        host = torch.cat([top.double(), rows.double(), words.double()], dim=1).cpu()
        found = read_candidates(host, eos_id, beam_size, k_next)
        if found.ended:
            self._finish(found.ended, beams, finished)
        keep = [  # the live sentences' positions that go on
            i
            for i, (b, best) in enumerate(zip(self.groups, found.best_live, strict=True))
            if not finished.done(b, t, best)
        ]
        if not keep:
            return None
        in_place = k_next == k  # rows that stay where they were, as many as can (else all move)
        if in_place:
            keep = in_place_order(keep)
        parents, ids, scores, placed = found.take(keep, k if in_place else 0)
        self.ranked = None if placed is None else on_device(placed, self.device)
        self.groups = [self.groups[i] for i in keep]
        self.k = k_next
        return Extension(
            on_device(parents, self.device),
            on_device(ids, self.device),
            on_device(scores, self.device, top.dtype),
            k_next,
        )

    def _finish(
        self, ended: list[tuple[int, int, float]], beams: Beams, finished: Finished
    ) -> None:
        """The candidates that end in EOS, (live sentence's position, row extended,
        log-probability) in rank order, into their sentences' finished hypotheses."""
        rows = on_device([row for _, row, _ in ended], self.device)
        outputs = beams.tokens.index_select(0, rows).tolist()
        for (i, _, log_prob), tokens in zip(ended, outputs, strict=True):
            finished.add(self.groups[i], tokens, log_prob)


def best_extensions(
    log_probs: Tensor,
    beam_log_probs: Tensor,
    k: int,
    n: int,
    ranked: Tensor | None = None,
    blocks: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """The n best one-token extensions of each live sentence's k beams. Equal scores go to
    the better-ranked beam, then the lower token id: `ranked` (B', k) gives each sentence's
    rows in the order of their hypotheses' rank (None: the rows' own order). `blocks`: each
    row's best by `row_topk` (the same ones), else by top-k over the whole row.

    Shape: log_probs (N, V) of the next token, beam_log_probs (N,) -> three (B', C) tensors,
    C = min(n, k V), best first: the extension's log-probability, the row it extends, its token.
    """
    N, V = log_probs.shape
    first_row = torch.arange(0, N, k, device=log_probs.device)[:, None]  # (B', 1)
    # A sentence's n best come from its rows' n best each: take those first (one top-k over
    # (N, V)), then the n best of its k n candidates. The same extensions as one top-k over all
    # k V, without the (N, V) sum of scores and with a cheaper second top-k.
    row_top, row_words = row_best(log_probs, min(n, V), blocks)  # (N, n')
    # `row_best` returns equal values in any order: a row's candidates sorted by token id, then
    # stably by value, put equal log-probabilities in id order (greedy's argmax takes the
    # first id: with beam 1 the two then choose alike, exact ties included).
    by_id = row_words.argsort(dim=1)
    row_top, row_words = row_top.gather(1, by_id), row_words.gather(1, by_id)
    row_top, by_value = row_top.sort(dim=1, descending=True, stable=True)
    row_words = row_words.gather(1, by_value)
    by_rank = None if ranked is None else first_row + ranked  # (B', k)
    if by_rank is not None:  # the candidates in rank order, so that ties break as ranked
        order = by_rank.flatten()
        row_top, row_words, beam_log_probs = row_top[order], row_words[order], beam_log_probs[order]
    n_row = row_top.size(1)
    scores = (beam_log_probs[:, None] + row_top).view(N // k, k * n_row)  # (B', k n')
    # A stable sort, not top-k: equal scores (exact ties, or two log-probabilities that adding
    # the beam's rounds to one float) keep the candidates' order: rank, then value, then id.
    top, flat = scores.sort(dim=1, descending=True, stable=True)
    top, flat = top[:, : min(n, k * n_row)], flat[:, : min(n, k * n_row)]  # (B', C)
    words = row_words.view(N // k, k * n_row).gather(1, flat)  # (B', C)
    rows = first_row + flat // n_row if by_rank is None else by_rank.gather(1, flat // n_row)
    return top, rows, words
