"""What a training run reads: its corpora, their cleaning and its tokenizer, as one typed section
(`data` in a config file), as `ModelConfig` in `model/` describes the network. The loader in
`cli/config.py` builds and type-checks it, each number against the range its field declares
(`ranged(1.0, "(0, inf)")`: `data.ranges`); `check_data` holds the rules between its values.
A setting that names files or folders (a corpus spec, a tokenizer folder) says so in its
field, `metadata={"path": True}`: a run records each such place absolute, and an export by its
name alone, wherever it sits in the schema (`cli.config.with_paths`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from data.errors import InputError
from data.ranges import ranged


@dataclass
class SetConfig:
    """A parallel corpus read in one direction: a dev or test set of a list (`data.dev`)."""

    # Any spec: PREFIX, .tsv, .jsonl, hf:NAME[:CFG][@SPLIT], bundled:NAME/SPLIT.
    corpus: str = field(metadata={"path": True})
    # Its languages as its files name them (suffixes, TSV header, JSON keys); "": data.*'s.
    src_lang: str = ""
    tgt_lang: str = ""
    reverse: bool = False  # read it the other way round: tgt_lang -> src_lang
    # A reserved piece put before every source sentence of it, e.g. "<bt>" (a dev set's: one
    # of the training corpora's, so that a tagged domain is validated as it trains).
    tag: str = ""


@dataclass
class CorpusConfig(SetConfig):
    """One training corpus of a mix (`data.train` as a list)."""

    # Its pairs are seen `weight` times per epoch (a fraction: a subset).
    weight: float = ranged(1.0, "(0, inf)", says="a positive number")


@dataclass
class NewLanguage:
    """A language `tf train --init` adds to its model (`data.new_languages`): its token, the
    next id of the tokenizer, and a new embedding row, the copy of `init`'s."""

    lang: str  # as the corpora name it (src_lang/tgt_lang): xyz_Latn, its token the model's form
    # Where its row starts: "mean" (of the model's language tokens' rows; of all its rows where
    # it has none, a one-way model), or a language of the model whose row it copies (a
    # related one: fra_Latn for a Romance language).
    init: str = "mean"


