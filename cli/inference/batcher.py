"""Requests from concurrent clients translated together: a queue, a few milliseconds' wait, one
search per group of requests that share decode settings, each answer back to its request.

Only the batcher's thread touches the model, so the server's request handlers never block on
it (they await a future) and the engine needs no locking.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import astuple, dataclass, field

from cli.config import DecodeConfig
from cli.inference.engines import Search
from model.search import Hypothesis

log = logging.getLogger(__name__)


@dataclass
class Job:
    src_ids: list[list[int]]
    decode: DecodeConfig
    done: Future = field(default_factory=Future)  # -> list[list[Hypothesis]], one per source

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.src_ids)


class Batcher:
    """Feeds `search` groups of jobs: a group starts with the oldest waiting job and takes
    those that arrive within `max_wait` seconds after it, up to `max_tokens` source tokens."""

    def __init__(self, search: Search, max_tokens: int, max_wait: float = 0.005) -> None:
        self.search, self.max_tokens, self.max_wait = search, max_tokens, max_wait
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.searches = 0  # calls of `search` made (the tests' window on the batching)
        threading.Thread(target=self.work, name="batcher", daemon=True).start()

    def submit(self, src_ids: list[list[int]], decode: DecodeConfig) -> Future:
        job = Job(src_ids, decode)
        self.jobs.put(job)
        return job.done

    def take(self) -> list[Job]:
        """The next group of jobs (blocks until there is one)."""
        group = [self.jobs.get()]
        tokens = group[0].tokens
        deadline = time.monotonic() + self.max_wait
        while tokens < self.max_tokens:
            left = deadline - time.monotonic()
            try:
                job = self.jobs.get(timeout=left) if left > 0 else self.jobs.get_nowait()
            except queue.Empty:
                break
            group.append(job)
            tokens += job.tokens
        return group

    def work(self) -> None:
        while True:
            by_settings: dict[tuple, list[Job]] = {}
            for job in self.take():
                by_settings.setdefault(astuple(job.decode), []).append(job)
            for jobs in by_settings.values():
                self.run(jobs)

    def run(self, jobs: list[Job]) -> None:
        """One search over the sources of `jobs` (same settings); each gets its share back."""
        sources = [ids for job in jobs for ids in job.src_ids]
        try:
            self.searches += 1
            found: list[list[Hypothesis]] = self.search(sources, jobs[0].decode)
        except Exception as err:  # noqa: BLE001 - reported to the requests, the thread lives on
            log.exception("search failed on %d sentences", len(sources))
            for job in jobs:
                job.done.set_exception(err)
            return
        start = 0
        for job in jobs:
            job.done.set_result(found[start : start + len(job.src_ids)])
            start += len(job.src_ids)
