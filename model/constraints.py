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
begin another), as in fairseq. The step, reorder and length conventions are `model.search`'s;
after the first step every sentence has the same number of rows (the widest sentence's width),
the ones beyond its own width or without a candidate dead (score -inf) until it ends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from model.search import (
    BeamStop,
    Hypothesis,
    LengthPenalty,
    Prefix,
    ReorderFn,
    State,
    StepFn,
    _best_length_penalty,
    _initial_beams,
    _on_device,
    _sentence_done,
    apply_step_rules,
    as_length_penalty,
    finished_kept,
    row_best,
)

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
    *,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    max_lens: Tensor,
    constraints: list[tuple[Phrase, ...]],
    length_penalty: float | LengthPenalty,
    patience: float,
    min_len: int = 0,
    nbest: int = 1,
    no_repeat_ngram_size: int = 0,
    prefix: Tensor | Prefix | None = None,
    beam_stop: BeamStop = "bound",
    score_forced_eos: bool = True,
    renormalize: bool = False,
) -> list[list[Hypothesis]]:
    """Beam search for B sentences at once, each output holding each of its sentence's
    `constraints` (see the module docstring). The other arguments are `beam_search`'s; the
    caller makes sure that each sentence's prefix and constraints fit its max_lens.

    Returns:
        For each sentence in input order, up to nbest hypotheses, best score first; none for
        a sentence whose constraints no hypothesis could hold within its max length (under
        the n-gram ban, say), which the caller reports.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"need 1 <= nbest <= beam_size, got nbest {nbest}, beam {beam_size}")
    device = max_lens.device
    lp = as_length_penalty(length_penalty)
    widths = [search_width(beam_size, phrases) for phrases in constraints]
    kept = [finished_kept(beam_stop, w, nbest) for w in widths]
    rows_each = max(widths)  # rows per live sentence after the first step
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    n_finished = [0] * batch_size
    enough = [max(nbest, round(w * patience)) if patience > 0 else 0 for w in widths]
    beams = _initial_beams(batch_size, device)
    progress = [Progress()] * batch_size  # one per row, on the host
    outputs: list[list[int]] = [[] for _ in range(batch_size)]  # each row's tokens, on the host
    tokens = torch.full((batch_size,), bos_id, dtype=torch.long, device=device)
    host_max_lens = max_lens.tolist()
    shortest = min(host_max_lens)
    k = 1  # rows per live sentence
    for t in itertools.count():
        log_probs, state = step(tokens, state)  # (N, V)
        sentences = beams.sentence.tolist()
        log_probs = apply_step_rules(
            log_probs, t, beams, max_lens, eos_id, min_len, shortest, no_repeat_ngram_size, prefix,
            score_forced_eos, renormalize,
        )  # fmt: skip
        unmet = [not p.done(constraints[b]) for p, b in zip(progress, sentences)]
        no_eos = _on_device([i for i, u in enumerate(unmet) if u], device)
        log_probs[no_eos, eos_id] = float("-inf")  # EOS only once every constraint is met
        scores = beams.log_probs[:, None] + log_probs  # (N, V)
        candidates = _candidates(scores, k, 2 * rows_each, progress, sentences, constraints)
        selected = []  # per live sentence: its rows' candidates, rows_each of them
        for i, found in enumerate(candidates):
            b = sentences[i * k]
            width, max_len = widths[b], host_max_lens[b]
            live = _finish_and_select(
                found, t, b, width, eos_id, constraints[b], max_len, outputs, finished,
                n_finished, lp, kept[b],
            )  # fmt: skip
            best = live[0].score if live else float("-inf")
            bound = best / _best_length_penalty(t, max_len, lp, beam_stop)
            done = not live or _sentence_done(
                finished[b], n_finished[b], enough[b], bound, t, max_len, kept[b]
            )
            if not done:
                dead = _Candidate(float("-inf"), live[0].row, eos_id, live[0].progress)
                selected.append(live + [dead] * (rows_each - len(live)))
        if not selected:
            break
        chosen = [c for sentence in selected for c in sentence]
        index = _on_device([c.row for c in chosen], device)
        tokens = _on_device([c.token for c in chosen], device)
        log_prob = _on_device([c.score for c in chosen], device, scores.dtype)
        beams = beams.take(index).extend(tokens, log_prob)
        state = reorder(state, index, rows_each)
        progress = [c.progress for c in chosen]
        outputs = [outputs[c.row] + [c.token] for c in chosen]
        k = rows_each
    return [hyps[:nbest] for hyps in finished]


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


def _finish_and_select(
    found, t, b, beam_size, eos_id, phrases, max_len, outputs, finished, n_finished, lp, kept
) -> list[_Candidate]:
    """Finish the sentence's EOS candidates that rank among its best `beam_size` (its `kept`
    best kept), drop the candidates that can no longer fit their unmet constraints, and fill
    the beam from the banks in turn (most constraint tokens met first); the chosen, best score
    first."""
    found.sort(key=lambda c: c.score, reverse=True)
    total = sum(len(p) for p in phrases)
    banks: dict[int, list[_Candidate]] = {}
    for rank, c in enumerate(found):
        if c.token == eos_id:
            if rank < beam_size:
                out = outputs[c.row]
                score = c.score / lp(len(out) + 1)  # |Y| counts EOS
                finished[b].append(Hypothesis(out, score, c.score))
                finished[b].sort(key=lambda h: h.score, reverse=True)
                del finished[b][kept:]
                n_finished[b] += 1
            continue
        met = c.progress.met_tokens(phrases)
        if t + 1 + total - met > max_len:
            continue  # its unmet constraint tokens no longer fit
        banks.setdefault(met, []).append(c)
    chosen: list[_Candidate] = []
    order = [banks[m] for m in sorted(banks, reverse=True)]
    for rank in itertools.count():
        if len(chosen) == beam_size or not any(rank < len(bank) for bank in order):
            break
        for bank in order:
            if rank < len(bank) and len(chosen) < beam_size:
                chosen.append(bank[rank])
    return sorted(chosen, key=lambda c: c.score, reverse=True)
