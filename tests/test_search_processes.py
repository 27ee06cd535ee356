"""`tf serve`'s search processes: they search as the engine does in the server's process, their
errors reach the caller, and one that dies fails only its search and is started again."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from cli.inference.engines import load_engine
from cli.runs.checkpoint import CheckpointError
from cli.serving import processes as search_processes
from cli.serving.processes import Cores, EngineSpec, SearchPool, SearchProcess

LINES = ["y dijo dios", "la luz", "el principio de los cielos y la tierra", "hola"]


@pytest.fixture(scope="module")
def engine(trained):
    return load_engine(str(trained), torch.device("cpu"), ["decode.beam_size=3"])


@pytest.fixture(scope="module")
def pool(trained):
    pool = SearchPool(EngineSpec(str(trained), "cpu", ["decode.beam_size=3"]), 2, 1)
    pool.wait_ready()
    yield pool
    pool.close()


# A search process runs on its own thread count (here 1), the engine on this process's: their
# matmuls sum in other orders, so a score may differ in its last float32 bits (-38.32145
# against -38.32144 once, the same tokens). Tokens are compared exactly, scores to 1e-5 of
# their size: a real difference in the search (another token's log-probability) is far larger.
SCORE_TOLERANCE = 1e-5


def assert_same_search(got, want) -> None:
    """The same hypotheses, best first, for every sentence; scores within SCORE_TOLERANCE."""
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    for mine, theirs in zip(got, want):
        for a, b in zip(mine, theirs):
            assert a.score == pytest.approx(b.score, rel=SCORE_TOLERANCE, abs=1e-6), (a, b)
            assert a.log_prob == pytest.approx(b.log_prob, rel=SCORE_TOLERANCE, abs=1e-6), (a, b)


def test_a_pool_searches_as_the_engine_does(engine, pool):
    ids = engine.tokenizer.encode_src(LINES)
    for decode in (engine.config.decode, replace(engine.config.decode, beam_size=1, nbest=1)):
        assert_same_search(pool(ids, decode), engine.search(ids, decode))
    # Both processes answer alike.
    want = engine.search(ids, engine.config.decode)
    for process in pool.processes:
        assert_same_search(process(ids, engine.config.decode), want)


def test_a_search_error_reaches_the_caller_as_raised(engine, pool):
    too_large = engine.model.src_embed.token.num_embeddings + 5  # no such embedding row
    with pytest.raises(IndexError):
        pool([[too_large, 2]], engine.config.decode)
    assert len(pool([[5, 6]], engine.config.decode)) == 1  # the process lives on, answers


def test_a_process_that_dies_fails_its_searches_and_is_started_again(engine, trained):
    process = SearchProcess(EngineSpec(str(trained), "cpu", []), 1)
    try:
        process.wait_ready()
        dead = process.process
        many = engine.tokenizer.encode_src(LINES * 100)  # long enough to be killed under
        with ThreadPoolExecutor(1) as running:
            searching = running.submit(process, many, engine.config.decode)
            while not process.held:
                time.sleep(0.01)
            os.kill(dead.pid, signal.SIGKILL)
            with pytest.raises(RuntimeError, match=r"search process ended \(exit code -9\)"):
                searching.result(timeout=60)
        assert process.process is not dead and process.process.is_alive()
        ids = engine.tokenizer.encode_src(LINES[:1])
        assert_same_search(
            process(ids, engine.config.decode), engine.search(ids, engine.config.decode)
        )
    finally:
        process.close()
    assert not process.process.is_alive()


def test_a_process_that_cannot_load_its_engine_says_why(tmp_path):
    pool = SearchPool(EngineSpec(str(tmp_path / "missing"), "cpu", []), 1, 1)
    with pytest.raises(CheckpointError, match="missing: no such run"):
        pool.wait_ready()
    assert not pool.processes[0].process.is_alive()


def test_a_lone_request_searches_on_every_core_and_gives_them_back_within_a_step(monkeypatch):
    """While the server has one request in flight its search takes the pool's threads (2
    processes x 1); a second request makes it go back to its share at its next step."""
    load = multiprocessing.get_context("spawn").Value("i", 1, lock=False)
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)

    class Model:
        def decode_step(self, tokens, state):
            return tokens + state

    model = Model()
    cores = Cores(load, share=1, workers=2)
    cores.follow(model)
    assert model.decode_step(1, 2) == 3 and threads == [2]
    model.decode_step(1, 2)
    assert threads == [2]  # set once, not at every step
    load.value = 2
    model.decode_step(1, 2)
    assert threads == [2, 1]
    load.value = 1
    model.decode_step(1, 2)
    assert threads == [2, 1, 2]


def test_a_search_process_reuses_freed_memory_as_tf_does(monkeypatch, tmp_path):
    """A spawned process does not run `tf`'s entry point: it sets glibc's memory reuse
    itself (`keep_freed_memory`), before loading its engine."""
    import cli.device

    calls = []
    monkeypatch.setattr(cli.device, "keep_freed_memory", lambda: calls.append("keep"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the process ignores Ctrl-C
    here, there = multiprocessing.Pipe()
    search_processes.serve_searches(EngineSpec(str(tmp_path / "missing"), "cpu", []), 1, there)
    ok, err = here.recv()
    assert calls == ["keep"] and not ok and "no such run" in str(err)
