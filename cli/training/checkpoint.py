"""Checkpoints: RUN/checkpoints/last.pt, best.pt, step_N.pt (see `cli.training.run` for the rest).

A checkpoint is a plain dict of tensors and Python values, loadable with
`torch.load(path, weights_only=True)`: no code is ever unpickled from a file. It is written
atomically (temporary file, flush, fsync, rename, fsync of the folder), so a kill at any instant
leaves the previous checkpoint whole.
"""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, ConfigError, DecodeConfig, check_config, from_dict
from cli.training.run import RunDir
from data.config import (
    VOCABULARY_SETTINGS,
    DataConfig,
    corpus_name,
    direction_of,
    with_directions,
)
from data.files import atomic_output
from data.tokenizer import Tokenizer, read_tokenizer_settings
from data.tokenizer_base import BaseTokenizer
from model.transformer import Transformer

FORMAT = "tf-checkpoint-1"


class CheckpointError(Exception):
    """A missing, truncated or foreign checkpoint; `str()` is one line for the user."""


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """Write `obj` with torch.save so that `path` is either the old file or the whole new one."""
    with atomic_output(path, "wb") as f:
        torch.save(obj, f)


def save_copies(obj: dict[str, Any], paths: list[Path]) -> None:
    """Write `obj` to the first path atomically, then make the others the same file: a hard link
    renamed into place (a later overwrite of either replaces its own name only), or a copy where
    the file system has no hard links. Serialising once saves time on large models."""
    first, *rest = paths
    save_atomic(obj, first)
    for path in rest:
        tmp = path.with_name(f".{path.name}.link")
        tmp.unlink(missing_ok=True)
        try:
            os.link(first, tmp)
        except OSError:
            shutil.copyfile(first, tmp)
        os.replace(tmp, path)


def load_checkpoint(
    path: Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Load a checkpoint dict safely, with one-line errors for the ways it can be wrong.
    `mmap`: its tensors read from the file as they are used, for a caller that copies the
    weights it needs and drops the rest (the optimizer's moments are two thirds of a
    checkpoint: `small`'s 121 MB loaded, its weights copied, in 0.34 -> 0.07 s the first
    time, 0.09 -> 0.03 s from the page cache)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # torch raises many types for truncated or foreign files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable tf checkpoint ({reason[:120]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tf checkpoint (no '{FORMAT}' format tag)")
    return ckpt


def resolve_checkpoint(run_or_checkpoint: str | Path) -> tuple[Path, RunDir]:
    """Map RUN (best.pt, else last.pt) or RUN/checkpoints/FILE.pt to (checkpoint, run dir)."""
    p = Path(run_or_checkpoint)
    if p.is_dir():
        run = RunDir(p)
        for name in ("best.pt", "last.pt"):
            if (run.checkpoints / name).is_file():
                return run.checkpoints / name, run
        weights = ("model.safetensors", "pytorch_model.bin")
        if (p / "config.json").is_file() and any(
            (p / name).is_file() or (p / f"{name}.index.json").is_file() for name in weights
        ):  # what `save_pretrained` writes
            raise CheckpointError(
                f"{p}: a Hugging Face model (config.json and its weights), not a tf run: "
                f"`tf import {p} -o RUN` makes it one"
            )
        raise CheckpointError(f"{p}: no checkpoints/best.pt or checkpoints/last.pt in this run")
    if not p.exists():
        raise CheckpointError(f"{p}: no such run directory or checkpoint")
    # A checkpoint inside RUN/checkpoints/, or beside a tokenizer/ folder.
    run = RunDir(p.parent.parent if p.parent.name == "checkpoints" else p.parent)
    return p, run


def config_from_checkpoint(ckpt: dict[str, Any], path: Path) -> Config:
    try:
        return from_dict(Config, ckpt["config"], str(path))
    except (KeyError, ConfigError) as e:
        raise CheckpointError(f"{path}: checkpoint config unreadable ({e})") from None


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
    from cli.training.new_languages import with_new_languages  # (which imports this module)

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


def load_weights(model: Transformer, ckpt: dict[str, Any], path: Path, key: str = "model") -> None:
    """`ckpt[key]` into `model` (a LoRA run's: its base with the adapters merged, an ordinary
    model); weights of other shapes are a one-line CheckpointError."""
    try:
        if "base" in ckpt and key == "model":
            from cli.training.lora import load_merged  # which imports this module

            load_merged(model, ckpt, path, config_from_checkpoint(ckpt, path))
        else:
            model.load_state_dict(ckpt[key])
    except (KeyError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{path}: weights do not fit the model ({first[:120]})") from None


def build_model(config: Config, tokenizer: Tokenizer) -> Transformer:
    try:
        return Transformer(
            config.model,
            tokenizer.src_vocab_size,
            tokenizer.tgt_vocab_size,
            tokenizer.pad_id,
            tokenizer.src_pad_id,
        )
    except ValueError as e:  # e.g. tie_embeddings "all" with a tokenizer of two vocabularies
        raise ConfigError(f"{tokenizer.directory}: {e}") from None


def load_for_inference(
    run_or_checkpoint: str | Path, device: torch.device
) -> tuple[Transformer, Tokenizer, Config]:
    """The model in eval mode, its tokenizer (checked against the checkpoint) and its config."""
    path, run = resolve_checkpoint(run_or_checkpoint)
    ckpt = load_checkpoint(path, mmap=True)  # the model copies its weights out
    config = config_from_checkpoint(ckpt, path)
    tokenizer = Tokenizer.load(run.tokenizer)
    if ckpt.get("tokenizer_digest") not in (None, *tokenizer.digests()):
        raise CheckpointError(f"{path}: was trained with another tokenizer than {run.tokenizer}")
    model = build_model(config, tokenizer)
    load_weights(model, ckpt, path)
    return model.to(device).eval(), tokenizer, config
