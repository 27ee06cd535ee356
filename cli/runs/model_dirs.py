"""What a model directory is: a tf run (RUN/checkpoints/best.pt or last.pt), a checkpoint
file (in RUN/checkpoints/, or beside a tokenizer/ folder), a CTranslate2 directory written by
`tf export`, or a Hugging Face model, which `tf import` makes a run first."""

from __future__ import annotations

from pathlib import Path

from cli.config import TF_CONFIG
from cli.runs.checkpoint import CheckpointError
from cli.runs.run_dir import RunDir

# What `save_pretrained` writes beside config.json, whole or in shards (an index).
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def resolve_checkpoint(run_or_checkpoint: str | Path) -> tuple[Path, RunDir]:
    """Map RUN (best.pt, else last.pt) or RUN/checkpoints/FILE.pt to (checkpoint, run dir)."""
    p = Path(run_or_checkpoint)
    if p.is_dir():
        run = RunDir(p)
        for name in ("best.pt", "last.pt"):
            if (run.checkpoints / name).is_file():
                return run.checkpoints / name, run
        if is_huggingface_dir(p):
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


def is_huggingface_dir(path: Path) -> bool:
    """Whether `path` holds what `save_pretrained` writes: config.json and its weights."""
    return (path / "config.json").is_file() and any(
        (path / name).is_file() or (path / f"{name}.index.json").is_file() for name in HF_WEIGHTS
    )


def is_ctranslate2_dir(path: str | Path) -> bool:
    """Whether `path` is a CTranslate2 model directory written by `tf export`."""
    path = Path(path)
    return (path / "model.bin").is_file() and (path / TF_CONFIG).is_file()
