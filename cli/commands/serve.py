"""`tf serve`: translation over HTTP, for a run or an exported CTranslate2 directory.

    POST /translate  {"text": ["...", ...], "beam": 5}  ->  {"translations": ["...", ...]}
    GET  /health     what is served: model, engine, languages, default beam
    GET  /           a page where a person types a sentence and reads its translation

Starlette routes and checks the requests and uvicorn speaks HTTP; the batcher translates the
requests of concurrent clients together. A bad request gets a 4xx and a one-line JSON error
(`{"error": "..."}`); nothing a client sends stops the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from importlib import resources

from cli.config import DecodeConfig
from cli.device import pick_device
from cli.inference.batcher import Batcher
from cli.inference.engines import Engine, load_engine
from data.errors import InputError

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one request
MAX_BEAM = 32


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Limits:
    max_lines: int = 256  # sentences in one request
    max_wait: float = 0.005  # seconds the batcher waits for other requests to join a batch


def parse_request(body: bytes, engine: Engine, limits: Limits) -> tuple[list[str], DecodeConfig]:
    """The lines and decode settings a POST /translate body asks for, or a RequestError."""
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON ({e})") from None
    if not isinstance(request, dict) or "text" not in request:
        raise RequestError(400, 'expected a JSON object with "text": a list of sentences')
    unknown = sorted(set(request) - {"text", "beam"})
    if unknown:
        raise RequestError(400, f'unknown field(s) {unknown}: only "text" and "beam"')
    text, beam = request["text"], request.get("beam", engine.config.decode.beam_size)
    if not isinstance(text, list):
        raise RequestError(400, f'"text" must be a list of sentences, got {type(text).__name__}')
    if len(text) > limits.max_lines:
        raise RequestError(413, f"{len(text)} sentences; at most {limits.max_lines} a request")
    for i, line in enumerate(text):
        if not isinstance(line, str):
            raise RequestError(400, f"text[{i}] must be a string, got {type(line).__name__}")
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        raise RequestError(400, f'"beam" must be a whole number from 1 to {MAX_BEAM}, got {beam!r}')
    # One sentence per item: a line break inside one is a space, as in `tf distill`.
    lines = [" ".join(line.split()) for line in text]
    return lines, replace(engine.config.decode, beam_size=beam, nbest=1)


def encode_within_limit(engine: Engine, lines: list[str]) -> list[list[int]]:
    """Source ids of `lines`; a sentence longer than the model takes is a 400, not truncated."""
    ids = engine.tokenizer.encode_src(lines)
    limit = engine.config.model.max_positions
    for i, seq in enumerate(ids):
        if len(seq) > limit:
            raise RequestError(400, f"text[{i}]: {len(seq)} pieces, over the model's {limit}")
    return ids


async def read_body(request) -> bytes:
    """The request body, refused (413) past MAX_BODY bytes without reading it all."""
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_BODY:
        raise RequestError(413, f"the body has {size} bytes; at most {MAX_BODY}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise RequestError(413, f"the body has over {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(engine: Engine, name: str, engine_kind: str, limits: Limits | None = None):
    """The Starlette application serving `engine` (`name` and `engine_kind` say what it is)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    limits = limits or Limits()
    batcher = Batcher(engine.search, engine.config.decode.max_tokens, limits.max_wait)
    page = resources.files("cli.commands").joinpath("page.html").read_text(encoding="utf-8")
    data = engine.config.data
    health = {
        "status": "ok",
        "model": name,
        "engine": engine_kind,
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "beam": engine.config.decode.beam_size,
        "max_lines": limits.max_lines,
    }

    async def translate(request) -> JSONResponse:
        lines, decode = parse_request(await read_body(request), engine, limits)
        src_ids = encode_within_limit(engine, lines)
        found = await asyncio.wrap_future(batcher.submit(src_ids, decode))
        texts = engine.tokenizer.decode_tgt([hyps[0].tokens for hyps in found])
        return JSONResponse({"translations": texts})

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    async def on_request_error(request, exc: RequestError) -> JSONResponse:
        return error(exc.status, str(exc))

    async def on_http_error(request, exc: HTTPException) -> JSONResponse:  # 404, 405
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    async def on_failure(request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error(500, f"translation failed: {exc}")

    app = Starlette(
        routes=[
            Route("/", lambda request: HTMLResponse(page)),
            Route("/health", lambda request: JSONResponse(health)),
            Route("/translate", translate, methods=["POST"]),
        ],
        exception_handlers={
            RequestError: on_request_error,
            HTTPException: on_http_error,
            Exception: on_failure,
        },
    )
    app.state.batcher = batcher
    return app


def engine_kind(engine: Engine, int8: bool) -> str:
    if engine.model is None:
        return "ctranslate2"
    return "pytorch-int8" if int8 else "pytorch"


def run_serve(
    run: str,
    host: str,
    port: int,
    overrides: list[str],
    device_name: str,
    int8: bool,
    limits: Limits,
) -> None:
    """The `tf serve` command: load RUN, then answer HTTP requests until Ctrl-C."""
    try:
        import uvicorn
    except ImportError:
        raise InputError("tf serve needs its server: pip install 'tf[serve]'") from None
    if limits.max_lines < 1:
        raise InputError(f"--max-lines must be 1 or more, got {limits.max_lines}")
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {port}")
    engine = load_engine(run, pick_device(device_name), overrides, int8)
    app = build_app(engine, run, engine_kind(engine, int8), limits)
    log.info("serving %s on http://%s:%d/ (Ctrl-C stops)", run, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
