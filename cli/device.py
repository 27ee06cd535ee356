"""Devices and precision: which device a command runs on and in which dtype it computes."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
from contextlib import AbstractContextManager, nullcontext

import torch

from data.errors import InputError
from model.packed import can_pack

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def pick_device(name: str = "auto") -> torch.device:
    """The device called `name` (auto: CUDA when present, else CPU), checked to exist here.

    Raises:
        InputError: an unknown name, or a CUDA device this machine does not have.
    """
    if not DEVICE_PATTERN.fullmatch(name):
        raise InputError(f"device {name!r}: unknown (expected auto, cpu, cuda or cuda:N)")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {name!r}: CUDA is not available here (use cpu or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def autocast_dtype(
    precision: str, device: torch.device, setting: str = "train.precision"
) -> torch.dtype | None:
    """The autocast dtype for `precision` (the value of `setting`) on this device (None: fp32).

    `auto` is bf16 on GPUs with native bf16 (Ampere and newer; else fp16 with a GradScaler) and
    on CPUs with native bf16 (AVX512-BF16 or AMX), fp32 elsewhere. Master weights and Adam's
    state stay fp32.
    """
    if precision == "fp32":
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise InputError(f"{setting}: fp16 needs a CUDA device; use bf16 or auto")
        return torch.float16
    if precision == "bf16":
        # Every CPU computes bf16 (emulated where not native, slower but right); a GPU too old
        # to hold bf16 tensors at all would fail at the first autocast.
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise InputError(f"{setting}: bf16 is not supported by this GPU; use fp16 or auto")
        return torch.bfloat16
    if device.type == "cuda":
        # Without `including_emulation=False` a V100 or T4 says yes and runs bf16 emulated.
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if native else torch.float16
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if native else None


def make_deterministic(device: torch.device) -> None:
    """torch.use_deterministic_algorithms, with what it needs on CUDA: a fixed cuBLAS workspace.
    Without CUBLAS_WORKSPACE_CONFIG torch refuses the first matmul; cuBLAS reads it when it
    starts, so it is set here, before any (a value the user set is kept)."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def configure_device(device: torch.device) -> None:
    """Process-wide settings for fast computing on `device`.

    On CPUs, flush denormal floats to zero: x86 computes on them in a slow microcode path, and
    training produces them (tiny gradients and Adam moments). Measured here on `small` in fp32:
    2,820 -> 3,000 target tokens/s; only values under ~1e-38 change (to 0). On CUDA, allow
    TF32 matmuls (training, translation and validation alike).
    """
    if device.type == "cpu":
        torch.set_flush_denormal(True)
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# oneDNN kernels a decoding process keeps (oneDNN's default: 1,024).
DECODING_KERNELS = 128
CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def bound_decoding_kernels() -> None:
    """Keep at most DECODING_KERNELS oneDNN kernels in this process, unless the user's
    ONEDNN_PRIMITIVE_CACHE_CAPACITY says otherwise: for decoding in bf16 or int8, not float32
    (`cli.inference.engines.load_engine`). oneDNN (packed linear layers, bf16 and int8
    matmuls) builds a kernel with scratch memory for each shape it meets and keeps up to
    1,024; decoding meets hundreds (rows per sentence count, sources' widths, beams per
    sentence), and on AMX each held about a megabyte: `tf translate` of 10,000 lines in bf16
    (`small`, beam 5, 2-core Xeon with AMX) grew from 1.71 GB at a tenth of the run to 2.23 GB
    (1.30x); with 128 kept, 1.56 -> 1.69 GB (1.09x), and the test set's search took 16.4 and
    16.1 s against 16.7 and 16.2 s with 1,024 (alternated): a step meets a dozen shapes, so
    128 hold its working set. Packed float32 kernels are small, and the test set's search
    at beam 5 met 300 shapes, 800 kernels built where 128 were kept: with 1,024 the 10,000
    lines took 178 s instead of 182 and peaked at 1.36 GB instead of 1.44 (2-core Xeon with
    AMX; capped to AVX2, where the 800 took 251 ms to build and the 300 58 ms, no change in
    the test set's time measurable over 3 rounds).

    oneDNN reads the variable once, at its first kernel: set for a one-element kernel made
    here, then removed, so that no process this one starts (a `tf train`) inherits it. Where
    oneDNN has made a kernel already, nothing changes."""
    if CACHE_VARIABLE in os.environ or not can_pack():
        return
    os.environ[CACHE_VARIABLE] = str(DECODING_KERNELS)
    try:
        with torch.no_grad():
            one = torch.ones(1, 1)
            weight = torch.ops.mkldnn._reorder_linear_weight(one)
            torch.ops.mkldnn._linear_pointwise(one, weight, None, "none", [], "")
    finally:
        del os.environ[CACHE_VARIABLE]


