"""`tf serve`'s searches on CPUs, each worker in a process of its own.

Searches run in the server's own process share one interpreter lock with each other and with
the HTTP event loop: a decoding step is a few hundred small ops, and every one takes and gives
back the lock. And a search with more than one intra-op thread runs at full speed only on a
process's main thread (OpenMP's team of any other thread sleeps between the small ops and wakes
slowly). So each search worker is a process that loaded the same engine and searches whole
groups of requests (`Engine.search`, as `tf translate` does) on its main thread, with its share
of the cores; the server's threads only write to and read from pipes. (The measurements are in
docs/performance.md.)

While the server has a single request in flight, its search takes every process's threads,
and gives them back at its next step once another request arrives (`Cores`): a lone request
is searched on every core, and under load each process keeps its share.

Each process holds its own copy of the model. One that dies (killed, out of memory) fails the
searches it held with a one-line error and is started again at once.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import pickle
import queue
import signal
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from cli.config import DecodeConfig
from cli.inference.engines import Guides
from model.search import Hypothesis

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSpec:
    """What `load_engine` is called with, to load the same engine in another process."""

    runs: str | list[str]
    device: str
    overrides: list[str]
    int8: bool = False
    to: str = ""
    frm: str = ""


class Cores:
    """The intra-op threads of one of a pool's `workers` processes: its `share` of the cores,
    or all of them while the server has one request in flight (`load`, the batcher's count,
    in memory the processes share). Checked at every decoding step, so a search gives the
    extra threads back within a step of a second request arriving, rather than two searches
    running more threads than there are cores. The translations do not depend on the thread
    count (the same bytes with 1 and 2 threads). Taking the threads whenever the other
    processes sat idle instead cost the load (docs/performance.md)."""

    def __init__(self, load, share: int, workers: int) -> None:
        self.load, self.share, self.every = load, share, share * workers
        self.now = share

    def update(self) -> None:
        threads = self.every if self.load.value <= 1 else self.share
        if threads != self.now:
            torch.set_num_threads(threads)
            self.now = threads

    def follow(self, model) -> None:
        """Check at each of `model`'s decoding steps (its `decode_step`, which every search
        calls, wrapped in this process)."""
        step = model.decode_step

        def decode_step(tokens, state):
            self.update()
            return step(tokens, state)

        model.decode_step = decode_step


class SearchProcess:
    """One spawned process that loads the engine of `spec` and searches what it is sent, on
    its main thread with `threads` intra-op threads (all of its pool's `workers` x `threads`
    while the server's `load` is one request: `Cores`).

    Called, it sends the search and waits for its hypotheses; a thread of this process's own
    reads the answers. A process that dies fails every search it held in one line and is
    started again for the next."""

    def __init__(
        self, spec: EngineSpec, threads: int, name: str = "tf-search", load=None, workers: int = 1
    ) -> None:
        self.spec, self.threads, self.name = spec, threads, name
        self.load, self.workers = load, workers
        self.held: dict[int, Future] = {}  # the searches sent and not yet answered, by key
        self.lock = threading.Lock()
        self.keys = itertools.count()
        self.closing = False
        self.start()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")  # no torch state of this process shared
        self.conn, child = context.Pipe()
        args = (self.spec, self.threads, child, self.load, self.workers)
        self.process = context.Process(target=serve_searches, args=args, name=self.name)
        self.process.daemon = True  # ended with the server, however it ends
        self.process.start()
        child.close()  # the child's end lives in the child: its death is EOF here
        self.ready = threading.Event()
        self.failed: Exception | None = None  # the engine could not load
        self.reader = threading.Thread(target=self._read, args=(self.conn, self.process),
                                       name=f"{self.name}-reader", daemon=True)  # fmt: skip
        self.reader.start()

    def wait_ready(self) -> None:
        """Block until the engine is loaded; its loading error, raised here, if it failed."""
        self.ready.wait()
        if self.failed is not None:
            raise self.failed

    @property
    def alive(self) -> bool:
        return self.process.is_alive() or not self.closing

    def __call__(
        self, src_ids: list[list[int]], decode: DecodeConfig, guides: Guides = None
    ) -> list[list[Hypothesis]]:
        """The engine's search of these sources, done in the process."""
        self.wait_ready()
        done: Future = Future()
        with self.lock:
            key = next(self.keys)
            self.held[key] = done
            try:
                self.conn.send((key, src_ids, decode, guides))
            except (OSError, ValueError):  # the pipe broke: its reader fails what it held
                pass
        return done.result()

    def _read(self, conn, process) -> None:
        """What the process says, until its pipe breaks: then every search it held fails in
        one line, and a new process starts for the next (unless this one is being closed, or
        could not load its engine)."""
        try:
            ok, value = conn.recv()
            if not ok:
                self.failed = value
            self.ready.set()
            while ok:
                key, ok_search, value = conn.recv()
                with self.lock:
                    done = self.held.pop(key)
                done.set_result(value) if ok_search else done.set_exception(value)
        except (EOFError, OSError):
            pass
        self.ready.set()
        with self.lock:
            if self.closing:  # `close` ends and reaps the process itself
                return
        process.join(timeout=5)
        with self.lock:
            if conn is not self.conn:  # closed and replaced: nothing of this one is held
                return
            held, self.held = self.held, {}
            if not self.closing and self.failed is None:
                log.warning("search process %s ended (exit code %s); starting it again",
                            self.name, process.exitcode)  # fmt: skip
                self.start()
        error = RuntimeError(
            f"the search process ended (exit code {process.exitcode}) during this search; "
            "it has been started again"
        )
        for key in sorted(held):
            held[key].set_exception(self.failed or error)

    def close(self) -> None:
        """End the process (it ends by itself on EOF; the searches it runs are cut short)."""
        with self.lock:
            self.closing = True
            conn, process, reader = self.conn, self.process, self.reader
        conn.close()
        process.join(timeout=1)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
        reader.join(timeout=5)


class SearchPool:
    """`workers` SearchProcesses, which a `Batcher` calls with whole groups (a thread per
    process). `load`: the requests in flight, which the batcher keeps (`Batcher.load`) and
    the processes read (`Cores`)."""

    def __init__(self, spec: EngineSpec, workers: int, threads: int):
        self.load = multiprocessing.get_context("spawn").Value("i", 0, lock=False)
        self.processes = [
            SearchProcess(spec, threads, f"tf-search-{i}", self.load, workers)
            for i in range(workers)
        ]
        self.free: queue.LifoQueue[SearchProcess] = queue.LifoQueue()
        for process in self.processes:
            self.free.put(process)

    def wait_ready(self) -> None:
        """Every process's engine loaded (they load side by side), or the first error."""
        try:
            for process in self.processes:
                process.wait_ready()
        except BaseException:
            self.close()
            raise

    def __call__(
        self, src_ids: list[list[int]], decode: DecodeConfig, guides: Guides = None
    ) -> list[list[Hypothesis]]:
        """A whole search of these sources in a free process, the one that searched last
        first, whose model and threads are still warm (docs/performance.md)."""
        process = self.free.get()
        try:
            return process(src_ids, decode, guides)
        finally:
            self.free.put(process)

    def close(self) -> None:
        for process in self.processes:
            process.close()


def serve_searches(spec: EngineSpec, threads: int, conn, load=None, workers: int = 1) -> None:
    """The process: load the engine, say so, then answer each (key, src_ids, decode, guides)
    with (key, True, hypotheses) or (key, False, the exception) until the server's end of the
    pipe closes. With `load` (see `SearchProcess`), its threads follow the server's load
    (`Cores`)."""
    # Ctrl-C in a terminal reaches the whole process group: the server handles it and ends
    # this process, which must not print a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from cli.device import keep_freed_memory, pick_device
    from cli.inference.engines import load_engine

    keep_freed_memory()  # as `tf` does for itself: a spawned process starts afresh
    if threads:
        torch.set_num_threads(threads)
    try:
        device = pick_device(spec.device)
        engine = load_engine(spec.runs, device, spec.overrides, spec.int8, spec.to, spec.frm)
    except Exception as err:  # noqa: BLE001 - the server raises it
        conn.send((False, portable(err)))
        return
    cores = None
    if load is not None and threads and workers > 1 and engine.kind == "pytorch":
        cores = Cores(load, threads, workers)
        cores.follow(engine.model)
    conn.send((True, None))
    while True:
        try:
            key, *search = conn.recv()
        except EOFError:  # the server is gone
            return
        if cores:
            cores.update()  # the encoder's threads, before the first step
        try:
            answer = (key, True, engine.search(*search))
        except Exception as err:  # noqa: BLE001 - the server's batcher handles it
            answer = (key, False, portable(err))
        conn.send(answer)


def portable(err: Exception) -> Exception:
    """`err` if it crosses a pipe (pickles), else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(err).__name__}: {err}")
