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

from benchmarks.common import corpus_batches, print_table
from benchmarks.decode_bench import default_run, source_sentences
from benchmarks.train_bench import build, time_pass
from cli.config import load_config
from cli.device import configure_device
from cli.inference.decoding import encode_sources, translate_ids
from cli.training.checkpoint import load_for_inference

CONFIGS = ("tiny", "small", "base")
LENGTHS = ((1, 15), (16, 30), (31, 45), (46, 60), (61, 120))  # source pieces, inclusive


def training(precision: str = "bf16", n_batches: int = 3) -> dict:
    """Target tokens/s of one `tf` update per config, on the corpus under its own budget."""
    cpu = torch.device("cpu")
    configure_device(cpu)
    dtype = torch.bfloat16 if precision == "bf16" else None
    results = {}
    for name in CONFIGS:
        # One vocabulary and one batch budget for all: the same batches, only the model grows.
        config = load_config(name, ["data.vocab_size=8000", "train.max_tokens=4096"])
        tokenizer, batches = corpus_batches(config, n_batches)
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
            start = time.perf_counter()
            hyps = translate_ids(model, tokenizer, bucket, decode, torch.device("cpu"))
            seconds = time.perf_counter() - start
            row = results.setdefault(f"{low}-{high}", {"sentences": len(bucket)})
            row[f"{name}_ms"] = seconds / len(bucket) * 1000
            row[f"{name}_out_tokens"] = sum(len(h[0].tokens) + 1 for h in hyps) / len(bucket)
    return results


def print_results(train: dict, decode: dict) -> None:
    rows = [("config (8k vocab)", "target tokens/s (bf16, 4096-token batches)", "vs tiny")]
    rows += [(n, f"{v:,.0f}", f"{v / train['tiny']:.2f}x") for n, v in train.items()]
    print_table(rows)
    print()
    rows = [("source pieces", "sentences", "greedy ms/sent", "beam 5 ms/sent", "output tokens")]
    for bucket, r in decode.items():
        rows.append(
            (
                bucket,
                r["sentences"],
                f"{r['greedy_ms']:.1f}",
                f"{r['beam5_ms']:.1f}",
                f"{r['greedy_out_tokens']:.0f}",
            )
        )
    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    args = parser.parse_args()
    print_results(training(), decoding(args.run or default_run()))