def keep_freed_memory() -> None:
    """Let glibc keep the memory a process frees, for the process's next allocations.

    By default it hands blocks over 32 MB, and the free top of its heap, back to the kernel at
    once; a training or decoding step frees and allocates the same large buffers every time,
    so each comes back as fresh pages the kernel must fault in and zero. Measured on a 2-core
    AMD EPYC (`small`, 16 updates in one process, two runs each way, alternated): bf16
    4,400-5,300 -> 5,070-6,430 target tokens/s, minor page faults 440k-460k -> 116k-123k;
    fp32 2,594-2,667 -> 2,873-2,976 tokens/s, 590k-640k -> 16k-20k faults; peak memory
    1.44-1.47 -> 1.46-1.48 GB (a process reaches its peak in its first steps anyway). Large
    blocks then come from the heap (M_MMAP_MAX 0), which is trimmed only past 2 GB free
    (M_TRIM_THRESHOLD). Linux with glibc only; elsewhere nothing changes.
    """
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 2**31 - 1)  # an int: trim only past 2 GB free at the top


def engine_precision(precision: str, device: torch.device) -> str:
    """What `decode.precision` a loaded model decodes in (`tf translate`, eval, serve...):
    `auto` is fp32 on a CPU without AMX where the linear layers can be packed for oneDNN
    (`model.packed`), else as `autocast_dtype` says. On the 2-core AMD EPYC (avx512_bf16, no
    amx) packed fp32 searched the test set 1.15x (`small`) to 1.4x (`demo`) as fast as packed
    bf16, and gives the trained model's exact numbers; bf16's 2x matmul rate there is lost to
    the casts around every layer at a step's sizes (measured before attention under autocast
    ran in float32 as meant). With AMX bf16 stays: on a 2-core Intel Xeon with AMX, packed bf16
    searched the test set 1.45x (greedy) and 1.41x (beam 5) as fast as packed fp32 (`small`,
    `benchmarks.engines_bench`). Validation in training decodes the training model itself,
    unpacked, where bf16 autocast is the faster (19.8 s against 23 s)."""
    if precision != "auto" or device.type != "cpu" or not can_pack():
        return precision
    return precision if torch.cpu._is_amx_tile_supported() else "fp32"


def inference_autocast(device: torch.device, precision: str = "auto") -> AbstractContextManager:
    """How decoding computes on `device` for `decode.precision`: `auto` autocasts to bf16 where
    the device has it natively (GPUs from Ampere on, else fp16 with TF32 matmuls; CPUs with
    AVX512-BF16 or AMX), so the matmuls of every step, the output projection first, run at
    twice the fp32 rate; elsewhere fp32. The residual stream, LayerNorm and the
    log-probabilities stay fp32 under autocast."""
    configure_device(device)
    dtype = autocast_dtype(precision, device, "decode.precision")
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as a container or taskset sets it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def search_workers(
    device: torch.device, workers: int = 0, own_threads: bool = False
) -> tuple[int, int]:
    """How `tf serve` searches: (worker threads, intra-op threads each; 0 = torch's own).

    A GPU runs one search at a time, and an engine with a thread pool of its own
    (`own_threads`: CTranslate2) shares the cores out itself: one worker. On CPUs the cores
    are shared out, at most 4 workers (`workers` asks for a number); a worker's small
    per-step ops gain little from more than a few threads, and concurrent groups keep every
    core busy (the measurements are in docs/performance.md). CTranslate2 on 2 cores at
    32 clients: 139 requests/s with one worker, 115 with two."""
    if device.type != "cpu" or own_threads:
        return max(1, workers), 0
    cores = usable_cores()
    workers = workers or min(cores, 4)
    return workers, max(1, cores // workers)


def demo_config(device: torch.device | None = None) -> tuple[str, str]:
    """`make demo`'s recipe for this machine, and why: its 4 minutes buy the most translation
    with `configs/demo.yaml` where bf16 runs natively, and with the narrower
    `configs/demo-fp32.yaml` where every matmul runs in fp32 (a third of the rate)."""
    device = device or pick_device("auto")  # where `tf train` will run it
    if device.type == "cuda":
        return "configs/demo.yaml", "a CUDA GPU: configs/demo.yaml"
    cores = usable_cores()
    if autocast_dtype("auto", device) is not None:
        return "configs/demo.yaml", f"native bf16 on {cores} cores: configs/demo.yaml"
    return (
        "configs/demo-fp32.yaml",
        f"no native bf16 (fp32, {cores} cores): configs/demo-fp32.yaml, a narrower model that "
        "makes more updates in the time",
    )


if __name__ == "__main__":  # `python -m cli.device --demo-config`, for `make demo`
    if sys.argv[1:] != ["--demo-config"]:
        sys.exit("usage: python -m cli.device --demo-config")
    config, why = demo_config()
    print(f"demo: {why}", file=sys.stderr)
    print(config)
