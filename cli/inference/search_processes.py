"""`tf serve`'s searches on CPUs, each worker in a process of its own.

Searches run in the server's own process had shared one interpreter lock with each other and
with the HTTP event loop: a decoding step is a few hundred small ops, and every one takes and
gives back the lock. On 2 cores (Intel Xeon with AMX, `small`, bf16, beam 5, groups of 16 of
one sentence) two such threads searched 66 sentences/s, two processes of one thread each 77
(`tf translate` of the same 300 sentences in one process: 75); and a search with more than
one intra-op thread runs at full speed only on a process's main thread (OpenMP's team of any
other thread sleeps between the small ops and wakes slowly: 58 against 35 sentences/s with 2
threads). So each search worker is a process that loaded the same engine and runs its
requests' searches (`cli.inference.lanes`: they join running searches) on its main thread,
with its share of the cores; the server's threads only write to and read from pipes.

While the server has a single request in flight, its search takes every process's threads,
and gives them back at its next step once another request arrives (`Cores`): a lone request
is searched on every core, and under load each process keeps its share.

Each process holds its own copy of the model. One that dies (killed, out of memory) fails the
requests it held with a one-line error and is started again at once.
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
from cli.inference.lanes import MAX_ROWS, STOP
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


class Ended(Exception):
    """The search process is gone (its pipe broke)."""


class Cores:
    """The intra-op threads of one of a pool's `workers` processes: its `share` of the cores,
    or all of them while the server has one request in flight (`load`, the batcher's count,
    in memory the processes share). Checked at every decoding step, so a search gives the
    extra threads back within a step of a second request arriving, rather than two searches
    running more threads than there are cores. The translations do not depend on the thread
    count (the test set's first 300 lines at beam 5, fp32 and bf16: the same bytes with 1 and
    2 threads). One sentence at beam 5 (`small`, 2-core Xeon with AMX), through `tf serve`:
    bf16 106 -> 100 ms p50, searching 104 -> 92 ms. Taking the threads whenever the other
    processes sat idle instead cost the load: at 8 clients 37 requests/s against 50."""

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
    """One spawned process that loads the engine of `spec` and runs its requests' searches
    (`cli.inference.lanes.Scheduler`: they join lanes that step all of them at once), on its
    main thread with `threads` intra-op threads (all of its pool's `workers` x `threads`
    while the server's `load` is one request: `Cores`).

    `submit` sends a request and returns at once; a thread of this process's own reads what
    the process says and calls `on_event(event)`: ("admitted", key) once every sentence of
    the request has joined a search, ("done", key, ok, value) with its hypotheses or its
    exception. `cancel(key)`: its rows leave at the next step. A process that dies fails every
    request it held in one line and is started again for the next."""

    def __init__(
        self,
        spec: EngineSpec,
        threads: int,
        name: str = "tf-search",
        load=None,
        workers: int = 1,
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.spec, self.threads, self.name = spec, threads, name
        self.load, self.workers, self.max_rows = load, workers, max_rows
        self.on_event = self._settle  # the owner's (`Joiner`) or this process's own futures
        self.futures: dict[int, Future] = {}
        self.held: set[int] = set()  # keys of the requests sent and not yet done
        self.lock = threading.Lock()
        self.keys = itertools.count()
        self.closing = False
        self.start()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")  # no torch state of this process shared
        self.conn, child = context.Pipe()
        args = (self.spec, self.threads, child, self.load, self.workers, self.max_rows)
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

    def submit(self, key: int, src_ids, decode: DecodeConfig, guides: Guides = None) -> None:
        """Send a request (answered through `on_event`; if the process dies first, as failed)."""
        with self.lock:
            self.held.add(key)
            try:
                self.conn.send(("search", key, src_ids, decode, guides))
            except (OSError, ValueError):  # the pipe broke: its reader fails what it held
                pass

    def cancel(self, key: int) -> None:
        with self.lock:
            if key in self.held:
                try:
                    self.conn.send(("cancel", key))
                except (OSError, ValueError):
                    pass

    def __call__(
        self, src_ids: list[list[int]], decode: DecodeConfig, guides: Guides = None
    ) -> list[list[Hypothesis]]:
        """The engine's search of these sources, done in the process (this process's own
        futures: not with an owner's `on_event`)."""
        self.wait_ready()
        done: Future = Future()
        key = next(self.keys)
        self.futures[key] = done
        self.submit(key, src_ids, decode, guides)
        return done.result()

    def _settle(self, event: tuple) -> None:
        if event[0] == "done":
            _, key, ok, value = event
            done = self.futures.pop(key)
            done.set_result(value) if ok else done.set_exception(value)

    def _read(self, conn, process) -> None:
        """What the process says, until its pipe breaks: then every request it held fails in
        one line, and a new process starts for the next (unless this one is being closed, or
        could not load its engine)."""
        try:
            ok, value = conn.recv()
            if not ok:
                self.failed = value
            self.ready.set()
            while ok:
                event = conn.recv()
                if event[0] == "done":
                    with self.lock:
                        self.held.discard(event[1])
                self.on_event(event)
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
            held, self.held = self.held, set()
            if not self.closing and self.failed is None:
                log.warning("search process %s ended (exit code %s); starting it again",
                            self.name, process.exitcode)  # fmt: skip
                self.start()
        error = RuntimeError(
            f"the search process ended (exit code {process.exitcode}) during this search; "
            "it has been started again"
        )
        for key in sorted(held):
            self.on_event(("done", key, False, self.failed or error))

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
    """`workers` SearchProcesses, each with its lanes. `load`: the requests in flight, which
    the server keeps (`Joiner.load`, `Batcher.load`) and the processes read (`Cores`).
    `tf serve --schedule steps` sends each request to a process through a `Joiner`; with
    `groups` a `Batcher` calls the pool with whole groups."""

    def __init__(self, spec: EngineSpec, workers: int, threads: int, max_rows: int = MAX_ROWS):
        self.load = multiprocessing.get_context("spawn").Value("i", 0, lock=False)
        self.processes = [
            SearchProcess(spec, threads, f"tf-search-{i}", self.load, workers, max_rows)
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
        """A whole search of these sources in a free process (`tf serve --schedule groups`:
        a `Batcher` thread per process), the one that searched last first, whose model and
        threads are still warm (a lone client's requests, taken in turn: 100-105 ms p50,
        each by the same process: 94-96 ms)."""
        process = self.free.get()
        try:
            return process(src_ids, decode, guides)
        finally:
            self.free.put(process)

    def close(self) -> None:
        for process in self.processes:
            process.close()


def serve_searches(
    spec: EngineSpec, threads: int, conn, load=None, workers: int = 1, max_rows: int = MAX_ROWS
) -> None:
    """The process: load the engine, say so, then run the requests it is sent
    (`cli.inference.lanes.Scheduler`), saying what happens to them, until the server's end of
    the pipe closes. With `load` (see `SearchProcess`), its threads follow the server's load
    (`Cores`)."""
    # Ctrl-C in a terminal reaches the whole process group: the server handles it and ends
    # this process, which must not print a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from cli.device import keep_freed_memory, pick_device
    from cli.inference.engines import load_engine
    from cli.inference.lanes import Scheduler, run_scheduler

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
    if load is not None and threads and workers > 1 and engine.model is not None:
        cores = Cores(load, threads, workers)
        cores.follow(engine.model)
    conn.send((True, None))

    def receive(block: bool):
        if not block and not conn.poll():
            return None
        try:
            return conn.recv()
        except EOFError:  # the server is gone
            return STOP

    def send(event: tuple) -> None:
        if event[0] == "done" and not event[2]:
            event = (*event[:3], portable(event[3]))
        conn.send(event)

    run_scheduler(Scheduler(engine, device, max_rows), receive, send, cores)


def portable(err: Exception) -> Exception:
    """`err` if it crosses a pipe (pickles), else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(err).__name__}: {err}")
