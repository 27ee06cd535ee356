"""The little `tf train` needs from `torch.distributed` when launched by `torchrun`.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them training runs as one process and
every helper here is a no-op.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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


class StartFailed(Exception):
    """The start of a run failed on some rank, and every rank stops together (`agreed_start`):
    `str()` is the first failing rank's message, which rank 0 alone says (`cli.main`);
    `refused`: it was a refusal (a setting, a corpus, a run in the way), not a crash."""

    def __init__(self, message: str, refused: bool):
        super().__init__(message)
        self.refused = refused


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process: it reports any exit but 0 of one as a failure of
    its own, with a traceback (ChildFailedError), so a refusal at start-up exits 0 there
    (`agreed_start`, `cli.main`)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def refusals() -> tuple[type[Exception], ...]:
    """The errors that are a refusal of what the user gave (a setting, a file, a run), said in
    one line without a traceback (`cli.main.user_errors`)."""
    from cli.config import ConfigError
    from cli.runs.checkpoint import CheckpointError
    from cli.training.run import TrainingError

    return InputError, ConfigError, CheckpointError, TrainingError


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
    """The main rank's `obj` on every rank (the others' are ignored), once every rank has come
    this far (`agree`: a step of the start)."""
    agree(d)
    if not d.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(d: Dist) -> None:
    if d.active:
        dist.barrier()


def agree(d: Dist, failure: tuple[str, bool] | None = None) -> None:
    """A point of the start of a run that every rank reaches, whether it failed on the way or
    not (`agreed_start`): each says so, and all go on only if none failed. Every collective of
    the start comes after one (a rank that failed alone before it announces that here, in
    the collective the others make next: no rank waits for one that has stopped).

    Args:
        failure: this rank's (message, refused), where it failed since the last agreement.

    Raises:
        StartFailed: on every rank where any failed, with the first failing rank's message.
    """
    failures = [failure]
    if d.active:
        failures = [None] * d.world_size
        dist.all_gather_object(failures, failure)
    first = next((f for f in failures if f is not None), None)
    if first is not None:
        raise StartFailed(*first)


@contextmanager
def agreed_start(d: Dist) -> Iterator[None]:
    """The start of a run under torchrun (from the config to the trainer built), which ends
    alike on every rank: where one rank fails (a refusal, a crash), the others stop with it
    at their next `agree`, and all raise `StartFailed` with the first failing rank's message,
    which rank 0 alone says (a crash's own rank raises its error, with its traceback). Before
    the process group exists (`Dist()`), every rank reads the same config and files: each
    fails alike, on its own. Without torchrun, errors pass as they are.

    Raises:
        StartFailed: under torchrun, where any rank failed in the block.
    """
    if not d.active and not launched_by_torchrun():
        yield
        return
    try:
        yield
    except StartFailed:
        raise  # agreed already
    except refusals() as e:
        agree(d, (str(e), True))  # (raises StartFailed: it failed here)
    except Exception as e:
        with suppress(StartFailed):
            agree(d, (f"rank {d.rank} failed at start-up: {type(e).__name__}: {e}", False))
        raise
    agree(d)


@contextmanager
def main_first(d: Dist) -> Iterator[None]:
    """Run the block on the main rank first, then on the others: files it writes (a tokenizer,
    the `datasets` cache of the encoded corpus) are made once and then read by the rest. A step
    of the start (`agreed_start`): the others wait for the main rank's block in an agreement,
    and where it fails there (a corpus refused) they stop with it, without running it.

    Raises:
        StartFailed: on the other ranks, where the block failed on the main rank (or any rank
            failed before it).
    """
    if d.active and not d.main:
        agree(d)
    yield
    if d.active and d.main:
        agree(d)
