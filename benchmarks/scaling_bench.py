"""How cost grows with the work: training tokens/s from `tiny` to `small` to `base` (the same
update, the same corpus batches), and decoding time per sentence by source length (cached
decoding does O(t) work at step t, so time per sentence should grow about linearly with the
length of the output, not with its square).

    python -m benchmarks.scaling_bench [--run RUN]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import OUT, corpus_batches, print_table
from benchmarks.decode_bench import default_run, source_sentences
from benchmarks.train_bench import build, time_pass
from cli.config import load_config
from cli.device import configure_device
from cli.inference.decoding import encode_sources, translate_ids
from cli.runs.models import load_for_inference

CONFIGS = ("tiny", "small", "base")
LENGTHS = ((1, 15), (16, 30), (31, 45), (46, 60), (61, 120))  # source pieces, inclusive


def run(
    run_dir: Path,
    configs: tuple[str, ...] = CONFIGS,
    n_batches: int = 3,
    per_bucket: int = 40,
    vocab_size: int = 8000,
    max_tokens: int = 4096,
    pairs: int | None = None,
    out: Path = OUT,
) -> dict:
    """Training tokens/s of each config under one vocabulary and batch budget, on the corpus
    (or its first `pairs` pairs); decoding ms per sentence of the model in `run_dir`."""
    train = training("bf16", n_batches, configs, vocab_size, max_tokens, pairs, out)
    decode = decoding(run_dir, per_bucket)
    return {"vocab_size": vocab_size, "max_tokens": max_tokens, "train": train, "decode": decode}


def training(
    precision: str = "bf16",
    n_batches: int = 3,
    configs: tuple[str, ...] = CONFIGS,
    vocab_size: int = 8000,
    max_tokens: int = 4096,
    pairs: int | None = None,
    out: Path = OUT,
) -> dict:
    """Target tokens/s of one `tf` update per config, on the corpus under one budget."""
    cpu = torch.device("cpu")
    configure_device(cpu)
    dtype = torch.bfloat16 if precision == "bf16" else None
    # One vocabulary and one batch budget for all: the same batches, only the model grows.
    sets = [f"data.vocab_size={vocab_size}", f"train.max_tokens={max_tokens}"]
    results = {}
    for name in configs:
        config = load_config(name, sets)
        tokenizer, batches = corpus_batches(config, n_batches, pairs=pairs, out=out)
        step = build("tf", config, tokenizer, cpu)
        time_pass(step, batches[:1], dtype, cpu)  # warm-up
        seconds = time_pass(step, batches, dtype, cpu)
        results[name] = sum(b.n_tgt_tokens for b in batches) / seconds
    return results


def decoding(run_dir: Path, per_bucket: int = 40) -> dict:
    """Milliseconds per sentence of greedy and beam 5, by source-length bucket."""
    model, tokenizer, config = load_for_inference(run_dir, torch.device("cpu"))
    ids = encode_sources(tokenizer, source_sentences(1000), model.config.max_positions, "", 1)
    results = {}
    for low, high in LENGTHS:
        bucket = [s for s in ids if low <= len(s) <= high][:per_bucket]
        if not bucket:
            continue
        for name, beam in (("greedy", 1), ("beam5", 5)):
            decode = replace(config.decode, beam_size=beam, nbest=1)
            started = time.perf_counter()
            hyps = translate_ids(model, tokenizer, bucket, decode, torch.device("cpu"))
            seconds = time.perf_counter() - started
            row = results.setdefault(f"{low}-{high}", {"sentences": len(bucket)})
            row[f"{name}_ms"] = seconds / len(bucket) * 1000
            row[f"{name}_out_tokens"] = sum(len(h[0].tokens) + 1 for h in hyps) / len(bucket)
    return results


def print_results(r: dict) -> None:
    train = r["train"]
    first = next(iter(train))  # the smallest config: the others are measured against it
    vocab = f"{r['vocab_size'] / 1000:g}k" if r["vocab_size"] >= 1000 else r["vocab_size"]
    rows = [
        (
            f"config ({vocab} vocab)",
            f"target tokens/s (bf16, {r['max_tokens']}-token batches)",
            f"vs {first}",
        )
    ]
    rows += [(n, f"{v:,.0f}", f"{v / train[first]:.2f}x") for n, v in train.items()]
    print_table(rows)
    print()
    rows = [("source pieces", "sentences", "greedy ms/sent", "beam 5 ms/sent", "output tokens")]
    for bucket, b in r["decode"].items():
        rows.append(
            (
                bucket,
                b["sentences"],
                f"{b['greedy_ms']:.1f}",
                f"{b['beam5_ms']:.1f}",
                f"{b['greedy_out_tokens']:.0f}",
            )
        )
    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    args = parser.parse_args()
    print_results(run(args.run or default_run()))
