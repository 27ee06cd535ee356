"""Greedy and beam search, driven by hand-written step functions and by a tiny random model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from benchmarks.uncached import uncached_start
from cli.config import DecodeConfig
from cli.inference import decoding
from cli.inference.decoding import cached_start, search_batch
from data.batching import collate
from model.search import (
    Hypothesis,
    SearchSettings,
    beam_search,
    candidates,
    gnmt_length_penalty,
    greedy_search,
    kernels,
    row_argmax,
    row_topk,
)
from model.search.beam import best_extensions
from model.search.candidates import (
    NumpyCandidates,
    PythonCandidates,
    children_in_place,
    children_in_place_rows,
)
from model.search.rows import in_place_order
from model.transformer import ModelConfig, Transformer

PAD, BOS, EOS = 0, 2, 3


# -- hand-written step functions: the state is (N, 1 + t) long, the sentence id then the tokens fed


def reorder_rows(state: torch.Tensor, index: torch.Tensor, group: int) -> torch.Tensor:
    return state[index]


def start(batch_size: int) -> torch.Tensor:
    return torch.arange(batch_size)[:, None]  # (B, 1): each row's sentence id


def table_step(table: dict[tuple[int, ...], dict[int, float]], vocab_size: int, default_eos=0.9):
    """Next-token probabilities looked up by the tokens after BOS; unlisted mass spread evenly."""

    def distribution(prefix: tuple[int, ...]) -> torch.Tensor:
        listed = table.get(prefix, {EOS: default_eos})
        rest = (1.0 - sum(listed.values())) / (vocab_size - len(listed))
        probs = torch.full((vocab_size,), rest, dtype=torch.float64)
        for token, p in listed.items():
            probs[token] = p
        return probs.log()

    def step(tokens: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = torch.cat([state, tokens[:, None]], dim=1)  # (N, 1 + t)
        return torch.stack([distribution(tuple(row[2:])) for row in state.tolist()]), state

    return step


def random_step(vocab_size: int = 6, eos_growth: float = 0.6):
    """Random log-probabilities, fixed by (sentence, prefix); EOS likelier as the prefix grows."""

    def log_probs(row: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(tuple(row)) % 2**31)
        logits = 2 * torch.randn(vocab_size, generator=g, dtype=torch.float64)
        logits[EOS] += eos_growth * (len(row) - 2)
        return logits.log_softmax(0)

    def step(tokens: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = torch.cat([state, tokens[:, None]], dim=1)  # (N, 1 + t)
        return torch.stack([log_probs(row) for row in state.tolist()]), state

    return step


# The config's defaults of the settings that beam_search takes without a default of its own.
DEFAULTS = {"length_penalty": DecodeConfig.length_penalty, "patience": DecodeConfig.patience}


def hand_settings(**options) -> SearchSettings:
    """The search settings of these tests' hand steps: their BOS and EOS, and `options`."""
    return SearchSettings(bos_id=BOS, eos_id=EOS, **options)


def search(
    step, batch_size: int, max_lens: list[int], beam_size: int | None = None, prefix=None, **options
):
    """Greedy search when beam_size is None, else beam search; from a fresh hand-step state."""
    state, lens = start(batch_size), torch.tensor(max_lens)
    if beam_size is None:
        return greedy_search(step, state, reorder_rows, hand_settings(**options), lens, prefix)
    options = {**DEFAULTS, **options, "beam_size": beam_size}
    return beam_search(step, state, reorder_rows, hand_settings(**options), lens, prefix)


def has_repeated_ngram(tokens: list[int], n: int) -> bool:
    ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(ngrams) != len(set(ngrams))


def test_beam_one_equals_greedy_with_a_hand_step():
    step, max_lens = random_step(), [1, 4, 6, 3, 8, 0]
    greedy = search(step, 6, max_lens)
    beam = search(step, 6, max_lens, beam_size=1, length_penalty=0.0)
    assert [[h] for h in greedy] == beam
    assert len({len(h.tokens) for h in greedy}) > 2


