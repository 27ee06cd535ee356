"""Lexically constrained beam search: dynamic beam allocation (Post & Vilar, 2018), the search
behind fairseq's `--constraints` (Hu et al., 2019's vectorised form of it).

Each sentence may carry constraints, token sequences that must each appear in its output, in
any order, while the search still chooses everything else. Every step, each live sentence's
candidates are the usual best extensions of its beams, plus for every beam its single best
token and the next token of each constraint it could advance, so a constraint can enter the
beam however unlikely the model finds it. The candidates are grouped into banks by how many
constraint tokens they have met, and the beam is filled from the banks in turn, the most
advanced bank first, each giving its best remaining candidate (fairseq's round robin), so
hypotheses that have met more constraints are never all pushed out by likelier ones that met
fewer. EOS is allowed only once every constraint is met, and a candidate that could no longer
fit its unmet constraint tokens before the length limit is dropped, so every finished
hypothesis holds every constraint.

The banks are one per count of constraint tokens met, C + 1 of them for C tokens, and dynamic
beam allocation divides the beam among them (Post & Vilar, 2018): it needs a beam of at least
C + 1 to give each bank a slot. With fewer, the least advanced banks get none: at beam 1 the one
slot always goes to a hypothesis that advanced a constraint, so the constraints come first
("God said ..." for ["God", "said"]) wherever the model would put them. A sentence with
constraints is therefore searched at a beam of max(beam_size, C + 1) (`search_width`): the
unconstrained best keeps its slot and each constraint enters where the model ranks it best;
the nbest returned are still at most beam_size. A sentence without constraints is beam search
at beam_size, exactly.

A constraint in progress that the next token does not continue is abandoned (that token may
begin another), as in fairseq. It is a strategy of the one beam loop
(`model.search.beam.search_beams`), whose step, reorder, length and stopping rules it shares;
after the first step every sentence has the same number of rows (the widest sentence's width),
the ones beyond its own width or without a candidate dead (score -inf) until it ends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from model.search.beam import Extension, Finished, search_beams
from model.search.kernels import row_best
from model.search.rows import Beams, on_device
from model.search.rules import Prefix, StepRules
from model.search.settings import Hypothesis, ReorderFn, SearchSettings, State, StepFn

Phrase = tuple[int, ...]


@dataclass(frozen=True)
class Progress:
    """Where one hypothesis stands on its sentence's constraints."""

    met: frozenset[int] = frozenset()  # the constraints already in its output
    current: int = -1  # the constraint it is spelling, -1 none
    position: int = 0  # the tokens of it spelled so far

    def advance(self, token: int, constraints: tuple[Phrase, ...]) -> Progress:
        """The progress after `token`."""
        progress = self
        if self.current >= 0:
            phrase = constraints[self.current]
            if token == phrase[self.position]:
                if self.position + 1 == len(phrase):
                    return Progress(self.met | {self.current})
                return Progress(self.met, self.current, self.position + 1)
            progress = Progress(self.met)  # abandoned; the token may begin another one
        for i, phrase in enumerate(constraints):
            if i not in progress.met and token == phrase[0]:
                if len(phrase) == 1:
                    return Progress(progress.met | {i})
                return Progress(progress.met, i, 1)
        return progress

    def met_tokens(self, constraints: tuple[Phrase, ...]) -> int:
        return sum(len(constraints[i]) for i in self.met) + self.position

    def next_tokens(self, constraints: tuple[Phrase, ...]) -> list[int]:
        """The tokens that would advance it: the next of the phrase in progress, else the first
        of each unmet one."""
        if self.current >= 0:
            return [constraints[self.current][self.position]]
        return [phrase[0] for i, phrase in enumerate(constraints) if i not in self.met]

    def done(self, constraints: tuple[Phrase, ...]) -> bool:
        return len(self.met) == len(constraints)


@dataclass
class _Candidate:
    score: float  # log-probability of the extended hypothesis
    row: int  # the row it extends
    token: int
    progress: Progress


def search_width(beam_size: int, phrases: tuple[Phrase, ...]) -> int:
    """The beam a sentence with these constraints is searched at: a slot for each of its
    C + 1 banks at least (see the module docstring)."""
    if not phrases:
        return beam_size
    return max(beam_size, sum(map(len, phrases)) + 1)


