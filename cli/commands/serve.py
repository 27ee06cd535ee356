"""`tf serve`: translation over HTTP, for a run or an exported CTranslate2 directory.

The application (routes, checks, batching, search processes) is `cli.serving`; this is the
command: its options checked, the engine loaded, uvicorn started.
"""

from __future__ import annotations

import logging
import math
import socket
from dataclasses import replace

from cli.device import pick_device, search_workers
from cli.inference.engines import load_engine
from cli.serving.app import Limits, build_app, check_engine, read_page, shown_name
from cli.serving.processes import EngineSpec, SearchPool
from data.errors import InputError

log = logging.getLogger(__name__)


def wait_seconds(max_wait: float) -> float:
    """`--max-wait`, in milliseconds, as seconds."""
    if not 0 <= max_wait < float("inf"):  # NaN too
        raise InputError(f"--max-wait must be 0 or more, got {max_wait}")
    return max_wait / 1000


def check_options(port: int, limits: Limits) -> None:
    """The command's own options, each wrong one in one line, before anything loads."""
    if limits.max_lines < 1:
        raise InputError(f"--max-lines must be 1 or more, got {limits.max_lines}")
    if limits.max_queue < 1:
        raise InputError(f"--max-queue must be 1 or more, got {limits.max_queue}")
    if limits.workers < 0:
        raise InputError(
            f"--workers must be 0 (as many as the cores allow) or more, got {limits.workers}"
        )
    if not (math.isfinite(limits.timeout) and limits.timeout > 0):
        raise InputError(f"--timeout must be a number of seconds above 0, got {limits.timeout}")
    if limits.max_wait >= limits.timeout:  # every batch would wait past its requests' time
        raise InputError(
            f"--max-wait {limits.max_wait * 1000:g} ms must be shorter than --timeout "
            f"({limits.timeout:g} s)"
        )
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {port}")


def check_address(host: str, port: int) -> None:
    """Bind the address and let it go: one taken, or not this machine's, is a one-line error
    before the search processes start (uvicorn said so after "serving", and exited 3)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise InputError(f"--host {host}: not an address to listen on ({e})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own socket
        try:
            probe.bind(address)
        except OSError as e:
            raise InputError(
                f"--host {host} --port {port}: cannot listen there ({e.strerror})"
            ) from None


def run_serve(
    runs: str | list[str],
    host: str,
    port: int,
    overrides: list[str],
    device_name: str,
    int8: bool,
    limits: Limits,
    to: str = "",
    frm: str = "",
) -> None:
    """The `tf serve` command: load RUN (several: an ensemble, `load_engine`), then answer
    HTTP requests until Ctrl-C; `to`: a multilingual model's output language for requests
    that name none."""
    try:
        import uvicorn
    except ImportError:
        raise InputError("tf serve needs its server: pip install 'tf[serve]'") from None
    check_options(port, limits)
    device = pick_device(device_name)
    engine = load_engine(runs, device, overrides, int8, to, frm)
    check_engine(engine)  # before any search process loads it again
    check_address(host, port)
    workers, threads = search_workers(device, limits.workers, own_threads=engine.own_threads)
    pool = None
    if device.type == "cpu" and engine.kind == "pytorch":  # tf's own search: in processes
        spec = EngineSpec(runs, str(device), overrides, int8, to, frm)
        pool = SearchPool(spec, workers, threads)
        pool.wait_ready()
        threads = 0  # the processes have theirs; the batcher's threads only wait on them
    limits = replace(limits, workers=workers, threads=threads)
    try:
        app = build_app(engine, runs, engine.label, limits, read_page(), pool)
        log.info(
            "serving %s on http://%s:%d/ with %d search %s (Ctrl-C stops)",
            shown_name(runs),
            host,
            port,
            workers,
            "process(es)" if pool else "thread(s)",
        )
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if pool is not None:
            pool.close()
