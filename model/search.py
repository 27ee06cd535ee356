"""Greedy and beam search over a step function: ids in, ids and scores out.

Search knows nothing of the model or of text (as flax's examples/wmt/decode.py). It calls

    step(tokens, state) -> (log_probs, state)
        tokens (N,) long, the last token of each row (BOS first); log_probs (N, V), normalised.
    reorder(state, index, group) -> state
        index (N',) long: row i of the new state is row index[i] of the old one; the new rows
        come in groups of `group` consecutive rows (a sentence's beams). While no sentence
        leaves, each keeps its group's place; as some leave, others may fill their places.

A row is one hypothesis. Both searches are batched over B sentences: the first step sees one row
per sentence, so `state` starts with B rows, and beam search's first reorder expands each to its
beams (index = arange(B).repeat_interleave(beam) then). A finished hypothesis is set aside, and a
finished sentence leaves the live rows through `reorder`, so it costs nothing further.

Lengths: a hypothesis holds at most max_lens[b] tokens; at that length EOS is the only choice
(as fairseq), so every hypothesis ends in EOS and its log-probability includes EOS's. Tokens are
returned without BOS and EOS; the length |Y| in the length penalty counts EOS.

Scores: beam search ranks finished hypotheses by GNMT's length-normalised score
log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, eq. 14), or by
log P(Y) / |Y| ** alpha, transformers' and CTranslate2's (`LengthPenalty`). Greedy search has
no length penalty: its score is the log-probability.

Two step rules make a search transformers' `generate` (an imported model's settings): the EOS
forced at the length limit counted as certain (`score_forced_eos` false, transformers'
`forced_eos_token_id`), and the log-probabilities normalised again after the rules forbid
tokens (`renormalize`, its `renormalize_logits`); and one stopping rule, `beam_stop`
"current_length" (its `early_stopping: false`, `_best_length_penalty`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import torch
from torch import Tensor

from model.beam_candidates import read_candidates

State = TypeVar("State")
StepFn = Callable[[Tensor, State], tuple[Tensor, State]]
ReorderFn = Callable[[State, Tensor, int], State]


@dataclass
class Hypothesis:
    tokens: list[int]  # no BOS, no EOS
    score: float  # length-penalised log-probability (the log-probability for greedy)
    log_prob: float  # sum of the tokens' log-probabilities, EOS included


@dataclass
class Beams:
    """The live hypotheses: k rows per live sentence, a sentence's rows adjacent."""

    tokens: Tensor  # (N, t) tokens generated so far
    log_probs: Tensor  # (N,) sum of their log-probabilities
    sentence: Tensor  # (N,) input index of the row's sentence

    def take(self, rows: Tensor) -> Beams:
        """Rows (N',) of these beams."""
        return Beams(self.tokens[rows], self.log_probs[rows], self.sentence[rows])

    def extend(self, tokens: Tensor, log_probs: Tensor) -> Beams:
        """Each row followed by tokens (N,), its sum of log-probabilities now log_probs (N,)."""
        extended = torch.cat([self.tokens, tokens[:, None]], dim=1)  # (N, t + 1)
        return Beams(extended, log_probs, self.sentence)