def constrained_beam_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    settings: SearchSettings,
    max_lens: Tensor,
    constraints: list[tuple[Phrase, ...]],
    prefix: Tensor | Prefix | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for B sentences at once, each output holding each of its sentence's
    `constraints` (see the module docstring). The other arguments are `beam_search`'s; the
    caller makes sure that each sentence's prefix and constraints fit its max_lens.

    Returns:
        For each sentence in input order, up to nbest hypotheses, best score first; none for
        a sentence whose constraints no hypothesis could hold within its max length (under
        the n-gram ban, say), which the caller reports.
    """
    rules = StepRules(settings, max_lens, prefix)
    strategy = Constrained(settings, constraints, rules.host_max_lens, max_lens.device)
    return search_beams(step, state, reorder, settings, rules, strategy)


class Constrained:
    """The beam loop's strategy for lexical constraints (`model.search.beam.BeamStrategy`):
    each sentence searched at its `search_width`, its candidates filled into the beam from
    the banks of constraint tokens met, EOS only once every constraint is met. Each row's
    progress and tokens are kept on the host."""

    def __init__(
        self,
        settings: SearchSettings,
        constraints: list[tuple[Phrase, ...]],
        max_lens: list[int],
        device: torch.device,
    ):
        self.settings, self.constraints, self.max_lens = settings, constraints, max_lens
        self.device = device
        self.widths = [search_width(settings.beam_size, phrases) for phrases in constraints]
        self.rows_each = max(self.widths)  # rows per live sentence after the first step
        self.k = 1  # rows per live sentence
        self.progress = [Progress()] * len(constraints)  # one per row
        self.outputs: list[list[int]] = [[] for _ in constraints]  # each row's tokens

    def choose(
        self, log_probs: Tensor, t: int, beams: Beams, finished: Finished
    ) -> Extension | None:
        eos_id, constraints, rows_each = self.settings.eos_id, self.constraints, self.rows_each
        sentences = beams.sentence.tolist()
        unmet = [not p.done(constraints[b]) for p, b in zip(self.progress, sentences)]
        no_eos = on_device([i for i, u in enumerate(unmet) if u], self.device)
        log_probs[no_eos, eos_id] = float("-inf")  # EOS only once every constraint is met
        scores = beams.log_probs[:, None] + log_probs  # (N, V)
        candidates = _candidates(
            scores, self.k, 2 * rows_each, self.progress, sentences, constraints
        )
        selected = []  # per live sentence: its rows' candidates, rows_each of them
        for i, found in enumerate(candidates):
            b = sentences[i * self.k]
            live = self._finish_and_select(found, t, b, finished)
            best = live[0].score if live else float("-inf")
            if live and not finished.done(b, t, best):
                dead = _Candidate(float("-inf"), live[0].row, eos_id, live[0].progress)
                selected.append(live + [dead] * (rows_each - len(live)))
        if not selected:
            return None
        chosen = [c for sentence in selected for c in sentence]
        self.progress = [c.progress for c in chosen]
        self.outputs = [self.outputs[c.row] + [c.token] for c in chosen]
        self.k = rows_each
        return Extension(
            on_device([c.row for c in chosen], self.device),
            on_device([c.token for c in chosen], self.device),
            on_device([c.score for c in chosen], self.device, scores.dtype),
            rows_each,
        )

    def _finish_and_select(
        self, found: list[_Candidate], t: int, b: int, finished: Finished
    ) -> list[_Candidate]:
        """Finish sentence b's EOS candidates that rank among its best `width` (its `kept`
        best kept, `Finished`), drop the candidates that can no longer fit their unmet
        constraints, and fill the beam from the banks in turn (most constraint tokens met
        first); the chosen, best score first."""
        width, phrases, max_len = self.widths[b], self.constraints[b], self.max_lens[b]
        found.sort(key=lambda c: c.score, reverse=True)
        total = sum(len(p) for p in phrases)
        banks: dict[int, list[_Candidate]] = {}
        for rank, c in enumerate(found):
            if c.token == self.settings.eos_id:
                if rank < width:
                    finished.add(b, self.outputs[c.row], c.score)
                continue
            met = c.progress.met_tokens(phrases)
            if t + 1 + total - met > max_len:
                continue  # its unmet constraint tokens no longer fit
            banks.setdefault(met, []).append(c)
        chosen: list[_Candidate] = []
        order = [banks[m] for m in sorted(banks, reverse=True)]
        for rank in itertools.count():
            if len(chosen) == width or not any(rank < len(bank) for bank in order):
                break
            for bank in order:
                if rank < len(bank) and len(chosen) < width:
                    chosen.append(bank[rank])
        return sorted(chosen, key=lambda c: c.score, reverse=True)


def _candidates(
    scores: Tensor,
    k: int,
    n: int,
    progress: list[Progress],
    sentences: list[int],
    constraints: list[tuple[Phrase, ...]],
) -> list[list[_Candidate]]:
    """Each live sentence's candidate extensions, finite scores only: its n best over all its
    k rows, each row's best token, and each row's constraint-advancing tokens.

    Shape: scores (N, V) the log-probability of every extension, N = B' k.
    """
    N, V = scores.shape
    # Equal scores at the n-th go to the lower row, then the lower id (`row_best`), not as
    # top-k happens to choose.
    top, flat = row_best(scores.view(N // k, k * V), min(n, k * V))  # (B', n)
    best, best_token = scores.max(dim=1)  # (N,)
    extra = [
        (r, w) for r, p in enumerate(progress) for w in p.next_tokens(constraints[sentences[r]])
    ]
    extra_scores = scores[[r for r, _ in extra], [w for _, w in extra]].tolist() if extra else []
    pairs: list[dict[tuple[int, int], float]] = [{} for _ in range(N // k)]
    for i, (row_top, row_flat) in enumerate(zip(top.tolist(), flat.tolist())):
        for score, f in zip(row_top, row_flat):
            pairs[i][(i * k + f // V, f % V)] = score
    for r, (score, w) in enumerate(zip(best.tolist(), best_token.tolist())):
        pairs[r // k][(r, w)] = score
    for (r, w), score in zip(extra, extra_scores):
        pairs[r // k][(r, w)] = score
    return [
        [
            _Candidate(score, r, w, progress[r].advance(w, constraints[sentences[r]]))
            for (r, w), score in found.items()
            if score != float("-inf")
        ]
        for found in pairs
    ]