def test_beam_finds_the_best_sequence_that_greedy_misses():
    # Greedy takes 4 (0.5) then can only end with 0.3: P = 0.15. Starting with 5 (0.4) leads
    # to EOS with 0.9: P = 0.36, the best sequence.
    table = {(): {4: 0.5, 5: 0.4, EOS: 0.05}, (4,): {EOS: 0.3, 4: 0.25, 5: 0.25}}
    step = table_step(table, vocab_size=6)
    (greedy,) = search(step, 1, [5])
    ((beam,),) = search(step, 1, [5], beam_size=2, length_penalty=0.0)
    assert greedy.tokens == [4] and greedy.log_prob == pytest.approx(math.log(0.15))
    assert beam.tokens == [5] and beam.log_prob == pytest.approx(math.log(0.36))


def all_outputs(step, sentence: int, max_len: int, vocab_size: int, alpha: float):
    """Every possible output of a sentence (tokens, GNMT score), by brute force."""
    words = [w for w in range(vocab_size) if w != EOS]
    outputs = [t for n in range(max_len + 1) for t in itertools.product(words, repeat=n)]
    scored = []
    for tokens in outputs:
        state, log_prob = torch.tensor([[sentence]]), 0.0
        for token, next_token in zip([BOS, *tokens], [*tokens, EOS], strict=True):
            log_probs, state = step(torch.tensor([token]), state)
            log_prob += log_probs[0, next_token].item()
        scored.append((list(tokens), log_prob / gnmt_length_penalty(len(tokens) + 1, alpha)))
    return sorted(scored, key=lambda pair: pair[1], reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0, -0.5])
def test_a_beam_holding_every_prefix_is_exact(alpha, reading):
    # 5 words and max_len 3: at most 25 * 6 = 150 candidates a step, so beam 150 loses nothing,
    # and the early stop (no live hypothesis can still win) must not lose the best either.
    step, vocab_size, max_len, nbest = random_step(vocab_size=6), 6, 3, 5
    options = dict(beam_size=150, length_penalty=alpha, nbest=nbest, patience=0.0)
    (hyps,) = search(step, 1, [max_len], **options)
    best = all_outputs(step, 0, max_len, vocab_size, alpha)[:nbest]
    assert [h.tokens for h in hyps] == [tokens for tokens, _ in best]
    assert [h.score for h in hyps] == pytest.approx([score for _, score in best])


def test_early_stop_waits_for_a_longer_hypothesis_that_can_still_win(reading):
    # [] scores log 0.6 = -0.51. [4 4 4] has log-prob log 0.4 + 3 log 0.999 = -0.92, but with
    # alpha 2 its score is -0.92 / ((5 + 4) / 6)^2 = -0.41: better. After the first step the live
    # [4] (-0.92) could still reach -0.92 / lp(max_len + 1) = -0.27, so the search must go on.
    table = {(): {EOS: 0.6, 4: 0.4}, (4,): {4: 0.999}, (4, 4): {4: 0.999}, (4, 4, 4): {EOS: 0.999}}
    step = table_step(table, vocab_size=6)
    ((best,),) = search(step, 1, [5], beam_size=2, length_penalty=2.0, patience=0.0)
    assert best.tokens == [4, 4, 4]
    assert best.score == pytest.approx((math.log(0.4) + 3 * math.log(0.999)) / 1.5**2)


def test_patience_stops_a_sentence_once_enough_hypotheses_finished(reading):
    # As above, [] finishes at the first step and [4 4 4] would beat it three steps later. With
    # beam 1, patience 1 allows one finished hypothesis: the search stops at []. Patience 2
    # waits for a second one, [4 4 4]; patience 0 waits until no live hypothesis can win.
    table = {(): {EOS: 0.6, 4: 0.4}, (4,): {4: 0.999}, (4, 4): {4: 0.999}, (4, 4, 4): {EOS: 0.999}}
    step = table_step(table, vocab_size=6)
    for patience, tokens in ((1.0, []), (2.0, [4, 4, 4]), (0.0, [4, 4, 4])):
        ((best,),) = search(step, 1, [5], beam_size=1, length_penalty=2.0, patience=patience)
        assert best.tokens == tokens, patience


def test_early_stop_with_a_negative_alpha_bounds_at_the_next_length():
    # alpha -1 favours short outputs: lp(Y) = 6 / (5 + |Y|). [] scores log 0.4 = -0.92; the live
    # [4] (log 0.6) can still reach -0.51 * 7/6 = -0.60 by ending next, and does.
    table = {(): {4: 0.6, EOS: 0.4}, (4,): {EOS: 0.999}}
    step = table_step(table, vocab_size=6)
    ((best,),) = search(step, 1, [5], beam_size=2, length_penalty=-1.0, patience=0.0)
    assert best.tokens == [4]
    assert best.score == pytest.approx((math.log(0.6) + math.log(0.999)) * 7 / 6)


