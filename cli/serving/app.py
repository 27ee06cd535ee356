"""The HTTP application of `tf serve`: Starlette routes and checks the requests, the batcher
(`cli.serving.batcher`) translates those of concurrent clients together. The engine may be an
ensemble of runs.

    POST /translate  {"text": ["...", ...], "beam": 5}  ->  {"translations": ["...", ...]}
                     an item of "text" may be {"text": "...", "prefix": "...", "constraints":
                     ["...", ...]}: its translation starts with prefix and holds each constraint
    POST /translate  {"format": "document", "text": "one string", ...}  ->  {"translation": "..."}
                     a plain-text document (paragraphs, line breaks, list markers kept:
                     `data.documents`), or with "format": "srt" a SubRip file
                     (`data.subtitles`); its sentences are batched with other requests' lines
    GET  /health     what is served: model, engine, languages, default beam; 503 if it is down
    GET  /           a page where a person pastes a document and reads its translation

A client's mistake gets a 4xx and a one-line JSON error (`{"error": "..."}`), never a 500 or a
traceback; a full queue is a 503 with `Retry-After`, at once; a request waits at most
`Limits.timeout` seconds (504), and one whose client left is dropped before it is searched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from importlib import resources

from cli.config import DecodeConfig
from cli.inference.decoding import Rows, hypothesis_texts
from cli.inference.engines import Engine, Search
from cli.inference.languages import check_languages
from cli.inference.requests import Request, check_text, request_of
from cli.serving.batcher import Batcher, QueueFull
from data.config import direction_of
from data.documents import Document, parse_document
from data.errors import InputError
from data.files import shown_path
from data.sentences import Splitter, sentence_splitter
from data.subtitles import Subtitles, parse_srt

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one request
MAX_BEAM = 32
RETRY_AFTER = "1"  # seconds a client refused for a full queue is asked to wait
FIELDS = ("text", "beam", "to", "from", "format")  # of a POST /translate body
# A body's "format", what its "text" is: a list of sentences, each translated alone (the
# default); one string of plain text, its paragraphs and lines written back around their
# translations (`data.documents`); one string holding a SubRip file (`data.subtitles`).
FORMATS = ("sentences", "document", "srt")


class RequestError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers


@dataclass
class Limits:
    max_lines: int = 256  # sentences in one request
    max_wait: float = 0.02  # seconds the batcher waits for other requests to join a batch
    max_queue: int = 1 << 16  # source tokens x beam waiting for the batcher
    timeout: float = 60.0  # seconds a request may take, queue and search included
    workers: int = 1  # searches side by side (`cli.device.search_workers`)
    threads: int = 0  # intra-op threads of each (0: torch's setting)


def beam_problem(beam: object) -> str | None:
    """What is wrong with a beam, for a request's "beam" and the server's own default alike."""
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        return f"a whole number from 1 to {MAX_BEAM}, got {beam!r}"
    return None


def check_engine(engine: Engine) -> None:
    """The server's default decode settings, under the limits a request's would meet: a
    default no request could ask for is refused at start, not blamed on every client."""
    beam = engine.config.decode.beam_size
    request_decode(engine, beam, "the server's beam (--beam, decode.beam_size)")


def request_decode(engine: Engine, beam: object, where: str) -> DecodeConfig:
    """The decode settings of a request asking for `beam` (the server's own, for the requests
    that ask none): one of a request's beams (`beam_problem`) that the engine searches with
    (`Engine.check_decode`, as the command line's settings are at load: CTranslate2 cannot
    follow an imported model's beam rules that its greedy default never met).

    Raises:
        InputError: naming `where` (the request's "beam", the server's --beam).
    """
    problem = beam_problem(beam)
    if problem:
        raise InputError(f"{where} must be {problem}")
    decode = replace(engine.config.decode, beam_size=beam, nbest=1)
    try:
        engine.check_decode(decode)
    except InputError as e:
        raise InputError(f"{where} {beam}: {e}") from None
    return decode


@dataclass
class Asked:
    """A POST /translate body, checked: the sentences to translate, their decode settings and
    languages (the body's "to" and "from", every sentence's that names none of its own), and
    the document or SubRip file whose sentences they are, to write their translations into."""

    requests: list[Request]
    decode: DecodeConfig
    langs: dict[str, str]
    layout: Document | Subtitles | None = None  # None: "text" is a list of sentences

    def where(self, i: int) -> str:
        """How a message names the i-th sentence."""
        return f"text[{i}]" if self.layout is None else f"text: sentence {i + 1}"


def parse_request(body: bytes, engine: Engine, limits: Limits) -> Asked:
    """What a POST /translate body asks for, or a RequestError."""
    try:
        request = json.loads(body)
    except RecursionError:
        raise RequestError(400, "the body is not JSON (nested too deeply)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON ({e})") from None
    except ValueError:  # Python reads no integer of over 4,300 digits
        raise RequestError(400, "the body holds a number too long to read") from None
    if not isinstance(request, dict) or "text" not in request:
        raise RequestError(400, 'expected a JSON object with "text": a list of sentences')
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise RequestError(400, f"unknown field(s) {unknown}: only {', '.join(FIELDS)}")
    form = request.get("format", FORMATS[0])
    if not isinstance(form, str) or form not in FORMATS:
        raise RequestError(400, f'"format" must be one of {", ".join(FORMATS)}; got {form!r}')
    beam = request.get("beam", engine.config.decode.beam_size)
    langs = {key: request.get(key, "") for key in ("to", "from")}
    for key, lang in langs.items():
        if not isinstance(lang, str):
            raise RequestError(400, f'"{key}" must be a language code, got {type(lang).__name__}')
    langs = {key: lang.strip() for key, lang in langs.items()}
    try:
        decode = request_decode(engine, beam, '"beam"')
    except InputError as e:
        raise RequestError(400, str(e)) from None
    if form == "sentences":
        return Asked(parse_text(request["text"], limits), decode, langs)
    layout = parse_layout(request["text"], form, splitter_of(engine, langs))
    if len(layout.sentences) > limits.max_lines:
        raise RequestError(
            413, f"{len(layout.sentences)} sentences; at most {limits.max_lines} a request"
        )
    # Each a line as a sentence of "text" is: its white space collapsed.
    lines = [Request(" ".join(sentence.split())) for sentence in layout.sentences]
    return Asked(lines, decode, langs, layout)


def parse_layout(text: object, form: str, split: Splitter) -> Document | Subtitles:
    """The document (or SubRip file, `form` "srt") that "text" holds, or a RequestError
    naming what is wrong (a malformed SubRip file: its line)."""
    if not isinstance(text, str):
        raise RequestError(
            400, f'"text" must be one string with "format": "{form}", got {type(text).__name__}'
        )
    try:
        check_text(text, "text")
        return parse_srt(text, "text", split) if form == "srt" else parse_document(text, split)
    except (ValueError, InputError) as e:
        raise RequestError(400, str(e)) from None


def splitter_of(engine: Engine, langs: dict[str, str]) -> Splitter:
    """The sentence splitter of the language a document is in: the body's "from", --from,
    the one the model reads into the body's "to" (or its default output), else the run's
    source language (a multilingual model's default; sentencex's generic rules for none)."""
    to, frm = langs["to"], langs["from"]
    code = frm or engine.frm or engine.default_source(to) or engine.config.data.src_lang
    return sentence_splitter(code)


def parse_text(text: object, limits: Limits) -> list[Request]:
    """The sentences of "text", each a string or {"text", "prefix", "constraints"} (one line
    each: a line break inside one is a space), or a RequestError naming the bad item."""
    if not isinstance(text, list):
        raise RequestError(400, f'"text" must be a list of sentences, got {type(text).__name__}')
    if len(text) > limits.max_lines:
        raise RequestError(413, f"{len(text)} sentences; at most {limits.max_lines} a request")
    try:
        return [request_of(item, f"text[{i}]") for i, item in enumerate(text)]
    except ValueError as e:
        raise RequestError(400, str(e)) from None


def encode_rows(
    engine: Engine, requests: list[Request], langs: dict[str, str], where: Callable[[int], str]
) -> Rows:
    """The rows to search for the requests (a multilingual model's with the token of the
    language each asks for, the body's "to" and "from" for a sentence that names none); a
    sentence longer than the model takes is translated in parts and joined, as `tf translate`
    does (`Engine.encode`), never cut."""
    to, frm = langs["to"], langs["from"]
    try:  # the body's, once, named as the body's: as --to and --from are checked
        check_languages(to, frm, engine.languages, engine.config, ('"to"', '"from"'))
        texts = [engine.source_text(r, where(i), to, frm) for i, r in enumerate(requests)]
    except InputError as e:  # no language, or one the model lacks
        raise RequestError(400, str(e)) from None
    return engine.encode(texts, [engine.reading(r, frm, to) for r in requests], "request", 1)


def check_json_body(request) -> None:
    """Only JSON is read: a web page can post a form or text/plain to a server on localhost
    without asking, but a JSON post from another origin needs CORS consent, never given."""
    kind = request.headers.get("content-type", "")
    if kind.split(";")[0].strip().lower() != "application/json":
        raise RequestError(415, f"send JSON with Content-Type: application/json, not {kind!r}")


async def read_body(request) -> bytes:
    """The request body, refused (413) past MAX_BODY bytes without reading it all."""
    declared = request.headers.get("content-length") or "0"
    if not declared.isdigit():
        raise RequestError(400, f"Content-Length {declared!r} is not a number of bytes")
    if int(declared) > MAX_BODY:
        raise RequestError(413, f"the body has {declared} bytes; at most {MAX_BODY}")
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise RequestError(413, f"the body has over {MAX_BODY} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was read: a 499 nobody reads, no traceback
        raise RequestError(499, "the client left before sending its whole body") from None
    return b"".join(chunks)


async def client_left(request) -> None:
    """Returns when the client disconnects (the body is read: what comes now is the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)  # not expected once the body is read; never spin on it


async def answer(request, done: Future):
    """The result of the batcher's `done`, unless the client leaves first (a 499 nobody reads)
    or this task is cancelled (time limit, server shutdown): then the job is cancelled, which
    drops it unless the batcher has taken it already."""
    result = asyncio.wrap_future(done)
    left = asyncio.ensure_future(client_left(request))
    try:
        await asyncio.wait({result, left}, return_when=asyncio.FIRST_COMPLETED)
        if result.done():
            return result.result()
        raise RequestError(499, "the client left before its translation was done")
    finally:
        left.cancel()
        done.cancel()  # False, and harmless, once the batcher has taken it
        result.cancel()


def read_page() -> str:
    """The page at /: a Spanish box, a beam field and the English (package data beside this
    module)."""
    return resources.files("cli.serving").joinpath("page.html").read_text(encoding="utf-8")


def shown_name(run: str | list[str]) -> str:
    """What /health calls the model: its name, never where it lies on this machine; an
    ensemble's, its members' names joined ("a + b")."""
    if not isinstance(run, str):
        return " + ".join(shown_name(member) for member in run)
    return shown_path(run)  # as an export names its paths


def build_app(
    engine: Engine,
    name: str | list[str],
    engine_kind: str = "",
    limits: Limits | None = None,
    page: str = "",
    search: Search | None = None,
):
    """The Starlette application serving `engine` (`name`, a path or an ensemble's paths, and
    `engine_kind` say what it is, the engine's own `Engine.label` by default; `page` is the
    HTML of /). Groups of requests are searched whole by `search` (`tf serve`'s search
    processes on CPUs, `cli.serving.processes.SearchPool`; the engine's own by default).
    Raises InputError for settings no request could use."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    limits = limits or Limits()
    check_engine(engine)
    load = getattr(search, "load", None)  # search processes read it (`Cores`)
    batcher = Batcher(
        search or engine.search, engine.config.decode.max_tokens, limits.max_wait,
        limits.max_queue, limits.workers, limits.threads, load=load,
    )  # fmt: skip
    about = health_fields(engine, name, engine_kind or engine.label, limits)

    async def health(request) -> JSONResponse:
        alive = batcher.alive  # a dead batcher would leave every request waiting: say so
        body = {"status": "ok" if alive else "down", **about, "queued": batcher.pending}
        return JSONResponse(body, status_code=200 if alive else 503)

    async def translate(request) -> JSONResponse:
        try:
            answered = await asyncio.wait_for(
                translate_request(request, engine, batcher, limits), limits.timeout
            )
        except asyncio.TimeoutError:
            raise RequestError(504, f"no translation within {limits.timeout:g} s") from None
        return JSONResponse(answered)

    app = Starlette(
        routes=[
            Route("/", lambda request: HTMLResponse(page)),
            Route("/health", health),
            Route("/translate", translate, methods=["POST"]),
        ],
        exception_handlers=error_handlers(JSONResponse, HTTPException),
    )
    app.state.batcher = batcher
    return app


def health_fields(engine: Engine, name: str | list[str], engine_kind: str, limits: Limits) -> dict:
    """What /health says is served."""
    into = engine.output_language  # --to, or the model's default; none: a request says
    return {
        "model": shown_name(name),
        "engine": engine_kind,
        # The direction a request without "to" (and "from") is translated in (none: a
        # multilingual model that records no default, asked for no --to), and every
        # direction the model translates.
        "src_lang": engine.source_language() if into else None,
        "tgt_lang": into or None,
        "directions": [direction_of(*way) for way in engine.config.data.translates()],
        "languages": list(engine.languages),  # a multilingual model's: a request's "to"
        "sources": list(engine.sources),  # a model whose sources say theirs: its "from"
        "beam": engine.config.decode.beam_size,
        "max_lines": limits.max_lines,
        "max_queue": limits.max_queue,
        "workers": limits.workers,
    }


async def translate_request(request, engine: Engine, batcher: Batcher, limits: Limits) -> dict:
    """One POST /translate: checked, queued, awaited, decoded: `{"translations": [...]}`, or
    a document's `{"translation": "..."}` (written back around its sentences' translations)."""
    check_json_body(request)
    body = await read_body(request)
    # In a thread: a document of a megabyte takes a while to parse, and other clients wait
    # on this event loop meanwhile.
    asked = await asyncio.to_thread(parse_request, body, engine, limits)
    translations = await translated(request, asked, engine, batcher) if asked.requests else []
    if asked.layout is None:
        return {"translations": translations}
    return {"translation": await asyncio.to_thread(asked.layout.render, translations)}


async def translated(request, asked: Asked, engine: Engine, batcher: Batcher) -> list[str]:
    """The translations of a body's sentences, searched by the batcher with other clients'."""
    requests, decode, langs, where = asked.requests, asked.decode, asked.langs, asked.where
    rows = encode_rows(engine, requests, langs, where)
    named = [where(i) for i in range(len(requests))]
    try:  # a prefix, constraints: each line's checked (`Engine.guide`), a 400 naming it
        guides = engine.guides(requests, rows, named, decode, langs["to"])
    except InputError as e:
        raise RequestError(400, str(e)) from None
    try:
        done = batcher.submit(list(rows), decode, guides)
    except QueueFull as e:
        raise RequestError(503, f"busy: {e}; try again", {"Retry-After": RETRY_AFTER}) from None
    found = await answer(request, done)
    try:
        engine.check_rows(rows, found, guides, named, decode)
    except InputError as e:  # constraints no translation can hold: the request's fault
        raise RequestError(400, str(e)) from None
    best = [hyps[0] for hyps in rows.joined(found, engine.tokenizer)]
    return hypothesis_texts(engine.tokenizer, best)


def error_handlers(JSONResponse, HTTPException) -> dict:
    """Every failure as `{"error": "one line"}`: a client's with its 4xx, ours as a 500."""

    def error(status: int, message: str, headers=None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    async def on_request_error(request, exc: RequestError) -> JSONResponse:
        if exc.status == 504:  # a 503 is the queue working as meant: not logged each time
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error(exc.status, str(exc), exc.headers)

    async def on_http_error(request, exc: HTTPException) -> JSONResponse:  # 404, 405
        where = f"{request.method} {request.url.path}"  # a 405 keeps its Allow header
        return error(exc.status_code, f"{where}: {exc.detail}", getattr(exc, "headers", None))

    async def on_failure(request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error(500, f"translation failed: {exc}".splitlines()[0])

    return {RequestError: on_request_error, HTTPException: on_http_error, Exception: on_failure}
