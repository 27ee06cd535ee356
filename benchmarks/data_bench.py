"""Data pipeline speed and batch quality on the bundled 28k-pair corpus.

Measures: loading, training a joint BPE tokenizer of 8,000 pieces, encoding (cold and from
the `datasets` cache), planning and collating one epoch of batches, and padding efficiency
(real tokens / padded tokens, both sides, BOS/EOS counted) at max_tokens 4096; and the
distinct batch shapes (B, S, T) over three epochs with `data.pad_multiple` 1 (each side to
its longest sentence) and at its default, with the padding share of each.

    python -m benchmarks.data_bench
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import datasets
import numpy as np

from data.batching import BatchIterator
from data.config import DataConfig
from data.corpus import encode_corpus, load_corpus, token_ids
from data.tokenizer import train_tokenizer

SPEC = "bundled:bible-es-en/train"
VOCAB_SIZE = 8000
MAX_TOKENS = 4096


def run(
    spec: str = SPEC,
    vocab_size: int = VOCAB_SIZE,
    max_tokens: int = MAX_TOKENS,
    pairs: int | None = None,
) -> dict:
    """Run the measurements on the corpus `spec` (or its first `pairs` pairs) and return them.

    A private `datasets` cache makes every step start cold, whatever ran before.
    """
    saved_cache = datasets.config.HF_DATASETS_CACHE
    with tempfile.TemporaryDirectory(prefix="tf-data-bench-") as tmp:
        datasets.config.HF_DATASETS_CACHE = Path(tmp) / "hf"
        try:
            return _measure(spec, vocab_size, max_tokens, pairs, Path(tmp) / "tokenizer")
        finally:
            datasets.config.HF_DATASETS_CACHE = saved_cache


def _measure(
    spec: str, vocab_size: int, max_tokens: int, pairs: int | None, tokenizer_dir: Path
) -> dict:
    started = time.perf_counter()
    ds = load_corpus(spec, "es", "en")
    if pairs is not None:
        ds = ds.select(range(min(pairs, len(ds))))
    load_s = time.perf_counter() - started

    started = time.perf_counter()
    tokenizer = train_tokenizer(ds["src"], ds["tgt"], tokenizer_dir, vocab_size=vocab_size, seed=0)
    train_s = time.perf_counter() - started

    started = time.perf_counter()
    encoded = encode_corpus(ds, tokenizer)
    encode_s = time.perf_counter() - started
    started = time.perf_counter()
    encoded = encode_corpus(ds, tokenizer)  # same corpus, same model: read from the cache
    encode_cached_s = time.perf_counter() - started

    def batches(pad_multiple: int) -> BatchIterator:
        return BatchIterator(
            token_ids(encoded, "src_ids"),
            token_ids(encoded, "tgt_ids"),
            max_tokens=max_tokens,
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            seed=0,
            pad_multiple=pad_multiple,
        )

    started = time.perf_counter()
    iterator = batches(DataConfig.pad_multiple)
    n_batches = len(iterator)  # plans the epoch
    plan_s = time.perf_counter() - started
    shapes = {m: epoch_shapes(batches(m), 3) for m in sorted({1, DataConfig.pad_multiple})}

    started = time.perf_counter()
    real = padded = sentences = 0
    for batch in iterator:
        real += batch.n_src_tokens + batch.n_tgt_tokens
        padded += batch.src.numel() + batch.tgt_in.numel()
        sentences += batch.src.shape[0]
    epoch_s = time.perf_counter() - started

    return {
        "pairs": len(ds),
        "load_s": load_s,
        "tokenizer_train_s": train_s,
        "vocab_size": tokenizer.src_vocab_size,
        "encode_s": encode_s,
        "encode_cached_s": encode_cached_s,
        "mean_src_tokens": float(np.mean(token_ids(encoded, "src_ids").lengths())),
        "mean_tgt_tokens": float(np.mean(token_ids(encoded, "tgt_ids").lengths())),
        "batch_plan_s": plan_s,
        "epoch_collate_s": epoch_s,
        "batches": n_batches,
        "sentences_per_batch": sentences / n_batches,
        "max_tokens": max_tokens,
        "padding_efficiency": real / padded,
        "pad_multiple": DataConfig.pad_multiple,
        "shapes_3_epochs": {str(m): r for m, r in shapes.items()},
    }


def epoch_shapes(iterator: BatchIterator, epochs: int) -> dict:
    """Distinct batch shapes (sentences, source width, target width) over `epochs` epochs,
    and the share of padding in them (both sides, BOS/EOS counted as real)."""
    shapes, real, padded, n = set(), 0, 0, 0
    for _ in range(epochs):
        for batch in iterator:
            shapes.add((*batch.src.shape, batch.tgt_in.shape[1]))
            real += batch.n_src_tokens + batch.n_tgt_tokens
            padded += batch.src.numel() + batch.tgt_in.numel()
            n += 1
    return {"batches": n, "distinct_shapes": len(shapes), "padding_share": 1 - real / padded}


def print_results(results: dict) -> None:
    rows = [
        ("corpus pairs", f"{results['pairs']:,}"),
        ("load (datasets, cold)", f"{results['load_s']:.2f} s"),
        (f"train joint BPE {results['vocab_size']}", f"{results['tokenizer_train_s']:.2f} s"),
        ("encode (cold)", f"{results['encode_s']:.2f} s"),
        ("encode (cached)", f"{results['encode_cached_s']:.3f} s"),
        (
            "mean src / tgt pieces",
            f"{results['mean_src_tokens']:.1f} / {results['mean_tgt_tokens']:.1f}",
        ),
        ("load ids + plan epoch", f"{results['batch_plan_s']:.3f} s"),
        ("collate one epoch", f"{results['epoch_collate_s']:.3f} s"),
        (f"batches at max_tokens {results['max_tokens']}", f"{results['batches']}"),
        ("sentences per batch", f"{results['sentences_per_batch']:.1f}"),
        (
            f"padding efficiency (pad_multiple {results['pad_multiple']})",
            f"{results['padding_efficiency']:.3f}",
        ),
    ]
    for m, r in results["shapes_3_epochs"].items():
        rows.append(
            (
                f"pad_multiple {m}: shapes in 3 epochs",
                f"{r['distinct_shapes']} of {r['batches']} batches, "
                f"{100 * r['padding_share']:.1f}% padding",
            )
        )
    width = max(len(name) for name, _ in rows)
    print(f"{'data pipeline':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    datasets.disable_progress_bars()
    print_results(run())
