"""What the benchmarks share: the corpus, a cached tokenizer, real batches, a table printer."""

from __future__ import annotations

import os
import subprocess
import sys
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


def corpus_head(split: str, pairs: int | None = None, out: Path = OUT) -> str:
    """The split, or its first `pairs` pairs as files written once under `out`: a spec that
    `load_corpus` and `tf train` both read, so a small run stays small end to end."""
    if pairs is None:
        return corpus_spec(split)
    prefix = out / f"corpus-{split}-{pairs}" / split
    if not Path(f"{prefix}.en").exists():  # written last: its presence means both are whole
        head = load_corpus(corpus_spec(split), "es", "en").select(range(pairs))
        prefix.parent.mkdir(parents=True, exist_ok=True)
        for lang, column in (("es", "src"), ("en", "tgt")):
            text = "".join(f"{line}\n" for line in head[column])
            Path(f"{prefix}.{lang}").write_text(text, encoding="utf-8")
    return str(prefix)


def bench_tokenizer(vocab_size: int, pairs: int | None = None, out: Path = OUT) -> Tokenizer:
    """A joint BPE tokenizer of the training corpus (or its first `pairs` pairs), trained once
    and kept in `out`."""
    name = f"tokenizer-{vocab_size}" + ("" if pairs is None else f"-of-{pairs}-pairs")
    directory = out / name
    if (directory / "joint.model").exists():
        return Tokenizer.load(directory)
    corpus = load_corpus(corpus_head("train", pairs, out), "es", "en")
    return train_tokenizer(corpus["src"], corpus["tgt"], directory, vocab_size=vocab_size, seed=0)


def corpus_batches(
    config, n_batches: int, seed: int = 0, pairs: int | None = None, out: Path = OUT
) -> tuple[Tokenizer, list[Batch]]:
    """The first `n_batches` training batches of the corpus (or of its first `pairs` pairs)
    under `config`'s token budget."""
    tokenizer = bench_tokenizer(config.data.vocab_size, pairs, out)
    encoded = encode_corpus(load_corpus(corpus_head("train", pairs, out), "es", "en"), tokenizer)
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


def run_python(*args: str) -> str:
    """Run `python ARGS` in the checkout, as a user would; its stdout, or its stderr's tail in
    the error (a failing child is otherwise just an exit status)."""
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def print_table(rows: list[tuple]) -> None:
    """Rows of cells, the first the header, as aligned columns."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def cpu_name() -> str:
    """The CPU as `lscpu` names it, with the flags that decide its precision: every benchmark
    figure depends on them (bf16 runs natively only with avx512_bf16 or amx_bf16; int8 products
    fastest with VNNI, `model/int8.py`)."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        return model
    precisions = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni")
    named = [f for f in precisions if f in flags]
    return f"{model} ({', '.join(named) or 'no avx2'})"


def stolen_seconds(stat: Path = Path("/proc/stat")) -> float:
    """CPU time the hypervisor has given to other guests so far, summed over this machine's
    CPUs: /proc/stat's steal column (0 where there is none). On shared virtual machines a
    neighbour's load took a third of the wall time of some `tf translate` runs of the test
    set, and doubled CTranslate2's, where nothing else ran in the guest; the engines benchmark
    reports it beside its figures and runs a disturbed search again."""
    try:
        with stat.open() as lines:
            fields = lines.readline().split()  # cpu user nice system idle iowait irq softirq steal
    except OSError:
        return 0.0
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return 0.0
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def steal_share(stolen: float, seconds: float) -> float:
    """The share of all CPUs' time over `seconds` of wall time that `stolen` seconds were."""
    return stolen / (seconds * (os.cpu_count() or 1)) if seconds > 0 else 0.0
