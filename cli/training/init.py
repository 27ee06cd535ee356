"""`train.init`: a fine-tune's config merged with its checkpoint's. The model's shapes, its
tokenizer, its languages and its decode settings come from the checkpoint; every other setting
stays as the config says, and the merged config is checked as a whole.
"""

from __future__ import annotations

import difflib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from cli.config import Config, ConfigError, DecodeConfig, check_config
from cli.runs.checkpoint import CheckpointError, config_from_checkpoint, load_checkpoint
from cli.runs.model_dirs import resolve_checkpoint
from cli.runs.run_dir import RunDir
from cli.training.new_languages import with_new_languages
from data.config import (
    VOCABULARY_SETTINGS,
    DataConfig,
    corpus_name,
    direction_of,
    with_directions,
)
from data.tokenizer import Tokenizer, read_tokenizer_settings
from data.tokenizer_base import BaseTokenizer

# What `train.init` takes from its checkpoint besides the tokenizer: the settings that decide
# which weights exist, their shapes and what they mean. Every other setting stays as the
# config says: the dropouts (LayerDrop's too), and `max_positions`, which shapes no weight (the
# sinusoidal table is computed and never saved), so the config's own limit holds for the
# sentences it trains on; but a learned table's (`positions: learned`) is its rows.
INIT_SHAPES = (
    "d_model",
    "n_heads",
    "d_head",
    "d_ff",
    "n_encoder_layers",
    "n_decoder_layers",
    "norm_first",  # Pre-LN has two more norms, and Post-LN weights mean something else
    "tie_embeddings",
    "activation",
    "output_bias",
    "decoder_start",
    "norm_eps",
    "positions",
    "position_offset",
    "scale_embedding",
    "layernorm_embedding",
)


def with_init(config: Config) -> Config:
    """`config` with `train.init`'s model shapes and tokenizer, every other setting as it was,
    checked as a whole (unchanged without `train.init`).

    Raises:
        CheckpointError: no such checkpoint, or its tokenizer is not the one it was trained with.
        ConfigError: the merged config breaks a rule of `check_config`.
    """
    if not config.train.init:
        return config
    path, run = resolve_checkpoint(config.train.init)
    ckpt = load_checkpoint(path)
    init = config_from_checkpoint(ckpt, path)
    tokenizer = init_tokenizer(config, ckpt, path, run)
    shapes = {name: getattr(init.model, name) for name in INIT_SHAPES}
    if init.model.positions == "learned":
        shapes["max_positions"] = init.model.max_positions
    # The run adopts that tokenizer (data.tokenizer); joint_vocab then says what it is, as the
    # check of tie_embeddings "all" needs; and it translates what the model translates.
    data = replace(config.data, tokenizer=str(tokenizer.directory), joint_vocab=tokenizer.joint)
    data = init_languages(data, with_directions(init.data, tokenizer.tags), path, tokenizer)
    data = with_new_languages(data, tokenizer, path)
    check_keeps_tokenizer(data, tokenizer, path)
    decode = init_decode(config.decode, init.decode)
    merged = replace(config, model=replace(config.model, **shapes), data=data, decode=decode)
    return check_config(merged, f"the config with train.init {path}")


def init_decode(ours: DecodeConfig, theirs: DecodeConfig) -> DecodeConfig:
    """The model's own decode settings (an import's generation settings, a run's recipe), but
    for those the config sets: a value other than the default wins."""
    default = DecodeConfig()
    kept = {
        f.name: getattr(theirs, f.name)
        for f in fields(DecodeConfig)
        if getattr(ours, f.name) == getattr(default, f.name)
    }
    return replace(ours, **kept)


def init_tokenizer(config: Config, ckpt: dict[str, Any], path: Path, run: RunDir) -> Tokenizer:
    """The tokenizer the embeddings of checkpoint `path` belong to: the config's
    `data.tokenizer` if it names one, else the one beside the checkpoint; either must be the
    tokenizer the checkpoint was trained with (its digest)."""
    source = Path(config.data.tokenizer) if config.data.tokenizer else run.tokenizer
    tokenizer = Tokenizer.load(source)
    # A checkpoint from before digests were recorded trusts the tokenizer beside it.
    expected = ckpt.get("tokenizer_digest") or Tokenizer.load(run.tokenizer).digest()
    if expected not in tokenizer.digests():
        named = "data.tokenizer " if config.data.tokenizer else ""
        raise CheckpointError(f"{path}: was trained with another tokenizer than {named}{source}")
    return tokenizer


