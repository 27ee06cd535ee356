"""Checkpoints: RUN/checkpoints/last.pt, best.pt, step_N.pt (see `cli.runs.run_dir` for the rest).

A checkpoint is a plain dict of tensors and Python values, loadable with
`torch.load(path, weights_only=True)`: no code is ever unpickled from a file. It is written
atomically (temporary file, flush, fsync, rename, fsync of the folder), so a kill at any instant
leaves the previous checkpoint whole. Its dict is made in one place (`checkpoint_dict`), for a
training run, an import, a pruned or an averaged model alike.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, ConfigError, from_dict
from data.files import atomic_output
from data.tokenizer_base import BaseTokenizer

FORMAT = "tf-checkpoint-1"


class CheckpointError(Exception):
    """A missing, truncated or foreign checkpoint; `str()` is one line for the user."""


def weights_only(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A file of weights alone (a LoRA run's base.pt): the format tag and "model"."""
    return {"format": FORMAT, "model": weights}


def checkpoint_dict(
    weights: dict[str, torch.Tensor],
    config: dict[str, Any],
    tokenizer_digest: str | None,
    step: int | None = None,
    **more: Any,
) -> dict[str, Any]:
    """A checkpoint: what every reader takes from it — "model" (the weights), "config" (the
    config as a dict: `Config.to_dict()`), "tokenizer_digest" (of the tokenizer its embeddings
    belong to) — the update it was written at ("step", left out where there is none: a pruned
    model's), then `more`: what a training run resumes from (its optimizer, schedule, batch
    positions, RNGs...) or where the weights came from ("imported", "pruned_from",
    "averaged_from")."""
    ckpt = weights_only(weights)
    if step is not None:
        ckpt["step"] = step
    return ckpt | {"config": config, "tokenizer_digest": tokenizer_digest} | more


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
    checkpoint; what it saves: docs/performance.md)."""
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


def config_from_checkpoint(ckpt: dict[str, Any], path: Path) -> Config:
    try:
        return from_dict(Config, ckpt["config"], str(path))
    except (KeyError, ConfigError) as e:
        raise CheckpointError(f"{path}: checkpoint config unreadable ({e})") from None


def check_trained_with(
    ckpt: dict[str, Any], path: Path, tokenizer: BaseTokenizer, named: str | Path
) -> None:
    """The checkpoint `ckpt` (at `path`) was trained with `tokenizer` (`named` so in the error),
    by the digest it records; one from before digests were recorded is trusted.

    Raises:
        CheckpointError: it records another tokenizer's digest.
    """
    if ckpt.get("tokenizer_digest") not in (None, *tokenizer.digests()):
        raise CheckpointError(f"{path}: was trained with another tokenizer than {named}")