def gnmt_length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha; alpha = 0 gives 1."""
    return ((5 + length) / 6) ** alpha


@dataclass(frozen=True)
class LengthPenalty:
    """lp(|Y|), the divisor of a finished hypothesis's log-probability (|Y| counts its EOS):
    GNMT's ((5 + |Y|) / 6) ** alpha, or with `power` |Y| ** alpha, the length penalty of
    transformers' and CTranslate2's beam search (fairseq's lenpen): another thing for the same
    alpha (at alpha 1, |Y| 20: 20 against 4.2). alpha 0 gives 1 either way."""

    alpha: float
    power: bool = False

    def __call__(self, length: int) -> float:
        return length**self.alpha if self.power else gnmt_length_penalty(length, self.alpha)


def as_length_penalty(length_penalty: float | LengthPenalty) -> LengthPenalty:
    """A `LengthPenalty`; a plain number is GNMT's alpha."""
    if isinstance(length_penalty, LengthPenalty):
        return length_penalty
    return LengthPenalty(length_penalty)


# What ends a sentence's beam search besides its max length and patience (`_sentence_done`):
# "bound" once no live hypothesis can beat its nbest finished ones, at any length it may reach;
# "current_length", transformers' default (`early_stopping: false`), once beam_size of its
# hypotheses have finished and the best live one, scored at its current length, does not beat
# the worst of them: a heuristic, sooner where the length penalty rewards length, which may
# miss a longer, better hypothesis.
BeamStop = Literal["bound", "current_length"]


def _initial_beams(batch_size: int, device: torch.device) -> Beams:
    empty = torch.empty(batch_size, 0, dtype=torch.long, device=device)  # (B, 0)
    zeros = torch.zeros(batch_size, device=device)  # (B,)
    return Beams(empty, zeros, torch.arange(batch_size, device=device))


def _restrict_length(
    log_probs: Tensor,
    t: int,
    max_lens: Tensor,
    eos_id: int,
    min_len: int | Tensor,
    shortest: int,
    score_forced_eos: bool = True,
) -> Tensor:
    """Forbid EOS before min_len tokens; force it once a row holds max_lens tokens (that wins),
    its log-probability kept, or 0 (certain) without `score_forced_eos`. `shortest` is the
    smallest of the batch's max_lens, known on the host: before it no row is at its limit,
    and the two (N, V) passes that force EOS are skipped. A row of a sentence that joined a
    running search at step s has its max length and min_len shifted by s (`Sentences`):
    min_len is then (N,), each row's.

    Shape: log_probs (N, V), max_lens (N,) per row -> (N, V).
    """
    per_row = isinstance(min_len, Tensor)
    if not per_row and t >= min_len and t < shortest:
        return log_probs
    is_eos = torch.arange(log_probs.size(1), device=log_probs.device) == eos_id  # (V,)
    if per_row:
        restricted = log_probs.masked_fill((t < min_len)[:, None] & is_eos, float("-inf"))
    else:
        restricted = log_probs.masked_fill(is_eos, float("-inf")) if t < min_len else log_probs
    if t < shortest:
        return restricted
    if score_forced_eos:
        forced = log_probs.masked_fill(~is_eos, float("-inf"))
    else:
        forced = torch.zeros_like(log_probs[:1]).masked_fill(~is_eos, float("-inf"))  # (1, V)
    return torch.where((max_lens <= t)[:, None], forced, restricted)


def _renormalize(log_probs: Tensor) -> Tensor:
    """Log-probabilities normalised again over the tokens the rules left (transformers'
    `renormalize_logits`); a row with none left stays as it is (all -inf).

    Shape: (N, V) -> (N, V).
    """
    some_left = log_probs.amax(dim=1, keepdim=True) > float("-inf")  # (N, 1)
    return torch.where(some_left, torch.log_softmax(log_probs, dim=1), log_probs)


def _ban_repeated_ngrams(log_probs: Tensor, tokens: Tensor, n: int) -> Tensor:
    """Forbid every token that would complete an n-gram already in the row's tokens.

    Shape: log_probs (N, V), tokens (N, t) -> (N, V).
    """
    if n <= 0 or tokens.size(1) < n:
        return log_probs
    windows = tokens.unfold(1, n, 1)  # (N, W, n): every n-gram so far
    last = tokens[:, tokens.size(1) - n + 1 :]  # (N, n - 1): the n-gram the next token completes
    match = (windows[:, :, :-1] == last[:, None, :]).all(dim=-1)  # (N, W)
    # A row that joined a running search is padded with -1 before its first token: a window
    # of padding alone is no n-gram (one ending in a token never matches `last` then).
    match &= windows[:, :, -1] >= 0
    ids = windows[:, :, -1].clamp(min=0)
    banned = torch.zeros_like(log_probs).scatter_add_(1, ids, match.to(log_probs))
    return log_probs.masked_fill(banned > 0, float("-inf"))


@dataclass(frozen=True)
class Prefix:
    """Each sentence's forced first tokens, `tokens` (B, L) long padded with -1: a user's
    target prefix, whose log-probabilities count in the score, after the first `certain`
    columns, which count as certain (log-probability 0): a language token the decoder is made
    to write (NLLB's, M2M100's, mBART-50's: transformers' `forced_bos_token_id`), no choice of
    the model's. A plain (B, L) tensor is a prefix with none certain."""

    tokens: Tensor
    certain: int = 0
    # (B,) long, the column of each sentence's first token, or None: all at 0. A sentence that
    # joined a running search at step s has its prefix from column s (`Sentences`).
    first: Tensor | None = None


def as_prefix(prefix: Tensor | Prefix | None) -> Prefix | None:
    return Prefix(prefix) if isinstance(prefix, Tensor) else prefix


def force_prefix(
    log_probs: Tensor, t: int, prefix: Tensor | Prefix | None, sentence: Tensor
) -> Tensor:
    """At step t, a row whose sentence's prefix is longer than t may take only its prefix's
    token t (the rest -inf; its log-probability still counts in the score, or is 0 in the
    prefix's certain columns).

    Shape: log_probs (N, V); prefix: (B, L) long (or a `Prefix` of them), each sentence's
    forced tokens padded with -1, or None; sentence (N,) the row's sentence -> (N, V).
    """
    prefix = as_prefix(prefix)
    if prefix is None or t >= prefix.tokens.size(1):
        return log_probs
    forced = prefix.tokens[sentence, t]  # (N,) -1: free
    allowed = torch.zeros_like(log_probs, dtype=torch.bool)
    allowed.scatter_(1, forced.clamp(min=0)[:, None], True)
    if prefix.first is None and t < prefix.certain:  # the model's to write, however it rates it
        log_probs = log_probs.masked_fill(allowed, 0.0)
    elif prefix.first is not None and prefix.certain:
        certain = (t - prefix.first[sentence] < prefix.certain)[:, None]  # (N, 1)
        log_probs = log_probs.masked_fill(allowed & certain, 0.0)
    return log_probs.masked_fill((forced >= 0)[:, None] & ~allowed, float("-inf"))


def apply_step_rules(
    log_probs: Tensor,
    t: int,
    beams: Beams,
    max_lens: Tensor,
    eos_id: int,
    min_len: int,
    shortest: int,
    no_repeat_ngram_size: int,
    prefix: Tensor | Prefix | None,
    score_forced_eos: bool = True,
    renormalize: bool = False,
) -> Tensor:
    """What every search forbids at step t: the length rules (`_restrict_length`), repeated
    n-grams, and all but a forced prefix's token. The forced prefix is exempt from the n-gram
    ban, as in CTranslate2: it is the user's text, repeats and all, and banning its own tokens
    would leave a row with no token at all; the tokens the search adds after it are banned
    from repeating any n-gram of the whole output, the prefix's included. With `renormalize`
    the log-probabilities are normalised again after the length and n-gram rules (and any ban
    of the step's own), before the prefix: its tokens keep the model's log-probabilities.

    Shape: log_probs (N, V), max_lens (B,) per sentence -> (N, V).
    """
    row_max_lens = max_lens[beams.sentence]
    log_probs = _restrict_length(
        log_probs, t, row_max_lens, eos_id, min_len, shortest, score_forced_eos
    )
    banned = _ban_repeated_ngrams(log_probs, beams.tokens, no_repeat_ngram_size)
    prefix = as_prefix(prefix)
    if prefix is not None and t < prefix.tokens.size(1) and banned is not log_probs:
        in_prefix = (prefix.tokens[beams.sentence, t] >= 0)[:, None]  # (N, 1) forced this step
        banned = torch.where(in_prefix, log_probs, banned)
    if renormalize:
        banned = _renormalize(banned)
    return force_prefix(banned, t, prefix, beams.sentence)


def greedy_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    *,
    batch_size: int,
    bos_id: int,
    eos_id: int,
    max_lens: Tensor,
    min_len: int = 0,
    no_repeat_ngram_size: int = 0,
    prefix: Tensor | Prefix | None = None,
    score_forced_eos: bool = True,
    renormalize: bool = False,
) -> list[Hypothesis]:
    """The most probable next token at every step, for B sentences at once.

    Args:
        step, state, reorder: as in the module docstring; state holds B rows.
        batch_size: B.
        bos_id, eos_id: the first token fed; the token that ends a hypothesis.
        max_lens: (B,) long, the most tokens of each sentence's output (EOS not counted), on
            the device of the step's tensors.
        min_len: EOS is forbidden before this many tokens.
        no_repeat_ngram_size: n > 0 forbids repeating any n-gram within a hypothesis (the
            forced prefix is exempt: `apply_step_rules`).
        prefix: (B, L) long, a `Prefix`, or None: each output starts with its row's tokens
            (padded with -1; `force_prefix`). max_lens must leave room for them.
        score_forced_eos: the EOS forced at max_lens counts its log-probability; else 0.
        renormalize: log-probabilities normalised again after the rules (`apply_step_rules`).

    Returns:
        B hypotheses in input order, score = log_prob.
    """

    def most_probable(log_probs: Tensor, t: int, rows: Tensor) -> Tensor:
        return row_argmax(log_probs)  # ties go to the first id

    rows = _row_search(
        step, state, reorder, most_probable, batch_size=batch_size, per_sentence=1,
        bos_id=bos_id, eos_id=eos_id, max_lens=max_lens, min_len=min_len,
        no_repeat_ngram_size=no_repeat_ngram_size, prefix=prefix,
        score_forced_eos=score_forced_eos, renormalize=renormalize,
    )  # fmt: skip
    return [Hypothesis(tokens, log_prob, log_prob) for tokens, log_prob in rows]


