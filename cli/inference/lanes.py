"""Continuous batching: a search worker's requests join a search that is already running.

A search worker (`tf serve`'s search process) holds one long-lived search per set of decode
settings, a lane: its rows are the live hypotheses of every request it holds, and it steps
them all at once. Between two steps the worker admits waiting sentences (encoded once, their
cross-attention keys and values stacked onto the lane's, their first step at one live row
each: `model.search.BeamSearch.admit`) and answers those whose search ended at the step,
whose rows leave at once (Orca's iteration-level scheduling, OSDI 2022). The step's batch so
stays as full as the load allows, where searching whole groups had stepped through each
group's longest sentence with ever fewer live rows.

`model.search` decides what a step does (greedy or beam, length rules, prefixes, n-gram bans);
a lane only decides which rows are in it. Requests whose search cannot share a step run as
whole searches between the lanes' steps (`joins`): sampling (its rows of a sentence expand
after the first step, and its noise is counted by step), constraints (a search of its own,
`model.constraints`) and ensembles. Different settings (beam, length penalty, n-best...) are
different lanes, stepped in turn: a step ranks every sentence's candidates with one beam
width, and per-sentence widths would cost every step of the common case for a mix that a
server's clients rarely send (they take the server's settings).

Admission is fair and bounded: sentences are taken from the waiting requests in turn, one
each, while the lanes' rows stay under `max_rows` (a sentence counts its beam), so a long
request never holds back the short ones that came after it, and a request waits at most one
step to join while there is room.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import astuple, dataclass, field, replace

import torch

from cli.config import DecodeConfig
from cli.device import autocast_dtype, inference_autocast
from cli.inference.decoding import (
    is_greedy,
    length_limits,
    length_penalty,
    log_prob_step,
    prefix_tensor,
)
from cli.inference.engines import Engine
from cli.inference.requests import Guide
from cli.inference.shapes import pad_batch, shapes_matter
from data.batching import collate
from model.packed import PackedLinear
from model.search import BeamSearch, Hypothesis, RowSearch, row_argmax
from model.transformer import Transformer

log = logging.getLogger(__name__)

MAX_ROWS = 256  # a worker's live rows by default: sentences x beam


def joins(engine: Engine, decode: DecodeConfig, guides: list[Guide | None] | None) -> bool:
    """Whether a request's sentences can join a lane (else it is searched whole)."""
    if not isinstance(engine.model, Transformer) or decode.sampling:
        return False
    return not (guides and any(g and g.constraints for g in guides))


class Lane:
    """One continuous search of the engine's model under one set of decode settings."""

    def __init__(self, engine: Engine, decode: DecodeConfig, device: torch.device):
        self.engine, self.decode, self.device = engine, decode, device
        model, tokenizer = engine.model, engine.tokenizer
        self.start_id = tokenizer.decoder_start_id(model.config.decoder_start)
        pad = tokenizer.pad_id if model.config.decoder_start == "pad" else None
        self.step = log_prob_step(lambda tokens, cache: model.decode_step(tokens, cache),
                                  tokenizer.eos_id, pad)  # fmt: skip
        settings = dict(
            bos_id=self.start_id,
            eos_id=tokenizer.eos_id,
            device=device,
            min_len=decode.min_len,
            no_repeat_ngram_size=decode.no_repeat_ngram_size,
            score_forced_eos=decode.score_forced_eos,
            renormalize=decode.renormalize,
        )
        if is_greedy(decode):
            self.search = RowSearch(lambda lp, t, rows: row_argmax(lp), **settings)
        else:  # autocast's logits hold ties: `beam_search`'s half_logits
            half = autocast_dtype(decode.precision, device, "decode.precision") is not None
            self.search = BeamSearch(
                beam_size=decode.beam_size, length_penalty=length_penalty(decode),
                patience=decode.patience, nbest=decode.nbest, beam_stop=decode.beam_stop,
                half_logits=half, **settings,
            )  # fmt: skip
        self.cache = None  # the model's DecoderCache of the live rows; None: none live
        for module in model.modules():  # rows change every step: a few shapes for oneDNN
            if isinstance(module, PackedLinear):
                module.bucket_rows = True

    @property
    def rows(self) -> int:
        return self.search.live

    def admit(self, keys: list, src_ids: list[list[int]], guides: list[Guide | None] | None):
        """Sentences join before the next step, named by `keys` in what `advance` answers."""
        model, tokenizer = self.engine.model, self.engine.tokenizer
        batch = collate(src_ids, None, tokenizer.pad_id, self.start_id, tokenizer.eos_id,
                        list(range(len(src_ids))), src_pad_id=tokenizer.src_pad_id)  # fmt: skip
        batch = batch.to(self.device)
        src, mask = batch.src, batch.src_pad_mask
        if shapes_matter(model, self.device):  # a few shapes for oneDNN (`cli.inference.shapes`)
            src, mask = pad_batch(batch, model.config.max_positions)
        with torch.no_grad(), inference_autocast(self.device, self.decode.precision):
            n = len(src_ids)
            memory, mask = model.encode(src, mask)[:n], mask[:n]
            joining = model.init_cache(memory, mask, batch.src.size(1) + 1)
        max_lens = length_limits(model, batch, self.decode)
        self.search.admit(max_lens, prefix_tensor(guides, self.device), keys)
        self.cache = joining if self.cache is None else self.cache.admit(joining)

    def advance(self) -> list[tuple[object, list[Hypothesis]]]:
        """One step of every live row; the (key, hypotheses) of the sentences it ended."""
        sentences = self.cache.cross_attn[0].keys.size(0)
        with torch.no_grad(), inference_autocast(self.device, self.decode.precision):
            log_probs, cache = self.step(self.search.tokens, self.cache)
            self.cache = self.search.advance(log_probs, cache, reorder)
        if not self.search.live:
            self.cache = None
        else:
            shift = self.search.forget()
            if shift:
                self.cache.drop_columns(shift)
            if self.cache.cross_attn[0].keys.size(0) < sentences:  # some left: the longest?
                self.cache.fit_source()  # the longest live source's width, not the longest seen
        done, self.search.done = self.search.done, []
        return done

    def cancel(self, keys: set) -> None:
        self.search.cancel(keys)