def test_scores_use_the_gnmt_length_penalty():
    assert gnmt_length_penalty(3, 0.6) == pytest.approx((8 / 6) ** 0.6)
    assert gnmt_length_penalty(10, 0.0) == 1.0
    for alpha in (0.0, 0.6, 1.0):
        for hyps in search(random_step(), 3, [5, 2, 7], beam_size=3, length_penalty=alpha, nbest=3):
            for h in hyps:
                assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** alpha)


def test_nbest_returns_k_distinct_hypotheses_best_first(reading):
    for hyps in search(random_step(), 4, [6, 6, 3, 8], beam_size=5, nbest=4):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4


def test_min_len_forbids_early_eos():
    step = table_step({}, vocab_size=6, default_eos=0.95)  # EOS is always the likeliest
    assert [h.tokens for h in search(step, 2, [9, 9])] == [[], []]
    for h in search(step, 2, [9, 9], min_len=3):
        assert len(h.tokens) == 3
    for (h,) in search(step, 2, [9, 9], beam_size=3, min_len=3):
        assert len(h.tokens) == 3


def test_max_len_forces_eos():
    step = table_step({}, vocab_size=6, default_eos=0.001)  # EOS is never chosen freely
    assert [len(h.tokens) for h in search(step, 3, [2, 0, 5])] == [2, 0, 5]
    hyps = search(step, 3, [2, 0, 5], beam_size=2)
    assert [len(h[0].tokens) for h in hyps] == [2, 0, 5]


def test_no_repeat_ngram_size():
    # Token 4 is always the likeliest: 4 4 4 ... unless bigrams may not repeat.
    loves_4 = table_step({(4,) * n: {4: 0.6, EOS: 0.001} for n in range(10)}, 8, 0.001)
    ((plain,),) = search(loves_4, 1, [6], beam_size=3)
    assert plain.tokens == [4] * 6
    for hyps in search(loves_4, 1, [6], beam_size=3, nbest=3, no_repeat_ngram_size=2):
        for h in hyps:
            assert not has_repeated_ngram(h.tokens, 2)
    for hyps in search(
        random_step(vocab_size=5, eos_growth=0.0),
        3,
        [8] * 3,
        beam_size=4,
        nbest=4,
        no_repeat_ngram_size=2,
    ):
        for h in hyps:
            assert not has_repeated_ngram(h.tokens, 2)


def test_batched_search_equals_one_sentence_at_a_time(reading):
    step, max_lens = random_step(), [5, 1, 7, 4]

    def alone(b: int, **options):
        state, lens = torch.tensor([[b]]), torch.tensor([max_lens[b]])
        if "beam_size" in options:
            return beam_search(step, state, reorder_rows, hand_settings(**options), lens)[0]
        return greedy_search(step, state, reorder_rows, hand_settings(), lens)[0]

    assert search(step, 4, max_lens) == [alone(b) for b in range(4)]
    options = dict(beam_size=3, nbest=2, **DEFAULTS, no_repeat_ngram_size=2)
    assert search(step, 4, max_lens, **options) == [alone(b, **options) for b in range(4)]


