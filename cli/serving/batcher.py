"""Requests from concurrent clients translated together, in whole groups (`Batcher`): a
bounded queue, a short wait for more while other requests are in flight, one search per group
of requests that share decode settings, each answer back to its request.

Only the batcher's worker threads touch the search, so the server's request handlers never
block on it (they await a future). Each worker takes the next group and searches it with its
own share of the cores: a search reads the model and writes only its own tensors, so workers
share one model without locking. Several workers, each with few threads, search faster than
one with every thread (a search's small per-step ops leave OpenMP's team idle between them;
the figures are in docs/performance.md). On CPUs `tf serve` goes further and gives each worker
a process of its own to search in (`cli.serving.processes`). Futures follow the
`concurrent.futures` protocol: a request that is cancelled (its client left, its time ran
out) before the batcher takes it is dropped unsearched; once taken it can no longer be
cancelled, so setting its result never meets a cancelled future. Nothing a job does stops the
thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import astuple, dataclass, field, replace

import torch

from cli.config import DecodeConfig
from cli.inference.decoding import search_widths
from cli.inference.engines import Search
from cli.inference.requests import Guide
from model.search import Hypothesis

log = logging.getLogger(__name__)


# Seconds the batcher remembers its highest number of requests in flight: its clients, those
# whose next requests follow their answers (a lower count replaces it after this long).
PEAK_MEMORY = 1.0


class QueueFull(Exception):
    """The queue holds as much work as it may: the request is refused, to be tried later."""


@dataclass
class Job:
    src_ids: list[list[int]]
    decode: DecodeConfig
    guides: list[Guide | None] | None = None  # one per source: a prefix, constraints
    done: Future = field(default_factory=Future)  # -> list[list[Hypothesis]], one per source
    queued: bool = False  # counted in Batcher.pending (guarded by Batcher.lock)

    @property
    def cost(self) -> int:
        """What it weighs in a batch and in the queue: source tokens x the rows their search
        keeps (the beam; wider for a line with constraints), for its memory grows with both."""
        widths = search_widths(self.decode, self.guides, len(self.src_ids))
        return sum(max(1, len(ids)) * w for ids, w in zip(self.src_ids, widths))


def check_room(pending: int, job: Job, max_queue: int) -> None:
    """QueueFull unless `job` fits beside the `pending` cost waiting (one job of any size fits
    an empty queue)."""
    if pending and pending + job.cost > max_queue:
        raise QueueFull(f"the queue is full ({pending} of {max_queue} waiting)")


class Batcher:
    """Feeds `search` groups of jobs: a group starts with the oldest waiting job and takes
    those that arrive within `max_wait` seconds after it, up to `max_tokens` source tokens x
    beam and up to its worker's share of the jobs lately in flight (queued or being searched:
    the most of them in the last `PEAK_MEMORY` seconds, over the workers). It waits only while
    other jobs are in flight, whose clients are the ones likely to send more, so a lone
    request is searched at once; and the share keeps one worker from taking every request
    while another idles, then takes the one that comes next alone (the windows and shares
    measured are in docs/performance.md). At most `max_queue` of that waits in the queue (one
    job of any size when it is empty): past it `submit` raises QueueFull. `workers` threads
    search groups side by side, each with `threads` intra-op threads (0: torch's setting, left
    as it is). `load`, where given, is kept equal to the count of jobs in flight (a shared
    `multiprocessing.Value`, which `tf serve`'s search processes read:
    `cli.serving.processes.Cores`)."""

    def __init__(
        self,
        search: Search,
        max_tokens: int,
        max_wait: float = 0.02,
        max_queue: int = 1 << 16,
        workers: int = 1,
        threads: int = 0,
        load=None,
    ) -> None:
        if workers < 1 or threads < 0:
            raise ValueError(f"need 1 worker or more and threads >= 0, got {workers}, {threads}")
        self.search, self.max_tokens, self.max_wait = search, max_tokens, max_wait
        self.max_queue, self.threads, self.load = max_queue, threads, load
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.held: Job | None = None  # taken from `jobs`, over the last group's budget
        self.lock = threading.Lock()
        self.taking = threading.Lock()  # one worker gathers a group at a time
        self.pending = 0  # cost of the jobs waiting to be taken, cancelled ones not counted
        self.in_flight = 0  # jobs submitted and not yet settled
        self.peak, self.peak_time = 0, 0.0  # the most in flight lately, and when
        self.searches = 0  # calls of `search` made (the tests' window on the batching)
        self.dropped = 0  # jobs cancelled before they were searched
        self.workers = [
            threading.Thread(target=self.work, name=f"batcher-{i}", daemon=True)
            for i in range(workers)
        ]
        for worker in self.workers:
            worker.start()

    @property
    def alive(self) -> bool:
        """Every worker runs (they never end: one that did would be a bug)."""
        return all(worker.is_alive() for worker in self.workers)

    def submit(
        self,
        src_ids: list[list[int]],
        decode: DecodeConfig,
        guides: list[Guide | None] | None = None,
    ) -> Future:
        """Queue a job; its future gets one list of hypotheses per source. Raises QueueFull."""
        job = Job(src_ids, decode, guides)
        with self.lock:
            check_room(self.pending, job, self.max_queue)
            self.pending += job.cost
            self._count(+1)
            now = time.monotonic()
            if self.in_flight >= self.peak or now - self.peak_time > PEAK_MEMORY:
                self.peak, self.peak_time = self.in_flight, now
            job.queued = True
        job.done.add_done_callback(self.settled)
        # A job cancelled while it waits stops counting at once: the queue frees its room.
        job.done.add_done_callback(lambda done: self.release(job) if done.cancelled() else None)
        self.jobs.put(job)
        return job.done

    def settled(self, done: Future) -> None:
        with self.lock:
            self._count(-1)

    def _count(self, change: int) -> None:
        """Jobs in flight go up or down by one (under the lock)."""
        self.in_flight += change
        if self.load is not None:
            self.load.value = self.in_flight

    def release(self, job: Job) -> None:
        """Stop counting `job` as waiting (once, whether taken or cancelled first)."""
        with self.lock:
            if job.queued:
                job.queued = False
                self.pending -= job.cost

    def take(self) -> list[Job]:
        """The next group of jobs (blocks until there is one)."""
        with self.taking:
            return self._gather()

    def _gather(self) -> list[Job]:
        group = [self.held or self.jobs.get()]
        self.held = None
        cost = group[0].cost
        with self.lock:
            alone = self.in_flight <= 1  # nobody else's answer will bring more soon
            share = -(-self.peak // len(self.workers))  # jobs: this worker's part of the load
        deadline = time.monotonic() + (0.0 if alone else self.max_wait)
        while cost < self.max_tokens and len(group) < share:
            left = deadline - time.monotonic()
            try:
                job = self.jobs.get(timeout=left) if left > 0 else self.jobs.get_nowait()
            except queue.Empty:
                break
            if cost + job.cost > self.max_tokens:
                self.held = job  # it starts the next group: this one is full
                break
            group.append(job)
            cost += job.cost
        for job in group:
            self.release(job)
        return group

    @property
    def waiting(self) -> int:
        """Jobs not yet taken into a search (cancelled ones included until dropped)."""
        return self.jobs.qsize() + (self.held is not None)

    def work(self) -> None:
        """A worker: groups taken, the jobs still wanted searched; it never dies of a job."""
        if self.threads:
            torch.set_num_threads(self.threads)  # this thread's own setting
        while True:
            try:
                self.work_once()
            except Exception:  # noqa: BLE001 - a bug here must not leave every request hanging
                log.exception("the batcher failed; it goes on")

    def work_once(self) -> None:
        wanted = []
        for job in self.take():
            # False: cancelled while it waited (the client left, its time ran out): drop it.
            if job.done.set_running_or_notify_cancel():
                wanted.append(job)
            else:
                self.dropped += 1
        try:
            by_settings: dict[tuple, list[Job]] = {}
            for job in wanted:
                by_settings.setdefault(astuple(job.decode), []).append(job)
            for jobs in by_settings.values():
                self.run(jobs)
        except Exception as err:  # noqa: BLE001 - running futures must be settled, or they hang
            log.exception("the batcher failed on %d request(s)", len(wanted))
            fail(wanted, err)

    def run(self, jobs: list[Job]) -> None:
        """One search over the sources of `jobs` (same settings); each gets its share back.
        When it fails, each job is searched alone: only a bad request fails."""
        try:
            sources = [ids for job in jobs for ids in job.src_ids]
            guides = None
            if any(job.guides for job in jobs):
                guides = [g for job in jobs for g in (job.guides or [None] * len(job.src_ids))]
            found = self.searched(sources, jobs[0].decode, guides)
        except Exception as err:  # noqa: BLE001 - reported to the requests, the thread lives on
            if len(jobs) == 1:
                log.exception("search failed on %d sentences", len(jobs[0].src_ids))
                fail(jobs, err)
                return
            log.warning("search failed on %d requests together (%s); one at a time", len(jobs), err)
            for job in jobs:
                self.run([job])
            return
        start = 0
        for job in jobs:
            finish(job, result=found[start : start + len(job.src_ids)])
            start += len(job.src_ids)

    def searched(
        self, sources: list[list[int]], decode: DecodeConfig, guides=None
    ) -> list[list[Hypothesis]]:
        """`search` under the batch budget counted with the beam: the engine's own batches of
        source tokens then hold `max_tokens` / beam of them, whatever beam a client asks."""
        with self.lock:
            self.searches += 1
        budget = max(1, self.max_tokens // max(1, decode.beam_size))
        found = self.search(sources, replace(decode, max_tokens=budget), guides)
        if len(found) != len(sources):
            raise RuntimeError(f"the search returned {len(found)} results for {len(sources)}")
        return found


def finish(job: Job, result=None, error: BaseException | None = None) -> None:
    """Set the job's outcome; a future already settled (it cannot be, once running) is left."""
    if job.done.done():
        return
    if error is None:
        job.done.set_result(result)
    else:
        job.done.set_exception(error)


def fail(jobs: list[Job], error: BaseException) -> None:
    for job in jobs:
        finish(job, error=error)
