"""The corpora a training run reads: the training corpora (one, or a mix with weights and tags)
cleaned, encoded and batched by the token budget (this rank's share), the dev pairs for loss,
and a dev subset decoded for BLEU."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import datasets
from tqdm import tqdm

from cli.config import Config
from cli.training import distributed
from data.batching import Batch, BatchIterator, RaggedConcat
from data.clean import Reference
from data.corpus import encode_corpus, filter_pairs, load_corpus, token_ids
from data.prepared import Filters, prepare_corpus
from data.tokenizer import Tokenizer


@dataclass
class Data:
    train: BatchIterator
    dev_batches: list[Batch]
    dev_src_ids: list[list[int]]  # the subset decoded for BLEU
    dev_refs: list[str]
    report: dict  # RUN/data.json: what each training corpus gave


def load_training_corpora(config: Config) -> list[datasets.Dataset]:
    """Each corpus of `data.train`, read (and cached as Arrow) through `datasets`."""
    d = config.data
    if sys.stderr.isatty():  # reading a large corpus takes a while: show it
        datasets.enable_progress_bars()
    try:
        return [load_corpus(c.corpus, d.src_lang, d.tgt_lang) for c in d.corpora()]
    finally:
        datasets.disable_progress_bars()


def joined(corpora: list[datasets.Dataset]) -> datasets.Dataset:
    """All the training pairs as one dataset (no copy), e.g. for the tokenizer; a single corpus
    is itself, so its fingerprint and its tokenizer settings stay what they were."""
    return corpora[0] if len(corpora) == 1 else datasets.concatenate_datasets(corpora)


def progress_bar(stage: str, total: int) -> tqdm:
    """A bar for one stage of preparing a corpus (shown on a terminal only)."""
    return tqdm(total=total, desc=stage, unit=" pairs", unit_scale=True, leave=False, disable=None)


def prepare_data(
    config: Config, tokenizer: Tokenizer, corpora: list[datasets.Dataset], dd: distributed.Dist
) -> Data:
    """Clean, encode and filter the training corpora (cached as memory-mapped ids) and batch
    their mix by the token budget; the dev set for loss and BLEU."""
    d, t = config.data, config.train
    dev = load_corpus(d.dev, d.src_lang, d.tgt_lang)
    reference = None
    if d.clean:  # no training pair may sit in the sets the run is scored on
        reference = Reference.of([dev, load_corpus(d.test, d.src_lang, d.tgt_lang)])
    parts, report = [], []
    for spec, ds in zip(d.corpora(), corpora):
        filters = Filters(d.clean, d.max_len, d.max_len_ratio, spec.tag or None)
        prepared = prepare_corpus(ds, tokenizer, filters, reference, spec.corpus, progress_bar)
        parts.append(prepared)
        report.append(corpus_report(spec, prepared.counts))
    special = dict(pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    src = parts[0].src if len(parts) == 1 else RaggedConcat([p.src for p in parts])
    tgt = parts[0].tgt if len(parts) == 1 else RaggedConcat([p.tgt for p in parts])
    train = BatchIterator(
        src,
        tgt,
        max_tokens=t.max_tokens,
        max_sentences=t.max_sentences,
        seed=t.seed,
        rank=dd.rank,
        world_size=dd.world_size,
        corpora=[(p.counts["kept"], spec.weight) for p, spec in zip(parts, d.corpora())],
        **special,
    )
    dev_batches, src_ids, refs = dev_sets(config, tokenizer, dev)
    return Data(train, dev_batches, src_ids, refs, {"corpora": report})


def corpus_report(spec, counts: dict) -> dict:
    """One corpus's entry of RUN/data.json: read, removed by rule, kept, and its share."""
    whole, fraction = divmod(spec.weight, 1.0)
    kept = counts["kept"]
    return {
        "spec": spec.corpus,
        "read": counts["read"],
        "removed": counts["removed"],
        "kept": kept,
        "weight": spec.weight,
        "per_epoch": int(whole) * kept + round(fraction * kept),
        "tag": spec.tag or None,
    }


def dev_sets(config: Config, tokenizer: Tokenizer, dev: datasets.Dataset):
    """Dev batches for the loss (the pairs the model can take) and the first sentences, raw, for
    BLEU as `tf eval` computes it."""
    t, limit = config.train, config.model.max_positions
    dev_encoded = encode_corpus(dev, tokenizer)
    dev_fit, _ = filter_pairs(dev_encoded, max_len=limit - 1, name=config.data.dev)
    dev_batches = BatchIterator(
        token_ids(dev_fit, "src_ids"),
        token_ids(dev_fit, "tgt_ids"),
        max_tokens=t.max_tokens,
        max_sentences=t.max_sentences,
        seed=t.seed,  # unused: no shuffling
        shuffle=False,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
    )
    n = min(t.eval_bleu_sentences or len(dev), len(dev))
    src_ids = [ids[:limit] for ids in dev_encoded.select(range(n))["src_ids"]]
    return list(dev_batches), src_ids, list(dev.select(range(n))["tgt"])
