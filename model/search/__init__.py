"""Greedy, sampling and beam search over a step function: ids in, ids and scores out.

Search knows nothing of the model or of text (as flax's examples/wmt/decode.py). It calls

    step(tokens, state) -> (log_probs, state)
        tokens (N,) long, the last token of each row (BOS first); log_probs (N, V), normalised.
    reorder(state, index, group) -> state
        index (N',) long: row i of the new state is row index[i] of the old one; the new rows
        come in groups of `group` consecutive rows (a sentence's beams). While no sentence
        leaves, each keeps its group's place; as some leave, others may fill their places.

A row is one hypothesis. Every search is batched over B sentences: the first step sees one row
per sentence, so `state` starts with B rows, and beam search's first reorder expands each to its
beams (index = arange(B).repeat_interleave(beam) then). A finished hypothesis is set aside, and
a finished sentence leaves the live rows through `reorder`, so it costs nothing further. What a
search is asked for besides its sentences is one `SearchSettings` value.

    settings.py     `SearchSettings`, `Hypothesis`, the length penalty, the stopping rules
    rules.py        the step rules: length limits, the n-gram ban, forced prefixes
    kernels.py      each row's best and argmax, read in blocks on CPUs
    greedy.py       greedy search and random sampling
    beam.py         the beam loop and its best-extensions strategy (`beam_search`)
    candidates.py   a beam step's candidates read on the host
    constraints.py  lexically constrained beam search, a strategy of the same loop
    rows.py         the live rows (`Beams`) and how they move
"""

from model.search.beam import (
    BeamStrategy,
    BestExtensions,
    Extension,
    Finished,
    beam_search,
    search_beams,
)
from model.search.constraints import Phrase, Progress, constrained_beam_search, search_width
from model.search.greedy import greedy_search, sample_search, sample_tokens
from model.search.kernels import row_argmax, row_best, row_topk
from model.search.rows import Beams
from model.search.rules import Prefix, StepRules, as_prefix
from model.search.settings import (
    BeamStop,
    Hypothesis,
    LengthPenalty,
    ReorderFn,
    Sampling,
    SearchSettings,
    StepFn,
    as_length_penalty,
    gnmt_length_penalty,
)

__all__ = [
    "BeamStop",
    "BeamStrategy",
    "Beams",
    "BestExtensions",
    "Extension",
    "Finished",
    "Hypothesis",
    "LengthPenalty",
    "Phrase",
    "Prefix",
    "Progress",
    "ReorderFn",
    "Sampling",
    "SearchSettings",
    "StepFn",
    "StepRules",
    "as_length_penalty",
    "as_prefix",
    "beam_search",
    "constrained_beam_search",
    "gnmt_length_penalty",
    "greedy_search",
    "row_argmax",
    "row_best",
    "row_topk",
    "sample_search",
    "sample_tokens",
    "search_beams",
    "search_width",
]
