"""What a training run's settings ask of the device it runs on, checked before any work.

Each setting is first used at its own moment: `train.precision` once the data is ready,
`decode.precision` at the first validation (`small`: 500 updates in), `train.compile` at the
first forward pass. A setting this device cannot honour is a one-line error before the run
directory, the tokenizer or the data are touched, for a new run and a resumed one alike.
"""

from __future__ import annotations

import torch

from cli.config import Config
from cli.device import autocast_dtype
from data.errors import InputError


def check_settings(config: Config, device: torch.device) -> None:
    """Every `train.*` and `decode.*` setting the trainer uses that depends on the device.

    Raises:
        InputError: naming the setting and what it needs.
    """
    autocast_dtype(config.train.precision, device, "train.precision")
    autocast_dtype(config.decode.precision, device, "decode.precision")  # validation decodes
    if config.train.shard and autocast_dtype(config.train.precision, device) == torch.float16:
        raise InputError(  # `auto` on a GPU without bf16 (V100, T4)
            "train.precision: fp16 on this device, whose loss scale is not sharded; use "
            "train.precision=fp32 with train.shard"
        )
    if config.train.compile:
        check_compiler(device)


def check_compiler(device: torch.device) -> None:
    """torch.compile generates its kernels at the first forward pass: C++ on a CPU, Triton on
    a GPU. Without them it fails there, after the data work, in a long traceback."""
    try:
        if device.type == "cuda":
            from torch.utils._triton import has_triton

            found, needed = has_triton(), "Triton (pip install triton)"
        else:
            from torch._inductor.cpp_builder import get_cpp_compiler

            needed = "a C++ compiler (g++ or clang++)"
            try:
                found = bool(get_cpp_compiler())
            except Exception:  # torch's InvalidCxxCompiler, or a failing search
                found = False
    except ImportError:  # torch's private helpers moved: torch.compile will tell
        return
    if not found:
        raise InputError(
            f"train.compile: torch.compile on {device.type} needs {needed}, not found here; "
            "install it or set train.compile=false"
        )
