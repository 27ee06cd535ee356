"""Text in, text out with a model: sources batched by a token budget, greedy or beam search
over the model's cached decoding step, detokenising, and output in input order, streaming.

Used by `tf translate`, `tf eval`, validation inside training and the benchmarks.
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cli.config import DecodeConfig
from cli.device import inference_autocast
from cli.inference.requests import Guide
from cli.inference.shapes import Padded, pad_batch, padded_step, shapes_matter
from data.batching import Batch, batch_by_tokens, collate
from data.errors import InputError
from data.tokenizer import Tokenizer, split_tags
from model.constraints import constrained_beam_search, search_width
from model.ensemble import Ensemble
from model.search import (
    Hypothesis,
    LengthPenalty,
    Prefix,
    Sampling,
    beam_search,
    greedy_search,
    sample_search,
)
from model.transformer import Transformer

log = logging.getLogger(__name__)

CHUNK_LINES = 4096  # lines held in memory at once while streaming
# Interactive input: a group of lines ends when no new line came for this long. Long enough
# that a fast pipe still fills whole chunks, too short for a person to notice.
ARRIVAL_WAIT = 0.05


# How the decoder starts on a batch: (model, memory (B, S, D), src_pad_mask (B, S), the tokens
# a row is expected to be fed) -> the initial state and the step (tokens (N,), state) -> logits
# (N, V), a tensor of the step's own (the search turns it into log-probabilities in place).
# The default is the KV cache.
Start = Callable[[Transformer, Tensor, Tensor, int], tuple[Any, Callable[[Tensor, Any], Tensor]]]


def cached_start(model: Transformer, memory: Tensor, src_pad_mask: Tensor, steps: int = 0):
    """The model's incremental decoding: O(t) work at step t, cross-attention K/V made once,
    self-attention's written in place into room for `steps` tokens."""
    return model.init_cache(memory, src_pad_mask, steps), model.decode_step


def is_greedy(decode: DecodeConfig) -> bool:
    """Beam 1 with one hypothesis is greedy search exactly (without its bookkeeping)."""
    return decode.beam_size == 1 and decode.nbest == 1 and not decode.sampling


def decode_overrides(
    beam: int | None, greedy: bool, nbest: int | None, lenpen: float | None, sets: list[str]
) -> list[str]:
    """The `decode.KEY=VALUE` overrides that `--beam`, `--greedy`, `--nbest`, `--lenpen` and
    `--set` ask for, the short flags first (so `--set` has the last word)."""
    if beam is not None and beam < 1:
        raise InputError(f"--beam must be 1 or more, got {beam}")
    if nbest is not None and nbest < 1:
        raise InputError(f"--nbest must be 1 or more, got {nbest}")
    if lenpen is not None and not math.isfinite(lenpen):  # else blamed on --set
        raise InputError(f"--lenpen must be a finite number, got {lenpen}")
    if greedy and beam not in (None, 1):
        raise InputError(f"--greedy and --beam {beam} contradict each other; give one")
    width = 1 if greedy else beam
    if nbest is not None and width is not None and nbest > width:
        raise InputError(f"--nbest {nbest} needs --beam {nbest} or more")
    flags = []
    if greedy or beam is not None:
        flags.append(f"decode.beam_size={1 if greedy else beam}")
    if nbest is not None:
        flags.append(f"decode.nbest={nbest}")
    if lenpen is not None:
        flags.append(f"decode.length_penalty={lenpen}")
    return flags + list(sets)


