"""A model built for a config and a tokenizer, and given a checkpoint's weights: what every
reader of a run does (inference, exports, `tf average`, `tf prune`, `train.init`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cli.config import Config, ConfigError
from cli.runs.adapted import load_merged
from cli.runs.checkpoint import (
    CheckpointError,
    check_trained_with,
    config_from_checkpoint,
    load_checkpoint,
)
from cli.runs.model_dirs import resolve_checkpoint
from data.tokenizer import Tokenizer
from model.transformer import Transformer


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


def load_weights(model: Transformer, ckpt: dict[str, Any], path: Path, key: str = "model") -> None:
    """`ckpt[key]` into `model` (a LoRA run's: its base with the adapters merged, an ordinary
    model); weights of other shapes are a one-line CheckpointError."""
    try:
        if "base" in ckpt and key == "model":
            load_merged(model, ckpt, path, config_from_checkpoint(ckpt, path))
        else:
            model.load_state_dict(ckpt[key])
    except (KeyError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{path}: weights do not fit the model ({first[:120]})") from None


def load_for_inference(
    run_or_checkpoint: str | Path, device: torch.device
) -> tuple[Transformer, Tokenizer, Config]:
    """The model in eval mode, its tokenizer (checked against the checkpoint) and its config."""
    path, run = resolve_checkpoint(run_or_checkpoint)
    ckpt = load_checkpoint(path, mmap=True)  # the model copies its weights out
    config = config_from_checkpoint(ckpt, path)
    tokenizer = Tokenizer.load(run.tokenizer)
    check_trained_with(ckpt, path, tokenizer, run.tokenizer)
    model = build_model(config, tokenizer)
    load_weights(model, ckpt, path)
    return model.to(device).eval(), tokenizer, config
