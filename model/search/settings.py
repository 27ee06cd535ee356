"""What a search is asked for, and what it gives back: `SearchSettings`, one value for every
search (the decode settings' mapping to it is `cli.inference.decoding.search_settings`), the
length penalty and the stopping rule it ranks and stops by, and `Hypothesis`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from torch import Tensor

State = TypeVar("State")
StepFn = Callable[[Tensor, State], tuple[Tensor, State]]
ReorderFn = Callable[[State, Tensor, int], State]


@dataclass
class Hypothesis:
    tokens: list[int]  # no BOS, no EOS
    score: float  # length-penalised log-probability (the log-probability for greedy)
    log_prob: float  # sum of the tokens' log-probabilities, EOS included


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


# What ends a sentence's beam search besides its max length and patience (`Finished.done`):
# "bound" once no live hypothesis can beat its nbest finished ones, at any length it may reach;
# "current_length", transformers' default (`early_stopping: false`), once beam_size of its
# hypotheses have finished and the best live one, scored at its current length, does not beat
# the worst of them: a heuristic, sooner where the length penalty rewards length, which may
# miss a longer, better hypothesis.
BeamStop = Literal["bound", "current_length"]


@dataclass(frozen=True)
class Sampling:
    """What random sampling draws from (the settings of fairseq, Marian and CTranslate2)."""

    topk: int  # the k most probable tokens; -1: every token
    topp: float = 1.0  # then the fewest most probable ones whose probability reaches p
    temperature: float = 1.0  # log-probabilities divided by it first (<1 sharper, >1 flatter)


@dataclass(frozen=True)
class SearchSettings:
    """Every setting of a search but its sentences (their max lengths, prefixes, constraints
    and noise, which come with each batch). The defaults of the ranking and stopping settings
    are the neutral ones (no length penalty, no stop by count) for hand-written steps: the
    decode settings' own defaults are `cli.config.DecodeConfig`'s, mapped here in one place
    (`cli.inference.decoding.search_settings`).

    Two step rules make a search transformers' `generate` (an imported model's settings): the
    EOS forced at the length limit counted as certain (`score_forced_eos` false, transformers'
    `forced_eos_token_id`), and the log-probabilities normalised again after the rules forbid
    tokens (`renormalize`, its `renormalize_logits`); and one stopping rule, `beam_stop`
    "current_length" (its `early_stopping: false`).
    """

    bos_id: int  # the first token fed
    eos_id: int  # the token that ends a hypothesis
    # Beam search's live hypotheses per sentence; sampling's samples per sentence.
    beam_size: int = 1
    nbest: int = 1  # hypotheses returned per sentence, at most beam_size
    # lp, by which beam search and sampling rank finished hypotheses (log P / lp(|Y|)); a plain
    # number is GNMT's alpha (made a `LengthPenalty`). Greedy search has none: its score is
    # the log-probability.
    length_penalty: LengthPenalty | float = LengthPenalty(0.0)
    # Beam search stops a sentence once round(beam_size x patience) (at least nbest) of its
    # hypotheses have finished, kept or not (CTranslate2's `patience`, Kasai et al., 2022);
    # 0: only at its max length or when no live hypothesis can still win (exhaustive up to
    # the beam).
    patience: float = 0.0
    beam_stop: BeamStop = "bound"
    min_len: int = 0  # EOS is forbidden before this many tokens
    # n > 0 forbids repeating any n-gram within a hypothesis (a forced prefix is exempt:
    # `model.search.rules.apply_step_rules`).
    no_repeat_ngram_size: int = 0
    score_forced_eos: bool = True  # the EOS forced at max_lens counts its log-probability; else 0
    renormalize: bool = False  # log-probabilities normalised again after the rules
    # The step's log-probabilities come from bf16 or fp16 logits, so equal values are common
    # (in float32 rare: docs/performance.md has the counts): `row_topk` would take most rows
    # twice, so beam search reads each row whole by top-k.
    half_logits: bool = False
    sampling: Sampling | None = None  # what `sample_search` draws from; None: no sampling

    def __post_init__(self) -> None:
        object.__setattr__(self, "length_penalty", as_length_penalty(self.length_penalty))