@dataclass
class DataConfig:
    # A corpus spec (PREFIX, .tsv, .jsonl, hf:NAME[:CFG][@SPLIT], bundled:NAME/SPLIT), or a list
    # of corpora with weights and tags: [{corpus: SPEC, weight: 4, tag: "<bt>"}, ...].
    train: str | list[CorpusConfig] = field(
        default="bundled:bible-es-en/train", metadata={"path": True}
    )
    # Temperature sampling between corpora (Arivazhagan et al., 2019): corpus i makes a share of
    # each epoch proportional to (weight_i x pairs_i) ** (1 / T), the epoch keeping its size
    # (the sum of weight x pairs). 1: the weights as given; above 1 small corpora gain (5 is
    # the paper's choice for many languages); RUN/data.json gives each corpus's share.
    temperature: float = ranged(1.0, "(0, inf)")
    # A corpus spec read as src_lang -> tgt_lang, or a list of sets with their directions,
    # [{corpus: SPEC}, {corpus: SPEC, reverse: true}]: each direction is validated on its own.
    # A set of a direction the model translates but no corpus trains (fine-tuning a
    # multilingual model on one direction) is watched: see `watched_directions`.
    dev: str | list[SetConfig] = field(default="bundled:bible-es-en/dev", metadata={"path": True})
    # The test sets: cleaning keeps their pairs out of training, either way round. "": none.
    test: str | list[SetConfig] = field(default="bundled:bible-es-en/test", metadata={"path": True})
    # The languages of a corpus that names none (its own `src_lang`/`tgt_lang` win). What a run
    # translates comes from its corpora (`translates`), not from these.
    src_lang: str = "es"
    tgt_lang: str = "en"
    # The directions the model translates besides its training corpora's, "SRC->TGT" each:
    # `tf train --init` records those of the model it starts from (a multilingual model
    # fine-tuned on one direction keeps the others, and their tokens), `tf import` the imported
    # model's. Empty: its corpora's alone.
    directions: list[str] = field(default_factory=list)
    # The languages a many-to-many model reads and writes, any into any, besides its
    # directions: an imported NLLB-200's 202 codes (`tf import` records them). Empty: none.
    languages: list[str] = field(default_factory=list)
    # A language's token: this with {lang} filled in ("<2en>"; ">>{lang}<<" gives OPUS-MT's
    # ">>en<<"; an imported model's own codes: "{lang}" for NLLB's fra_Latn, "__{lang}__" for
    # M2M100's __fr__), one reserved piece per language.
    lang_token: str = "<2{lang}>"
    # Where the token of the language to write goes. "source": first in the source, in a run
    # with more than one target language (Johnson et al., 2017; OPUS-MT). "target": the source
    # starts with its own language's token and the decoder's first token after its start is
    # the target language's, forced (NLLB-200, M2M100, mBART-50: `forced_bos_token_id`), in
    # every run.
    lang_token_side: Literal["source", "target"] = "source"
    # The SentencePiece model a run trains (unless `tokenizer` names one to use): its size at
    # least the four special pieces and a few more.
    vocab_size: int = ranged(8000, "[8, inf)")
    tokenizer_type: Literal["bpe", "unigram"] = "bpe"
    joint_vocab: bool = True  # one SentencePiece model for both sides (needed for full tying)
    character_coverage: float = ranged(1.0, "(0, 1]")
    # Pairs with a side longer than this many pieces are dropped.
    max_len: int = ranged(256, "(0, inf)")
    # Pairs whose longer side is over this times the other's are dropped.
    max_len_ratio: float = ranged(3.0, "[1, inf)")
    # Training batches pad both sides to one width, a multiple of this, and hold a multiple of 8
    # sentences, so that a run sees few shapes (a kernel and its memory are kept per shape on
    # CPUs; see data/batching.py). 1: each side to its longest sentence, any count (no rounding).
    pad_multiple: int = ranged(2, "[1, inf)")
    # Drop duplicate pairs, untranslated copies, pairs of the dev or test set, and junk (no
    # letters, mostly digits, punctuation or URLs): see data/clean.py. Counts go to RUN/data.json.
    clean: bool = True
    # A tokenizer folder to use instead of training one: a run's RUN/tokenizer (a distilled
    # student uses its teacher's) or an imported model's (`tf import`: Marian's SentencePiece
    # models and vocabulary). The vocabulary settings above then do not apply.
    tokenizer: str = field(default="", metadata={"path": True})
    # Languages a fine-tuned model lacks, added to it (`tf train --init`): each one's token
    # joins the run's copy of the tokenizer and a row the embeddings, started from a named
    # language's row or the mean: [{lang: xyz_Latn, init: fra_Latn}]. Every id there was keeps
    # its id and its row. A one-way model given a second target gains its old target's token
    # too, recorded here first (`tf train --init` adds it).
    new_languages: list[NewLanguage] = field(default_factory=list)

    def corpora(self) -> list[CorpusConfig]:
        """`train` as a list: a single spec is one corpus of weight 1, untagged."""
        return [CorpusConfig(self.train)] if isinstance(self.train, str) else list(self.train)

    def dev_sets(self) -> list[SetConfig]:
        """`dev` as a list; "" is none (a model alone's, imported: training needs one)."""
        if isinstance(self.dev, str):
            return [SetConfig(self.dev)] if self.dev else []
        return list(self.dev)

    def test_sets(self) -> list[SetConfig]:
        """`test` as a list; "" is none (a fine-tuning recipe's: the user's pairs decide)."""
        if isinstance(self.test, str):
            return [SetConfig(self.test)] if self.test else []
        return list(self.test)

    def watched_directions(self) -> list[tuple[str, str]]:
        """The dev sets' directions that no training corpus trains, each once, in order:
        watched, not followed. Each is validated and logged (`dev_bleu/SRC-TGT`, their mean
        `watched_bleu`), but `dev_bleu`, `dev_loss`, early stopping and best.pt follow the
        trained directions alone: a model fine-tuned on one direction forgets the others
        (fairseq #5025), which a user wants to see, not to pick a checkpoint by. None where no
        dev set is of a trained direction: the sets listed are then all a run can follow."""
        trained = {self.direction(c) for c in self.corpora()}
        ways = list(dict.fromkeys(self.direction(s) for s in self.dev_sets()))
        if not any(way in trained for way in ways):
            return []
        return [way for way in ways if way not in trained]

    def file_languages(self, s: SetConfig) -> tuple[str, str]:
        """The languages of `s`'s files: (source, target) before any reversing."""
        return s.src_lang or self.src_lang, s.tgt_lang or self.tgt_lang

    def direction(self, s: SetConfig) -> tuple[str, str]:
        """(source, target) language of the pairs `s` gives, reversed if it says so."""
        src, tgt = self.file_languages(s)
        return (tgt, src) if s.reverse else (src, tgt)

    def translates(self) -> list[tuple[str, str]]:
        """The (source, target) directions of the model, each once, in order: those recorded
        (`directions`), then its training corpora's; a model with neither (and no
        `languages`: imported before directions were recorded) data.src_lang ->
        data.tgt_lang. The one place every command learns what a run translates, with
        `languages` (a many-to-many model's: any into any)."""
        ways = [parse_direction(way) for way in self.directions]
        ways += [self.direction(c) for c in self.corpora()]
        if ways or self.languages:
            return list(dict.fromkeys(ways))
        return [(self.src_lang, self.tgt_lang)]

    def target_langs(self) -> list[str]:
        """The languages the model translates into, each once, in order."""
        return list(dict.fromkeys([*(tgt for _, tgt in self.translates()), *self.languages]))

    def source_langs(self) -> list[str]:
        """The languages the model reads, each once, in order."""
        return list(dict.fromkeys([*(src for src, _ in self.translates()), *self.languages]))

    def sources_into(self, target: str) -> list[str]:
        """The languages the model reads to write `target`: its training corpora's into it
        where it has any (a fine-tuned model's are the ones it was tuned on), else those of
        every direction into it, else (a many-to-many model's) all it reads."""
        trained = [self.direction(c)[0] for c in self.corpora() if self.direction(c)[1] == target]
        every = [src for src, tgt in self.translates() if tgt == target]
        into = trained or every or (self.languages if target in self.languages else [])
        return list(dict.fromkeys(into))

    def lang_tokens(self) -> dict[str, str]:
        """{language: its token} of the languages the model writes, where a token says which
        to write: a run with more than one target language, or (`lang_token_side: target`)
        every run; empty for a one-way run of source-side tokens, whose sources need none."""
        langs = self.target_langs()
        if self.lang_token_side == "source" and len(langs) < 2:
            return {}
        return {lang: lang_token(self.lang_token, lang) for lang in langs}

    def source_tokens(self) -> dict[str, str]:
        """{language: its token} of the languages the model reads, where the source says its
        own language (`lang_token_side: target`); else empty."""
        if self.lang_token_side == "source":
            return {}
        return {lang: lang_token(self.lang_token, lang) for lang in self.source_langs()}

    def source_prefix(self, s: SetConfig) -> list[str]:
        """The pieces put before each source of `s`: the token of its target language
        (`lang_token_side: source`, multilingual runs) or of its own, then its corpus tag."""
        src, tgt = self.direction(s)
        token = self.source_tokens().get(src) or (
            self.lang_tokens().get(tgt) if self.lang_token_side == "source" else None
        )
        return [t for t in (token, s.tag) if t]

    def target_prefix(self, s: SetConfig) -> list[str]:
        """The pieces each target of `s` starts with: its language's token where the decoder
        writes it first (`lang_token_side: target`); else none."""
        if self.lang_token_side == "source":
            return []
        return [self.lang_tokens()[self.direction(s)[1]]]

    def new_tokens(self) -> list[str]:
        """The tokens of `new_languages`, in the run's form (`lang_token`), in order."""
        return [lang_token(self.lang_token, n.lang) for n in self.new_languages]

    def tags(self) -> list[str]:
        """The reserved pieces, each once, in order (the tokenizer reserves them): the language
        tokens, then the training corpora's tags."""
        tokens = [*self.lang_tokens().values(), *self.source_tokens().values()]
        tags = [*tokens, *(c.tag for c in self.corpora() if c.tag)]
        return list(dict.fromkeys(tags))


