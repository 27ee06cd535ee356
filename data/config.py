"""What a training run reads: its corpora, their cleaning and its tokenizer, as one typed section
(`data` in a config file), as `ModelConfig` in `model/` describes the network. The loader in
`cli/config.py` builds and type-checks it; `check_data` holds the rules of its values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from data.errors import InputError


@dataclass
class CorpusConfig:
    """One training corpus of a mix (`data.train` as a list)."""

    corpus: str  # any spec: PREFIX, .tsv, .jsonl, hf:NAME[:CFG][@SPLIT], bundled:NAME/SPLIT
    weight: float = 1.0  # its pairs are seen `weight` times per epoch (a fraction: a subset)
    tag: str = ""  # a reserved piece put before every source sentence of it, e.g. "<bt>"


@dataclass
class DataConfig:
    # A corpus spec (PREFIX, .tsv, .jsonl, hf:NAME[:CFG][@SPLIT], bundled:NAME/SPLIT), or a list
    # of corpora with weights and tags: [{corpus: SPEC, weight: 4, tag: "<bt>"}, ...].
    train: str | list[CorpusConfig] = "bundled:bible-es-en/train"
    # Temperature sampling between corpora (Arivazhagan et al., 2019): corpus i makes a share of
    # each epoch proportional to (weight_i x pairs_i) ** (1 / T), the epoch keeping its size
    # (the sum of weight x pairs). 1: the weights as given; above 1 small corpora gain (5 is
    # the paper's choice for many languages); RUN/data.json gives each corpus's share.
    temperature: float = 1.0
    dev: str = "bundled:bible-es-en/dev"
    test: str = "bundled:bible-es-en/test"
    src_lang: str = "es"
    tgt_lang: str = "en"
    # The SentencePiece model a run trains (unless `tokenizer` names one to use).
    vocab_size: int = 8000
    tokenizer_type: Literal["bpe", "unigram"] = "bpe"
    joint_vocab: bool = True  # one SentencePiece model for both sides (needed for full tying)
    character_coverage: float = 1.0
    max_len: int = 256  # pairs with a side longer than this many pieces are dropped
    max_len_ratio: float = 3.0  # pairs whose longer side is over this times the other's are dropped
    # Training batches pad both sides to one width, a multiple of this, and hold a multiple of 8
    # sentences, so that a run sees few shapes (a kernel and its memory are kept per shape on
    # CPUs; see data/batching.py). 1: each side to its longest sentence, any count (no rounding).
    pad_multiple: int = 2
    # Drop duplicate pairs, untranslated copies, pairs of the dev or test set, and junk (no
    # letters, mostly digits, punctuation or URLs): see data/clean.py. Counts go to RUN/data.json.
    clean: bool = True
    # A tokenizer folder to use instead of training one: a run's RUN/tokenizer (a distilled
    # student uses its teacher's) or an imported model's (`tf import`: Marian's SentencePiece
    # models and vocabulary). The vocabulary settings above then do not apply.
    tokenizer: str = ""

    def corpora(self) -> list[CorpusConfig]:
        """`train` as a list: a single spec is one corpus of weight 1, untagged."""
        return [CorpusConfig(self.train)] if isinstance(self.train, str) else list(self.train)

    def tags(self) -> list[str]:
        """The tags of the training corpora, each once, in order (the tokenizer reserves them)."""
        return list(dict.fromkeys(c.tag for c in self.corpora() if c.tag))


def check_trainable(d: DataConfig) -> None:
    """A run that trains (or trains a tokenizer) needs a corpus; a config that describes a
    model alone (an imported one's: `data.train: []`) has none.

    Raises:
        InputError: data.train names no corpus.
    """
    if not d.corpora():
        raise InputError("data.train is an empty list: name at least one corpus to train on")


# Pieces that mean something to some tokenizer: never a corpus tag.
SPECIAL_PIECES = ("<s>", "</s>", "<pad>", "<unk>", "<mask>", "<cls>", "<sep>", "<bos>", "<eos>")
_TAG = re.compile(r"<[^\s<>]+>|>>[^\s<>]+<<")


def is_tag(tag: str) -> bool:
    """A tag must be a piece that cannot pass for text: "<bt>", or a Marian model's ">>fra<<"
    (a word like "Y" would make every sentence that starts with it look tagged). That no
    corpus holds it is checked on the text (`data.pipeline.check_tags`)."""
    return bool(_TAG.fullmatch(tag)) and tag not in SPECIAL_PIECES


def corpus_name(d: DataConfig, i: int) -> str:
    """How messages name corpus i of `data.train`."""
    return "data.train" if isinstance(d.train, str) else f"data.train[{i}]"


# The settings that shape a trained SentencePiece model: they cannot apply to a tokenizer that
# is adopted (`data.tokenizer`) or comes with a checkpoint (`train.init`).
VOCABULARY_SETTINGS = ("vocab_size", "tokenizer_type", "character_coverage")


def check_data(d: DataConfig, fail: Callable[[str], None]) -> None:
    """The rules of the `data` section's values; `fail` gets a one-line problem."""
    if d.vocab_size < 8:  # the four special pieces and a few more
        fail(f"data.vocab_size must be 8 or more, got {d.vocab_size}")
    if not 0 < d.character_coverage <= 1:
        fail(f"data.character_coverage must be in (0, 1], got {d.character_coverage}")
    for i, c in enumerate(d.corpora()):
        where = corpus_name(d, i)
        if not c.corpus.strip():
            fail(f"{where}: no corpus spec")
        if not (c.weight > 0 and math.isfinite(c.weight)):
            fail(f"{where}.weight must be a positive number, got {c.weight}")
        if c.tag and not is_tag(c.tag):
            fail(
                f"{where}.tag {c.tag!r}: a tag is a piece no text holds, written <name> (or "
                ">>name<<, a Marian model's target-language token), and not one of "
                f"{', '.join(SPECIAL_PIECES)}"
            )
    if not (d.temperature > 0 and math.isfinite(d.temperature)):
        fail(f"data.temperature must be a positive number, got {d.temperature}")
    if d.pad_multiple < 1:
        fail(f"data.pad_multiple must be 1 or more, got {d.pad_multiple}")
    if d.max_len_ratio < 1:
        fail(f"data.max_len_ratio must be 1 or more, got {d.max_len_ratio}")
