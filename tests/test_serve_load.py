"""`tf serve` under load, on a real uvicorn server on loopback: 32 concurrent clients x 8
requests each, mixed beams and lengths, some clients leaving before their answer, one sending
garbage. Every well-formed request gets 200 and exactly the translations its sentences get
alone; the batcher is alive at the end and nothing is left in its queue. Bounded: 256 requests,
a 60-second limit on each call and on the whole run."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cli.inference.engines import Engine, load_engine
from cli.serving.app import build_app

pytest.importorskip("uvicorn")  # the `serve` extra; `make test` installs it
from test_serve import serving  # noqa: E402 - after the skip: it imports uvicorn's users

CLIENTS, REQUESTS, BEAMS = 32, 8, (1, 2, 3)
LEAVING = {7, 15, 23, 31}  # clients that leave before two of their answers come
GARBAGE = [  # (body, content type): what client 0 sends, each a 4xx
    (b"{not json", "application/json"),
    (b'{"text": ["hola"]}', "text/plain"),
    (json.dumps({"text": ["hola \ud800"]}).encode(), "application/json"),
    (b"[" * 50_000 + b"]" * 50_000, "application/json"),
    (b'{"text": ["hola"], "beam": 99}', "application/json"),
    (b'{"text": ["hola", 3]}', "application/json"),
    (json.dumps({"text": ["hola"] * 300}).encode(), "application/json"),
    (b'{"text": ["hola"], "beam": ' + b"9" * 5000 + b"}", "application/json"),
]


@pytest.fixture(scope="module")
def engine(trained) -> Iterator[Engine]:
    # fp32: bf16 autocast may round differently in a batch of another shape, and the test
    # asks for the very translation a sentence gets alone. Outputs of at most 4 pieces: the
    # barely trained model runs every output to its length limit, and the test is about
    # serving. One torch thread: on a busy 2-core machine two threads that wait on each
    # other made each tiny search 20x slower (1 s instead of 50 ms).
    sets = ["decode.precision=fp32", "decode.max_len_a=0", "decode.max_len_b=4"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_engine(str(trained), torch.device("cpu"), sets)
    finally:
        torch.set_num_threads(threads)


def sentences(prefix: str) -> list[str]:
    """Short and longer sentences of the fixture, with an empty one."""
    lines = sorted(set(Path(f"{prefix}.es").read_text(encoding="utf-8").splitlines()), key=len)
    return [""] + lines[:8] + lines[40:44]


def plan(pool: list[str]) -> list[list[dict]]:
    """Each client's requests: 1 to 3 sentences, a beam of 1 to 3 or the server's default."""
    requests = []
    for c in range(CLIENTS):
        rng = random.Random(c)
        mine = []
        for _ in range(REQUESTS):
            request = {"text": rng.sample(pool, rng.randint(1, 3))}
            beam = rng.choice((*BEAMS, None))
            mine.append(request if beam is None else {**request, "beam": beam})
        requests.append(mine)
    return requests


def alone(engine: Engine, pool: list[str]) -> dict[tuple[str, int], str]:
    """Each sentence's translation searched by itself, at each beam."""
    out = {}
    for beam in BEAMS:
        decode = replace(engine.config.decode, beam_size=beam, nbest=1)
        for line in pool:
            hyps = engine.search(engine.tokenizer.encode_src([line]), decode)
            out[line, beam] = engine.tokenizer.decode_tgt([hyps[0][0].tokens])[0]
    return out


def post(conn: http.client.HTTPConnection, body: bytes, kind: str) -> tuple[int, dict]:
    conn.request("POST", "/translate", body, {"Content-Type": kind})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def leave_early(port: int, body: bytes) -> None:
    """Send a whole request and hang up without reading the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        head = "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)


def client(c: int, port: int, requests: list[dict], answers: dict, start) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start.wait(timeout=60)
    for r, request in enumerate(requests):
        if c == 0:
            answers[c, r] = post(conn, *GARBAGE[r])
        elif c in LEAVING and r in (2, 5):
            leave_early(port, json.dumps(request).encode())
        else:
            answers[c, r] = post(conn, json.dumps(request).encode(), "application/json")
    conn.close()


def test_32_clients_at_once_each_get_what_they_would_alone(engine, tiny_prefix):
    pool = sentences(tiny_prefix)
    requests, expected = plan(pool), alone(engine, pool)
    default_beam = engine.config.decode.beam_size
    app = build_app(engine, "run", "pytorch")
    answers: dict[tuple[int, int], tuple[int, dict]] = {}
    start = threading.Barrier(CLIENTS, timeout=60)
    began = time.monotonic()
    with serving(app) as url:
        port = int(url.rsplit(":", 1)[1])
        threads = [
            threading.Thread(target=client, args=(c, port, requests[c], answers, start))
            for c in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, 120 - (time.monotonic() - began)))
        assert not any(t.is_alive() for t in threads), "clients still waiting after 120 s"
        batcher = app.state.batcher
        deadline = time.monotonic() + 30  # the leavers' jobs: dropped or searched, then gone
        while batcher.waiting or batcher.pending:
            assert time.monotonic() < deadline, "work left in the queue"
            time.sleep(0.01)
        assert batcher.alive
    for r in range(REQUESTS):
        status, body = answers[0, r]
        assert 400 <= status < 500 and "\n" not in body["error"], (GARBAGE[r][0][:40], body)
    for c in range(1, CLIENTS):
        for r, request in enumerate(requests[c]):
            if (c, r) not in answers:
                continue  # it left
            beam = request.get("beam", default_beam)
            want = [expected[line, beam] for line in request["text"]]
            assert answers[c, r] == (200, {"translations": want}), (c, r, request)
    assert len(answers) == CLIENTS * REQUESTS - 2 * len(LEAVING)
    assert batcher.searches < CLIENTS * REQUESTS  # and requests were batched together


def test_the_serve_benchmark_runs(trained, tiny_prefix, tmp_path):
    """`make bench`'s serve row, small: a live `tf serve` and the one-process path."""
    from benchmarks import serve_bench

    lines = [line for line in sentences(tiny_prefix) if line][:6]
    results = serve_bench.run(
        trained, lines, clients=(1, 3), device="cpu", precisions=("fp32",), out=tmp_path
    )
    assert set(results["translate"]["fp32"]) == {"same sentence", "varied"}
    for load, per_s in results["translate"]["fp32"].items():
        assert per_s > 0
        for clients in (1, 3):
            row = results["serve"]["tf"]["fp32"][load][clients]
            assert row["errors"] == 0 and row["requests_per_s"] > 0
            assert 0 < row["p50_ms"] <= row["p99_ms"]
    serve_bench.print_results(results)
