"""Continuous batching (`cli.inference.lanes`): sentences that join a running search mid-way
get the translation they get alone, cancelled ones leave at the next step, admission is
bounded and fair, a bad request fails alone, and through `tf serve`'s search processes 200
concurrent requests of mixed settings, some cancelled, each get what they would alone."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cli.inference.batcher import Joiner, QueueFull
from cli.inference.engines import load_engine
from cli.inference.lanes import Scheduler
from cli.inference.requests import Guide
from model.search import BeamSearch

# Scores of a sentence searched among other rows may sum in another order (a matmul over more
# rows, its cache's masked columns): within 1e-5 of their size; tokens exactly.
SCORE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def engine(trained):
    sets = ["decode.precision=fp32", "decode.max_len_a=1", "decode.max_len_b=6"]
    return load_engine(str(trained), torch.device("cpu"), sets)


@pytest.fixture(scope="module")
def sources(engine, tiny_prefix):
    lines = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    return engine.tokenizer.encode_src([line for line in lines if line][:40])


def alone(engine, ids, decode, guide=None):
    return engine.search([ids], decode, [guide] if guide else None)[0]


def assert_same(got, want):
    assert [h.tokens for h in got] == [h.tokens for h in want]
    for a, b in zip(got, want):
        assert a.score == pytest.approx(b.score, rel=SCORE_TOLERANCE, abs=1e-6), (a, b)


def staggered(scheduler, requests, every=2, cancel_after=None):
    """Submit (key, src_ids, decode, guides) one every `every` steps; run until idle. Returns
    the answers by key, and the most rows a step held. cancel_after: {key: steps after its
    submission}."""
    answers, most, step, todo = {}, 0, 0, list(requests)
    submitted = {}
    while todo or scheduler.busy:
        if todo and step % every == 0:
            key, *rest = todo.pop(0)
            scheduler.submit(key, *rest)
            submitted[key] = step
        for key, after in (cancel_after or {}).items():
            if submitted.get(key) == step - after:
                scheduler.cancel(key)
        for event in scheduler.events():
            if event[0] == "done":
                answers[event[1]] = event[2:]
        most = max(most, sum(lane.rows for lane in scheduler.lanes.values()))
        step += 1
    return answers, most


@pytest.mark.parametrize("beam, nbest", [(1, 1), (4, 1), (3, 2)])
def test_a_sentence_that_joins_mid_search_gets_its_translation_alone(engine, sources, beam, nbest):
    decode = replace(engine.config.decode, beam_size=beam, nbest=nbest)
    requests = [(k, [ids], decode, None) for k, ids in enumerate(sources)]
    answers, most = staggered(Scheduler(engine, torch.device("cpu")), requests)
    assert most > 3 * beam  # sentences did share steps, at different steps of their own
    for key, ids in enumerate(sources):
        ok, found = answers[key]
        assert ok and len(found) == 1
        assert_same(found[0], alone(engine, ids, decode))


def test_prefixes_n_gram_bans_and_min_len_hold_at_each_sentences_own_step(engine, sources):
    decode = replace(engine.config.decode, beam_size=3, no_repeat_ngram_size=2, min_len=3)
    eos = engine.tokenizer.eos_id
    requests, want = [], {}
    for key, ids in enumerate(sources[:24]):
        guide = Guide(prefix=tuple(t for t in ids[:2] if t != eos)) if key % 3 == 0 else None
        requests.append((key, [ids], decode, [guide]))
        want[key] = alone(engine, ids, decode, guide)
    answers, _ = staggered(Scheduler(engine, torch.device("cpu")), requests, every=3)
    for key, hyps in want.items():
        ok, found = answers[key]
        assert ok, found
        assert_same(found[0], hyps)
        if key % 3 == 0:  # the prefix came first, whenever the sentence joined
            assert found[0][0].tokens[:2] == list(requests[key][3][0].prefix)


def test_a_cancelled_request_leaves_at_the_next_step_unanswered(engine, sources):
    decode = replace(engine.config.decode, beam_size=4)
    scheduler = Scheduler(engine, torch.device("cpu"))
    scheduler.submit(0, sources[:3], decode, None)
    scheduler.submit(1, sources[3:4], decode, None)
    scheduler.events()  # both joined and took a step
    lane = next(iter(scheduler.lanes.values()))
    before = lane.rows
    scheduler.cancel(0)
    events = scheduler.events()
    assert lane.rows <= before - 3 * 4 + 4 and not [e for e in events if e[1] == 0]
    answers, _ = staggered(scheduler, [])
    assert set(answers) == {1}
    assert_same(answers[1][1][0], alone(engine, sources[3], decode))


def test_rows_stay_under_the_cap_and_a_long_request_does_not_hold_back_a_short_one(engine, sources):
    decode = replace(engine.config.decode, beam_size=4)
    scheduler = Scheduler(engine, torch.device("cpu"), max_rows=8)
    scheduler.submit("long", sources[:12], decode, None)
    scheduler.submit("short", sources[12:13], decode, None)
    order, most = [], 0
    while scheduler.busy:
        order += [e[1] for e in scheduler.events() if e[0] == "done"]
        most = max(most, sum(lane.rows for lane in scheduler.lanes.values()))
    assert most <= 8
    assert order == ["short", "long"]  # admitted in turn: the short one's sentence came second


def test_a_long_running_search_forgets_old_columns_and_old_sentences(engine, sources):
    # Outputs of at most 8 tokens: a sentence's rows live 9 steps or fewer.
    decode = replace(engine.config.decode, beam_size=2, max_len_a=0, max_len_b=8)
    scheduler = Scheduler(engine, torch.device("cpu"))
    widths = []
    requests = [(k, [sources[k % len(sources)]], decode, None) for k in range(120)]
    answers, step = {}, 0
    while requests or scheduler.busy:
        if requests and step % 2 == 0:
            scheduler.submit(*requests.pop(0))
        for event in scheduler.events():
            answers[event[1]] = event[2:]
        lane = next(iter(scheduler.lanes.values()))
        widths.append((lane.search.t, len(lane.search.sentences.keys)))
        step += 1
    assert step > 200 and max(t for t, _ in widths) < 80  # columns dropped as rows left
    assert max(n for _, n in widths) < 100  # and the slots of the sentences done
    for k in (0, 60, 119):
        assert_same(answers[k][1][0], alone(engine, sources[k % len(sources)], decode))


def test_new_sentences_are_written_into_room_and_attention_fits_the_live_sources(engine, sources):
    """Admission writes a sentence's cross-attention keys into the cache's spare rows (the
    tables grow by doubling, not at every admission), and once the longest source leaves,
    cross-attention narrows to the live ones' width. Every answer equals its search alone."""
    decode = replace(engine.config.decode, beam_size=2, max_len_a=0, max_len_b=8)
    scheduler = Scheduler(engine, torch.device("cpu"))
    by_length = sorted(sources, key=len)
    longest, short = by_length[-1], by_length[:12]
    assert len(longest) > 4 / 3 * (len(short[-1]) + 8)  # past what the short ones need
    requests = [(0, [longest], decode, None)]
    requests += [(k, [ids], decode, None) for k, ids in enumerate(short, start=1)]
    answers, tables, widths = {}, set(), []
    while requests or scheduler.busy:
        if requests:
            scheduler.submit(*requests.pop(0))
        for event in scheduler.events():
            if event[0] == "done":
                answers[event[1]] = event[2:]
        lane = next(iter(scheduler.lanes.values()))
        if lane.cache is not None:
            room = lane.cache.room
            tables.add(None if room is None else room[0].keys.data_ptr())
            widths.append((0 not in answers, lane.cache.cross_attn[0].keys.size(2)))
    assert len(tables - {None}) <= 5  # 13 admissions, a few tables: doubled, and narrowed once
    with_longest = [w for live, w in widths if live]
    after = [w for live, w in widths if not live]
    assert min(with_longest) >= len(longest) and after and max(after) <= len(short[-1]) + 8
    for k, ids in enumerate([longest, *short]):
        assert_same(answers[k][1][0], alone(engine, ids, decode))


