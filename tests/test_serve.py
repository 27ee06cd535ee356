"""`tf serve`: answers in order per request under concurrent clients, batches them together,
a one-line JSON 4xx for every bad request, a page for people, and the CLI that starts it."""

from __future__ import annotations

import json
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

from cli.commands.serve import Limits, build_app
from cli.inference.engines import Engine, load_engine
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


def call(url: str, body: bytes | dict | None = None, method: str | None = None):
    """(status, parsed JSON or text, content type) of one request."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            status, raw, kind = r.status, r.read(), r.headers["content-type"]
    except urllib.error.HTTPError as e:
        status, raw, kind = e.code, e.read(), e.headers["content-type"]
    payload = json.loads(raw) if kind.startswith("application/json") else raw.decode()
    return status, payload, kind


@pytest.fixture(scope="module")
def engine(trained) -> Engine:
    return load_engine(str(trained), torch.device("cpu"), [])


def echo_engine(engine: Engine) -> Engine:
    """The run's tokenizer and config, with a search that answers each source with itself:
    which answer came back for which sentence is then plain to see."""

    def search(src_ids, decode):
        return [[Hypothesis(list(ids), 0.0, 0.0)] for ids in src_ids]

    return replace(engine, search=search, model=None)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answers_in_order(engine):
    echo = echo_engine(engine)
    app = build_app(echo, "echo", "test", Limits(max_lines=8, max_wait=0.3))
    requests = [[f"{word} {i}" for word in LINES[: 1 + i % 4]] for i in range(8)]
    expected = [echo.tokenizer.decode_tgt(echo.tokenizer.encode_src(r)) for r in requests]
    answers: dict[int, tuple] = {}
    start = threading.Barrier(len(requests))

    def client(i: int) -> None:
        start.wait()
        answers[i] = call(f"{url}/translate", {"text": requests[i], "beam": 2})

    with serving(app) as url:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    for i, lines in enumerate(expected):
        assert answers[i][0] == 200, answers[i]
        assert answers[i][1] == {"translations": lines}
    # Eight clients at once, a 0.3 s wait: fewer searches than requests.
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


@pytest.mark.parametrize(
    "body, status, says",
    [
        (b"{not json", 400, "not JSON"),
        (b"\xff\xfe", 400, "not JSON"),
        ({"texts": ["hola"]}, 400, '"text"'),
        ({"text": "hola"}, 400, "list of sentences"),
        ({"text": ["hola", 3]}, 400, "text[1] must be a string"),
        ({"text": ["hola"] * 5}, 413, "at most 4"),
        ({"text": ["hola " * 300]}, 400, "text[0]: "),
        ({"text": ["hola"], "beam": 0}, 400, '"beam"'),
        ({"text": ["hola"], "beam": "5"}, 400, '"beam"'),
        ({"text": ["hola"], "beam": True}, 400, '"beam"'),
        ({"text": ["hola"], "bean": 5}, 400, "unknown field"),
        (b"[]", 400, '"text"'),
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
        status, payload, _ = call(f"{url}/nowhere")
        assert status == 404 and "/nowhere" in payload["error"]


def test_a_failing_search_is_a_500_and_the_server_lives_on(engine):
    calls = []

    def search(src_ids, decode):
        calls.append(len(src_ids))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return engine.search(src_ids, decode)

    with serving(build_app(replace(engine, search=search), "run", "pytorch")) as url:
        status, payload, _ = call(f"{url}/translate", {"text": ["hola"]})
        assert status == 500 and "out of memory" in payload["error"]
        assert call(f"{url}/translate", {"text": ["hola"]})[0] == 200


def test_the_page_and_health(engine, trained):
    with serving(build_app(engine, str(trained), "pytorch")) as url:
        status, page, kind = call(f"{url}/")
        assert status == 200 and kind.startswith("text/html")
        assert "<textarea" in page and 'fetch("translate"' in page
        status, health, _ = call(f"{url}/health")
    assert status == 200
    assert health["status"] == "ok" and health["engine"] == "pytorch"
    assert (health["src_lang"], health["tgt_lang"], health["model"]) == ("es", "en", str(trained))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["run", "ctranslate2"])
def test_tf_serve_starts_from_the_command_line(trained, tmp_path, kind):
    """The real command, for a run and for an exported CTranslate2 directory."""
    target = trained
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
    command = [sys.executable, "-m", "cli.main", "serve", str(target), "--port", str(port)]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
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
        status, body, _ = call(f"{url}/translate", {"text": LINES[:2], "beam": 2})
        assert status == 200 and len(body["translations"]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_tf_serve_refuses_bad_options_in_one_line(trained):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", str(trained), "--max-lines", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --max-lines must be 1 or more, got 0"
