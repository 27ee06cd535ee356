"""`tf serve`: answers in order per request under concurrent clients, batches them together,
a one-line JSON 4xx for every bad request, a page for people, and the CLI that starts it; the
batcher outlives cancelled and failing requests, drops the work of clients that left, bounds its
queue (503) and each request's time (504), and counts the beam in its batches."""

from __future__ import annotations

import json
import multiprocessing
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_export import sharp  # noqa: F401 - fixture

from cli.device import search_workers
from cli.inference import decoding
from cli.inference.engines import Engine, load_engine
from cli.serving.app import Limits, build_app, read_page
from cli.serving.batcher import Batcher
from data.errors import InputError
from model.search import Hypothesis

pytest.importorskip("uvicorn")  # the `serve` extra; `make test` installs it
ROOT = Path(__file__).resolve().parents[1]
LINES = ["y dijo dios", "la luz", "el principio de los cielos y la tierra", "hola"]


@contextmanager
def serving(app):
    """`app` under a real uvicorn server on a free port, in a thread; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def call(
    url: str,
    body: bytes | dict | None = None,
    method: str | None = None,
    kind: str | None = "application/json",
    timeout: float = 60,
):
    """(status, parsed JSON or text, content type) of one request; a body is sent as `kind`."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None and kind is not None:
        request.add_header("Content-Type", kind)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            status, raw, kind = r.status, r.read(), r.headers["content-type"]
    except urllib.error.HTTPError as e:
        status, raw, kind = e.code, e.read(), e.headers["content-type"]
    payload = json.loads(raw) if kind.startswith("application/json") else raw.decode()
    return status, payload, kind


def call_at_once(url: str, bodies: list[dict], timeout: float = 60) -> list[tuple]:
    """`call(url, body)` for every body at once, each from a thread of its own, all released
    together, so that a server takes them in while it searches (and batches them): their
    answers, in the bodies' order."""
    answers: dict[int, tuple] = {}
    start = threading.Barrier(len(bodies))

    def client(i: int) -> None:
        start.wait()
        answers[i] = call(url, bodies[i], timeout=timeout)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert len(answers) == len(bodies), "a client got no answer in time"
    return [answers[i] for i in range(len(bodies))]


@pytest.fixture(scope="module")
def engine(trained) -> Engine:
    return load_engine(str(trained), torch.device("cpu"), [])


def echo_engine(engine: Engine) -> Engine:
    """The run's tokenizer and config, with a search that answers each source with itself:
    which answer came back for which sentence is then plain to see."""

    def search(src_ids, decode, guides=None):
        return [[Hypothesis(list(ids), 0.0, 0.0)] for ids in src_ids]

    return replace(engine, search=search, model=None)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answers_in_order(engine):
    echo = echo_engine(engine)

    def slow_search(*args):  # as a real one: later requests arrive while it runs
        time.sleep(0.2)
        return echo.search(*args)

    app = build_app(echo, "echo", "test", Limits(max_lines=8, max_wait=0.3), search=slow_search)
    requests = [[f"{word} {i}" for word in LINES[: 1 + i % 4]] for i in range(8)]
    expected = [echo.tokenizer.decode_tgt(echo.tokenizer.encode_src(r)) for r in requests]
    with serving(app) as url:
        answers = call_at_once(f"{url}/translate", [{"text": r, "beam": 2} for r in requests])
    for i, lines in enumerate(expected):
        assert answers[i][0] == 200, answers[i]
        assert answers[i][1] == {"translations": lines}
    # Eight clients at once, searches of 0.2 s, a 0.3 s wait: fewer searches than requests.
    assert app.state.batcher.searches < len(requests)


def test_a_request_is_translated_as_tf_translate_does(engine, trained):
    from typer.testing import CliRunner

    from cli.main import app as cli_app

    direct = CliRunner().invoke(
        cli_app, ["translate", str(trained), "--beam", "3"], input="\n".join(LINES) + "\n"
    )
    assert direct.exit_code == 0, direct.output
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, body, _ = call(f"{url}/translate", {"text": LINES, "beam": 3})
    assert status == 200
    assert body["translations"] == direct.stdout.splitlines()


