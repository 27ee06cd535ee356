"""What the benchmarks share: the corpus, a cached tokenizer, real batches, a table printer."""

from __future__ import annotations

from pathlib import Path

from data.batching import Batch, BatchIterator
from data.corpus import encode_corpus, load_corpus, token_ids
from data.tokenizer import Tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"  # git-ignored: tokenizers, trained models, JSON results
SHARED = ROOT.parent / "shared" / "corpora" / "bible-es-en"


def corpus_spec(split: str) -> str:
    """The shared copy of the corpus when it is beside the checkout, else the bundled one."""
    if (SHARED / f"{split}.es").exists() or (SHARED / f"{split}.es.gz").exists():
        return str(SHARED / split)
    return f"bundled:bible-es-en/{split}"


def bench_tokenizer(vocab_size: int) -> Tokenizer:
    """A joint BPE tokenizer of the training corpus, trained once and kept in bench-out/."""
    directory = OUT / f"tokenizer-{vocab_size}"
    if (directory / "joint.model").exists():
        return Tokenizer.load(directory)
    corpus = load_corpus(corpus_spec("train"), "es", "en")
    return train_tokenizer(corpus["src"], corpus["tgt"], directory, vocab_size=vocab_size, seed=0)


def corpus_batches(config, n_batches: int, seed: int = 0) -> tuple[Tokenizer, list[Batch]]:
    """The first `n_batches` training batches of the corpus under `config`'s token budget."""
    tokenizer = bench_tokenizer(config.data.vocab_size)
    encoded = encode_corpus(load_corpus(corpus_spec("train"), "es", "en"), tokenizer)
    iterator = BatchIterator(
        token_ids(encoded, "src_ids"),
        token_ids(encoded, "tgt_ids"),
        max_tokens=config.train.max_tokens,
        max_sentences=config.train.max_sentences,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        seed=seed,
    )
    batches = []
    for batch in iterator:
        batches.append(batch)
        if len(batches) == n_batches:
            break
    return tokenizer, batches


def print_table(rows: list[tuple]) -> None:
    """Rows of cells, the first the header, as aligned columns."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
        if n == 0:
            print("  ".join("-" * w for w in widths))