def test_a_request_that_fails_fails_alone(engine, sources):
    decode = engine.config.decode
    scheduler = Scheduler(engine, torch.device("cpu"))
    too_large = engine.model.src_embed.token.num_embeddings + 5  # no such embedding row
    constrained = Guide(constraints=((sources[1][0],),))
    sampled = replace(decode, sampling_topk=5, beam_size=2)
    requests = [
        (0, sources[:2], decode, None),
        (1, [[too_large, 5]], decode, None),
        (2, [sources[2]], decode, None),
        (3, [sources[3]], decode, [constrained]),  # searched whole, between the lanes' steps
        (4, [sources[4]], sampled, None),
    ]
    answers, _ = staggered(scheduler, requests, every=1)
    assert answers[1][0] is False and isinstance(answers[1][1], IndexError)
    assert_same(answers[0][1][1], alone(engine, sources[1], decode))
    assert_same(answers[2][1][0], alone(engine, sources[2], decode))
    assert_same(answers[3][1][0], alone(engine, sources[3], decode, constrained))
    assert_same(answers[4][1][0], alone(engine, sources[4], sampled))


def test_a_beam_search_admits_at_the_width_of_its_rows():
    search = BeamSearch(beam_size=3, bos_id=1, eos_id=2, device=torch.device("cpu"),
                        length_penalty=0.0, patience=1.0)  # fmt: skip
    assert search.admit(torch.tensor([5, 5])) == 1  # before the first step: one row each
    log_probs = torch.log_softmax(torch.randn(2, 10), dim=1)
    log_probs[:, 2] = float("-inf")  # no EOS: both go on
    search.advance(log_probs, None, lambda state, index, group: state)
    assert search.admit(torch.tensor([5]), keys=["late"]) == 3  # after it: the beam's rows
    assert search.live == 3 * 3 and search.beams.log_probs[-2:].eq(float("-inf")).all()
    assert search.beams.tokens[-3:].eq(-1).all()  # no token of its own yet


