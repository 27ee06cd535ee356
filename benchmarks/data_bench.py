"""Data pipeline speed and batch quality on the bundled 28k-pair corpus.

Measures: loading, training a joint BPE tokenizer of 8,000 pieces, encoding (cold and from
the `datasets` cache), planning and collating one epoch of batches, and padding efficiency
(real tokens / padded tokens, both sides, BOS/EOS counted) at max_tokens 4096.

    python -m benchmarks.data_bench
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import datasets
import numpy as np

from data.batching import BatchIterator
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

    started = time.perf_counter()
    iterator = BatchIterator(
        token_ids(encoded, "src_ids"),
        token_ids(encoded, "tgt_ids"),
        max_tokens=max_tokens,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        seed=0,
    )
    n_batches = len(iterator)  # plans the epoch
    plan_s = time.perf_counter() - started

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
    }


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
        ("padding efficiency", f"{results['padding_efficiency']:.3f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'data pipeline':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    datasets.disable_progress_bars()
    print_results(run())
