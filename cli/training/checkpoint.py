"""Checkpoints: RUN/checkpoints/last.pt, best.pt, step_N.pt (see `cli.training.run` for the rest).

A checkpoint is a plain dict of tensors and Python values, loadable with
`torch.load(path, weights_only=True)`: no code is ever unpickled from a file. It is written
atomically (temporary file, flush, fsync, rename, fsync of the folder), so a kill at any instant
leaves the previous checkpoint whole.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, ConfigError, check_config, from_dict
from cli.training.run import RunDir
from data.config import VOCABULARY_SETTINGS, DataConfig
from data.files import atomic_output
from data.tokenizer import Tokenizer, read_tokenizer_settings
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
# config says: the dropouts, and `max_positions`, which shapes no weight (the sinusoidal table
# is computed and never saved), so the config's own limit holds for the sentences it trains on.
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
    check_keeps_tokenizer(config.data, tokenizer, path)
    shapes = {name: getattr(init.model, name) for name in INIT_SHAPES}
    # The run adopts that tokenizer (data.tokenizer); joint_vocab then says what it is, as the
    # check of tie_embeddings "all" needs; and it translates in the model's direction.
    data = replace(config.data, tokenizer=str(tokenizer.directory), joint_vocab=tokenizer.joint)
    data = replace(data, **init_languages(config.data, init.data, path))
    merged = replace(config, model=replace(config.model, **shapes), data=data)
    return check_config(merged, f"the config with train.init {path}")


def init_tokenizer(config: Config, ckpt: dict[str, Any], path: Path, run: RunDir) -> Tokenizer:
    """The tokenizer the embeddings of checkpoint `path` belong to: the config's
    `data.tokenizer` if it names one, else the one beside the checkpoint; either must be the
    tokenizer the checkpoint was trained with (its digest)."""
    source = Path(config.data.tokenizer) if config.data.tokenizer else run.tokenizer
    tokenizer = Tokenizer.load(source)
    # A checkpoint from before digests were recorded trusts the tokenizer beside it.
    expected = ckpt.get("tokenizer_digest") or Tokenizer.load(run.tokenizer).digest()
    if tokenizer.digest() != expected:
        named = "data.tokenizer " if config.data.tokenizer else ""
        raise CheckpointError(f"{path}: was trained with another tokenizer than {named}{source}")
    return tokenizer


def init_languages(d: DataConfig, init: DataConfig, path: Path) -> dict[str, str]:
    """The languages of `train.init`'s model (its config's), which a config that names none
    (the defaults) takes; other ones are a ConfigError: the weights translate one way."""
    theirs = (init.src_lang, init.tgt_lang)
    ours = (d.src_lang, d.tgt_lang)
    if ours not in (theirs, (DataConfig.src_lang, DataConfig.tgt_lang)):
        raise ConfigError(
            f"data.src_lang/tgt_lang {'->'.join(ours)}: train.init {path} translates "
            f"{'->'.join(theirs)}, and fine-tuning keeps its direction"
        )
    return {"src_lang": theirs[0], "tgt_lang": theirs[1]}


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
    missing = [tag for tag in d.tags() if tag not in tokenizer.tags]
    if missing:
        known = ", ".join(tokenizer.tags) or "none"
        raise ConfigError(
            f"data.train: the tag(s) {', '.join(missing)} are not pieces of train.init's "
            f"tokenizer ({tokenizer.directory}; its tags: {known}), which fine-tuning keeps"
        )


def load_weights(model: Transformer, ckpt: dict[str, Any], path: Path, key: str = "model") -> None:
    """`ckpt[key]` into `model`; weights of other shapes are a one-line CheckpointError."""
    try:
        model.load_state_dict(ckpt[key])
    except (KeyError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{path}: weights do not fit the model ({first[:120]})") from None


def build_model(config: Config, tokenizer: Tokenizer) -> Transformer:
    try:
        return Transformer(
            config.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id
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
    if ckpt.get("tokenizer_digest") not in (None, tokenizer.digest()):
        raise CheckpointError(f"{path}: was trained with another tokenizer than {run.tokenizer}")
    model = build_model(config, tokenizer)
    load_weights(model, ckpt, path)
    return model.to(device).eval(), tokenizer, config
