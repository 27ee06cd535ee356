"""The rules every search applies to a step's log-probabilities before it chooses: the length
limits, the n-gram ban and a forced prefix (`StepRules`), over the live rows (`Beams`).

Lengths: a hypothesis holds at most max_lens[b] tokens; at that length EOS is the only choice
(as fairseq), so every hypothesis ends in EOS and its log-probability includes EOS's. Tokens are
returned without BOS and EOS; the length |Y| in the length penalty counts EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.search.rows import Beams
from model.search.settings import SearchSettings


@dataclass(frozen=True)
class Prefix:
    """Each sentence's forced first tokens, `tokens` (B, L) long padded with -1: a user's
    target prefix, whose log-probabilities count in the score, after the first `certain`
    columns, which count as certain (log-probability 0): a language token the decoder is made
    to write (NLLB's, M2M100's, mBART-50's: transformers' `forced_bos_token_id`), no choice of
    the model's. A plain (B, L) tensor is a prefix with none certain."""

    tokens: Tensor
    certain: int = 0


def as_prefix(prefix: Tensor | Prefix | None) -> Prefix | None:
    return Prefix(prefix) if isinstance(prefix, Tensor) else prefix


def force_prefix(log_probs: Tensor, t: int, prefix: Prefix | None, sentence: Tensor) -> Tensor:
    """At step t, a row whose sentence's prefix is longer than t may take only its prefix's
    token t (the rest -inf; its log-probability still counts in the score, or is 0 in the
    prefix's certain columns).

    Shape: log_probs (N, V); prefix's tokens (B, L); sentence (N,) the row's sentence -> (N, V).
    """
    if prefix is None or t >= prefix.tokens.size(1):
        return log_probs
    forced = prefix.tokens[sentence, t]  # (N,) -1: free
    allowed = torch.zeros_like(log_probs, dtype=torch.bool)
    allowed.scatter_(1, forced.clamp(min=0)[:, None], True)
    if t < prefix.certain:  # the model's to write, however it rates it
        log_probs = log_probs.masked_fill(allowed, 0.0)
    return log_probs.masked_fill((forced >= 0)[:, None] & ~allowed, float("-inf"))


class StepRules:
    """What every search forbids at step t, for one batch of sentences: the length rules
    (`restrict_length`), repeated n-grams, and all but a forced prefix's token. The forced
    prefix is exempt from the n-gram ban, as in CTranslate2: it is the user's text, repeats
    and all, and banning its own tokens would leave a row with no token at all; the tokens the
    search adds after it are banned from repeating any n-gram of the whole output, the
    prefix's included. With `renormalize` the log-probabilities are normalised again after the
    length and n-gram rules, before the prefix: its tokens keep the model's log-probabilities.

    max_lens (B,) long: the most tokens of each sentence's output (EOS not counted), on the
    device of the step's tensors; `host_max_lens` the same on the host. prefix: (B, L) long,
    a `Prefix`, or None: each output starts with its sentence's tokens (padded with -1).
    """

    def __init__(
        self, settings: SearchSettings, max_lens: Tensor, prefix: Tensor | Prefix | None = None
    ):
        self.settings, self.max_lens, self.prefix = settings, max_lens, as_prefix(prefix)
        self.host_max_lens: list[int] = max_lens.tolist()
        # The smallest max length, known on the host: before it no row is at its limit.
        self.shortest = min(self.host_max_lens)

    def __call__(self, log_probs: Tensor, t: int, beams: Beams) -> Tensor:
        """Shape: log_probs (N, V) of step t for the rows of `beams` -> (N, V)."""
        s, prefix = self.settings, self.prefix
        row_max_lens = self.max_lens[beams.sentence]
        log_probs = restrict_length(
            log_probs, t, row_max_lens, s.eos_id, s.min_len, self.shortest, s.score_forced_eos
        )
        banned = ban_repeated_ngrams(log_probs, beams.tokens, s.no_repeat_ngram_size)
        if prefix is not None and t < prefix.tokens.size(1) and banned is not log_probs:
            in_prefix = (prefix.tokens[beams.sentence, t] >= 0)[:, None]  # (N, 1) forced now
            banned = torch.where(in_prefix, log_probs, banned)
        if s.renormalize:
            banned = renormalize(banned)
        return force_prefix(banned, t, prefix, beams.sentence)


def restrict_length(
    log_probs: Tensor,
    t: int,
    max_lens: Tensor,
    eos_id: int,
    min_len: int,
    shortest: int,
    score_forced_eos: bool = True,
) -> Tensor:
    """Forbid EOS before min_len tokens; force it once a row holds max_lens tokens (that wins),
    its log-probability kept, or 0 (certain) without `score_forced_eos`. `shortest` is the
    smallest of the batch's max_lens, known on the host: before it no row is at its limit,
    and the two (N, V) passes that force EOS are skipped.

    Shape: log_probs (N, V), max_lens (N,) per row -> (N, V).
    """
    if t >= min_len and t < shortest:
        return log_probs
    is_eos = torch.arange(log_probs.size(1), device=log_probs.device) == eos_id  # (V,)
    restricted = log_probs.masked_fill(is_eos, float("-inf")) if t < min_len else log_probs
    if t < shortest:
        return restricted
    if score_forced_eos:
        forced = log_probs.masked_fill(~is_eos, float("-inf"))
    else:
        forced = torch.zeros_like(log_probs[:1]).masked_fill(~is_eos, float("-inf"))  # (1, V)
    return torch.where((max_lens <= t)[:, None], forced, restricted)


def renormalize(log_probs: Tensor) -> Tensor:
    """Log-probabilities normalised again over the tokens the rules left (transformers'
    `renormalize_logits`); a row with none left stays as it is (all -inf).

    Shape: (N, V) -> (N, V).
    """
    some_left = log_probs.amax(dim=1, keepdim=True) > float("-inf")  # (N, 1)
    return torch.where(some_left, torch.log_softmax(log_probs, dim=1), log_probs)


def ban_repeated_ngrams(log_probs: Tensor, tokens: Tensor, n: int) -> Tensor:
    """Forbid every token that would complete an n-gram already in the row's tokens.

    Shape: log_probs (N, V), tokens (N, t) -> (N, V).
    """
    if n <= 0 or tokens.size(1) < n:
        return log_probs
    windows = tokens.unfold(1, n, 1)  # (N, W, n): every n-gram so far
    last = tokens[:, tokens.size(1) - n + 1 :]  # (N, n - 1): the n-gram the next token completes
    match = (windows[:, :, :-1] == last[:, None, :]).all(dim=-1)  # (N, W)
    banned = torch.zeros_like(log_probs).scatter_add_(1, windows[:, :, -1], match.to(log_probs))
    return log_probs.masked_fill(banned > 0, float("-inf"))