def reorder(cache, index, group):
    return cache.reorder(index, group)


@dataclass
class Request:
    """A request a worker holds: its sentences' answers as they come, and those not yet
    admitted."""

    key: int
    src_ids: list[list[int]]
    decode: DecodeConfig
    guides: list[Guide | None] | None
    found: list[list[Hypothesis] | None] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)  # sentence indices not yet admitted

    @property
    def answered(self) -> bool:
        return all(f is not None for f in self.found)


class Scheduler:
    """A search worker's requests: whole searches for those that cannot join (`joins`), lanes
    for the others, admission between steps under `max_rows`. `events()` runs what is due
    (admissions, one step of each lane) and returns what to tell the server: ("admitted",
    key) once all of a request's sentences joined, ("done", key, ok, value) with its
    hypotheses or the exception its search raised."""

    def __init__(self, engine: Engine, device: torch.device, max_rows: int = MAX_ROWS):
        self.engine, self.device, self.max_rows = engine, device, max_rows
        self.lanes: dict[tuple, Lane] = {}
        self.requests: dict[int, Request] = {}
        self.queue: deque[Request] = deque()  # requests with sentences still to admit
        self.whole: deque[Request] = deque()  # requests searched whole, in turn
        self.out: list[tuple] = []

    @property
    def busy(self) -> bool:
        """Work to do without a new message."""
        return bool(self.queue or self.whole or any(lane.rows for lane in self.lanes.values()))

    def submit(self, key: int, src_ids, decode: DecodeConfig, guides) -> None:
        request = Request(key, src_ids, decode, guides, [None] * len(src_ids))
        for i, ids in enumerate(src_ids):
            if ids:
                request.waiting.append(i)
            else:  # an empty line stays empty, unsearched (as `translate_ids`)
                request.found[i] = [Hypothesis([], 0.0, 0.0)]
        self.requests[key] = request
        if not request.waiting:
            self._answer(request)
        elif joins(self.engine, decode, guides):
            self.queue.append(request)
        else:
            self.whole.append(request)

    def cancel(self, key: int) -> None:
        """The request leaves: its waiting sentences are dropped, its rows leave at the next
        step, nothing is answered."""
        request = self.requests.pop(key, None)
        if request is None:
            return
        for waiting in (self.queue, self.whole):
            if request in waiting:
                waiting.remove(request)
        keys = {(key, i) for i in range(len(request.src_ids))}
        for lane in self.lanes.values():
            lane.cancel(keys)

    def events(self) -> list[tuple]:
        if self.whole:
            self._search_whole(self.whole.popleft())
        self._admit()
        for settings, lane in list(self.lanes.items()):
            if lane.rows:
                self._advance(settings, lane)
        out, self.out = self.out, []
        return out

    def _search_whole(self, request: Request) -> None:
        todo = list(request.waiting)
        try:
            guides = [request.guides[i] for i in todo] if request.guides else None
            found = self.engine.search([request.src_ids[i] for i in todo], request.decode, guides)
        except Exception as err:  # noqa: BLE001 - the request's alone
            self._fail(request, err)
            return
        for i, hyps in zip(todo, found, strict=True):
            request.found[i] = hyps
        self._answer(request)

    def _admit(self) -> None:
        """Sentences of the waiting requests in turn, one each, while there is room."""
        rows = sum(lane.rows for lane in self.lanes.values())
        taken: dict[tuple, list[tuple[Request, int]]] = {}
        while self.queue:
            request = self.queue[0]
            width = request.decode.beam_size
            if rows and rows + width > self.max_rows:
                break  # full: the next step's leavers make room
            taken.setdefault(lane_key(request.decode), []).append((request, request.waiting[0]))
            request.waiting.popleft()
            rows += width
            self.queue.rotate(-1)
            if not request.waiting:
                self.queue.remove(request)
                self.out.append(("admitted", request.key))
        for settings, members in taken.items():
            self._join(settings, members)

    def _join(self, settings: tuple, members: list[tuple[Request, int]]) -> None:
        decode = members[0][0].decode
        lane = self.lanes.get(settings)
        if lane is None:
            lane = self.lanes[settings] = Lane(self.engine, decode, self.device)
        keys = [(r.key, i) for r, i in members]
        src_ids = [r.src_ids[i] for r, i in members]
        guides = None
        if any(r.guides for r, _ in members):
            guides = [r.guides[i] if r.guides else None for r, i in members]
        try:
            lane.admit(keys, src_ids, guides)
        except Exception as err:  # noqa: BLE001 - a bad sentence fails its request alone
            if len(members) == 1:
                self._fail(members[0][0], err)
                return
            for member in members:  # which one: each joins alone
                if member[0].key in self.requests:
                    self._join(settings, [member])

    def _advance(self, settings: tuple, lane: Lane) -> None:
        try:
            done = lane.advance()
        except Exception as err:  # noqa: BLE001 - the lane's requests fail, the worker lives on
            log.exception("a search step failed; its lane's requests fail")
            del self.lanes[settings]
            for request in list(self.requests.values()):
                if lane_key(request.decode) == settings and joins(
                    self.engine, request.decode, request.guides
                ):
                    self._fail(request, err)
            return
        for (key, i), hyps in done:
            request = self.requests.get(key)
            if request is None:
                continue  # cancelled
            request.found[i] = hyps
            if request.answered:
                self._answer(request)

    def _answer(self, request: Request) -> None:
        del self.requests[request.key]
        self.out.append(("done", request.key, True, request.found))

    def _fail(self, request: Request, err: Exception) -> None:
        """The request's error, alone: its sentences that joined a lane leave it."""
        if self.requests.get(request.key) is not request:
            return
        self.cancel(request.key)
        self.out.append(("done", request.key, False, err))


