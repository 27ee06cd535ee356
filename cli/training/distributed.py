"""The little `tf train` needs from `torch.distributed` when launched by `torchrun`.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them training runs as one process and
every helper here is a no-op.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cli.device import pick_device
from data.errors import InputError, counted


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Only the main process writes checkpoints, metrics and the progress bar."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


class StoppedWithMain(Exception):
    """The main rank failed in a block it runs first (`main_first`): this rank stops with it,
    and says nothing (the main rank says why)."""


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process: it reports any exit but 0 of one as a failure of
    its own, with a traceback (ChildFailedError), so a refusal exits 0 there (`cli.main`)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def init(device_name: str, timeout: float = 7200.0) -> tuple[Dist, torch.device]:
    """Join the process group torchrun described (NCCL on GPUs, Gloo on CPUs), pick the device.

    `timeout`: seconds a collective may wait for the slowest rank before failing.

    Raises:
        InputError: more processes on this machine than it has GPUs (on every rank alike: a
            rank that stopped alone would leave the others waiting for it).
    """
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Dist(), pick_device(device_name)
    d = Dist(
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        int(os.environ.get("LOCAL_RANK", "0")),
    )
    device = pick_device(device_name)
    if device.type == "cuda":
        # torchrun's LOCAL_WORLD_SIZE: the processes on this machine, each taking its own GPU.
        local = max(int(os.environ.get("LOCAL_WORLD_SIZE", "0")), d.local_rank + 1)
        if local > torch.cuda.device_count():
            raise InputError(
                f"{counted(local, 'process', 'processes')} on this machine, which has "
                f"{counted(torch.cuda.device_count(), 'CUDA device')}: start at most that "
                "many on it (torchrun --nproc-per-node)"
            )
        device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout)
        )
    return d, device


def shutdown(d: Dist) -> None:
    """Leave the process group; then let Gloo's threads finish before the interpreter exits.

    A Gloo worker thread frees each collective's tensors after the caller has moved on; freeing
    one that Python made takes the GIL, and a thread that asks for it while the interpreter
    exits aborts the process ("terminate called without an active exception"), turning a clean
    exit or a clear error into SIGABRT. Sleeping hands them the GIL: a pending free takes
    microseconds, and no new collective can start once the group is destroyed.
    """
    if d.active and dist.is_initialized():
        dist.destroy_process_group()
        time.sleep(0.1)


def sum_over_ranks(d: Dist, values: list[float], device: torch.device) -> list[float]:
    """Each value summed over all ranks (one all-reduce for the lot)."""
    if not d.active:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def sum_with_counts(d: Dist, sums: torch.Tensor, counts: list[float]) -> torch.Tensor:
    """`sums` (on the device) followed by the host numbers `counts`, each summed over all ranks,
    in one all-reduce; the result stays on the device (nothing waits for the host).

    Shape: sums (n,), counts k numbers -> (n + k,) float64.
    """
    host = torch.tensor(counts, dtype=torch.float64)
    if sums.device.type == "cuda":
        host = host.pin_memory().to(sums.device, non_blocking=True)
    out = torch.cat([sums.double(), host.to(sums.device)])
    if d.active:
        dist.all_reduce(out)
    return out


def any_rank(d: Dist, flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is true on any: all ranks stop together."""
    return sum_over_ranks(d, [float(flag)], device)[0] > 0


def gather_to_main(d: Dist, obj: Any) -> list[Any] | None:
    """Each rank's `obj`, in rank order, on the main process (None elsewhere)."""
    if not d.active:
        return [obj]
    out = [None] * d.world_size if d.main else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_object(d: Dist, obj: Any) -> Any:
    """The main rank's `obj` on every rank (the others' are ignored)."""
    if not d.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(d: Dist) -> None:
    if d.active:
        dist.barrier()


@contextmanager
def main_first(d: Dist) -> Iterator[None]:
    """Run the block on the main rank first, then on the others: files it writes (a tokenizer,
    the `datasets` cache of the encoded corpus) are made once and then read by the rest. Where
    it fails on the main rank (a corpus refused), the others stop too, without running it
    (`StoppedWithMain`): every rank stops together, and the main rank alone says why.

    Raises:
        StoppedWithMain: on the other ranks, when the block failed on the main rank.
    """
    if d.active and not d.main and not broadcast_object(d, None):
        raise StoppedWithMain("the main rank stopped")
    try:
        yield
    except BaseException:
        if d.active and d.main:
            broadcast_object(d, False)
        raise
    if d.active and d.main:
        broadcast_object(d, True)
