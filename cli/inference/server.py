"""The HTTP application of `tf serve`: Starlette routes and checks the requests, the batcher
translates those of concurrent clients together. The engine may be an ensemble of runs.

    POST /translate  {"text": ["...", ...], "beam": 5}  ->  {"translations": ["...", ...]}
                     an item of "text" may be {"text": "...", "prefix": "...", "constraints":
                     ["...", ...]}: its translation starts with prefix and holds each constraint
    GET  /health     what is served: model, engine, languages, default beam; 503 if it is down
    GET  /           a page where a person types a sentence and reads its translation

A client's mistake gets a 4xx and a one-line JSON error (`{"error": "..."}`), never a 500 or a
traceback; a full queue is a 503 with `Retry-After`, at once; a request waits at most
`Limits.timeout` seconds (504), and one whose client left is dropped before it is searched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import Future
from dataclasses import dataclass, replace

from cli.config import DecodeConfig
from cli.inference.batcher import Batcher, Joiner, QueueFull
from cli.inference.decoding import source_ids
from cli.inference.engines import Engine, Search, check_found
from cli.inference.lanes import MAX_ROWS
from cli.inference.languages import check_languages
from cli.inference.requests import Guide, Request, request_of
from data.config import direction_of
from data.errors import InputError
from data.files import shown_path

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one request
MAX_BEAM = 32
RETRY_AFTER = "1"  # seconds a client refused for a full queue is asked to wait


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
    max_rows: int = MAX_ROWS  # live rows (sentences x beam) a search worker steps at once
    # "groups": requests batched into whole searches (`Batcher`); "steps": each joins a running
    # search at its next step (`Joiner`, `cli.inference.lanes`), tf's own engine only
    schedule: str = "groups"


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


def parse_request(
    body: bytes, engine: Engine, limits: Limits
) -> tuple[list[Request], DecodeConfig, dict[str, str]]:
    """The lines, decode settings and languages (the body's "to" and "from", every sentence's
    that names none of its own) a POST /translate body asks for, or a RequestError."""
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
    unknown = sorted(set(request) - {"text", "beam", "to", "from"})
    if unknown:
        raise RequestError(400, f'unknown field(s) {unknown}: only "text", "beam", "to" and "from"')
    beam = request.get("beam", engine.config.decode.beam_size)
    lines = parse_text(request["text"], limits)
    langs = {key: request.get(key, "") for key in ("to", "from")}
    for key, lang in langs.items():
        if not isinstance(lang, str):
            raise RequestError(400, f'"{key}" must be a language code, got {type(lang).__name__}')
    try:
        decode = request_decode(engine, beam, '"beam"')
    except InputError as e:
        raise RequestError(400, str(e)) from None
    return lines, decode, {key: lang.strip() for key, lang in langs.items()}


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


def encode_within_limit(
    engine: Engine, requests: list[Request], langs: dict[str, str]
) -> list[list[int]]:
    """Source ids of the requests (a multilingual model's with the token of the language each
    asks for, the body's "to" and "from" for a sentence that names none); a sentence longer
    than the model takes is a 400, not cut."""
    to, frm = langs["to"], langs["from"]
    try:  # the body's, once, named as the body's: as --to and --from are checked
        check_languages(to, frm, engine.languages, engine.config, ('"to"', '"from"'))
        texts = [engine.source_text(r, f"text[{i}]", to, frm) for i, r in enumerate(requests)]
    except InputError as e:  # no language, or one the model lacks
        raise RequestError(400, str(e)) from None
    ids = source_ids(engine.tokenizer, texts)
    limit = engine.config.model.max_positions
    for i, seq in enumerate(ids):
        if len(seq) > limit:
            raise RequestError(400, f"text[{i}]: {len(seq)} pieces, over the model's {limit}")
    return ids


def guides_of(
    engine: Engine,
    requests: list[Request],
    src_ids: list[list[int]],
    decode: DecodeConfig,
    to: str,
) -> list[Guide | None] | None:
    """The requests' guides (`Engine.guide`: a language token written first, a prefix,
    constraints; None when none has any), or a 400."""
    if not any(r.prefix or r.constraints for r in requests) and not engine.target_side:
        return None
    try:
        return [
            engine.guide(r, ids, f"text[{i}]", decode, to)
            for i, (r, ids) in enumerate(zip(requests, src_ids))
        ]
    except InputError as e:
        raise RequestError(400, str(e)) from None


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


def shown_name(run: str | list[str]) -> str:
    """What /health calls the model: its name, never where it lies on this machine; an
    ensemble's, its members' names joined ("a + b")."""
    if not isinstance(run, str):
        return " + ".join(shown_name(member) for member in run)
    return shown_path(run)  # as an export names its paths


def build_app(
    engine: Engine,
    name: str | list[str],
    engine_kind: str,
    limits: Limits | None = None,
    page: str = "",
    search: Search | None = None,
    joining: list | None = None,
):
    """The Starlette application serving `engine` (`name`, a path or an ensemble's paths, and
    `engine_kind` say what it is; `page` is the HTML of /). With `joining`, search workers
    (`tf serve`'s search processes, `cli.inference.search_processes`, whose pool is
    `search`; a GPU's thread, `cli.inference.lanes.ThreadWorker`), each request joins a
    running search there (`Joiner`; an ensemble's is searched whole between the steps);
    else groups of requests are searched whole by `search` (the engine's own by default:
    CTranslate2's). Raises InputError for settings no request could use."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    limits = limits or Limits()
    check_engine(engine)
    load = getattr(search, "load", None)  # search processes read it (`Cores`)
    if joining:  # tf's own engine: requests join running searches (`cli.inference.lanes`)
        batcher = Joiner(joining, limits.max_queue, load)
    else:
        batcher = Batcher(
            search or engine.search, engine.config.decode.max_tokens, limits.max_wait,
            limits.max_queue, limits.workers, limits.threads, load=load,
        )  # fmt: skip
    about = health_fields(engine, name, engine_kind, limits)

    async def health(request) -> JSONResponse:
        alive = batcher.alive  # a dead batcher would leave every request waiting: say so
        body = {"status": "ok" if alive else "down", **about, "queued": batcher.pending}
        return JSONResponse(body, status_code=200 if alive else 503)

    async def translate(request) -> JSONResponse:
        try:
            texts = await asyncio.wait_for(
                translate_request(request, engine, batcher, limits), limits.timeout
            )
        except asyncio.TimeoutError:
            raise RequestError(504, f"no translation within {limits.timeout:g} s") from None
        return JSONResponse({"translations": texts})

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


async def translate_request(
    request, engine: Engine, batcher: Batcher | Joiner, limits: Limits
) -> list[str]:
    """One POST /translate: checked, queued, awaited, decoded."""
    check_json_body(request)
    requests, decode, langs = parse_request(await read_body(request), engine, limits)
    if not requests:
        return []
    src_ids = encode_within_limit(engine, requests, langs)
    guides = guides_of(engine, requests, src_ids, decode, langs["to"])
    try:
        done = batcher.submit(src_ids, decode, guides)
    except QueueFull as e:
        raise RequestError(503, f"busy: {e}; try again", {"Retry-After": RETRY_AFTER}) from None
    found = await answer(request, done)
    settings = replace(engine.config, decode=decode)
    for i, (ids, hyps) in enumerate(zip(src_ids, found)):
        try:
            check_found(hyps, ids, guides[i] if guides else None, settings, f"text[{i}]")
        except InputError as e:  # constraints no translation can hold: the request's fault
            raise RequestError(400, str(e)) from None
    return engine.tokenizer.decode_tgt([hyps[0].tokens for hyps in found])


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