def with_directions(d: DataConfig, tags: Iterable[str]) -> DataConfig:
    """`d` with what its model translates recorded (`directions`), as a run's config has it: a
    model imported before `tf import` recorded its directions names its target languages only
    by its tokenizer's `tags`, OPUS-MT's `>>xxx<<` pieces, read from its one source. (A run
    trained on corpora says what it translates into: its `>>bt<<`-style tags are no languages.)"""
    if d.corpora() or d.directions:
        return d
    langs = [m.group(1) for tag in tags if (m := _MARIAN_TOKEN.fullmatch(tag))]
    if len(langs) < 2:
        return d
    return replace(
        d, directions=[direction_of(d.src_lang, lang) for lang in langs], lang_token=">>{lang}<<"
    )


def parse_direction(way: str) -> tuple[str, str]:
    """Read "es->en" as ("es", "en"); ("", "") for what is no direction (`check_data` says
    so)."""
    src, arrow, tgt = way.partition("->")
    return (src.strip(), tgt.strip()) if arrow else ("", "")


def direction_of(src: str, tgt: str) -> str:
    """How `data.directions` writes a direction: "es->en"."""
    return f"{src}->{tgt}"


def lang_token(form: str, lang: str) -> str:
    return form.replace("{lang}", lang)


def direction_name(direction: tuple[str, str]) -> str:
    """How logs and metrics name a direction: "es-en"."""
    return "-".join(direction)


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
_MARIAN_TOKEN = re.compile(r">>([^\s<>]+)<<")  # OPUS-MT's target-language tokens: >>fra<<
_TAG = re.compile(r"<[^\s<>]+>|>>[^\s<>]+<<")
LANGUAGE_CODE = re.compile(r"[A-Za-z0-9_-]+")


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


