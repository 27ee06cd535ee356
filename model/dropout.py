"""Dropout (Srivastava et al., 2014) in a quarter to a third of torch's time on a CPU.

`torch.nn.functional.dropout` draws its CPU mask with `bernoulli_`, one draw of the generator
per element: 7.5 ms for 1M elements on 2 cores (Xeon, AMX), 30 times the multiply it masks,
and a tenth of a bf16 fine-tuning update of NLLB-600M's stand-in (62 dropouts). Here one
64-bit draw makes four 16-bit uniforms, each kept when at or above p's share of 2^16: forward
and backward in 0.25x-0.35x `F.dropout`'s time (`benchmarks/dropout_bench.py`). The probability is p
rounded to 1/65,536 (0.1 drops 6,554/65,536 = 0.100006), and the kept values are scaled by the
inverse of the rounded keep probability (in float32, then rounded once to x's dtype), so the
mean holds. The draws come from torch's own CPU generator, which seeds, checkpoints and resumes
as before. On other devices, and in graphs `torch.compile` builds (which fuse a mask of their
own), torch's dropout is already fast: used as it is. SDPA's attention dropout (fp32 training
on a CPU) stays torch's, inside its kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16  # the uniforms' resolution: p is rounded to a multiple of 1 / LEVELS


def dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of `x` with probability `p` (0 <= p <= 1).

    Raises:
        ValueError: p outside [0, 1], as `F.dropout`.
    """
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    drop = round(p * LEVELS)
    if x.device.type != "cpu" or drop in (0, LEVELS) or torch.compiler.is_compiling():
        return F.dropout(x, p)  # p = 1 (all dropped) included
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits
    uniforms = words.view(torch.int16)[:n].view(x.shape)  # int16: -32768 .. 32767
    # 1 where kept, 0 where dropped, in x's dtype: a comparison written straight into it takes
    # a fifth of the time a boolean mask's use does (`where`, or a product with it: 1 ms per 1M).
    keep = torch.ge(uniforms, drop - LEVELS // 2, out=torch.empty_like(x))
    return (x * keep).mul_(LEVELS / (LEVELS - drop))  # the product is not saved: in place


class Dropout(nn.Dropout):
    """`torch.nn.Dropout` with `dropout`'s mask (the model's modules use it); never in place."""

    def __init__(self, p: float = 0.5):
        super().__init__(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p) if self.training and self.p > 0 else x