@dataclass(frozen=True)
class Sampling:
    """What random sampling draws from (the settings of fairseq, Marian and CTranslate2)."""

    topk: int  # the k most probable tokens; -1: every token
    topp: float = 1.0  # then the fewest most probable ones whose probability reaches p
    temperature: float = 1.0  # log-probabilities divided by it first (<1 sharper, >1 flatter)


def sample_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    *,
    batch_size: int,
    samples: int,
    sampling: Sampling,
    noise: Tensor,
    bos_id: int,
    eos_id: int,
    max_lens: Tensor,
    length_penalty: float | LengthPenalty,
    min_len: int = 0,
    nbest: int = 1,
    no_repeat_ngram_size: int = 0,
    prefix: Tensor | Prefix | None = None,
    score_forced_eos: bool = True,
    renormalize: bool = False,
) -> list[list[Hypothesis]]:
    """Random samples, token by token, `samples` per sentence for B sentences at once: the
    next token is drawn from the model's distribution cut to `sampling`'s top-k and top-p,
    tempered, as greedy search takes its most probable one (the same length rules).

    The draws are inverse-CDF lookups of given uniform numbers, so a sample depends on its own
    noise only, never on which sentences share its batch: the caller makes the noise (from a
    seed and the sentence, say) and the same noise gives the same samples. Top-k 1 is greedy.

    Args:
        step, state, reorder: as in the module docstring; state holds B rows, expanded to
            B x samples rows (a sentence's samples adjacent) after the first step.
        batch_size: B.
        samples: drawn per sentence.
        sampling: the distribution drawn from.
        noise: (B, samples, T) uniform in [0, 1), T > max(max_lens): the draw of step t of a
            sample is noise[b, s, t].
        bos_id, eos_id, max_lens, min_len, no_repeat_ngram_size, prefix, score_forced_eos,
            renormalize: as in `greedy_search`.
        length_penalty: lp, to rank a sentence's samples (log P / lp(|Y|)): a `LengthPenalty`,
            or GNMT's alpha.
        nbest: samples returned per sentence, the best first, at most `samples`.

    Returns:
        For each sentence in input order, its nbest best-scoring samples.
    """
    if not 1 <= nbest <= samples:
        raise ValueError(f"need 1 <= nbest <= samples, got nbest {nbest}, samples {samples}")
    flat_noise = noise.reshape(batch_size * samples, -1)  # (B samples, T)
    lp = as_length_penalty(length_penalty)

    def draw(log_probs: Tensor, t: int, rows: Tensor) -> Tensor:
        return sample_tokens(log_probs, flat_noise[rows, t], sampling)

    rows = _row_search(
        step, state, reorder, draw, batch_size=batch_size, per_sentence=samples,
        bos_id=bos_id, eos_id=eos_id, max_lens=max_lens, min_len=min_len,
        no_repeat_ngram_size=no_repeat_ngram_size, prefix=prefix,
        score_forced_eos=score_forced_eos, renormalize=renormalize,
    )  # fmt: skip
    results = []
    for b in range(batch_size):
        hyps = []
        for tokens, log_prob in rows[b * samples : (b + 1) * samples]:
            hyps.append(Hypothesis(tokens, log_prob / lp(len(tokens) + 1), log_prob))  # |Y|: EOS
        hyps.sort(key=lambda h: h.score, reverse=True)  # stable: earlier samples win ties
        results.append(hyps[:nbest])
    return results


def sample_tokens(log_probs: Tensor, uniform: Tensor, sampling: Sampling) -> Tensor:
    """One token per row drawn from softmax(log_probs / temperature) cut to the top-k, then to
    the top-p (nucleus: the most probable tokens until their mass reaches p, always one), by
    the inverse CDF at `uniform`. Forbidden tokens (-inf) are never drawn.

    Shape: log_probs (N, V), uniform (N,) in [0, 1) -> (N,) long.
    """
    if sampling.topk == 1:
        return row_argmax(log_probs)  # exactly greedy's choice, ties included
    if sampling.topk > 0:
        top, words = log_probs.topk(min(sampling.topk, log_probs.size(1)), dim=1)  # (N, k)
    else:
        top, words = log_probs.sort(dim=1, descending=True)  # (N, V)
    probs = torch.softmax(top / sampling.temperature, dim=1)  # (N, k), most probable first
    if sampling.topp < 1.0:
        before = probs.cumsum(dim=1) - probs  # mass of the more probable tokens
        probs = probs.masked_fill(before >= sampling.topp, 0.0)  # the first is always kept
    cdf = probs.cumsum(dim=1)  # (N, k), unnormalised after the cut
    target = (uniform.to(cdf.dtype) * cdf[:, -1])[:, None]  # (N, 1), below the total
    choice = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.size(1) - 1)  # (N, 1)
    return words.gather(1, choice).squeeze(1)