# no_grad, not inference_mode: under inference_mode autocast casts every weight to half
# precision at every step (its cache of casts is off there); under no_grad once per batch. On 2
# cores (`demo`, bf16, groups of 16 sentences) a search went at 106 sentences/s against 78.
@torch.no_grad()
def search_batch(
    model: Transformer | Ensemble,
    batch: Batch,
    decode: DecodeConfig,
    bos_id: int,
    eos_id: int,
    start: Start = cached_start,
    guides: list[Guide | None] | None = None,
    pad_id: int | None = None,
) -> list[list[Hypothesis]]:
    """Translate one padded batch of source ids: `decode.nbest` hypotheses per sentence, best
    first, with `decode`'s search settings; a sentence's guide forces a prefix (any search)
    or constraints (beam search, `model.constraints`; greedy is its beam of 1). `pad_id`, when
    given, is never chosen: a model whose decoder starts from it (Marian's, `decoder_start:
    pad`) sees it as an input and may rate it high as an output, which no target ever was.
    It is banned after the softmax, as transformers bans OPUS-MT's `bad_words_ids`, so that
    an imported model searches exactly as `generate` does."""
    limit = model.config.max_positions - 1
    max_lens = length_limits(model, batch, decode)
    # Room for as many target tokens as source tokens, which most rows stay within (the cache
    # doubles for those that do not). Room for the limit (the source + 50), buffers 2.5 times
    # the size used, made greedy search slower than growing the cache by concatenation.
    cache, decode_step = encoded(model, batch, start, batch.src.size(1) + 1)
    step = log_prob_step(decode_step, eos_id, pad_id)

    def reorder(state: Any, index: Tensor, group: int) -> Any:
        return state.reorder(index, group)

    common = dict(
        batch_size=batch.src.size(0),
        bos_id=bos_id,
        eos_id=eos_id,
        max_lens=max_lens,
        min_len=decode.min_len,
        no_repeat_ngram_size=decode.no_repeat_ngram_size,
        prefix=prefix_tensor(guides, batch.src.device),
        score_forced_eos=decode.score_forced_eos,
        renormalize=decode.renormalize,
    )
    beam = dict(
        beam_size=decode.beam_size,
        length_penalty=length_penalty(decode),
        nbest=decode.nbest,
        patience=decode.patience,
        beam_stop=decode.beam_stop,
    )
    if guides and any(g and g.constraints for g in guides):
        constraints = [g.constraints if g else () for g in guides]
        return constrained_beam_search(
            step, cache, reorder, constraints=constraints, **beam, **common
        )
    if decode.sampling:
        return _sample(step, cache, reorder, batch, decode, limit, common)
    if is_greedy(decode):
        return [[h] for h in greedy_search(step, cache, reorder, **common)]
    # Under autocast the logits are bf16 or fp16, whose ties make `row_topk` slower than top-k.
    half_logits = torch.is_autocast_enabled(batch.src.device.type)
    return beam_search(step, cache, reorder, **beam, **common, half_logits=half_logits)


def length_limits(model: Transformer | Ensemble, batch: Batch, decode: DecodeConfig) -> Tensor:
    """(B,) long, the most tokens each sentence's output may hold: `decode.max_len_a` x its
    source length + `max_len_b`, within the model's positions."""
    src_lens = (~batch.src_pad_mask).sum(dim=1)  # (B,)
    limit = model.config.max_positions - 1
    return (decode.max_len_a * src_lens + decode.max_len_b).clamp(1, limit).long()


def length_penalty(decode: DecodeConfig) -> LengthPenalty:
    """The length penalty `decode` ranks finished hypotheses by (`model.search.LengthPenalty`)."""
    return LengthPenalty(decode.length_penalty, power=decode.length_penalty_form == "power")


