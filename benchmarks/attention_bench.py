"""One attention's forward and backward on the CPU: torch's fused SDPA kernel, its math
backend, and the written-out form `tf` uses under CPU autocast (model/attention.py), in bf16
and fp32, at the shape of a `small` training batch (64 sentences, 4 heads, 36 positions).

    python -m benchmarks.attention_bench
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import print_table
from model.attention import written_out_attention

SHAPE = (64, 4, 36, 64)  # (B, H, T, D/H)


def fused(q, k, v, keep, causal):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal)


def math_backend(q, k, v, keep, causal):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal)


def written_out(q, k, v, keep, causal):
    return written_out_attention(q, k, v, keep, causal, 0.0)


def milliseconds(
    fn, dtype: torch.dtype, causal: bool, repeats: int = 20, shape: tuple[int, ...] = SHAPE
) -> float:
    B, H, T, _ = shape
    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    keep = None
    if not causal:  # a key-padding mask: half the sentences 5 positions shorter
        keep = torch.ones(B, 1, 1, T, dtype=torch.bool)
        keep[: B // 2, ..., T - 5 :] = False
    for _ in range(3):
        fn(q, k, v, keep, causal).float().sum().backward()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(q, k, v, keep, causal).float().sum().backward()
    return (time.perf_counter() - start) / repeats * 1000


def run(sentences: int = SHAPE[0], repeats: int = 20) -> dict:
    """Milliseconds of forward + backward per kernel, precision and mask, at `sentences` (B)
    rows of the `small` batch shape."""
    shape = (sentences, *SHAPE[1:])
    results: dict[str, float] = {}
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        for causal in (False, True):
            for label, fn in (("sdpa", fused), ("sdpa_math", math_backend), ("ours", written_out)):
                key = f"{label}_{name}_{'causal' if causal else 'padding'}_ms"
                results[key] = milliseconds(fn, dtype, causal, repeats, shape)
    return results


def print_results(r: dict) -> None:
    rows = [("precision, mask", "SDPA fused ms", "SDPA math ms", "written out ms")]
    for name in ("bf16", "fp32"):
        for mask in ("padding", "causal"):
            rows.append(
                (
                    f"{name}, {mask}",
                    *(
                        f"{r[f'{label}_{name}_{mask}_ms']:.1f}"
                        for label in ("sdpa", "sdpa_math", "ours")
                    ),
                )
            )
    print_table(rows)


if __name__ == "__main__":
    print_results(run())