class FakeWorker:
    """A search worker that holds what it is sent (the test says when it answers)."""

    def __init__(self):
        self.sent, self.cancelled, self.alive = [], [], True
        self.on_event = None

    def submit(self, key, src_ids, decode, guides=None):
        self.sent.append(key)

    def cancel(self, key):
        self.cancelled.append(key)


def test_the_joiner_sends_each_request_to_the_least_busy_worker_and_answers_503_past_its_queue(
    engine,
):
    workers = [FakeWorker(), FakeWorker()]
    joiner = Joiner(workers, max_queue=30)
    decode = replace(engine.config.decode, beam_size=2)
    first = joiner.submit([[5] * 10], decode)  # cost 20 waits
    second = joiner.submit([[5] * 2], decode)
    assert workers[0].sent == [0] and workers[1].sent == [1]
    with pytest.raises(QueueFull):
        joiner.submit([[5] * 10], decode)
    joiner.event(("admitted", 0))  # joined a search: its room is free
    third = joiner.submit([[5] * 10], decode)
    assert workers[1].sent == [1, 2]  # the less busy
    assert second.cancel() and workers[1].cancelled == [1]  # leaves its worker's search
    joiner.event(("done", 0, True, [["hyps"]]))
    joiner.event(("done", 1, True, [["late"]]))  # cancelled: dropped
    assert first.result(timeout=1) == [["hyps"]] and not third.done()
    assert joiner.dropped == 1 and joiner.in_flight == 1 and joiner.pending == 20


