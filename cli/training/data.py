"""The corpora a training run reads: the training pairs encoded, filtered and batched by the
token budget (this rank's share), the dev pairs for loss, and a dev subset decoded for BLEU."""

from __future__ import annotations

from dataclasses import dataclass

from cli.config import Config
from cli.training import distributed
from data.batching import Batch, BatchIterator
from data.corpus import encode_corpus, filter_pairs, load_corpus, token_ids
from data.tokenizer import Tokenizer


@dataclass
class Data:
    train: BatchIterator
    dev_batches: list[Batch]
    dev_src_ids: list[list[int]]  # the subset decoded for BLEU
    dev_refs: list[str]
    counts: dict[str, int]


def prepare_data(config: Config, tokenizer: Tokenizer, train_corpus, dd: distributed.Dist) -> Data:
    """Encode (cached by `datasets`) and filter the corpora; batch them by the token budget."""
    d, t = config.data, config.train
    encoded, counts = filter_pairs(
        encode_corpus(train_corpus, tokenizer),
        max_len=d.max_len,
        max_len_ratio=d.max_len_ratio,
        name=d.train,
    )
    special = dict(pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    train = BatchIterator(
        token_ids(encoded, "src_ids"),
        token_ids(encoded, "tgt_ids"),
        max_tokens=t.max_tokens,
        max_sentences=t.max_sentences,
        seed=t.seed,
        rank=dd.rank,
        world_size=dd.world_size,
        **special,
    )
    # Dev loss over the pairs the model can take; BLEU on the raw first sentences, as `tf eval`.
    limit = config.model.max_positions
    dev = load_corpus(d.dev, d.src_lang, d.tgt_lang)
    dev_encoded = encode_corpus(dev, tokenizer)
    dev_fit, _ = filter_pairs(dev_encoded, max_len=limit - 1, name=d.dev)
    dev_batches = BatchIterator(
        token_ids(dev_fit, "src_ids"),
        token_ids(dev_fit, "tgt_ids"),
        max_tokens=t.max_tokens,
        max_sentences=t.max_sentences,
        seed=t.seed,  # unused: no shuffling
        shuffle=False,
        **special,
    )
    n = min(t.eval_bleu_sentences or len(dev), len(dev))
    src_ids = [ids[:limit] for ids in dev_encoded.select(range(n))["src_ids"]]
    return Data(train, list(dev_batches), src_ids, list(dev.select(range(n))["tgt"]), counts)