def lane_key(decode: DecodeConfig) -> tuple:
    """The settings that make a lane: all of `decode` but the batch budget."""
    return astuple(replace(decode, max_tokens=0))


STOP = ("stop",)  # what `receive` gives when the server is gone


def run_scheduler(scheduler: Scheduler, receive, send, cores=None) -> None:
    """A search worker's loop: take every message waiting (`receive(block)`: a message, None
    when there is none and block is False, STOP), blocking only while there is nothing to
    do; run what is due; `send` each event. `cores` (`search_processes.Cores`) sets the
    threads before the encoder runs."""
    while True:
        message = receive(not scheduler.busy)
        while message is not None:
            if message == STOP:
                return
            kind, key, *rest = message
            if kind == "search":
                scheduler.submit(key, *rest)
            elif kind == "cancel":
                scheduler.cancel(key)
            message = receive(False)
        if cores is not None:
            cores.update()
        for event in scheduler.events():
            send(event)


class ThreadWorker:
    """A search worker in this process, on a thread of its own (a GPU's, where one search
    runs at a time): `SearchProcess`'s interface without the process."""

    def __init__(self, engine: Engine, device: torch.device, max_rows: int = MAX_ROWS,
                 name: str = "tf-lanes"):  # fmt: skip
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.on_event = lambda event: None
        scheduler = Scheduler(engine, device, max_rows)
        self.thread = threading.Thread(
            target=run_scheduler, args=(scheduler, self._receive, self._send), name=name,
            daemon=True,
        )  # fmt: skip
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def submit(self, key: int, src_ids, decode: DecodeConfig, guides=None) -> None:
        self.inbox.put(("search", key, src_ids, decode, guides))

    def cancel(self, key: int) -> None:
        self.inbox.put(("cancel", key))

    def close(self) -> None:
        self.inbox.put(STOP)

    def _receive(self, block: bool):
        try:
            return self.inbox.get(block)
        except queue.Empty:
            return None

    def _send(self, event: tuple) -> None:
        self.on_event(event)
