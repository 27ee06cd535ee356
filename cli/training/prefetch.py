"""Training batches, endlessly, epoch after epoch, each with where the iterator then stands.

On a GPU a background thread collates the next batches and pins them in page-locked memory
while the device computes, so that the copy to the device runs asynchronously; on a CPU the
batches are made in line (a second thread would only compete for the same cores).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from data.batching import Batch, BatchIterator


@dataclass
class Fetched:
    batch: Batch
    state: dict[str, Any]  # the iterator's state_dict after this batch: a resume goes on from here
    epochs: float  # epochs done once this batch is consumed, with the fraction of the current one


def endless(iterator: BatchIterator) -> Iterator[Fetched]:
    """The iterator's batches across epochs, each with its resume state."""
    while True:
        for batch in iterator:
            state = iterator.state_dict()
            n = len(iterator)
            yield Fetched(batch, state, iterator.epoch + iterator.position / n)


class Prefetcher:
    """`endless(iterator)` run `depth` batches ahead by a daemon thread, batches pinned (which
    needs a GPU) if `pin`.

    The thread holds the iterator (its memory-mapped Arrow tables) and up to `depth` pinned
    batches: `close()` stops it and lets all of them go. The trainer closes it when training
    ends or fails, and whenever it starts the batches anew.
    """

    def __init__(self, iterator: BatchIterator, depth: int = 2, pin: bool = True) -> None:
        self._queue: queue.Queue[Fetched | BaseException] = queue.Queue(maxsize=depth)
        self._pin = pin
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._fill, args=(iterator,), name="tf-prefetch", daemon=True
        )
        self._thread.start()

    def _fill(self, iterator: BatchIterator) -> None:
        try:
            for fetched in endless(iterator):
                if self._closed.is_set():
                    return
                if self._pin:
                    fetched.batch = fetched.batch.pin_memory()
                self._queue.put(fetched)  # close() empties the queue: this never waits forever
        except BaseException as e:  # raised again in the consumer, not lost in the thread
            if not self._closed.is_set():  # else no one reads it, and the queue may be full
                self._queue.put(e)

    def __iter__(self) -> Iterator[Fetched]:
        return self

    def __next__(self) -> Fetched:
        if self._closed.is_set():
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop the thread, wait for it, and drop the batches it made (idempotent)."""
        self._closed.set()
        # The thread puts at most one more item after the flag is set (it checks the flag
        # between items): once the queue is empty, that put finds room.
        self._drain()
        self._thread.join()
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return


def training_batches(
    iterator: BatchIterator, prefetch: bool
) -> Prefetcher | Generator[Fetched, None, None]:
    """Endless training batches: prefetched by a thread (GPU) or made in line (CPU); either
    way `close()` ends them."""
    return Prefetcher(iterator) if prefetch else endless(iterator)