def init_languages(
    d: DataConfig, init: DataConfig, path: Path, tokenizer: BaseTokenizer
) -> DataConfig:
    """`d` translating what `train.init`'s model translates (`DataConfig.translates`,
    `languages`) besides its own corpora: its directions and languages recorded (a
    multilingual model tuned on one direction keeps the others, and their tokens), where its
    tokens go and their form (a one-way model's none: the form its `tokenizer`'s kind reads,
    OPUS-MT's ">>{lang}<<", for the tokens a new language brings), its languages the default
    of corpora that name none.

    A corpus may read another source language (transfer: an es->en model tuned on pt->en),
    but write only into a language the model writes: its decoder learned those alone; a model
    whose source says its language (NLLB's) reads only its own languages (each a token).

    Raises:
        ConfigError: a corpus in a language the model lacks, naming the nearest it has, or
            another form of language token than the model's.
    """
    ways = init.translates()  # a one-way model's direction is its corpora's, not its defaults
    src, tgt = ways[0] if len(ways) == 1 else (init.src_lang, init.tgt_lang)
    if d.src_lang == DataConfig.src_lang:  # (a setting left at its default)
        d = replace(d, src_lang=src)
    if d.tgt_lang == DataConfig.tgt_lang:
        d = replace(d, tgt_lang=tgt)
    has_tokens = bool(init.lang_tokens() or init.source_tokens())  # pieces of its tokenizer
    form = init.lang_token if has_tokens else tokenizer.lang_token
    if form:
        if d.lang_token not in (form, DataConfig.lang_token):
            raise ConfigError(
                f"data.lang_token {d.lang_token!r}: train.init {path} writes its language "
                f"tokens as {form!r}, which fine-tuning keeps"
            )
        d = replace(d, lang_token=form)
    if has_tokens:
        d = replace(d, lang_token_side=init.lang_token_side)
    check_init_languages(d, init, path)
    recorded = [direction_of(*way) for way in init.translates()]
    # A many-to-many model's new languages are its languages too: any into any.
    new = [n.lang for n in d.new_languages] if init.languages else []
    return replace(
        d,
        directions=list(dict.fromkeys([*recorded, *d.directions])),
        languages=list(dict.fromkeys([*init.languages, *d.languages, *new])),
    )


def check_init_languages(d: DataConfig, init: DataConfig, path: Path) -> None:
    """Each corpus writes a language `init` writes, and (where the source says its language)
    reads one it reads.

    Raises:
        ConfigError: naming the corpus, the language and the model's nearest ones.
    """
    reads = init.source_langs() if init.lang_token_side == "target" else None
    new = [n.lang for n in d.new_languages]  # added to the model (`check_new_languages`)
    for i, c in enumerate(d.corpora()):
        src, tgt = d.direction(c)
        for lang, known, does in (
            (tgt, init.target_langs(), "translates into"),
            (src, reads, "reads"),
        ):
            if known is not None and lang not in known and lang not in new:
                near = difflib.get_close_matches(lang, known, n=3, cutoff=0.0)
                raise ConfigError(
                    f"{corpus_name(d, i)} ({c.corpus}) translates {src}->{tgt}: train.init "
                    f"{path} {does} {short(known)}, not {lang} (nearest: {', '.join(near)}); "
                    "fine-tuning keeps a model's languages (name the corpus's: src_lang, "
                    "tgt_lang, reverse), or adds one data.new_languages names"
                )


def short(langs: list[str]) -> str:
    """A dozen languages at most, then their count (NLLB has 202)."""
    return ", ".join(langs) if len(langs) <= 12 else f"{len(langs)} languages"


def check_keeps_tokenizer(d: DataConfig, tokenizer: Tokenizer, path: Path) -> None:
    """Fine-tuning keeps the checkpoint's tokenizer: a vocabulary setting that asks for another
    one (other than the default, and than what that tokenizer was trained with), or a corpus
    tag it lacks, would need a new SentencePiece model, whose pieces the weights never saw.

    Raises:
        ConfigError: naming the setting.
    """
    trained = read_tokenizer_settings(tokenizer.directory) or {}
    for key in VOCABULARY_SETTINGS:
        value = getattr(d, key)
        if value != getattr(DataConfig, key) and value != trained.get(key):
            raise ConfigError(
                f"data.{key} {value!r}: train.init {path} brings its own tokenizer "
                f"({tokenizer.directory}), which fine-tuning keeps; remove the setting"
            )
    added = d.new_tokens()  # the run's copy gets them
    missing = [tag for tag in d.tags() if tag not in tokenizer.tags and tag not in added]
    if missing:
        known = ", ".join(tokenizer.tags) or "none"
        raise ConfigError(
            f"data.train: the tag(s) {', '.join(missing)} are not pieces of train.init's "
            f"tokenizer ({tokenizer.directory}; its tags: {known}), which fine-tuning keeps"
        )