def testbest_extensions_equal_one_top_k_over_every_beam_and_word():
    """The two-stage top-k (each row's n best, then each sentence's n best of those) selects
    what one top-k over a sentence's k V scores selects, with V well above n."""
    g = torch.Generator().manual_seed(3)
    B, k, V, n = 4, 3, 50, 6
    log_probs = torch.randn(B * k, V, generator=g, dtype=torch.float64).log_softmax(1)
    beam_log_probs = torch.randn(B * k, generator=g, dtype=torch.float64)
    top, rows, words = best_extensions(log_probs, beam_log_probs, k, n)
    flat = (beam_log_probs[:, None] + log_probs).view(B, k * V)
    want_top, want_flat = flat.topk(n, dim=1)
    assert torch.equal(top, want_top)
    assert torch.equal(rows, torch.arange(0, B * k, k)[:, None] + want_flat // V)
    assert torch.equal(words, want_flat % V)


def testbest_extensions_break_ties_by_rank_whatever_rows_hold_the_beams():
    """Beams kept in their parents' rows (`ranked` says which row holds which rank) give the
    extensions of the same beams in rank order, equal scores included."""
    g = torch.Generator().manual_seed(4)
    B, k, V, n = 3, 4, 6, 8
    # Scores from a few values: ties within and across beams.
    log_probs = -torch.randint(0, 3, (B * k, V), generator=g).double()
    beam_log_probs = -torch.randint(0, 2, (B * k,), generator=g).double()
    ranked = torch.stack([torch.randperm(k, generator=g) for _ in range(B)])  # rank -> row
    first = torch.arange(0, B * k, k)[:, None]
    held = torch.empty(B * k, dtype=torch.long)
    held[(first + ranked).flatten()] = torch.arange(B * k)  # row -> the hypothesis it holds
    top, rows, words = best_extensions(log_probs, beam_log_probs, k, n)
    moved = best_extensions(log_probs[held], beam_log_probs[held], k, n, ranked)
    assert torch.equal(moved[0], top) and torch.equal(moved[2], words)
    assert torch.equal(moved[1], first + ranked.gather(1, rows - first))


@pytest.mark.parametrize("blocks", [True, False])
def testbest_extensions_order_ties_as_greedy_does(blocks):
    """Equal log-probabilities in a row go to the lower id, greedy's argmax's choice (top-k
    returned 45 before 2 for a tie in a trained `tiny`, and beam 1 then wrote another
    translation than greedy); two log-probabilities that adding the beam's log-probability
    rounds to one float keep their order (float32: 1e-7 apart under a score of -40)."""
    V = 8000  # wide enough for `row_topk`'s blocks
    log_probs = torch.full((2, V), -12.0)
    log_probs[0, [2, 45, 3000, 7000]] = torch.tensor([-3.1889505, -3.1889505, -3.5, -3.1889505])
    log_probs[1, [60, 7]] = torch.tensor([-3.0000001, -3.0000002])
    beam_log_probs = torch.tensor([0.0, -40.0])
    assert row_argmax(log_probs).tolist() == [2, 60]
    for row in range(2):  # each row a sentence of one beam (beam 1)
        one = slice(row, row + 1)
        top, _, words = best_extensions(log_probs[one], beam_log_probs[one], 1, 4, blocks=blocks)
        assert words[0, 0].item() == [2, 60][row]
        assert torch.equal(top[0], top[0].sort(descending=True).values)
    top, _, words = best_extensions(log_probs[:1], beam_log_probs[:1], 1, 4, blocks=blocks)
    assert words[0, :3].tolist() == [2, 45, 7000]  # the three tied, in id order


def test_beam_one_equals_greedy_at_a_tie_of_three_at_the_top():
    """Three tokens equally likely at the top of a 100-token row: greedy takes the lowest id,
    and so must beam 1, whose two candidates a row top-k had taken from the other two."""
    table = {(): {7: 0.2, 5: 0.2, 4: 0.2}, (4,): {EOS: 0.9}, (5,): {EOS: 0.9}, (7,): {EOS: 0.9}}
    step = table_step(table, vocab_size=100)
    (greedy,) = search(step, 1, [4])
    ((beam,),) = search(step, 1, [4], beam_size=1, length_penalty=0.0)
    assert greedy.tokens == [4] and beam.tokens == greedy.tokens


@pytest.mark.parametrize("blocks", [True, False])
@pytest.mark.parametrize("V", [100, 8000])
def test_row_best_takes_the_lowest_columns_of_equal_values(V, blocks, blocks_at_any_size):
    """Each row's n best are the n that a stable sort in descending order puts first: of values
    equal to the n-th, the lowest columns (top-k's choice among them is its own: other columns
    in most tied rows of bf16 logits). Rows of `rows_to_rank` but its NaN one, and rows with a
    tie of three at the top."""
    g = torch.Generator().manual_seed(V)
    x = rows_to_rank(V, g)[:-1]
    three = torch.randn(2, V, generator=g)
    three[0, [V - 1, V // 2, 5]] = 9.0
    three[1, [V // 3, V - 2, V - 5]] = 9.0
    x = torch.cat([x, three.log_softmax(dim=1)])
    want = x.sort(dim=1, descending=True, stable=True)
    for n in (1, 2, 3, 10):
        top, columns = kernels.row_best(x, n, blocks)
        assert torch.equal(top, want.values[:, :n])
        assert torch.equal(columns.sort(dim=1).values, want.indices[:, :n].sort(dim=1).values)
        assert torch.equal(x.gather(1, columns), top)
        # The GPUs' way, over every row: the same columns.
        top, columns = x.topk(n + 1, dim=1)
        tied = top[:, n - 1] == top[:, n]
        top, columns = top[:, :n], columns[:, :n]
        columns = kernels.lowest_columns(x, top, columns, tied)
        assert torch.equal(columns.sort(dim=1).values, want.indices[:, :n].sort(dim=1).values)


class Widths(TorchFunctionMode):
    """Records the width (last dimension) of every call of op `name` (`topk`, `argmax`)
    inside it."""

    def __init__(self, name: str):
        super().__init__()
        self.funcs = (getattr(torch, name), getattr(torch.Tensor, name))
        self.widths: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.funcs:
            self.widths.append(args[0].size(-1))
        return func(*args, **(kwargs or {}))


def rows_to_rank(V: int, g: torch.Generator) -> torch.Tensor:
    """Rows of every kind `row_topk` meets: distinct values; a few values only (ties inside
    and at the edge of the n best); bf16-rounded; the best in the partial last block; -inf
    but for a few; all -inf; NaN (which top-k ranks first)."""
    distinct = torch.randn(6, V, generator=g)
    few = torch.randint(0, 4, (3, V), generator=g).float()
    rounded = torch.randn(3, V, generator=g).bfloat16().float()
    tail = torch.randn(2, V, generator=g)
    tail[:, -3:] += 10
    finite = torch.cat([distinct, few, rounded, tail]).log_softmax(dim=1)
    banned = torch.full((3, V), float("-inf"))
    banned[0, torch.randperm(V, generator=g)[:3]] = torch.randn(3, generator=g)
    banned[2, torch.randperm(V, generator=g)[:2]] = float("nan")
    return torch.cat([finite, banned])


@pytest.fixture
def blocks_at_any_size(monkeypatch):
    """`row_topk` and `row_argmax` read blocks of an x of any number of elements (they leave
    small ones to the plain ops), so that small test rows take the path large ones take."""
    monkeypatch.setattr(kernels, "TOPK_MIN_ELEMENTS", 0)
    monkeypatch.setattr(kernels, "ARGMAX_MIN_ELEMENTS", 0)


@pytest.mark.parametrize("V, n", [(8000, 10), (3001, 4), (1000, 3), (300, 10)])
def test_row_topk_equals_top_k(V, n, blocks_at_any_size):
    """The same values and columns as `topk`, in its order, equal values included; narrow
    rows (too few blocks) are `topk`'s own."""
    x = rows_to_rank(V, torch.Generator().manual_seed(V))
    (top, columns), want = row_topk(x, n), x.topk(n, dim=1)
    assert torch.equal(columns, want.indices)
    torch.testing.assert_close(top, want.values, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("V", [8000, 3001, 1000, 130, 128])
def test_row_argmax_equals_argmax(V, blocks_at_any_size):
    """The first largest column, as argmax: on `rows_to_rank`'s rows (ties, -inf, NaN, the best
    in the partial last block), and rows whose largest value recurs in a later block, in the
    partial last block too (whose columns the last whole block's end overlaps)."""
    x = rows_to_rank(V, torch.Generator().manual_seed(V))
    recurring = torch.zeros(3, V)
    recurring[0, [V // 3, V // 2, V - 1]] = 1.0  # in three blocks: the first of them
    recurring[1, [V - 60, V - 1]] = 1.0  # in the last whole block (or the overlap), and the last
    recurring[2, V - 1] = 1.0  # the very last column only
    x = torch.cat([x, recurring])
    assert torch.equal(row_argmax(x), x.argmax(dim=1))


def test_row_topk_reads_blocks_and_takes_only_tied_rows_whole():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(20, 8000, generator=g).log_softmax(dim=1)
    with Widths("topk") as untied:
        row_topk(x, 10)
    assert 8000 not in untied.widths
    x[3, :20] = x[3].max()  # one row with a tie among its best
    with Widths("topk") as tied:
        top, columns = row_topk(x, 10)
    assert tied.widths.count(8000) == 1
    assert columns[3].tolist() == x[3].topk(10).indices.tolist()


def test_small_inputs_take_the_plain_top_k_and_argmax():
    """Below TOPK_MIN_ELEMENTS (ARGMAX_MIN_ELEMENTS) elements, one top-k (argmax) over each
    whole row: faster there than the blocks' handful of ops."""
    x = torch.randn(5, 8000, generator=torch.Generator().manual_seed(6))
    assert x.numel() < kernels.TOPK_MIN_ELEMENTS
    with Widths("topk") as seen:
        row_topk(x, 10)
    assert seen.widths == [8000]
    with Widths("topk") as seen:
        row_topk(torch.cat([x, x]), 10)  # 80,000 elements: blocks
    assert 8000 not in seen.widths
    with Widths("argmax") as seen:
        row_argmax(x[:1])
        row_argmax(x[:2])
    assert seen.widths == [8000, 125, 64]  # the second over the blocks' maxima, then one block


@pytest.mark.parametrize("half_logits", [False, True])
def test_beam_search_ranks_rows_by_blocks_unless_the_logits_are_half(
    half_logits, blocks_at_any_size
):
    """Blocks (`row_topk`) or a top-k over each whole row: the same hypotheses; bf16 or fp16
    logits, tied most steps, take the latter. (No sentence reaches its length limit, where
    every token but EOS is -inf, a tie that `row_topk` hands to top-k.) V: 31 blocks, enough
    for `row_topk` to read blocks for `row_best`'s 2 x beam + 1 best (1,500's 23 were not)."""
    V = 2000
    step = random_step(vocab_size=V, eos_growth=2.0)
    plain = search(step, 3, [40] * 3, beam_size=2, nbest=2, half_logits=True)
    with Widths("topk") as seen:
        hyps = search(step, 3, [40] * 3, beam_size=2, nbest=2, half_logits=half_logits)
    assert hyps == plain and len({len(h.tokens) for n in hyps for h in n}) > 1
    assert (V in seen.widths) == half_logits


def test_beams_are_expanded_and_finished_sentences_dropped_by_reorder():
    # Sentence 0 ends at once (EOS is certain); sentence 1 goes on.
    table = {(): {EOS: 1.0}}
    step_0, step_1 = table_step(table, 6), random_step(eos_growth=0.0)

    def step(tokens, state):
        first = state[:, 0] == 0
        log_probs = torch.empty(len(tokens), 6, dtype=torch.float64)
        new_state = torch.cat([state, tokens[:, None]], dim=1)
        if first.any():
            log_probs[first] = step_0(tokens[first], state[first])[0]
        if (~first).any():
            log_probs[~first] = step_1(tokens[~first], state[~first])[0]
        return log_probs, new_state

    indices = []

    def reorder(state, index, group):
        indices.append(index)
        return state[index]

    common = (hand_settings(beam_size=3, **DEFAULTS), torch.tensor([4, 4, 4]))
    beam_search(step, torch.tensor([[1], [1], [1]]), reorder, *common)
    assert indices[0].tolist() == torch.arange(3).repeat_interleave(3).tolist()
    indices.clear()
    beam_search(step, torch.tensor([[0], [1], [1]]), reorder, *common)
    assert indices[0].tolist() == (torch.arange(1, 3).repeat_interleave(3)).tolist()


def test_children_take_their_parents_rows():
    # The row of each hypothesis (best first): a parent's first child stays in the parent's
    # row, the others fill the rows of parents with no child, in order.
    parents = [[0, 0, 2, 1], [3, 3, 3, 0], [1, 2, 3, 0]]
    rows = [[0, 3, 2, 1], [3, 1, 2, 0], [1, 2, 3, 0]]
    assert [children_in_place(p) for p in parents] == rows
    assert children_in_place_rows(np.array(parents)).tolist() == rows


@pytest.fixture(params=["python", "numpy"])
def reading(request, monkeypatch):
    """Beam search's candidates read in plain Python, or in numpy, whatever the batch."""
    monkeypatch.setattr(candidates, "NUMPY_SENTENCES", 10**9 if request.param == "python" else 0)
    return request.param


def test_python_and_numpy_read_the_candidates_alike():
    """Random candidates, EOS and -inf among them: the same ends, best live candidates and
    rows taken, in place or not, whichever reads them."""
    g = np.random.default_rng(0)
    ended = 0
    for B, k, beam_size in [(1, 1, 3), (1, 5, 5), (9, 4, 4), (30, 3, 3)]:
        C = min(2 * beam_size, k * 6)
        scores = -g.exponential(size=(B, C))
        scores[g.random((B, C)) < 0.1] = -np.inf
        scores = np.sort(scores, axis=1)[:, ::-1]  # best first
        rows = np.arange(B)[:, None] * k + g.integers(0, k, (B, C))
        ids = g.integers(4, 50, (B, C))
        for sentence in ids:  # at most one EOS a row, so at least C - k candidates live
            sentence[g.choice(C, size=g.integers(0, k + 1), replace=False)] = EOS
        k_next = min(beam_size, C - k)
        host = np.concatenate([scores, rows, ids], axis=1).astype(np.float64)
        py = PythonCandidates(host.tolist(), EOS, beam_size, k_next)
        npy = NumpyCandidates(host, EOS, beam_size, k_next)
        assert py.ended == npy.ended
        ended += len(py.ended)
        assert py.best_live == npy.best_live
        keep = sorted(g.choice(B, size=max(1, B // 2), replace=False).tolist())
        for in_place in [False, True] if k_next == k else [False]:
            a, b = py.take(keep, k if in_place else 0), npy.take(keep, k if in_place else 0)
            assert [list(x) for x in a[:3]] == [x.tolist() for x in b[:3]]
            assert a[3] == (None if b[3] is None else b[3].tolist())
    assert ended > 10


def test_a_few_sentences_are_read_in_python_and_many_in_numpy():
    def reader(sentences: int) -> type:
        host = torch.zeros(sentences, 6, dtype=torch.float64)  # C = 2 candidates, both live
        return type(candidates.read_candidates(host, EOS, 1, 1))

    n = candidates.NUMPY_SENTENCES
    assert (reader(1), reader(n - 1), reader(n)) == (
        PythonCandidates,
        PythonCandidates,
        NumpyCandidates,
    )


def test_rows_that_stay_keep_their_places():
    assert in_place_order([0, 1, 2]) == [0, 1, 2]
    assert in_place_order([0, 2, 3, 5]) == [0, 5, 2, 3]  # 5 takes the place 1 left
    assert in_place_order([3, 4]) == [3, 4]


@pytest.mark.parametrize("beam_size", [None, 3])
def test_reorders_move_only_the_rows_that_must(beam_size, reading):
    """After the first step a reorder keeps every surviving row, or group of a sentence's
    rows, in its place; only a beam's second and later children of one parent and the rows
    that fill a finished sentence's place move (what `rows_to_move` then copies)."""
    indices = []

    def reorder(state, index, group):
        indices.append((index, group))
        return state[index]

    step = random_step(vocab_size=7, eos_growth=0.3)
    max_lens = torch.tensor([9, 2, 9, 9, 3, 9])
    if beam_size is None:
        greedy_search(step, start(6), reorder, hand_settings(), max_lens)
    else:
        beam_search(
            step, start(6), reorder, hand_settings(beam_size=beam_size, **DEFAULTS), max_lens
        )
    k = beam_size or 1
    dropped = 0
    for index, group in indices[1 if beam_size else 0 :]:
        assert group == k
        sources = index.view(-1, k) // k  # (B'', k) the old place of each row's sentence
        assert (sources == sources[:, :1]).all()  # a sentence's rows stay together
        for place, (source, rows) in enumerate(zip(sources[:, 0].tolist(), index.view(-1, k))):
            if place in sources[:, 0].tolist():  # its sentence lives on: it stays in place
                assert source == place
                moved = int((rows != torch.arange(place * k, place * k + k)).sum())
                assert moved == k - rows.unique().numel()  # the second children only
            else:  # its sentence finished: one from past the end takes its place
                assert source >= sources.size(0)
                dropped += 1
    assert dropped  # the test saw sentences leave from the middle


# -- a tiny random model


def tiny_model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        d_model=16,
        n_heads=4,
        d_ff=32,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        tie_embeddings="none",
    )
    model = Transformer(config, 40, 40, PAD).double().eval()
    with torch.no_grad():
        model.generator.weight[EOS] *= 6  # so that outputs end at different lengths
    return model


def model_search(model: Transformer, cached: bool, beam_size: int | None, **options):
    """Search a fixed batch with decode_step (cached) or the uncached reference."""
    g = torch.Generator().manual_seed(7)
    src = torch.randint(4, 40, (5, 6), generator=g)
    src_pad = torch.arange(6)[None, :] >= torch.tensor([6, 3, 5, 2, 4])[:, None]  # (B, S)
    memory = model.encode(src.masked_fill(src_pad, PAD), src_pad)
    state, decode = (cached_start if cached else uncached_start)(model, memory, src_pad)

    def step(tokens, state):
        return F.log_softmax(decode(tokens, state), dim=-1), state

    max_lens = torch.tensor([9, 4, 8, 2, 6])
    if beam_size is None:
        return greedy_search(
            step, state, lambda s, i, g: s.reorder(i, g), hand_settings(**options), max_lens
        )
    options = {**DEFAULTS, **options, "beam_size": beam_size}
    return beam_search(
        step, state, lambda s, i, g: s.reorder(i, g), hand_settings(**options), max_lens
    )


@torch.no_grad()
def test_beam_one_equals_greedy_with_a_model():
    model = tiny_model()
    greedy = model_search(model, cached=True, beam_size=None)
    assert [[h] for h in greedy] == model_search(model, True, beam_size=1, length_penalty=0.0)
    assert len({len(h.tokens) for h in greedy}) > 1


def tokens_and_scores(hyps: list[list[Hypothesis]]) -> tuple[list, list]:
    """All tokens as nested lists, all scores as one flat list (for pytest.approx)."""
    return [[h.tokens for h in n] for n in hyps], [h.score for n in hyps for h in n]


@torch.no_grad()
@pytest.mark.parametrize("beam_size, options", [(None, {}), (4, dict(nbest=2, length_penalty=0.6))])
def test_cached_search_equals_uncached_search(beam_size, options):
    model = tiny_model()
    cached = model_search(model, cached=True, beam_size=beam_size, **options)
    uncached = model_search(model, cached=False, beam_size=beam_size, **options)
    if beam_size is None:
        cached, uncached = [[h] for h in cached], [[h] for h in uncached]
    cached_tokens, cached_scores = tokens_and_scores(cached)
    uncached_tokens, uncached_scores = tokens_and_scores(uncached)
    assert cached_tokens == uncached_tokens
    assert cached_scores == pytest.approx(uncached_scores)


@torch.no_grad()
@pytest.mark.parametrize("autocast", [False, True])
def test_translation_scores_are_the_models_log_probabilities(autocast, monkeypatch):
    """`search_batch`'s hypotheses score the model's log-softmax of each token (computed over
    the step's logits in place), and autocast's half logits reach beam search as such: the
    precision the search is asked to decode in (`decode.precision`, which `translate_ids`
    autocasts to) says so."""
    seen, original = [], decoding.beam_search

    def beam_search(step, state, reorder, settings, *args):
        seen.append(settings.half_logits)
        return original(step, state, reorder, settings, *args)

    monkeypatch.setattr(decoding, "beam_search", beam_search)
    model = tiny_model().float()
    src = [[5, 9, 13, 7], [21, 30], [8, 8, 6]]
    batch = collate(src, None, PAD, BOS, EOS, range(3))
    decode = DecodeConfig(
        beam_size=2,
        length_penalty=0.0,
        max_len_a=0.0,
        max_len_b=6,
        precision="bf16" if autocast else "fp32",
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        hyps = search_batch(model, batch, decode, BOS, EOS)
    assert seen == [autocast]
    if autocast:
        return
    for source, (best,) in zip(src, hyps):
        target = torch.tensor([[BOS, *best.tokens, EOS]])
        logits = model(
            torch.tensor([source]), target[:, :-1], torch.zeros(1, len(source)).bool(), None
        )
        log_prob = F.log_softmax(logits[0], dim=-1).gather(1, target[0, 1:, None]).sum()
        assert best.log_prob == pytest.approx(log_prob.item(), abs=1e-5)
