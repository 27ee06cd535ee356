"""`tf serve`'s search processes: they search as the engine does in the server's process, their
errors reach the caller, and one that dies fails only its search and is started again."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest
import torch

from cli.inference.engines import load_engine
from cli.inference.search_processes import EngineSpec, SearchPool, SearchProcess
from cli.training.checkpoint import CheckpointError

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


def searched(hyps):
    return [[(h.tokens, round(h.score, 5)) for h in sentence] for sentence in hyps]


def test_a_pool_searches_as_the_engine_does(engine, pool):
    ids = engine.tokenizer.encode_src(LINES)
    for decode in (engine.config.decode, replace(engine.config.decode, beam_size=1, nbest=1)):
        assert searched(pool(ids, decode)) == searched(engine.search(ids, decode))
    # Both processes answer alike: each call takes the free one, so two in a row use both.
    assert [searched(p(ids, engine.config.decode)) for p in pool.processes] == [
        searched(engine.search(ids, engine.config.decode))
    ] * 2


def test_a_search_error_reaches_the_caller_as_raised(engine, pool):
    too_large = engine.model.src_embed.token.num_embeddings + 5  # no such embedding row
    with pytest.raises(IndexError):
        pool([[too_large, 2]], engine.config.decode)
    assert searched(pool([[5, 6]], engine.config.decode))  # the process lives on


def test_a_process_that_dies_fails_its_search_and_is_started_again(engine, trained):
    process = SearchProcess(EngineSpec(str(trained), "cpu", []), 1)
    try:
        process.wait_ready()
        dead = process.process
        os.kill(dead.pid, signal.SIGKILL)
        dead.join(timeout=30)
        dead.is_alive = lambda: True  # as if it died while searching: the pipe says so
        ids = engine.tokenizer.encode_src(LINES[:1])
        with pytest.raises(RuntimeError, match=r"search process ended \(exit code -9\)"):
            process(ids, engine.config.decode)
        assert process.process is not dead and process.process.is_alive()
        assert searched(process(ids, engine.config.decode)) == searched(
            engine.search(ids, engine.config.decode)
        )
    finally:
        process.close()
    assert not process.process.is_alive()


def test_a_process_that_cannot_load_its_engine_says_why(tmp_path):
    pool = SearchPool(EngineSpec(str(tmp_path / "missing"), "cpu", []), 1, 1)
    with pytest.raises(CheckpointError, match="missing: no such run"):
        pool.wait_ready()
    assert not pool.processes[0].process.is_alive()