def _row_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    choose: Callable[[Tensor, int, Tensor], Tensor],
    *,
    batch_size: int,
    per_sentence: int,
    max_lens: Tensor,
    prefix: Tensor | Prefix | None,
    **settings,
) -> list[tuple[list[int], float]]:
    """Greedy search's loop (`RowSearch`) over B sentences that all start at once; returns
    (tokens, log P) for every row, sentence-major."""
    search = RowSearch(choose, per_sentence=per_sentence, device=max_lens.device, **settings)
    search.admit(max_lens, as_prefix(prefix))
    while search.live:
        log_probs, state = step(search.tokens, state)
        state = search.advance(log_probs, state, reorder)
    return [search.rows[i] for i in range(batch_size * per_sentence)]


class Sentences:
    """The sentences of a step-wise search (`RowSearch`, `BeamSearch`) by slot, in the order
    they joined: the caller's key of each, the step it joined at (`starts`), its own max
    length, the step at which it reaches it (`limits`, start + max length, on the device), its
    forced prefix, from the column of its start, and its finished hypotheses. The step rules
    (`apply_step_rules`) count one step for every row: a sentence's limits and prefix, shifted
    by its start, hold at its own step."""

    def __init__(self, device: torch.device):
        self.device = device
        self.keys: list = []
        self.starts: list[int] = []
        self.max_lens: list[int] = []
        self.limits = torch.empty(0, dtype=torch.long, device=device)
        self.shortest = 1 << 62  # the smallest limit: before it no row is at its max length
        self.prefix: Prefix | None = None
        self.finished: list[list[Hypothesis]] = []
        self.n_finished: list[int] = []  # hypotheses finished, kept or not
        self.cancelled: set[int] = set()

    def add(self, t: int, keys: list, max_lens: Tensor, prefix: Prefix | None) -> range:
        """Sentences joining at step t; their slots."""
        first, n = len(self.keys), max_lens.numel()
        host = max_lens.tolist()
        self.keys += keys
        self.starts += [t] * n
        self.max_lens += host
        self.limits = max_lens + t if first == 0 else torch.cat([self.limits, max_lens + t])
        self.shortest = min(self.shortest, t + min(host))
        self.finished += [[] for _ in range(n)]
        self.n_finished += [0] * n
        self.prefix = self._joined_prefix(first, n, t, prefix)
        return range(first, first + n)

    def _joined_prefix(self, first: int, n: int, t: int, prefix: Prefix | None) -> Prefix | None:
        """Every slot's prefix after n sentences join at step t with `prefix` (n, L) or None."""
        if prefix is None and self.prefix is None:
            return None
        if first == 0 and t == 0:
            return prefix
        mine = self.prefix.tokens if self.prefix is not None else self._free(first, 0)
        theirs = self._free(n, t)
        if prefix is not None:
            theirs = torch.cat([theirs, prefix.tokens], dim=1)
        width = max(mine.size(1), theirs.size(1))
        tokens = torch.cat([_free_after(mine, width), _free_after(theirs, width)])
        certain = {p.certain for p in (self.prefix, prefix) if p is not None and p.certain}
        if len(certain) > 1:  # as `cli.inference.decoding.prefix_tensor`
            raise ValueError(f"sentences forced to write {sorted(certain)} language tokens")
        first_columns = torch.tensor(self.starts, dtype=torch.long, device=self.device)
        return Prefix(tokens, certain.pop() if certain else 0, first_columns)

    def _free(self, n: int, width: int) -> Tensor:
        return torch.full((n, width), -1, dtype=torch.long, device=self.device)

    def own_step(self, slot: int, t: int) -> int:
        return t - self.starts[slot]

    def keep(self, slots: list[int], shift: int) -> Tensor:
        """Only the sentences of `slots` (ascending), their steps counted from `shift` on;
        the new slot of each old one (-1: gone), (slots before,) on the device."""
        index = _on_device(slots, self.device)
        mapping = torch.full((len(self.keys),), -1, dtype=torch.long)
        mapping[slots] = torch.arange(len(slots))
        self.keys = [self.keys[b] for b in slots]
        self.starts = [self.starts[b] - shift for b in slots]
        self.max_lens = [self.max_lens[b] for b in slots]
        self.limits = self.limits.index_select(0, index) - shift
        self.shortest = min((a + m for a, m in zip(self.starts, self.max_lens)), default=1 << 62)
        self.finished = [self.finished[b] for b in slots]
        self.n_finished = [self.n_finished[b] for b in slots]
        self.cancelled = {int(mapping[b]) for b in self.cancelled if mapping[b] >= 0}
        if self.prefix is not None:
            tokens = self.prefix.tokens.index_select(0, index)[:, shift:]
            first = torch.tensor(self.starts, dtype=torch.long, device=self.device)
            self.prefix = Prefix(tokens, self.prefix.certain, first)
        return mapping.to(self.device)


def _free_after(tokens: Tensor, width: int) -> Tensor:
    """(n, w) prefix tokens padded with -1 (free) to `width` columns."""
    return torch.nn.functional.pad(tokens, (0, width - tokens.size(1)), value=-1)


def _own_tokens(row: list[int]) -> list[int]:
    """A row's tokens without the -1 columns before the step its sentence joined at."""
    return [token for token in row if token >= 0] if row and row[0] < 0 else row


