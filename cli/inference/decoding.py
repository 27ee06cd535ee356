"""Text in, text out with a model: sources batched by a token budget, greedy or beam search
over the model's cached decoding step, detokenising, and output in input order, streaming.

Used by `tf translate`, `tf eval`, validation inside training and the benchmarks.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cli.config import DecodeConfig
from cli.device import autocast_dtype, inference_autocast
from cli.inference.requests import Guide
from cli.inference.shapes import Padded, pad_batch, padded_step, shapes_matter
from data.batching import Batch, batch_by_tokens, collate
from data.errors import InputError, counted
from data.segments import fit, join
from data.sentences import Span, Splitter, sentence_splitter
from data.tokenizer import Tokenizer, split_tags
from model.ensemble import Ensemble
from model.search import (
    Hypothesis,
    LengthPenalty,
    Prefix,
    Sampling,
    SearchSettings,
    beam_search,
    constrained_beam_search,
    greedy_search,
    sample_search,
    search_width,
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
# precision at every step (its cache of casts is off there); under no_grad once per batch
# (docs/performance.md has the figures).
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
    first, with `decode`'s search settings (`search_settings`); a sentence's guide forces a
    prefix (any search) or constraints (beam search, `model.search.constraints`; greedy is
    its beam of 1). `pad_id`, when given, is never chosen: a model whose decoder starts from
    it (Marian's, `decoder_start: pad`) sees it as an input and may rate it high as an
    output, which no target ever was. It is banned after the softmax, as transformers bans
    OPUS-MT's `bad_words_ids`, so that an imported model searches exactly as `generate`
    does."""
    settings = search_settings(decode, bos_id, eos_id, batch.src.device)
    max_lens = length_limits(model, batch, decode)
    # Room for as many target tokens as source tokens, which most rows stay within (the cache
    # doubles for those that do not). Room for the limit (the source + 50), buffers 2.5 times
    # the size used, made greedy search slower than growing the cache by concatenation.
    cache, decode_step = encoded(model, batch, start, batch.src.size(1) + 1)
    step = log_prob_step(decode_step, eos_id, pad_id)

    def reorder(state: Any, index: Tensor, group: int) -> Any:
        return state.reorder(index, group)

    prefix = prefix_tensor(guides, batch.src.device)
    if guides and any(g and g.constraints for g in guides):
        constraints = [g.constraints if g else () for g in guides]
        return constrained_beam_search(
            step, cache, reorder, settings, max_lens, constraints, prefix
        )
    if settings.sampling is not None:  # `decode.beam_size` samples, the nbest best kept
        noise = sample_noise(batch, decode, model.config.max_positions).to(batch.src.device)
        return sample_search(step, cache, reorder, settings, max_lens, noise, prefix)
    if is_greedy(decode):
        return [[h] for h in greedy_search(step, cache, reorder, settings, max_lens, prefix)]
    return beam_search(step, cache, reorder, settings, max_lens, prefix)


def search_settings(
    decode: DecodeConfig, bos_id: int, eos_id: int, device: torch.device
) -> SearchSettings:
    """The search settings `decode` asks for (`model.search.SearchSettings`): the one mapping
    from decode settings to a search's, for every search of tf's own engine (`tf translate`,
    `tf eval`, `tf serve`, validation). The logits are half (`half_logits`) where
    `decode.precision` autocasts on `device`, as `inference_autocast` applies it around every
    search: known from the settings, before any step."""
    sampling = None
    if decode.sampling:
        sampling = Sampling(decode.sampling_topk, decode.sampling_topp, decode.sampling_temperature)
    return SearchSettings(
        bos_id=bos_id,
        eos_id=eos_id,
        beam_size=decode.beam_size,
        nbest=decode.nbest,
        length_penalty=length_penalty(decode),
        patience=decode.patience,
        beam_stop=decode.beam_stop,
        min_len=decode.min_len,
        no_repeat_ngram_size=decode.no_repeat_ngram_size,
        score_forced_eos=decode.score_forced_eos,
        renormalize=decode.renormalize,
        half_logits=autocast_dtype(decode.precision, device, "decode.precision") is not None,
        sampling=sampling,
    )


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
        # In place over the logits, no second (N, V) tensor a step (docs/performance.md).
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
    """Search for every source (already encoded, within the limit: `encode_sources`),
    results in input order; each may have a guide (`cli.inference.requests`), checked to fit
    its length limit.

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
    with constraints (`model.search.search_width`)."""
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
    tokenizer: Tokenizer,
    lines: list[str],
    max_len: int,
    source: str,
    first_line: int,
    language: str | list[str] = "",
) -> Rows:
    """Encode raw lines as the rows to search: one a line, and none of a line cut off.

    A line longer than the model's limit (`max_len` pieces) is fitted (`data.segments.fit`:
    at its sentences, by the splitter of its `language`, one for all lines or one each, and a
    sentence still too long at its best break) and its parts become rows of their own, each
    with the tags the line starts with (a target-language token, say); `Rows.joined` puts
    their translations back together. Lines that fit are encoded as they always were.
    """
    ids = source_ids(tokenizer, lines)
    over = [n for n, row in enumerate(ids) if len(row) > max_len]
    if not over:
        return Rows(ids, [range(n, n + 1) for n in range(len(ids))])
    languages = [language] * len(lines) if isinstance(language, str) else language
    rows: list[list[int]] = []
    spans: list[range] = []
    cuts: dict[int, tuple[str, list[Span]]] = {}
    for n, row in enumerate(ids):
        parts = [row]
        if len(row) > max_len:
            text, spans_of, parts = fit_line(tokenizer, lines[n], len(row), max_len, languages[n])
            cuts[n] = (text, spans_of)
            parts = [cut_to_limit(tokenizer, p, max_len, source, first_line + n) for p in parts]
        spans.append(range(len(rows), len(rows) + len(parts)))
        rows += parts
    log.info(
        "%s: %s over the model's limit of %d pieces, translated in parts (at sentence ends "
        "where they have them) and joined",
        source,
        counted(len(over), "line"),
        max_len,
    )
    return Rows(rows, spans, cuts)