def check_tags(d: DataConfig, fail: Callable[[str], None]) -> None:
    """A corpus tag is a piece no text holds, none of the special pieces, and none of the
    run's target-language tokens: those the run puts itself where a corpus's target language
    asks for one, and a corpus tagged with one as well would train on it twice. A dev or test
    set's tag is one of the training corpora's (a piece the tokenizer reserves)."""
    tokens = {token: lang for lang, token in {**d.source_tokens(), **d.lang_tokens()}.items()}
    trained = [c.tag for c in d.corpora() if c.tag]
    listed = [(corpus_name(d, i), c) for i, c in enumerate(d.corpora())]
    listed += [(f"data.dev[{i}]", s) for i, s in enumerate(d.dev_sets())]
    listed += [(f"data.test[{i}]", s) for i, s in enumerate(d.test_sets())]
    for where, s in listed:
        if not s.tag:
            continue
        if s.tag in tokens:
            fail(
                f"{where}.tag {s.tag!r} is the run's token for {tokens[s.tag]}, which it puts "
                "before every source translated into it: drop the tag, and name the "
                f"corpus's languages instead (tgt_lang: {tokens[s.tag]}, or reverse: true)"
            )
        if not is_tag(s.tag):
            fail(
                f"{where}.tag {s.tag!r}: a tag is a piece no text holds, written <name> or "
                f">>name<<, and not one of {', '.join(SPECIAL_PIECES)}"
            )
        if s.tag not in trained:
            fail(
                f"{where}.tag {s.tag!r} tags no training corpus ("
                f"{', '.join(trained) or 'none is tagged'}): a set's tag must be a piece the "
                "tokenizer reserves for one"
            )


