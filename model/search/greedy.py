"""Greedy search and random sampling: one token per row at every step, the most probable one
or one drawn from the model's distribution, for B sentences at once."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from model.search.kernels import row_argmax
from model.search.rows import Beams, in_place_order, on_device
from model.search.rules import Prefix, StepRules
from model.search.settings import Hypothesis, ReorderFn, Sampling, SearchSettings, State, StepFn

# How a row's next token is chosen: (log_probs (N, V), t, rows (N,)) -> (N,) long, `rows` the
# index of each live row among all sentences x rows a sentence.
Choose = Callable[[Tensor, int, Tensor], Tensor]


def greedy_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    settings: SearchSettings,
    max_lens: Tensor,
    prefix: Tensor | Prefix | None = None,
) -> list[Hypothesis]:
    """The most probable next token at every step, for B sentences at once.

    Args:
        step, state, reorder: as in `model.search`; state holds B rows.
        settings: the ids and step rules (`SearchSettings`; the beam settings are not read).
        max_lens: (B,) long, the most tokens of each sentence's output (EOS not counted), on
            the device of the step's tensors.
        prefix: (B, L) long, a `Prefix`, or None: each output starts with its row's tokens
            (padded with -1; `model.search.rules.force_prefix`). max_lens must leave room.

    Returns:
        B hypotheses in input order, score = log_prob.
    """

    def most_probable(log_probs: Tensor, t: int, rows: Tensor) -> Tensor:
        return row_argmax(log_probs)  # ties go to the first id

    rows = _row_search(step, state, reorder, most_probable, settings, max_lens, prefix, 1)
    return [Hypothesis(tokens, log_prob, log_prob) for tokens, log_prob in rows]


def sample_search(
    step: StepFn,
    state: State,
    reorder: ReorderFn,
    settings: SearchSettings,
    max_lens: Tensor,
    noise: Tensor,
    prefix: Tensor | Prefix | None = None,
) -> list[list[Hypothesis]]:
    """Random samples, token by token, `settings.beam_size` per sentence for B sentences at
    once: the next token is drawn from the model's distribution cut to `settings.sampling`'s
    top-k and top-p, tempered, as greedy search takes its most probable one (the same length
    rules). A sentence's samples are ranked by log P / lp(|Y|) (`settings.length_penalty`),
    its `settings.nbest` best returned.

    The draws are inverse-CDF lookups of given uniform numbers, so a sample depends on its own
    noise only, never on which sentences share its batch: the caller makes the noise (from a
    seed and the sentence, say) and the same noise gives the same samples. Top-k 1 is greedy.

    Args:
        step, state, reorder: as in `model.search`; state holds B rows, expanded to B x samples
            rows (a sentence's samples adjacent) after the first step.
        settings: as `greedy_search`'s, with `sampling`, `beam_size` (samples) and `nbest`.
        max_lens, prefix: as in `greedy_search`.
        noise: (B, samples, T) uniform in [0, 1), T > max(max_lens): the draw of step t of a
            sample is noise[b, s, t].

    Returns:
        For each sentence in input order, its nbest best-scoring samples.
    """
    samples, nbest, sampling = settings.beam_size, settings.nbest, settings.sampling
    if sampling is None:
        raise ValueError("sample_search needs settings.sampling")
    if not 1 <= nbest <= samples:
        raise ValueError(f"need 1 <= nbest <= samples, got nbest {nbest}, samples {samples}")
    batch_size = max_lens.numel()
    flat_noise = noise.reshape(batch_size * samples, -1)  # (B samples, T)
    lp = settings.length_penalty

    def draw(log_probs: Tensor, t: int, rows: Tensor) -> Tensor:
        return sample_tokens(log_probs, flat_noise[rows, t], sampling)

    rows = _row_search(step, state, reorder, draw, settings, max_lens, prefix, samples)
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
    choose: Choose,
    settings: SearchSettings,
    max_lens: Tensor,
    prefix: Tensor | Prefix | None,
    per_sentence: int,
) -> list[tuple[list[int], float]]:
    """Greedy search's loop: `per_sentence` rows for each sentence (its one row expanded after
    its first step), each row's token chosen by `choose`; a row leaves the live ones (through
    `reorder`) as it ends. Returns (tokens, log P) for every row, sentence-major."""
    device, batch_size = max_lens.device, max_lens.numel()
    rules = StepRules(settings, max_lens, prefix)
    beams = Beams.start(batch_size, device)
    row_ids = torch.arange(batch_size, device=device) * per_sentence  # (N,) of all rows
    tokens = torch.full((batch_size,), settings.bos_id, device=device)
    ended_rows: dict[int, tuple[list[int], float]] = {}
    for t in itertools.count():
        log_probs, state = step(tokens, state)
        if t == 0 and per_sentence > 1:
            expand = torch.arange(batch_size, device=device).repeat_interleave(per_sentence)
            state = reorder(state, expand, per_sentence)
            beams, log_probs = beams.take(expand), log_probs[expand]
            row_ids = torch.arange(batch_size * per_sentence, device=device)
        limits = max_lens[beams.sentence]  # (N,)
        log_probs = rules(log_probs, t, beams)
        tokens = choose(log_probs, t, row_ids)  # (N,)
        sum_log_probs = beams.log_probs + log_probs.gather(1, tokens[:, None]).squeeze(1)
        ended = (tokens == settings.eos_id) | (limits <= t)  # (N,) the latter even if EOS is -inf
        host_ended = ended.tolist()  # the step's one wait for the device
        if any(host_ended):
            rows = on_device([i for i, e in enumerate(host_ended) if e], device)
            for row, output, log_prob in zip(
                row_ids.index_select(0, rows).tolist(),
                beams.tokens.index_select(0, rows).tolist(),
                sum_log_probs.index_select(0, rows).tolist(),
                strict=True,
            ):
                ended_rows[row] = (output, log_prob)
            if all(host_ended):
                break
            live = on_device(in_place_order([i for i, e in enumerate(host_ended) if not e]), device)
            state = reorder(state, live, 1)
            beams, tokens, sum_log_probs = beams.take(live), tokens[live], sum_log_probs[live]
            row_ids = row_ids[live]
        beams = beams.extend(tokens, sum_log_probs)
    return [ended_rows[i] for i in range(batch_size * per_sentence)]