def test_a_lone_client_keeps_to_the_worker_that_searched_last(engine):
    workers = [FakeWorker(), FakeWorker()]
    joiner = Joiner(workers)
    for key in range(3):
        joiner.submit([[5, 6]], engine.config.decode)
        joiner.event(("admitted", key))
        joiner.event(("done", key, True, [[]]))
    assert workers[1].sent == [] and workers[0].sent == [0, 1, 2]


pytest.importorskip("uvicorn")  # the `serve` extra; `make test` installs it
from test_serve import serving  # noqa: E402
from test_serve_load import leave_early, post  # noqa: E402


def test_200_concurrent_requests_of_mixed_settings_get_what_they_get_alone(trained, tiny_prefix):
    """Through `tf serve`'s search processes (2 x 1 thread): beams 1 to 5, prefixes,
    constraints (searched whole), clients that leave; each answer equals the request alone."""
    from cli.inference.search_processes import EngineSpec, SearchPool
    from cli.inference.server import Limits, build_app

    sets = ["decode.precision=fp32", "decode.max_len_a=0", "decode.max_len_b=12"]
    engine = load_engine(str(trained), torch.device("cpu"), sets)
    lines = [ln for ln in Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines() if ln]
    rng = random.Random(0)
    requests = []
    for _ in range(200):
        text = []
        for line in rng.sample(lines[:30], rng.randint(1, 3)):
            roll = rng.random()
            words = line.split()
            if roll < 0.15:
                text.append({"text": line, "prefix": words[0]})
            elif roll < 0.25:
                text.append({"text": line, "constraints": [words[-1]]})
            else:
                text.append(line)
        requests.append({"text": text, "beam": rng.choice((1, 2, 3, 5))})
    leaving = set(rng.sample(range(200), 20))
    pool = SearchPool(EngineSpec(str(trained), "cpu", sets), 2, 1)
    pool.wait_ready()
    answers: dict[int, tuple[int, dict]] = {}
    try:
        app = build_app(engine, "run", "pytorch", Limits(workers=2), search=pool,
                        joining=pool.processes)  # fmt: skip
        with serving(app) as url:
            port = int(url.rsplit(":", 1)[1])

            def client(first: int) -> None:
                import http.client

                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                for r in range(first, 200, 25):
                    body = json.dumps(requests[r]).encode()
                    if r in leaving:
                        leave_early(port, body)
                    else:
                        answers[r] = post(conn, body, "application/json")

            threads = [threading.Thread(target=client, args=(c,)) for c in range(25)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            assert not any(t.is_alive() for t in threads)
            joiner = app.state.batcher
            deadline = time.monotonic() + 30
            while joiner.in_flight:  # the leavers' requests: cancelled, gone from the workers
                assert time.monotonic() < deadline, "requests left in flight"
                time.sleep(0.05)
            assert joiner.alive and joiner.pending == 0
    finally:
        pool.close()
    assert len(answers) == 200 - len(leaving)
    for r, (status, body) in answers.items():
        want = []  # the same request alone, through the engine
        decode = replace(engine.config.decode, beam_size=requests[r]["beam"], nbest=1)
        for item in requests[r]["text"]:
            item = item if isinstance(item, dict) else {"text": item}
            ids = engine.tokenizer.encode_src([item["text"]])
            guide = None
            if "prefix" in item or "constraints" in item:
                prefix = engine.tokenizer.encode_tgt([item.get("prefix", "")])[0]
                phrases = engine.tokenizer.encode_tgt(item.get("constraints", []))
                guide = Guide(tuple(prefix), tuple(tuple(p) for p in phrases))
            hyps = engine.search(ids, decode, [guide] if guide else None)
            want.append(engine.tokenizer.decode_tgt([hyps[0][0].tokens])[0])
        assert (status, body) == (200, {"translations": want}), (r, requests[r], body)