def test_a_sentence_over_the_models_limit_is_translated_in_parts_as_tf_translate_does(
    engine, trained
):
    """Issue 69: tf serve cuts nothing either: a sentence over the model's limit (and one in a
    document) is translated in parts and joined, word for word as `tf translate` writes it."""
    from typer.testing import CliRunner

    from cli.main import app as cli_app

    long = "Y dijo Dios: Sea la luz. " * 60  # ~600 pieces, over the tiny model's limit
    assert len(engine.tokenizer.encode_src([long.strip()])[0]) > engine.config.model.max_positions
    direct = CliRunner().invoke(
        cli_app, ["translate", str(trained), "--beam", "2"], input=f"hola\n{long}\n"
    )
    assert direct.exit_code == 0, direct.output
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, body, _ = call(f"{url}/translate", {"text": ["hola", long], "beam": 2})
        doc_status, doc, _ = call(
            f"{url}/translate", {"text": f"hola\n\n{long}", "beam": 2, "format": "document"}
        )
    assert status == 200 and body["translations"] == direct.stdout.splitlines()
    assert doc_status == 200 and doc["translation"].count("\n\n") == 1


@pytest.mark.parametrize(
    "body, status, says",
    [
        (b"{not json", 400, "not JSON"),
        (b"\xff\xfe", 400, "not JSON"),
        ({"texts": ["hola"]}, 400, '"text"'),
        ({"text": "hola"}, 400, "list of sentences"),
        ({"text": ["hola", 3]}, 400, "text[1] must be a string"),
        ({"text": ["hola"] * 5}, 413, "at most 4"),
        (
            {"text": ["hola", {"text": "hola " * 300, "constraints": ["hola"]}]},
            400,
            "text[1]: constraints on a line over the model's limit",
        ),
        ({"text": ["hola"], "beam": 0}, 400, '"beam"'),
        ({"text": ["hola"], "beam": "5"}, 400, '"beam"'),
        ({"text": ["hola"], "beam": True}, 400, '"beam"'),
        ({"text": ["hola"], "bean": 5}, 400, "unknown field"),
        (b"[]", 400, '"text"'),
        ({"text": ["hola", "hola \ud800"]}, 400, "text[1]: a lone surrogate"),
        (b'{"text": ["\xed\xa0\x80"]}', 400, "text[0]: a lone surrogate"),  # CESU-8 bytes
        ({"text": [["hola"]]}, 400, "text[0] must be a string"),
        ({"text": ["hola", {"text": "hola", "prefix": 3}]}, 400, 'text[1]: "prefix" must be'),
        (
            {"text": [{"text": "hola", "constraints": ["\u732b"]}]},
            400,
            "pieces the tokenizer lacks",
        ),
        ({"text": [{"txt": "hola"}]}, 400, "text[0]: unknown field(s) ['txt']"),
        pytest.param(
            b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            400,
            "nested too deeply",
            id="deeply-nested",
        ),
        pytest.param(
            b'{"text": ["hola"], "beam": ' + b"9" * 5000 + b"}",
            400,
            "number too long",
            id="5000-digit-beam",
        ),
        ({"text": ["hola"], "beam": None}, 400, '"beam"'),
        (b'{"text": ["hola"], "beam": NaN}', 400, '"beam"'),
        ({"text": "hola", "format": "html"}, 400, '"format" must be one of'),
        ({"text": "hola", "format": ["document"]}, 400, '"format" must be one of'),
        ({"text": ["hola"], "format": "document"}, 400, '"text" must be one string'),
        ({"text": "Hola. " * 5, "format": "document"}, 413, "5 sentences; at most 4"),
        ({"text": "Hola.\n\nla \u0000 luz", "format": "document"}, 400, "text: "),
        ({"text": "- \ud800\nhola", "format": "document"}, 400, "text: a lone surrogate"),
        ({"text": "1\n00:00:01,000 --> 00:00:02\nhola\n", "format": "srt"}, 400, "text:2: "),
    ],
)
def test_bad_requests_get_a_4xx_and_a_one_line_json_error(engine, body, status, says):
    with serving(build_app(engine, "run", "pytorch", Limits(max_lines=4))) as url:
        got, payload, kind = call(f"{url}/translate", body)
        assert (got, kind) == (status, "application/json"), payload
        assert says in payload["error"] and "\n" not in payload["error"]
        assert call(f"{url}/translate", {"text": ["hola"]})[0] == 200  # still serving


