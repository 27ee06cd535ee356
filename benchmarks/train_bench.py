"""Training-step throughput: `tf`'s model against the same step built from `torch.nn.Transformer`.

Both get the same dims, the same real batches of the corpus (token-budget bucketing), the same
label-smoothed loss and Adam; the reference computes logits for every (padded) target position,
as a straightforward implementation does, while `tf` projects only real target tokens. The two
are timed alternately in one process, so machine noise hits both alike; the ratio is the result.

    python -m benchmarks.train_bench [--config small] [--batches 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import corpus_batches, print_table
from cli.config import load_config
from cli.optim import build_optimizer
from model.loss import label_smoothed_cross_entropy
from model.transformer import ModelConfig, Transformer, sinusoidal_positions


class Reference(nn.Module):
    """Embeddings (x sqrt(D) + sinusoidal), torch.nn.Transformer (Post-LN), tied generator."""

    def __init__(self, config: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        D = config.d_model
        self.embed = nn.Embedding(vocab_size, D, padding_idx=pad_id)
        self.register_buffer(
            "positions", sinusoidal_positions(config.max_positions, D), persistent=False
        )
        self.transformer = nn.Transformer(
            D,
            config.n_heads,
            config.n_encoder_layers,
            config.n_decoder_layers,
            config.d_ff,
            config.dropout,
            batch_first=True,
            norm_first=False,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.scale = math.sqrt(D)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * self.scale + self.positions[: ids.size(1)])

    def forward(self, src, tgt_in, src_pad_mask, tgt_pad_mask) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=src.device, dtype=torch.bool
        )
        hidden = self.transformer(
            self.embed_tokens(src),
            self.embed_tokens(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad_mask,
            tgt_key_padding_mask=tgt_pad_mask,
            memory_key_padding_mask=src_pad_mask,
            tgt_is_causal=True,
        )
        return hidden @ self.embed.weight.T  # (B, T, V): every position, padding included


def ours_loss(model: Transformer, batch, eps: float) -> torch.Tensor:
    real = ~batch.tgt_pad_mask
    logits = model(batch.src, batch.tgt_in, batch.src_pad_mask, batch.tgt_pad_mask, real)  # (N,V)
    loss, _ = label_smoothed_cross_entropy(logits, batch.tgt_out[real], eps)
    return loss / batch.n_tgt_tokens


def reference_loss(model: Reference, batch, eps: float, pad_id: int) -> torch.Tensor:
    logits = model(batch.src, batch.tgt_in, batch.src_pad_mask, batch.tgt_pad_mask)  # (B,T,V)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(),
        batch.tgt_out.flatten(),
        ignore_index=pad_id,
        label_smoothing=eps,
        reduction="sum",
    )
    return loss / batch.n_tgt_tokens


def build(which: str, config, tokenizer):
    """A function doing one training step of model `which` ("tf" or "reference")."""
    torch.manual_seed(0)
    eps = config.train.label_smoothing
    if which == "tf":
        model = Transformer(
            config.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id
        )

        def loss_fn(batch):
            return ours_loss(model, batch, eps)
    else:
        model = Reference(config.model, tokenizer.tgt_vocab_size, tokenizer.pad_id)

        def loss_fn(batch):
            return reference_loss(model, batch, eps, tokenizer.pad_id)

    optimizer, _ = build_optimizer(
        model.parameters(), config.train, config.model.d_model, torch.device("cpu")
    )
    model.train()

    def step(batch, dtype) -> None:
        with torch.autocast("cpu", dtype=dtype) if dtype else nullcontext():
            loss = loss_fn(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def time_pass(step, batches, dtype) -> float:
    start = time.perf_counter()
    for b in batches:
        step(b, dtype)
    return time.perf_counter() - start


def peak_rss_mb(which: str, config_name: str, precision: str, n_batches: int) -> float:
    """Peak resident memory of a fresh process doing `n_batches` steps of one model."""
    code = (
        f"from benchmarks.train_bench import memory_probe; "
        f"memory_probe({which!r}, {config_name!r}, {precision!r}, {n_batches})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def memory_probe(which: str, config_name: str, precision: str, n_batches: int) -> None:
    config = load_config(config_name)
    tokenizer, batches = corpus_batches(config, n_batches)
    step = build(which, config, tokenizer)
    dtype = torch.bfloat16 if precision == "bf16" else None
    time_pass(step, batches, dtype)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def run(
    config_name: str = "small", n_batches: int = 6, repeats: int = 3, memory: bool = True
) -> dict:
    config = load_config(config_name)
    tokenizer, batches = corpus_batches(config, n_batches)
    tokens = sum(b.n_tgt_tokens for b in batches)
    steps = {name: build(name, config, tokenizer) for name in ("tf", "reference")}
    results = {}
    for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        for step in steps.values():  # warm-up: allocator, autocast caches, threads
            time_pass(step, batches[:2], dtype)
        times = {name: [] for name in steps}
        for _ in range(repeats):
            for name, step in steps.items():  # alternate, so noise hits both alike
                times[name].append(time_pass(step, batches, dtype))
        for name in steps:
            results[f"{name}_{precision}_tokens_per_s"] = tokens / statistics.median(times[name])
    ref32 = results["reference_fp32_tokens_per_s"]
    results["ratio_fp32"] = results["tf_fp32_tokens_per_s"] / ref32
    results["ratio_bf16_vs_ref_bf16"] = (
        results["tf_bf16_tokens_per_s"] / results["reference_bf16_tokens_per_s"]
    )
    results["ratio_bf16_vs_ref_fp32"] = results["tf_bf16_tokens_per_s"] / ref32
    if memory:
        for name in steps:
            for precision in ("fp32", "bf16"):
                results[f"{name}_{precision}_peak_rss_mb"] = peak_rss_mb(
                    name, config_name, precision, 2
                )
    results["target_tokens_per_pass"] = tokens
    results["batches"] = len(batches)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    r = run(args.config, args.batches, args.repeats)
    rows = [("model", "precision", "target tokens/s", "vs reference fp32", "peak RSS MB")]
    for name in ("tf", "reference"):
        for precision in ("fp32", "bf16"):
            tps = r[f"{name}_{precision}_tokens_per_s"]
            rows.append(
                (
                    name,
                    precision,
                    f"{tps:,.0f}",
                    f"{tps / r['reference_fp32_tokens_per_s']:.2f}x",
                    f"{r.get(f'{name}_{precision}_peak_rss_mb', 0):,.0f}",
                )
            )
    print_table(rows)


if __name__ == "__main__":
    main()