def fit_line(
    tokenizer: Tokenizer, line: str, pieces: int, max_len: int, language: str
) -> tuple[str, list[Span], list[list[int]]]:
    """A line of `pieces` pieces, over `max_len`, as parts that fit: (its text after the tags
    it starts with, the parts' spans in that text, the parts' ids, each with the tags)."""
    _, text = split_tags(line, tuple(tokenizer.tags))
    tags = line[: len(line) - len(text)].lstrip()  # as written, before the text

    def count(part: str) -> int:
        return len(tokenizer.encode_src([tags + part])[0])

    parts = fit(text, count, max_len, splitter_for(language), pieces=pieces)
    return text, parts, source_ids(tokenizer, [tags + text[a:b].strip() for a, b in parts])


def cut_to_limit(tokenizer: Tokenizer, ids: list[int], max_len: int, source: str, line: int):
    """A part's ids within the model's limit: as they are, or (a limit below the tokenizer's
    frame and one character, which no text fits) cut, with a warning."""
    if len(ids) <= max_len:
        return ids
    log.warning(
        "%s:%d: a character of %d pieces, cut to the model's limit of %d",
        source,
        line,
        len(ids),
        max_len,
    )
    return tokenizer.truncate_src(ids, max_len)


@functools.cache
def splitter_for(language: str) -> Splitter:
    """The sentence splitter of a run's language code (`data.sentences`), one per language."""
    return sentence_splitter(language)


@dataclass
class Joined(Hypothesis):
    """A line translated in parts (`encode_sources`) as one hypothesis: the parts' tokens one
    after the other, their scores and log-probabilities summed, and its text joined from
    theirs (`data.segments.join`), which is what is written (`hypothesis_texts`)."""

    text: str = ""
    parts: int = 1


class Rows(list):
    """The source ids a group of lines is searched as (`encode_sources`): a list of rows, one
    a line, or one a part of a line over the model's limit.

    Attributes:
        lines: each line's rows, as a range of indices.
        cuts: each line translated in parts: its text (tags aside) and the parts' spans in it.
    """

    def __init__(
        self,
        rows: list[list[int]],
        lines: list[range],
        cuts: dict[int, tuple[str, list[Span]]] | None = None,
    ) -> None:
        super().__init__(rows)
        self.lines = lines
        self.cuts = cuts or {}

    def owners(self) -> list[int]:
        """The line each row belongs to."""
        return [n for n, rows in enumerate(self.lines) for _ in rows]

    def firsts(self) -> list[bool]:
        """Whether each row is its line's first (a request's prefix goes there)."""
        return [r == rows.start for rows in self.lines for r in rows]

    def line_ids(self) -> list[list[int]]:
        """Each line's source ids as searched: its rows one after the other."""
        return [[i for r in rows for i in self[r]] for rows in self.lines]

    def joined(self, found: list[list[Hypothesis]], tokenizer: Tokenizer) -> list[list[Hypothesis]]:
        """Each line's hypotheses from its rows' (`found`, one list a row): a line in parts
        gets its k-th hypothesis joined from each part's k-th, as many as the part with
        fewest has (so --nbest k gives k, the best joined from the bests)."""
        out = []
        for n, rows in enumerate(self.lines):
            if n not in self.cuts:
                out.append(found[rows.start])
                continue
            text, parts = self.cuts[n]
            each = [found[r] for r in rows]
            ranks = min(map(len, each))
            out.append(
                [join_parts(tokenizer, text, parts, [h[k] for h in each]) for k in range(ranks)]
            )
        return out


def join_parts(
    tokenizer: Tokenizer, text: str, parts: list[Span], hyps: list[Hypothesis]
) -> Joined:
    """One hypothesis of a line translated in parts, from one of each part's."""
    translations = tokenizer.decode_tgt([h.tokens for h in hyps])
    return Joined(
        tokens=[t for h in hyps for t in h.tokens],
        score=sum(h.score for h in hyps),
        log_prob=sum(h.log_prob for h in hyps),
        text=join(text, parts, translations),
        parts=len(parts),
    )


def hypothesis_texts(tokenizer: Tokenizer, hyps: list[Hypothesis]) -> list[str]:
    """The text of each hypothesis: its tokens detokenised, or a joined one's own text."""
    texts = tokenizer.decode_tgt([h.tokens for h in hyps])
    return [h.text if isinstance(h, Joined) else t for h, t in zip(hyps, texts)]


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
    texts = hypothesis_texts(tokenizer, hyps)
    if nbest == 1:
        return [f"{texts[0]}\t{hyps[0].score:.4f}" if scores else texts[0]]
    return [
        f"{k} ||| {t} ||| {h.score:.4f}" if scores else f"{k} ||| {t}"
        for k, (t, h) in enumerate(zip(texts, hyps))
    ]