def test_an_oversized_body_is_refused_before_it_is_read(engine):
    import http.client

    with serving(build_app(engine, "run", "pytorch")) as url:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
        conn.putrequest("POST", "/translate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(64 << 20))
        conn.endheaders(b'{"text": ["')  # and no more: the server must not wait for 64 MB
        response = conn.getresponse()
        assert response.status == 413
        assert "bytes" in json.loads(response.read())["error"]
        conn.close()


def test_wrong_routes_and_methods_answer_json(engine):
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, payload, _ = call(f"{url}/translate")  # GET
        assert status == 405 and "GET /translate" in payload["error"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/translate", timeout=60)
        assert refused.value.headers["Allow"] == "POST"  # what HTTP asks of a 405
        status, payload, _ = call(f"{url}/nowhere")
        assert status == 404 and "/nowhere" in payload["error"]


def test_an_address_in_use_is_a_one_line_error_before_serving(trained):
    from typer.testing import CliRunner

    from cli.main import app as cli_app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", str(trained), "--port", str(port), "--workers", "1"]
        done = CliRunner().invoke(cli_app, args)
    assert done.exit_code == 2, done.output
    assert f"--port {port}: cannot listen there" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "serving" not in done.output


def test_a_failing_search_is_a_500_and_the_server_lives_on(engine):
    calls = []

    def search(src_ids, decode, guides=None):
        calls.append(len(src_ids))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return engine.search(src_ids, decode, guides)

    with serving(build_app(replace(engine, search=search), "run", "pytorch")) as url:
        status, payload, _ = call(f"{url}/translate", {"text": ["hola"]})
        assert status == 500 and "out of memory" in payload["error"]
        assert call(f"{url}/translate", {"text": ["hola"]})[0] == 200


def test_the_page_and_health(engine, trained):
    app = build_app(engine, str(trained), "pytorch", page=read_page())
    with serving(app) as url:
        status, page, kind = call(f"{url}/")
        assert status == 200 and kind.startswith("text/html")
        assert "<textarea" in page and 'fetch("translate"' in page
        assert '"Content-Type": "application/json"' in page  # else the server answers 415
        status, health, _ = call(f"{url}/health")
        assert status == 200
        assert health["status"] == "ok" and health["engine"] == "pytorch"
        # The run's name, not where it lies on the server's disk.
        assert (health["src_lang"], health["tgt_lang"], health["model"]) == ("es", "en", "run")
        assert str(trained.parent) not in json.dumps(health)
        # A batcher that died would leave every request waiting: /health says so.
        dead = threading.Thread(target=lambda: None)
        dead.start()
        dead.join()
        app.state.batcher.workers[-1] = dead
        status, health, _ = call(f"{url}/health")
        assert status == 503 and health["status"] == "down"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["run", "ctranslate2", "ensemble"])
def test_tf_serve_starts_from_the_command_line(trained, sharp, tmp_path, kind):  # noqa: F811
    """The real command, for a run, for an exported CTranslate2 directory and for an ensemble
    of two runs, whose requests the search processes search whole."""
    target, options = trained, []
    if kind == "ensemble":
        options = [str(sharp), "--set", "decode.precision=fp32"]
    if kind == "ctranslate2":
        pytest.importorskip("ctranslate2")
        target = tmp_path / "ct2"
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "export", str(trained), "--to", kind, "-o", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    port = free_port()
    command = [sys.executable, "-m", "cli.main", "serve", str(target), *options]
    command += ["--port", str(port)]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    searchers: list[int] = []
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while True:
            try:
                status, health, _ = call(f"{url}/health")
                break
            except urllib.error.URLError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "tf serve did not answer"
                time.sleep(0.2)
        assert status == 200
        assert health["engine"] == ("ctranslate2" if kind == "ctranslate2" else "pytorch")
        assert health["model"] == ("run + run" if kind == "ensemble" else target.name)
        own_threads = kind == "ctranslate2"  # its own thread pool: one worker
        assert health["workers"] == search_workers(torch.device("cpu"), 0, own_threads)[0]
        status, body, _ = call(f"{url}/translate", {"text": LINES[:2], "beam": 2})
        assert status == 200 and len(body["translations"]) == 2
        if kind == "ensemble":  # the two runs' mean, as `tf translate` has it
            alone = subprocess.run(
                [sys.executable, "-m", "cli.main", "translate", str(trained), str(sharp),
                 "--beam", "2", "--set", "decode.precision=fp32"],
                cwd=ROOT, input="\n".join(LINES[:2]) + "\n", capture_output=True, text=True,
            )  # fmt: skip
            assert body["translations"] == alone.stdout.splitlines(), alone.stderr
        # A run searches in processes of its own, one per worker (CTranslate2 in the server's).
        searchers = children(proc.pid)
        assert len(searchers) == (0 if own_threads else health["workers"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in searchers):  # ended with the server
        assert time.monotonic() < deadline, "search processes outlived tf serve"
        time.sleep(0.1)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc; multiprocessing's helper excluded)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(command name)"
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid and b"resource_tracker" not in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize(
    "option, says",
    [
        (["--max-lines", "0"], "--max-lines must be 1 or more, got 0"),
        (["--workers", "-1"], "--workers must be 0 (as many as the cores allow) or more, got -1"),
    ],
)
def test_tf_serve_refuses_bad_options_in_one_line(trained, option, says):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", str(trained), *option],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {says}"


def test_workers_search_side_by_side_each_with_its_threads(engine):
    """Two workers: a second group is searched while the first still runs (each search waits
    for the other at a barrier, which one worker alone would never pass), each in a thread
    of the intra-op threads it was given; the caller's own setting is left alone."""
    both = threading.Barrier(2, timeout=30)
    seen, entered = [], threading.Event()

    def search(src_ids, decode, guides=None):
        seen.append(torch.get_num_threads())
        entered.set()
        both.wait()
        return [[Hypothesis(list(ids), 0.0, 0.0)] for ids in src_ids]

    mine = torch.get_num_threads()
    batcher = Batcher(search, max_tokens=4096, max_wait=0.0, workers=2, threads=mine + 1)
    first = batcher.submit([[1]], engine.config.decode)
    assert entered.wait(30)  # its search runs: the next job cannot join its group
    second = batcher.submit([[2]], engine.config.decode)
    assert first.result(timeout=30)[0][0].tokens == [1]
    assert second.result(timeout=30)[0][0].tokens == [2]
    assert seen == [mine + 1] * 2 and batcher.searches == 2 and batcher.alive
    assert torch.get_num_threads() == mine


def test_search_workers_share_the_cores_out(monkeypatch):
    import cli.device

    monkeypatch.setattr(cli.device, "usable_cores", lambda: 16)
    assert search_workers(torch.device("cpu")) == (4, 4)
    assert search_workers(torch.device("cpu"), workers=16) == (16, 1)
    monkeypatch.setattr(cli.device, "usable_cores", lambda: 2)
    assert search_workers(torch.device("cpu")) == (2, 1)
    assert search_workers(torch.device("cuda")) == (1, 0)  # a GPU runs one search at a time
    assert search_workers(torch.device("cpu"), own_threads=True) == (1, 0)  # CTranslate2's pool


# --- the batcher under cancellation, failure, departed clients, a full queue, a time limit ---


class Gate:
    """An echo search that holds its first call until `open` is set, recording every source
    it is given: a search running while the test arranges the queue behind it."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.open, self.entered = threading.Event(), threading.Event()
        self.searched: list[list[int]] = []
        self.calls: list[tuple[int, int]] = []  # (sources, decode.max_tokens) of each call
        self.fail_on = fail_on  # a token id that fails any search holding it

    def search(self, src_ids, decode, guides=None):
        self.entered.set()
        assert self.open.wait(60), "the test never opened the gate"
        self.searched += src_ids
        self.calls.append((len(src_ids), decode.max_tokens))
        if any(self.fail_on in ids for ids in src_ids):
            raise RuntimeError("a sentence this search cannot take")
        return [[Hypothesis(list(ids), 0.0, 0.0)] for ids in src_ids]


def held_batcher(gate: Gate, engine: Engine, **kwargs) -> tuple[Batcher, object]:
    """A batcher busy with a first job on `gate` (so later jobs queue); that job's future."""
    batcher = Batcher(gate.search, **{"max_tokens": 4096, "max_wait": 0.0, **kwargs})
    first = batcher.submit([[1, 2]], engine.config.decode)
    assert gate.entered.wait(30)
    return batcher, first


class Holds:
    """An echo search that holds each group until the test releases its first token, and
    says which groups it entered: workers kept busy in the order a test arranges."""

    def __init__(self) -> None:
        self.release: dict[int, threading.Event] = {}
        self.entered: queue.Queue[list[int]] = queue.Queue()
        self.groups: list[list[int]] = []

    def search(self, src_ids, decode, guides=None):
        group = [ids[0] for ids in src_ids]
        self.groups.append(group)
        self.entered.put(group)
        assert self.release.setdefault(group[0], threading.Event()).wait(60), "never released"
        return [[Hypothesis(list(ids), 0.0, 0.0)] for ids in src_ids]

    def let_go(self, token: int) -> None:
        self.release.setdefault(token, threading.Event()).set()


def test_a_lone_request_is_searched_at_once_and_others_wait_to_join(engine):
    """The batching window waits only while other requests are in flight: a lone request
    would wait for nobody."""
    gate = Gate()
    gate.open.set()
    lone = Batcher(gate.search, max_tokens=4096, max_wait=60.0)
    assert lone.submit([[1]], engine.config.decode).result(timeout=20)[0][0].tokens == [1]
    holds, decode = Holds(), engine.config.decode
    batcher = Batcher(holds.search, max_tokens=4096, max_wait=1.0, workers=2)
    first = batcher.submit([[1]], decode)
    assert holds.entered.get(timeout=30) == [1]
    second = batcher.submit([[2]], decode)  # the other worker takes it (its share: 1 of 2)
    assert holds.entered.get(timeout=30) == [2]
    third = batcher.submit([[3]], decode)  # 3 in flight now: a share of 2
    holds.let_go(2)  # a worker takes the third and waits for one more to join...
    time.sleep(0.2)
    fourth = batcher.submit([[4]], decode)
    assert holds.entered.get(timeout=30) == [3, 4]  # ... which it does
    holds.let_go(3)
    holds.let_go(1)
    for future, token in ((first, 1), (second, 2), (third, 3), (fourth, 4)):
        assert future.result(timeout=30)[0][0].tokens[0] == token


def test_workers_share_the_requests_in_flight(engine):
    """A free worker takes its share of the requests lately in flight, not all that wait:
    otherwise one takes every request as the other idles, then the next one alone."""
    holds, decode = Holds(), engine.config.decode
    batcher = Batcher(holds.search, max_tokens=4096, max_wait=0.2, workers=2)
    futures = [batcher.submit([[1]], decode)]
    assert holds.entered.get(timeout=30) == [1]
    futures.append(batcher.submit([[2]], decode))
    assert holds.entered.get(timeout=30) == [2]
    futures += [batcher.submit([[token]], decode) for token in (3, 4, 5, 6)]  # 6 in flight
    holds.let_go(2)
    assert holds.entered.get(timeout=30) == [3, 4, 5]  # a share of 3, where it took all 4
    holds.let_go(1)
    assert holds.entered.get(timeout=30) == [6]
    for token in (3, 6):
        holds.let_go(token)
    assert [f.result(timeout=30)[0][0].tokens[0] for f in futures] == [1, 2, 3, 4, 5, 6]


def test_the_batcher_keeps_its_load_for_the_search_processes(engine):
    """`load` (shared with `tf serve`'s search processes) counts the requests in flight:
    queued or being searched, and none once answered."""
    holds, decode = Holds(), engine.config.decode
    load = multiprocessing.get_context("spawn").Value("i", 0, lock=False)
    batcher = Batcher(holds.search, max_tokens=4096, max_wait=0.0, load=load)
    first = batcher.submit([[1]], decode)
    assert holds.entered.get(timeout=30) == [1] and load.value == 1
    second = batcher.submit([[2]], decode)
    assert load.value == 2
    holds.let_go(1)
    assert first.result(timeout=30) and holds.entered.get(timeout=30) == [2]
    assert settles_to(load, 1)  # once the first answer's callbacks have run
    holds.let_go(2)
    assert second.result(timeout=30) and settles_to(load, 0)


def settles_to(load, value: int) -> bool:
    """Whether `load` reaches `value` within 10 s (a future's callbacks run just after its
    result is visible)."""
    deadline = time.monotonic() + 10
    while load.value != value and time.monotonic() < deadline:
        time.sleep(0.01)
    return load.value == value


def test_a_cancelled_request_does_not_kill_the_batcher(engine):
    """A future cancelled while queued (a client gone, a host that cancels handler tasks) is
    dropped unsearched; the thread lives on and answers the next request."""
    gate = Gate()
    batcher, first = held_batcher(gate, engine)
    gone = batcher.submit([[7, 7, 7]], engine.config.decode)
    assert gone.cancel()
    gate.open.set()
    later = batcher.submit([[5]], engine.config.decode)
    assert later.result(timeout=30)[0][0].tokens == [5]
    assert first.result(timeout=30)[0][0].tokens == [1, 2]
    assert batcher.alive and batcher.dropped == 1 and [7, 7, 7] not in gate.searched
    assert batcher.pending == 0 and batcher.waiting == 0


def test_a_host_cancelling_the_handler_task_cancels_its_job(engine):
    """What uvicorn never does but other ASGI hosts do (a shutdown timeout, a disconnect):
    cancel the task of a request waiting in the queue. Its job is dropped, nothing breaks."""
    import asyncio

    gate = Gate()
    app = build_app(replace(engine, search=gate.search, model=None), "echo", "test")
    batcher = app.state.batcher
    body = json.dumps({"text": ["hola"]}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/translate",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "http_version": "1.1",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
    }

    async def receive():
        if not getattr(receive, "sent", False):
            receive.sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # a client that stays

    async def send(message):
        pass

    async def cancel_one_waiting() -> None:
        task = asyncio.ensure_future(app(scope, receive, send))
        while batcher.waiting < 1:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    first = batcher.submit([[1]], engine.config.decode)
    assert gate.entered.wait(30)
    asyncio.run(asyncio.wait_for(cancel_one_waiting(), 30))
    assert batcher.pending == 0  # its place in the queue is free at once
    gate.open.set()
    assert first.result(timeout=30)
    assert batcher.submit([[5]], engine.config.decode).result(timeout=30)[0][0].tokens == [5]
    assert batcher.alive and batcher.dropped == 1 and gate.searched == [[1], [5]]


def test_a_failing_batch_is_retried_request_by_request(engine):
    """One bad request in a shared batch fails alone; the others get their answers."""
    gate = Gate(fail_on=13)
    batcher, first = held_batcher(gate, engine)
    good, bad, also_good = (
        batcher.submit(ids, engine.config.decode) for ids in ([[3, 4]], [[13]], [[5]])
    )
    gate.open.set()
    assert good.result(timeout=30)[0][0].tokens == [3, 4]
    assert also_good.result(timeout=30)[0][0].tokens == [5]
    assert "cannot take" in str(bad.exception(timeout=30))
    assert first.result(timeout=30) and batcher.alive


def test_the_batch_budget_counts_the_beam(engine):
    """Source tokens x beam: a group of beam-4 requests holds a quarter of the tokens of a
    greedy one, and the engine's own batches are cut to the same budget."""
    gate = Gate()
    batcher, _ = held_batcher(gate, engine, max_tokens=100)
    beam4 = replace(engine.config.decode, beam_size=4)
    futures = [batcher.submit([[i] * 10], beam4) for i in range(6)]  # 40 each
    gate.open.set()
    for f in futures:
        f.result(timeout=30)
    assert gate.calls[1:] == [(2, 25)] * 3


def test_work_of_clients_that_left_is_never_searched(engine):
    """Ten clients post and leave while the batcher is busy: their requests are dropped
    before they are searched, and the next real request does not wait for them."""
    gate = Gate()
    echo = replace(engine, search=gate.search, model=None)
    app = build_app(echo, "echo", "test", Limits(max_wait=0.0))
    batcher = app.state.batcher
    with serving(app) as url:
        host, port = url.removeprefix("http://").split(":")
        blocker = threading.Thread(target=call, args=(f"{url}/translate", {"text": ["la luz"]}))
        blocker.start()
        assert gate.entered.wait(30)
        for i in range(10):
            body = json.dumps({"text": [f"hola {i}"]}).encode()
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(
                    b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                wait_for(lambda n=i + 1: batcher.waiting == n)  # queued, then its client leaves
        wait_for(lambda: batcher.pending == 0)  # each noticed and cancelled
        gate.open.set()
        status, body, _ = call(f"{url}/translate", {"text": ["y dijo dios"]})
        blocker.join(timeout=30)
    assert status == 200 and batcher.dropped == 10
    searched = echo.tokenizer.decode_tgt(gate.searched)
    assert searched == ["la luz", "y dijo dios"]


def wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_full_queue_is_a_503_with_retry_after_at_once(engine):
    gate = Gate()
    app = build_app(
        replace(engine, search=gate.search, model=None), "echo", "test", Limits(max_queue=50)
    )
    batcher = app.state.batcher
    with serving(app) as url:
        blocker = threading.Thread(target=call, args=(f"{url}/translate", {"text": ["la luz"]}))
        blocker.start()
        assert gate.entered.wait(30)
        filler = batcher.submit([[5] * 60], engine.config.decode)  # alone it may wait
        started = time.monotonic()
        status, body, _ = call(f"{url}/translate", {"text": ["hola"]}, timeout=20)
        assert time.monotonic() - started < 10  # at once, not after the search ahead of it
        request = urllib.request.Request(
            f"{url}/translate", b'{"text": ["hola"]}', {"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=20)
        gate.open.set()
        blocker.join(timeout=30)
        assert filler.result(timeout=30)
    assert status == 503 and "full" in body["error"]
    assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"


def test_a_request_past_its_time_limit_is_a_504_and_dropped(engine):
    gate = Gate()
    echo = replace(engine, search=gate.search, model=None)
    app = build_app(echo, "echo", "test", Limits(max_wait=0.0, timeout=2.0))
    with serving(app) as url:
        status, body, _ = call(f"{url}/translate", {"text": ["la luz"]})  # searched, held
        assert status == 504 and "within 2 s" in body["error"]
        assert call(f"{url}/translate", {"text": ["hola"]})[0] == 504  # queued behind it
        assert app.state.batcher.pending == 0
        gate.open.set()
        wait_for(lambda: app.state.batcher.waiting == 0)
        status, body, _ = call(f"{url}/translate", {"text": ["y dijo dios"]})
    assert status == 200 and body == {"translations": ["y dijo dios"]}
    assert echo.tokenizer.decode_tgt(gate.searched) == ["la luz", "y dijo dios"]
    assert app.state.batcher.dropped == 1


# --- the shapes of answers, what the server takes, its own settings ---


def test_no_sentences_get_no_translations_as_a_list(engine):
    assert engine.tokenizer.decode_tgt([]) == []
    with serving(build_app(engine, "run", "pytorch")) as url:
        assert call(f"{url}/translate", {"text": []})[:2] == (200, {"translations": []})
        status, body, _ = call(f"{url}/translate", {"text": ["", "   "]})
    assert (status, body) == (200, {"translations": ["", ""]})


DOCUMENT = (
    "  # El principio\n\nY dijo dios: la luz. La luz\r\nde los cielos y la tierra.\n\n- hola\n"
)
SUBTITLES = (
    "1\n00:00:01,000 --> 00:00:02,000\nY dijo dios\n\n2\n00:00:02,500 --> 00:00:04,000\nla luz.\n"
)


@pytest.mark.parametrize(
    "form, text, sentences",
    [
        (
            "document",
            DOCUMENT,
            ["El principio", "Y dijo dios: la luz.", "La luz de los cielos y la tierra.", "hola"],
        ),
        ("srt", SUBTITLES, ["Y dijo dios la luz."]),
        ("document", "", []),
        ("document", "\n \r\n\n", []),
    ],
)
def test_a_document_is_translated_by_sentences_and_answered_with_its_layout(
    engine, form, text, sentences
):
    """A body of "format" "document" (or "srt"): the server splits its "text" into sentences,
    searches each as a line of its own, and answers the document written back around their
    translations: with a search that answers each source with itself, the document as it
    was (heading marks, blank lines, CRLF, a sentence over two lines, a list marker)."""
    gate = Gate()
    gate.open.set()
    echo = echo_engine(engine)
    with serving(build_app(echo, "echo", "test", search=gate.search)) as url:
        status, body, _ = call(f"{url}/translate", {"format": form, "text": text})
    assert (status, body) == (200, {"translation": text})
    assert echo.tokenizer.decode_tgt(gate.searched) == sentences


def test_a_documents_sentences_share_a_batch_with_other_requests_lines(engine):
    """A document's sentences are ordinary lines to the batcher: searched in one group with
    another client's sentences that waited beside them."""
    gate, echo = Gate(), echo_engine(engine)
    app = build_app(echo, "echo", "test", Limits(max_wait=0.5), search=gate.search)
    bodies = [
        {"text": ["hola"]},
        {"format": "document", "text": "Y dijo dios.\n\nLa luz."},
        {"text": ["el principio"]},
    ]
    answers: list[tuple] = []
    with serving(app) as url:
        batcher = app.state.batcher
        clients = [
            threading.Thread(target=lambda b=b: answers.append(call(f"{url}/translate", b)))
            for b in bodies
        ]
        clients[0].start()
        assert gate.entered.wait(30)  # the first request holds the search...
        for client in clients[1:]:
            client.start()
        wait_for(lambda: batcher.waiting == 2)  # ... while the other two queue behind it
        gate.open.set()
        for client in clients:
            client.join(timeout=30)
    assert sorted(status for status, *_ in answers) == [200] * 3
    assert {"translation": bodies[1]["text"]} in [body for _, body, _ in answers]
    assert [n for n, _ in gate.calls] == [1, 3]  # the document's two sentences and a line
    searched = sorted(echo.tokenizer.decode_tgt(gate.searched[1:]))
    assert searched == ["La luz.", "Y dijo dios.", "el principio"]


@pytest.mark.parametrize(
    "kind", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_only_json_is_taken_so_web_pages_cannot_post_forms(engine, kind):
    """A page on any site can post a form or text/plain to localhost without asking the
    server; JSON from another origin needs a CORS consent that is never given."""
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, body, _ = call(f"{url}/translate", b'{"text": ["hola"]}', kind=kind)
        assert status == 415 and "application/json" in body["error"]
        charset = "application/json; charset=utf-8"
        assert call(f"{url}/translate", b'{"text": ["hola"]}', kind=charset)[0] == 200


def test_the_servers_own_beam_is_checked_at_start_with_the_requests_limits(engine):
    with pytest.raises(InputError, match="beam.*1 to 32, got 40"):
        build_app(engine_with_beam(engine, 40), "run", "pytorch")
    echo = echo_engine(engine_with_beam(engine, 32))  # the largest a request may ask
    with serving(build_app(echo, "echo", "test")) as url:
        assert call(f"{url}/translate", {"text": ["hola"]})[:2] == (200, {"translations": ["hola"]})


def engine_with_beam(engine: Engine, beam: int) -> Engine:
    decode = replace(engine.config.decode, beam_size=beam)
    return replace(engine, config=replace(engine.config, decode=decode))


@pytest.mark.parametrize(
    "args, says",
    [
        (["--beam", "40"], "error: the server's beam (--beam, decode.beam_size) must be"),
        (["--set", "decode.beam_size=33"], "got 33"),
        (["--max-queue", "0"], "error: --max-queue must be 1 or more, got 0"),
        (["--timeout", "0"], "error: --timeout must be a number of seconds above 0, got 0.0"),
        (["--max-wait", "nan"], "error: --max-wait must be 0 or more, got nan"),
        (["--max-wait", "1e13"], "error: --max-wait 1e+13 ms must be shorter than --timeout"),
    ],
)
def test_tf_serve_refuses_bad_settings_at_start_in_one_line(trained, args, says):
    from typer.testing import CliRunner

    from cli.main import app as cli_app

    # An address uvicorn cannot bind: a check that let a bad setting through fails the test
    # at once instead of serving forever.
    done = CliRunner().invoke(cli_app, ["serve", str(trained), "--host", "256.0.0.0", *args])
    assert done.exit_code == 2, done.output
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_sentence_can_ask_for_a_prefix_and_constraints(engine, trained):
    """The same fields as `tf translate --input-format jsonl`, per sentence, with the same
    answers; sentences that ask nothing share the batch unchanged."""
    from typer.testing import CliRunner

    from cli.main import app as cli_app

    asked = [
        {"text": "el perro come", "prefix": "And", "constraints": ["the house"]},
        "yo soy",
        {"text": "la casa", "constraints": ["God", "of Israel"]},
    ]
    lines = "".join(json.dumps(a) + "\n" for a in asked)
    direct = CliRunner().invoke(
        cli_app, ["translate", str(trained), "--input-format", "jsonl", "--beam", "3"], input=lines
    )
    assert direct.exit_code == 0, direct.output
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, body, _ = call(f"{url}/translate", {"text": asked, "beam": 3})
    assert status == 200, body
    assert body["translations"] == direct.stdout.splitlines()
    first, _, third = body["translations"]
    assert first.startswith("And") and "the house" in first
    assert "God" in third and "of Israel" in third


def test_an_ensemble_is_served_as_tf_translate_decodes_it(trained, sharp):  # noqa: F811
    """`tf serve RUN RUN2`: the command takes several runs (it took one), and a request gets
    `tf translate RUN RUN2`'s translations, searched in whole groups."""
    from typer.testing import CliRunner

    from cli.main import app as cli_app

    args = ["serve", str(trained), str(sharp), "--host", "256.0.0.0"]
    done = CliRunner().invoke(cli_app, args)  # loads both, then meets the bad address
    assert done.exit_code == 2 and "--host 256.0.0.0" in done.stderr, done.output
    settings = ["--beam", "2", "--set", "decode.precision=fp32"]
    direct = CliRunner().invoke(
        cli_app, ["translate", str(trained), str(sharp), *settings], input="\n".join(LINES) + "\n"
    )
    assert direct.exit_code == 0, direct.output
    cpu = torch.device("cpu")
    engine = load_engine([str(trained), str(sharp)], cpu, ["decode.beam_size=2",
                                                          "decode.precision=fp32"])  # fmt: skip
    app = build_app(engine, [str(trained), str(sharp)], "pytorch")
    with serving(app) as url:
        status, body, _ = call(f"{url}/translate", {"text": LINES})
        health = call(f"{url}/health")[1]
    assert status == 200 and body["translations"] == direct.stdout.splitlines()
    assert health["model"] == "run + run"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_translate_and_serve_search_with_the_same_settings(trained, precision, monkeypatch):
    """One mapping from decode settings to a search's (`decoding.search_settings`): the lines
    of `tf translate` and a `tf serve` request asking the server's beam are searched with
    equal `SearchSettings`, whose `half_logits` says whether the logits are half: the
    precision asked (bf16), as `translate_ids` autocasts to it, on both paths alike."""
    built, real = [], decoding.search_settings

    def recorded(*args):
        built.append(real(*args))
        return built[-1]

    monkeypatch.setattr(decoding, "search_settings", recorded)
    cpu = torch.device("cpu")
    engine = load_engine(str(trained), cpu, ["decode.beam_size=3", f"decode.precision={precision}"])
    translated = [hyps[0].tokens for _, hyps in engine.stream(LINES, "<test>")]
    by_translate, built[:] = set(built), []
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, body, _ = call(f"{url}/translate", {"text": LINES})
    assert status == 200, body
    assert body["translations"] == engine.tokenizer.decode_tgt(translated)
    assert set(built) == by_translate and len(by_translate) == 1
    (settings,) = by_translate
    assert settings.beam_size == 3 and settings.half_logits == (precision == "bf16")
