"""`tf serve`'s searches on CPUs, each in a process of its own.

The batcher's worker threads (`cli.inference.batcher`) searched in the server's own process,
where they shared one interpreter lock with each other and with the HTTP event loop: a decoding
step is a few hundred small ops, and every one takes and gives back the lock. On 2 cores
(Intel Xeon with AMX, `small`, bf16, beam 5, groups of 16 of one sentence) two such threads
searched 66 sentences/s, two processes of one thread each 77 (`tf translate` of the same 300
sentences in one process: 75); and a search with more than one intra-op thread runs at full
speed only on a process's main thread (OpenMP's team of any other thread sleeps between the
small ops and wakes slowly: 58 against 35 sentences/s with 2 threads). So each worker thread of
the batcher hands its group to a process that loaded the same engine and searches on its main
thread with the worker's share of the cores; the threads only wait on pipes.

While the server has a single request in flight, its search takes every process's threads,
and gives them back at its next step once another request arrives (`Cores`): a lone request
is searched on every core, and under load each process keeps its share.

Each process holds its own copy of the model. One that dies (killed, out of memory) fails the
search it was running with a one-line error and is started again for the next.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
import signal
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
    """One spawned process that loads the engine of `spec` and searches what it is sent, on
    its main thread with `threads` intra-op threads (all of its pool's `workers` x `threads`
    while the server's `load` is one request: `Cores`). Not thread-safe: one caller at a time
    (`SearchPool` sees to it)."""

    def __init__(
        self, spec: EngineSpec, threads: int, name: str = "tf-search", load=None, workers: int = 1
    ) -> None:
        self.spec, self.threads, self.name = spec, threads, name
        self.load, self.workers = load, workers
        self.start()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")  # no torch state of this process shared
        self.conn, child = context.Pipe()
        args = (self.spec, self.threads, child, self.load, self.workers)
        self.process = context.Process(target=serve_searches, args=args, name=self.name)
        self.process.daemon = True  # ended with the server, however it ends
        self.process.start()
        child.close()  # the child's end lives in the child: its death is EOF here
        self.ready = False

    def wait_ready(self) -> None:
        """Block until the engine is loaded; its loading error, raised here, if it failed."""
        if not self.ready:
            self._exchange()
            self.ready = True

    def __call__(
        self, src_ids: list[list[int]], decode: DecodeConfig, guides: Guides = None
    ) -> list[list[Hypothesis]]:
        """The engine's search of these sources, done in the process."""
        if not self.process.is_alive():
            self.restart()
        try:
            self.wait_ready()
            return self._exchange((src_ids, decode, guides))
        except Ended:  # the process died under this search
            self.process.join(timeout=5)
            code = self.process.exitcode
            self.restart()
            raise RuntimeError(
                f"the search process ended (exit code {code}) during this search; "
                "it has been started again"
            ) from None

    def _exchange(self, request: tuple | None = None):
        """Send `request` (None: nothing), then the process's answer, or the exception it
        sent raised here; Ended if the pipe broke (its own errors, an OSError among them, are
        the search's, never taken for the process's end)."""
        try:
            if request is not None:
                self.conn.send(request)
            ok, value = self.conn.recv()
        except (EOFError, OSError):
            raise Ended from None
        if not ok:
            raise value
        return value

    def restart(self) -> None:
        log.warning("search process %s ended (exit code %s); starting it again",
                    self.name, self.process.exitcode)  # fmt: skip
        self.close()
        self.start()

    def close(self) -> None:
        """End the process (it ends by itself on EOF; a search it is running is cut short)."""
        self.conn.close()
        self.process.join(timeout=1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


class SearchPool:
    """A `Search` over `workers` SearchProcesses: each call takes a free one, the one that
    searched last first, whose model and threads are still warm (a lone client's requests,
    taken in turn: 100-105 ms p50, each by the same process: 94-96 ms). The batcher has as
    many worker threads as processes, so a call never waits for one. `load`: the requests in
    flight, which the batcher keeps (`Batcher.load`) and the processes read (`Cores`)."""

    def __init__(self, spec: EngineSpec, workers: int, threads: int) -> None:
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
        process = self.free.get()
        try:
            return process(src_ids, decode, guides)
        finally:
            self.free.put(process)

    def close(self) -> None:
        for process in self.processes:
            process.close()


def serve_searches(spec: EngineSpec, threads: int, conn, load=None, workers: int = 1) -> None:
    """The process: load the engine, say so, then answer each (src_ids, decode, guides) with
    (True, hypotheses) or (False, the exception) until the server's end of the pipe closes.
    With `load` (see `SearchProcess`), its threads follow the server's load (`Cores`)."""
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
    if load is not None and threads and workers > 1 and engine.model is not None:
        cores = Cores(load, threads, workers)
        cores.follow(engine.model)
    conn.send((True, None))
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the server is gone
            return
        if cores:
            cores.update()  # the encoder's threads, before the first step
        try:
            answer = (True, engine.search(*request))
        except Exception as err:  # noqa: BLE001 - the server's batcher handles it
            answer = (False, portable(err))
        conn.send(answer)


def portable(err: Exception) -> Exception:
    """`err` if it crosses a pipe (pickles), else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(err).__name__}: {err}")