class _StepwiseSearch:
    """What both step-wise searches share: their sentences, their live rows (`beams`, the
    `tokens` to feed next), admission between steps, cancellation, the answers of the
    sentences done (`done`, taken by the caller) and the forgetting of old columns."""

    def __init__(self, device: torch.device, bos_id: int, eos_id: int, min_len: int,
                 no_repeat_ngram_size: int, score_forced_eos: bool, renormalize: bool):  # fmt: skip
        self.device, self.bos_id, self.eos_id, self.min_len = device, bos_id, eos_id, min_len
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.score_forced_eos, self.renormalize = score_forced_eos, renormalize
        self.done: list[tuple[object, list[Hypothesis]]] = []
        self.restart()

    def restart(self) -> None:
        """No sentence: the next to join start at step 0."""
        self.t = 0
        self.sentences = Sentences(self.device)
        self.beams = _initial_beams(0, self.device)
        self.tokens = torch.empty(0, dtype=torch.long, device=self.device)
        self.joined_late = False  # a sentence joined after step 0: rows have their own steps

    @property
    def live(self) -> int:
        """Live rows."""
        return self.beams.sentence.numel()

    def _add_rows(self, slots: range, k: int) -> None:
        """k rows for each sentence of `slots`, after the live ones: BOS to feed, no token yet
        (-1 columns up to this step), log-probability 0 for the first, -inf for the others
        (so the first step extends the first alone, as at one row a sentence)."""
        n = len(slots)
        sentence = torch.arange(slots.start, slots.stop, device=self.device)
        sentence = sentence.repeat_interleave(k)
        log_probs = torch.full((n, k), float("-inf"), device=self.device)
        log_probs[:, 0] = 0.0
        tokens = torch.full((n * k, self.t), -1, dtype=torch.long, device=self.device)
        beams = self.beams
        self.beams = Beams(
            torch.cat([beams.tokens, tokens]),
            torch.cat([beams.log_probs, log_probs.flatten()]),
            torch.cat([beams.sentence, sentence]),
        )
        bos = torch.full((n * k,), self.bos_id, device=self.device)
        self.tokens = torch.cat([self.tokens, bos])
        self.joined_late = self.joined_late or self.t > 0

    def cancel(self, keys: set) -> None:
        """The sentences of `keys` leave at the next step, unanswered."""
        for slot, key in enumerate(self.sentences.keys):
            if key in keys:
                self.sentences.cancelled.add(slot)

    def rules(self, log_probs: Tensor) -> Tensor:
        """`apply_step_rules` at this step, each sentence at its own step."""
        sentences, min_len = self.sentences, self.min_len
        if self.joined_late and min_len:
            starts = _on_device(sentences.starts, self.device).index_select(0, self.beams.sentence)
            min_len = starts + min_len  # (N,) the step until which each row's EOS is banned
        return apply_step_rules(
            log_probs, self.t, self.beams, sentences.limits, self.eos_id, min_len,
            sentences.shortest, self.no_repeat_ngram_size, sentences.prefix,
            self.score_forced_eos, self.renormalize,
        )  # fmt: skip

    def live_slots(self) -> list[int]:
        raise NotImplementedError

    def forget(self, at_least: int = 8) -> int:
        """Drop the sentences that left and the columns before the oldest live one joined,
        once they are `at_least` columns and a quarter of the live width (every row attends
        over the whole width, so dead columns cost every step; dropping copies the live ones,
        which this bounds to a few columns a step); the caller drops the same columns of its
        state (`DecoderCache.drop_columns`). Returns how many columns were dropped."""
        slots = self.live_slots()
        shift = min((self.sentences.starts[b] for b in slots), default=0)
        due = shift >= max(at_least, (self.t - shift) // 4)
        gone = len(self.sentences.keys) - len(slots)
        if not due and gone < 64 + 2 * len(slots):
            return 0
        if not due:
            shift = 0
        mapping = self.sentences.keep(slots, shift)
        self.beams = Beams(
            self.beams.tokens[:, shift:], self.beams.log_probs, mapping[self.beams.sentence]
        )
        self.t -= shift
        self._renumber(mapping)
        return shift

    def _renumber(self, mapping: Tensor) -> None:
        pass


class RowSearch(_StepwiseSearch):
    """Greedy search's loop (and sampling's) a step at a time, one token per row each step:
    `per_sentence` rows for each sentence (its one row expanded after its first step), the
    token of each row chosen by `choose(log_probs (N, V), t, rows (N,)) -> (N,)`, `rows` the
    index of each live row among all sentences x per_sentence. Sentences may join between
    steps (`admit`, one row a sentence: greedy only) and leave (`cancel`); each sentence's
    result goes to `done` as it ends ((key, [Hypothesis]), per_sentence 1), and every row's to
    `rows` ((tokens, log P) by row index)."""

    def __init__(self, choose: Callable[[Tensor, int, Tensor], Tensor], *, per_sentence: int = 1,
                 device: torch.device, bos_id: int, eos_id: int, min_len: int = 0,
                 no_repeat_ngram_size: int = 0, score_forced_eos: bool = True,
                 renormalize: bool = False):  # fmt: skip
        self.choose, self.per_sentence = choose, per_sentence
        super().__init__(device, bos_id, eos_id, min_len, no_repeat_ngram_size,
                         score_forced_eos, renormalize)  # fmt: skip

    def restart(self) -> None:
        super().restart()
        self.row_ids = torch.empty(0, dtype=torch.long, device=self.device)
        self.rows: dict[int, tuple[list[int], float]] = {}

    def admit(
        self, max_lens: Tensor, prefix: Prefix | None = None, keys: list | None = None
    ) -> int:
        """Sentences join before the next step: max_lens (n,) and prefix (n, L) as in
        `greedy_search`; `keys` name them in `done` (their slots by default). Returns the rows
        a sentence the caller adds to its state for them: one."""
        if self.t > 0 and self.per_sentence > 1:
            raise ValueError("sentences join a running search only at one row a sentence")
        first = len(self.sentences.keys)
        keys = keys or list(range(first, first + max_lens.numel()))
        slots = self.sentences.add(self.t, keys, max_lens, prefix)
        self._add_rows(slots, 1)
        row_ids = torch.arange(slots.start, slots.stop, device=self.device) * self.per_sentence
        self.row_ids = torch.cat([self.row_ids, row_ids])
        return 1

    def live_slots(self) -> list[int]:
        return sorted(set(self.beams.sentence.tolist()))

    def _renumber(self, mapping: Tensor) -> None:
        per = self.per_sentence
        self.row_ids = mapping[self.row_ids // per] * per + self.row_ids % per

    def advance(self, log_probs: Tensor, state: State, reorder: ReorderFn) -> State:
        """The step's choice from its log_probs (N, V) for `tokens`: the state reordered as
        rows end and leave."""
        t, beams, device = self.t, self.beams, self.device
        if t == 0 and self.per_sentence > 1:
            n = self.live
            expand = torch.arange(n, device=device).repeat_interleave(self.per_sentence)
            state = reorder(state, expand, self.per_sentence)
            beams, log_probs = beams.take(expand), log_probs[expand]
            self.beams = beams
            self.row_ids = torch.arange(n * self.per_sentence, device=device)
        limits = self.sentences.limits[beams.sentence]  # (N,)
        log_probs = self.rules(log_probs)
        tokens = self.choose(log_probs, t, self.row_ids)  # (N,)
        sum_log_probs = beams.log_probs + log_probs.gather(1, tokens[:, None]).squeeze(1)
        ended = (tokens == self.eos_id) | (limits <= t)  # (N,) the latter even if EOS is -inf
        cancelled = self.sentences.cancelled
        if cancelled:
            ended |= torch.isin(beams.sentence, _on_device(sorted(cancelled), device))
            self.sentences.cancelled = set()  # their rows leave at this step
        host_ended = ended.tolist()  # the step's one wait for the device
        if any(host_ended):
            rows = _on_device([i for i, e in enumerate(host_ended) if e], device)
            for row, slot, output, log_prob in zip(
                self.row_ids.index_select(0, rows).tolist(),
                beams.sentence.index_select(0, rows).tolist(),
                beams.tokens.index_select(0, rows).tolist(),
                sum_log_probs.index_select(0, rows).tolist(),
                strict=True,
            ):
                if slot in cancelled:
                    continue
                output = _own_tokens(output)
                self.rows[row] = (output, log_prob)
                if self.per_sentence == 1:
                    hypothesis = Hypothesis(output, log_prob, log_prob)
                    self.done.append((self.sentences.keys[slot], [hypothesis]))
            if all(host_ended):
                rows_done = self.rows
                self.restart()
                self.rows = rows_done
                return state
            live = _on_device(
                _in_place_order([i for i, e in enumerate(host_ended) if not e]), device
            )
            state = reorder(state, live, 1)
            beams, tokens, sum_log_probs = beams.take(live), tokens[live], sum_log_probs[live]
            self.row_ids = self.row_ids[live]
        self.beams = beams.extend(tokens, sum_log_probs)
        self.tokens = tokens
        self.t += 1
        return state


def beam_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    *,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    max_lens: Tensor,
    length_penalty: float | LengthPenalty,  # no default here: `decode.length_penalty` is the one
    patience: float,  # nor here: `decode.patience`
    min_len: int = 0,
    nbest: int = 1,
    no_repeat_ngram_size: int = 0,
    prefix: Tensor | Prefix | None = None,
    half_logits: bool = False,
    beam_stop: BeamStop = "bound",
    score_forced_eos: bool = True,
    renormalize: bool = False,
) -> list[list[Hypothesis]]:
    """Beam search for B sentences at once.

    Each step, every live sentence ranks the 2 * beam_size best extensions of its beams by
    log-probability. Those ending in EOS among the first beam_size are finished (as fairseq: an
    EOS ranked lower would not have made the beam); the best beam_size not ending in EOS stay
    live. A sentence keeps its nbest best finished hypotheses by length-penalised score and
    stops at its max length, as soon as no live hypothesis can beat the worst of them
    (`_sentence_done`; with `beam_stop` "current_length", transformers' rule: its beam_size
    best, and the live one scored at its current length), or once beam_size x patience of its
    hypotheses have finished (fairseq's rule at patience 1). With length_penalty 0, beam_size 1
    is greedy search exactly.

    Args:
        step, state, reorder: as in the module docstring; state holds B rows (one per sentence).
        batch_size: B.
        beam_size: live hypotheses per sentence.
        bos_id, eos_id: the first token fed; the token that ends a hypothesis.
        max_lens: (B,) long, the most tokens of each sentence's output (EOS not counted), on
            the device of the step's tensors.
        length_penalty: lp (`LengthPenalty`), or GNMT's alpha; alpha 0 ranks by
            log-probability.
        patience: stop a sentence once round(beam_size x patience) (at least nbest) of its
            hypotheses have finished, kept or not (CTranslate2's `patience`, Kasai et al., 2022);
            0: only at its max length or when no live hypothesis can still win (exhaustive up
            to the beam).
        min_len: EOS is forbidden before this many tokens.
        nbest: hypotheses returned per sentence, at most beam_size.
        no_repeat_ngram_size: as in `greedy_search`.
        prefix: as in `greedy_search`; while it is forced a sentence has one live hypothesis.
        half_logits: the step's log-probabilities come from bf16 or fp16 logits, so equal
            values are common (45% of the rows' 11 best held a tie at beam 5 in bf16, 2 rows
            in 178,000 in float32, `small` on the test set): `row_topk` would take most rows
            twice, so each row is read whole by top-k.
        beam_stop: "bound" or "current_length" (`BeamStop`).
        score_forced_eos, renormalize: as in `greedy_search`.

    Returns:
        For each sentence in input order, up to nbest hypotheses, best score first (fewer only
        when max_len leaves fewer possible outputs).
    """
    search = BeamSearch(
        beam_size=beam_size, bos_id=bos_id, eos_id=eos_id, device=max_lens.device,
        length_penalty=length_penalty, patience=patience, min_len=min_len, nbest=nbest,
        no_repeat_ngram_size=no_repeat_ngram_size, half_logits=half_logits,
        beam_stop=beam_stop, score_forced_eos=score_forced_eos, renormalize=renormalize,
    )  # fmt: skip
    search.admit(max_lens, as_prefix(prefix))
    while search.live:
        log_probs, state = step(search.tokens, state)
        state = search.advance(log_probs, state, reorder)
    found = dict(search.done)
    return [found[b] for b in range(batch_size)]


class BeamSearch(_StepwiseSearch):
    """`beam_search`'s loop a step at a time. Sentences may join between steps (`admit`):
    before the search's first step at one row a sentence, after it at as many rows as the
    others hold (k, the beam), the first alone live (the others at -inf), which the first
    step extends exactly as a row of its own. Each sentence's n-best goes to `done`, (key,
    hypotheses), as it stops; `cancel` makes sentences leave unanswered."""

    def __init__(self, *, beam_size: int, bos_id: int, eos_id: int, device: torch.device,
                 length_penalty: float | LengthPenalty, patience: float, min_len: int = 0,
                 nbest: int = 1, no_repeat_ngram_size: int = 0, half_logits: bool = False,
                 beam_stop: BeamStop = "bound", score_forced_eos: bool = True,
                 renormalize: bool = False):  # fmt: skip
        if not 1 <= nbest <= beam_size:
            raise ValueError(f"need 1 <= nbest <= beam_size, got nbest {nbest}, beam {beam_size}")
        self.beam_size, self.nbest, self.half_logits = beam_size, nbest, half_logits
        self.lp, self.beam_stop = as_length_penalty(length_penalty), beam_stop
        self.kept = finished_kept(beam_stop, beam_size, nbest)
        # hypotheses a sentence may finish before it stops; 0: no such stop
        self.enough = max(nbest, round(beam_size * patience)) if patience > 0 else 0
        super().__init__(device, bos_id, eos_id, min_len, no_repeat_ngram_size,
                         score_forced_eos, renormalize)  # fmt: skip

    def restart(self) -> None:
        super().restart()
        self.groups: list[int] = []  # the slot of each live group of k rows
        self.k = 1  # rows per live sentence: one before the first step, then up to beam_size
        self.ranked: Tensor | None = None  # (B', k) each group's rows by rank; None: in order

    def admit(
        self, max_lens: Tensor, prefix: Prefix | None = None, keys: list | None = None
    ) -> int:
        """Sentences join before the next step (max_lens (n,), prefix (n, L), as in
        `beam_search`; `keys` name them in `done`, their slots by default). Returns the rows
        a sentence (k) the caller adds to its state for them, k copies of its first row."""
        first = len(self.sentences.keys)
        keys = keys or list(range(first, first + max_lens.numel()))
        slots = self.sentences.add(self.t, keys, max_lens, prefix)
        self._add_rows(slots, self.k)
        self.groups += list(slots)
        if self.ranked is not None:
            order = torch.arange(self.k, device=self.device).expand(len(slots), -1)
            self.ranked = torch.cat([self.ranked, order])
        return self.k

    def live_slots(self) -> list[int]:
        return sorted(self.groups)

    def _renumber(self, mapping: Tensor) -> None:
        host = mapping.tolist()
        self.groups = [host[b] for b in self.groups]

    def advance(self, log_probs: Tensor, state: State, reorder: ReorderFn) -> State:
        """The step's choice from its log_probs (N, V) for `tokens`: the sentences that stop
        answered in `done`, the state reordered to the rows that go on."""
        t, k, beam_size, sentences = self.t, self.k, self.beam_size, self.sentences
        log_probs = self.rules(log_probs)
        top, rows, words = _best_extensions(
            log_probs, self.beams.log_probs, k, 2 * beam_size, self.ranked,
            blocks=not self.half_logits,
        )  # fmt: skip
        # At most k candidates end in EOS (one per row), so C - k of them do not.
        k_next = min(beam_size, top.size(1) - k)
        # From here a step decides over a few candidates a sentence, on the host after one
        # transfer (on a GPU, the step's one wait): `model.beam_candidates`.
        host = torch.cat([top.double(), rows.double(), words.double()], dim=1).cpu()
        found = read_candidates(host, self.eos_id, beam_size, k_next)
        if found.ended:
            ended = [(self.groups[i], row, log_prob) for i, row, log_prob in found.ended]
            _add_finished(sentences.finished, sentences.n_finished, self.beams, ended,
                          self.lp, self.kept)  # fmt: skip
        keep = []  # the live sentences' positions that go on
        for i, (b, best) in enumerate(zip(self.groups, found.best_live, strict=True)):
            if b in sentences.cancelled:
                continue
            own, max_len = sentences.own_step(b, t), sentences.max_lens[b]
            bound = best / _best_length_penalty(own, max_len, self.lp, self.beam_stop)
            hyps = sentences.finished[b]
            if not _sentence_done(hyps, sentences.n_finished[b], self.enough, bound, own,
                                  max_len, self.kept):  # fmt: skip
                keep.append(i)
            else:
                self.done.append((sentences.keys[b], hyps[: self.nbest]))
        sentences.cancelled = set()
        if not keep:
            self.restart()
            return state
        in_place = k_next == k  # rows that stay where they were, as many as can (else all move)
        if in_place:
            keep = _in_place_order(keep)
        parents, ids, scores, placed = found.take(keep, k if in_place else 0)
        self.ranked = None if placed is None else _on_device(placed, self.device)
        self.groups = [self.groups[i] for i in keep]
        index, tokens = _on_device(parents, self.device), _on_device(ids, self.device)
        extended = torch.cat([self.beams.tokens.index_select(0, index), tokens[:, None]], dim=1)
        sentence = _on_device([b for b in self.groups for _ in range(k_next)], self.device)
        self.beams = Beams(extended, _on_device(scores, self.device, top.dtype), sentence)
        self.tokens, self.k, self.t = tokens, k_next, t + 1
        return reorder(state, index, k_next)


def finished_kept(beam_stop: BeamStop, beam_size: int, nbest: int) -> int:
    """The finished hypotheses a sentence keeps, best first, for its stopping rule: its nbest,
    or beam_size of them with "current_length" (transformers compares with its beam_size-th)."""
    return max(nbest, beam_size) if beam_stop == "current_length" else nbest


def _in_place_order(kept: list[int]) -> list[int]:
    """The positions `kept` (ascending) of the rows, or groups of rows, that stay live, in the
    order that leaves the most where they are: one below len(kept) keeps its place, the others
    fill the places of those that left, in order. A reorder (`model.attention.rows_to_move`)
    then copies only the rows that fill them, where keeping the order moved every row after
    the first that left. The searches do not depend on the order of their sentences."""
    n = len(kept)
    staying = {p for p in kept if p < n}
    fillers = iter(p for p in kept if p >= n)
    return [p if p in staying else next(fillers) for p in range(n)]


def _on_device(
    values: list | np.ndarray, device: torch.device, dtype: torch.dtype = torch.long
) -> Tensor:
    """A tensor of host values on `device`, copied without waiting for the device."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _best_extensions(
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


def row_best(x: Tensor, n: int, blocks: bool = True) -> tuple[Tensor, Tensor]:
    """Each row's n largest values of a 2-D x, largest first, and their columns: of equal
    values those of the lower columns (the n a stable sort in descending order puts first).
    Top-k chooses among values equal to its n-th as it likes (on a CPU, at bf16 logits' ties,
    other than the lowest columns in most rows; so that a beam of 1 could miss greedy's argmax
    at a tie of three at the top): one more is taken, and where the n-th and (n+1)-th values
    are equal, `_lowest_columns` puts the right columns in. Equal values among the n come in
    any order. `blocks`: each row's best by `row_topk`, else by top-k over the whole row."""
    m = min(n + 1, x.size(1))
    top, columns = row_topk(x, m) if blocks else x.topk(m, dim=1)
    if m == n:  # every column
        return top, columns
    tied = top[:, n - 1] == top[:, n]  # (N,); NaN, which top-k ranks first, is never equal
    top, columns = top[:, :n], columns[:, :n]
    if x.device.type != "cpu":  # every row, masked: a search step's one wait stays its only one
        return top, _lowest_columns(x, top, columns, tied)
    if tied.any():  # on a CPU, the tied rows alone
        rows = tied.nonzero().squeeze(1)
        x, tied = x.index_select(0, rows), tied[rows]
        columns[rows] = _lowest_columns(x, top[rows], columns[rows], tied)
    return top, columns


def _lowest_columns(x: Tensor, top: Tensor, columns: Tensor, tied: Tensor) -> Tensor:
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


TOPK_BLOCK = 64  # columns a block of `row_topk`: the fastest of 32, 64 and 128 (below)
# Below these many elements the plain top-k and argmax are faster than reading blocks, whose
# handful of ops cost ~40 us however small x is: (5, 8000) n 10 took 74 us by top-k, 104 by
# blocks, (10, 8000) 105 both; argmax (1, 8000) 17 us, by blocks 27, (5, 8000) 52 and 35.
TOPK_MIN_ELEMENTS = 80_000
ARGMAX_MIN_ELEMENTS = 16_000


def row_topk(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """`x.topk(n, dim=1)` of a wide 2-D x on a CPU, the same values and columns, reading most
    of x once instead of sorting it. The n largest of a row lie in the n blocks of
    `TOPK_BLOCK` columns with the largest maxima (a block holding one of them has a maximum at
    least as large, and at most n blocks can), so the top-k runs over those blocks and the
    columns past the last whole block. Where equal values could make the choice or the order
    of columns differ from top-k's (its own, implementation-defined), the row is taken again
    by `x.topk`: rare in float32 (`beam_search`'s `half_logits` has the figures), and so are
    rows with -inf among their best (a forced EOS) or NaN.
    The (N, V) top-k of beam search's step took 7% of its time (`small`, 8,000 tokens, fp32,
    2 cores): (300, 8000), n 10, 1.9 ms, in blocks 1.1 ms (32 columns 1.3, 128 1.4; Xeon,
    AVX512). GPUs keep top-k, fast there.
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
    and then within that block. On a CPU argmax reads a row element by element, 12x as slow as
    amax: (600, 8000) float32 took 5.4-6.3 ms, amax 0.5, this 1.1 (2 cores, Xeon with AMX); it
    had been 5% of greedy search of the test set. GPUs keep argmax.
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


def _add_finished(
    finished: list[list[Hypothesis]],
    n_finished: list[int],
    beams: Beams,
    ends: list[tuple[int, int, float]],
    lp: LengthPenalty,
    kept: int,
) -> None:
    """Put the candidates that end in EOS, (sentence, row extended, log-probability) in rank
    order, into their sentence's list of its `kept` best (earlier ones win ties), and count
    them."""
    rows = _on_device([row for _, row, _ in ends], beams.tokens.device)
    prefixes = [_own_tokens(row) for row in beams.tokens.index_select(0, rows).tolist()]
    for (b, _, log_prob), prefix in zip(ends, prefixes, strict=True):
        score = log_prob / lp(len(prefix) + 1)  # |Y| counts EOS
        hyps = finished[b]
        hyps.append(Hypothesis(prefix, score, log_prob))
        hyps.sort(key=lambda h: h.score, reverse=True)  # stable: earlier ones win ties
        del hyps[kept:]
        n_finished[b] += 1


def _best_length_penalty(
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


def _sentence_done(
    hyps: list[Hypothesis],
    n_finished: int,
    enough: int,
    best_possible: float,
    t: int,
    max_len: int,
    nbest: int,
) -> bool:
    """A sentence stops after step t at its max length, once `enough` (> 0) of its hypotheses
    have finished (`n_finished`, its kept `hyps` and those that fell out of them), or once it
    holds `nbest` (the number it keeps) finished hypotheses and its best live one's
    `best_possible` score is no better than the worst."""
    return (
        t >= max_len
        or 0 < enough <= n_finished
        or (len(hyps) >= nbest and best_possible <= hyps[-1].score)
    )