def log_prob_step(decode_step: Callable[[Tensor, Any], Tensor], eos_id: int, pad_id: int | None):
    """The searches' step: a decoding step's logits as float32 log-probabilities (N, V), with
    `pad_id` (unless it is EOS) at -inf (`search_batch`)."""

    def step(tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        # In place over the logits, no second (N, V) tensor a step: (600, 8000) float32 took
        # 1.5 ms instead of 2.1 (19 MB past the caches; Xeon with AMX, 2 cores).
        logits = decode_step(tokens, state).float()  # (N, V)
        log_probs = torch.log_softmax(logits, dim=-1, out=logits)
        if pad_id is not None and pad_id != eos_id:
            log_probs[:, pad_id] = float("-inf")
        return log_probs, state

    return step


def encoded(model: Transformer | Ensemble, batch: Batch, start: Start, steps: int):
    """The batch encoded, and the decoder's initial state and step over it (`Start`), with
    room for `steps` tokens a row; where shapes matter, from a few sizes (`cli.inference.shapes`),
    the search seeing its own only."""
    if not shapes_matter(model, batch.src.device):
        memory = model.encode(batch.src, batch.src_pad_mask)  # (B, S, D), a list for an ensemble
        return start(model, memory, batch.src_pad_mask, steps)
    src, src_pad_mask = pad_batch(batch, model.config.max_positions)  # (B', S'), S' >= S
    state, decode_step = start(model, model.encode(src, src_pad_mask), src_pad_mask, steps)
    return Padded(state, batch.src.size(0), src.size(0), 1), padded_step(decode_step)


def _sample(step, cache, reorder, batch: Batch, decode: DecodeConfig, limit: int, common: dict):
    """`decode.beam_size` samples of each sentence, its nbest best kept (`sample_search`)."""
    return sample_search(
        step,
        cache,
        reorder,
        samples=decode.beam_size,
        sampling=Sampling(decode.sampling_topk, decode.sampling_topp, decode.sampling_temperature),
        noise=sample_noise(batch, decode, limit + 1).to(batch.src.device),
        length_penalty=length_penalty(decode),
        nbest=decode.nbest,
        **common,
    )


def prefix_tensor(guides: list[Guide | None] | None, device: torch.device) -> Prefix | None:
    """Each sentence's forced first tokens, (B, L) long padded with -1: its language token
    (certain, `Guide.forced`), then its prefix; None when none has any."""
    prefixes = [list(g.forced + g.prefix) if g else [] for g in guides or []]
    if not any(prefixes):
        return None
    certain = {len(g.forced) if g else 0 for g in guides}
    if len(certain) > 1:  # one model's lines all have a language token to write, or none
        raise ValueError(f"sentences forced to write {sorted(certain)} language tokens")
    longest = max(map(len, prefixes))
    rows = [p + [-1] * (longest - len(p)) for p in prefixes]
    return Prefix(torch.tensor(rows, dtype=torch.long, device=device), certain.pop())


def sample_noise(batch: Batch, decode: DecodeConfig, steps: int) -> Tensor:
    """The uniform numbers sampling draws with, (B, beam_size, steps): each sentence's from a
    generator seeded by `decode.seed` and its source ids, so that its samples are the same
    whatever batch it lands in (another chunk size, a resumed run) and differ by seed."""
    rows = []
    for ids, pad in zip(batch.src.tolist(), batch.src_pad_mask.tolist()):
        sentence = np.array([i for i, p in zip(ids, pad) if not p], dtype=np.int64)
        digest = hashlib.blake2b(sentence.tobytes(), digest_size=8, key=str(decode.seed).encode())
        generator = torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") >> 1)
        rows.append(torch.rand(steps, decode.beam_size, generator=generator).T)
    return torch.stack(rows)


def translate_ids(
    model: Transformer | Ensemble,
    tokenizer: Tokenizer,
    src_ids: list[list[int]],
    decode: DecodeConfig,
    device: torch.device,
    max_sentences: int = 1024,
    start: Start = cached_start,
    guides: list[Guide | None] | None = None,
) -> list[list[Hypothesis]]:
    """Search for every source (already encoded and truncated), results in input order; each
    may have a guide (`cli.inference.requests`), checked to fit its length limit.

    Sources are batched by `decode.max_tokens` source tokens, and by the rows their search
    keeps: a line with constraints is searched at a wider beam (`search_width`), so it is
    batched with lines of its width, under a budget cut in proportion."""
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
    todo = [i for i, ids in enumerate(src_ids) if ids]  # empty lines stay empty
    widths = search_widths(decode, guides, len(src_ids))
    start_id = tokenizer.decoder_start_id(model.config.decoder_start)
    for width in sorted({widths[i] for i in todo}):
        members = [i for i in todo if widths[i] == width]
        costs = [-(-len(src_ids[i]) * width // decode.beam_size) for i in members]
        for group in batch_by_tokens(costs, [0] * len(costs), decode.max_tokens, max_sentences):
            rows = [members[j] for j in group]
            batch = collate(
                [src_ids[i] for i in rows],
                None,
                tokenizer.pad_id,
                start_id,
                tokenizer.eos_id,
                rows,
                src_pad_id=tokenizer.src_pad_id,
            ).to(device)
            with inference_autocast(device, decode.precision):
                hyps = search_batch(
                    model,
                    batch,
                    decode,
                    start_id,
                    tokenizer.eos_id,
                    start,
                    [guides[i] for i in rows] if guides else None,
                    pad_id=tokenizer.pad_id if model.config.decoder_start == "pad" else None,
                )
            for i, h in zip(rows, hyps):
                results[i] = h
    return results


def search_widths(decode: DecodeConfig, guides: list[Guide | None] | None, n: int) -> list[int]:
    """The rows each of `n` sources' search keeps: the beam (or samples), wider for a line
    with constraints (`model.constraints.search_width`)."""
    if not guides:
        return [decode.beam_size] * n
    return [
        search_width(decode.beam_size, g.constraints) if g else decode.beam_size for g in guides
    ]


def source_ids(tokenizer: Tokenizer, lines: list[str]) -> list[list[int]]:
    """The ids of raw lines; a line of no text has none: a blank one, or one of tags alone (a
    target-language token, say), which stays empty as a blank line does, whatever a tokenizer
    appends (Marian's ends every source, an empty one too, in EOS)."""
    ids = tokenizer.encode_src([line.strip() for line in lines])
    tags = tuple(tokenizer.tags)
    return [row if split_tags(line, tags)[1].strip() else [] for line, row in zip(lines, ids)]


def encode_sources(
    tokenizer: Tokenizer, lines: list[str], max_len: int, source: str, first_line: int
) -> list[list[int]]:
    """Encode raw lines; a line longer than the model's limit is cut, with one warning."""
    ids = source_ids(tokenizer, lines)
    for n, seq in enumerate(ids):
        if len(seq) > max_len:
            log.warning(
                "%s:%d: %d pieces, truncated to the model's limit of %d",
                source,
                first_line + n,
                len(seq),
                max_len,
            )
            ids[n] = tokenizer.truncate_src(seq, max_len)
    return ids


def chunks(lines: Iterable[str], size: int | None = None) -> Iterator[list[str]]:
    """Lists of `size` lines (default: CHUNK_LINES, read at call time), the last one shorter."""
    size = size or CHUNK_LINES
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def as_they_arrive(
    lines: Iterable[str], size: int | None = None, wait: float | None = None
) -> Iterator[list[str]]:
    """Groups of the lines that arrived together, for a terminal or a slow pipe: a group ends
    when `wait` seconds (default ARRIVAL_WAIT) pass without a new line, or at `size` lines
    (default CHUNK_LINES), so each line typed is answered as soon as it is complete while a
    fast pipe still gets whole chunks. A thread reads ahead; its errors are raised here."""
    size, wait = size or CHUNK_LINES, ARRIVAL_WAIT if wait is None else wait
    arrived: queue.Queue = queue.Queue(maxsize=size)
    end = object()

    def read() -> None:
        try:
            for line in lines:
                arrived.put(line)
        except Exception as err:  # noqa: BLE001 - handed to the consumer, which raises it
            arrived.put(err)
        arrived.put(end)

    threading.Thread(target=read, daemon=True).start()  # daemon: Ctrl-C is not held up
    group: list[str] = []
    while True:
        try:
            item = arrived.get(timeout=wait) if group else arrived.get()
        except queue.Empty:  # nothing more for now: answer what came
            yield group
            group = []
            continue
        if item is end:
            break
        if isinstance(item, Exception):
            raise item
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


# How lines are grouped into what is translated at once: `chunks` or `as_they_arrive`.
Grouping = Callable[[Iterable[str]], Iterable[list[str]]]


def format_hypotheses(
    tokenizer: Tokenizer, hyps: list[Hypothesis], scores: bool, nbest: int
) -> list[str]:
    """Output lines for one input: the best translation, or `nbest` lines (`i ||| text ||| s`)."""
    texts = tokenizer.decode_tgt([h.tokens for h in hyps])
    if nbest == 1:
        return [f"{texts[0]}\t{hyps[0].score:.4f}" if scores else texts[0]]
    return [
        f"{k} ||| {t} ||| {h.score:.4f}" if scores else f"{k} ||| {t}"
        for k, (t, h) in enumerate(zip(texts, hyps))
    ]