def check_sets(d: DataConfig, fail: Callable[[str], None]) -> None:
    """Each dev and test set is of a direction the model translates, trained or not (a dev set
    of another is watched: `DataConfig.watched_directions`): into a language it writes, and,
    where its sources say their language (`lang_token_side: target`), from one it reads, a
    token of its own. (Where the target's token alone is put, any source is read, as a corpus
    of another source language is transfer.)"""
    writes, reads = d.target_langs(), d.source_langs()
    for name, sets in (("data.dev", d.dev_sets()), ("data.test", d.test_sets())):
        for i, s in enumerate(sets):
            src, tgt = d.direction(s)
            if tgt not in writes:
                fail(
                    f"{name}[{i}] translates into {tgt!r}, which the model does not (its "
                    f"corpora, data.directions and data.languages: into {few(writes, tgt)})"
                )
            if d.lang_token_side == "target" and src not in reads:
                fail(
                    f"{name}[{i}] reads {src!r}, which the model does not (its sources say "
                    f"their language: it reads {few(reads, src)})"
                )


def few(langs: list[str], lang: str) -> str:
    """The languages a model has, for a message about `lang`, which it lacks: a dozen at most,
    else their count and the three nearest to `lang` (NLLB has 202)."""
    if len(langs) <= 12:
        return ", ".join(langs)
    near = difflib.get_close_matches(lang, langs, n=3, cutoff=0.0)
    return f"{len(langs)} languages; nearest: {', '.join(near)}"


def check_data(d: DataConfig, fail: Callable[[str], None], model_known: bool = True) -> None:
    """The rules of the `data` section's values; `fail` gets a one-line problem.

    `model_known` False: a config with `train.init`, whose model translates directions its
    corpora do not; `with_init` records them (`directions`, `languages`), and the dev and test
    sets' directions are checked then."""
    # An imported model's own codes (NLLB's fra_Latn: "{lang}") are its tokenizer's special
    # pieces; a SentencePiece model tf trains reserves a token, which no text may then hold.
    own_codes = d.tokenizer or not d.corpora()
    if "{lang}" not in d.lang_token or not (own_codes or is_tag(lang_token(d.lang_token, "xx"))):
        fail(
            f"data.lang_token {d.lang_token!r} must hold {{lang}} and make a piece no text "
            'holds: "<2{lang}>" or ">>{lang}<<"'
        )
    for name, sets in (("data.dev", d.dev), ("data.test", d.test)):
        if isinstance(sets, list) and not sets:
            fail(f"{name} is an empty list: name at least one set")
    listed = [(corpus_name(d, i), c) for i, c in enumerate(d.corpora())]
    listed += [(f"data.dev[{i}]", s) for i, s in enumerate(d.dev_sets())]
    listed += [(f"data.test[{i}]", s) for i, s in enumerate(d.test_sets())]
    for where, s in listed:
        src, tgt = d.file_languages(s)
        for lang in (src, tgt):
            if not LANGUAGE_CODE.fullmatch(lang):
                fail(f"{where}: language {lang!r} must be a code of letters, digits, _ or -")
        if src == tgt and s.corpus:  # (no corpus: an imported many-to-many model, gem-gem)
            fail(f"{where}: source and target language are both {src!r}")
    for i, lang in enumerate(d.languages):
        if not LANGUAGE_CODE.fullmatch(lang):
            fail(f"data.languages[{i}] {lang!r} must be a code of letters, digits, _ or -")
    for i, way in enumerate(d.directions):
        src, tgt = parse_direction(way)
        if not (LANGUAGE_CODE.fullmatch(src) and LANGUAGE_CODE.fullmatch(tgt)):
            fail(
                f"data.directions[{i}] {way!r} must be two language codes, source then "
                'target: "es->en"'
            )
    if model_known:
        check_sets(d, fail)
    for i, c in enumerate(d.corpora()):
        where = corpus_name(d, i)
        if not c.corpus.strip():
            fail(f"{where}: no corpus spec")
    check_tags(d, fail)
