"""A LoRA run's checkpoints (`train.lora`; the training side: `cli.training.lora`): its base
weights in RUN/base.pt, written once, and its checkpoints' adapters merged into them on load.

A run adapted from `train.init` holds its base weights in RUN/base.pt, written once at its
start (a hard link to the init's checkpoint where that file holds weights alone, an import's,
and the file system allows it), and every checkpoint records the file's sha256. Its
checkpoints' "model" holds only what trains (the adapters, the groups `train.trainable`
names) with their optimizer state: megabytes where the base is gigabytes. Whatever reads a
checkpoint's weights (`load_weights`: inference, export, `tf average`, `tf distill`, a later
`train.init`) gets the base with the adapters merged in, an ordinary model (`load_merged`); a
resume gets them apart (`load_adapted`), to go on training the adapters alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from cli.config import Config
from cli.runs.checkpoint import CheckpointError, load_checkpoint, save_atomic, weights_only
from cli.runs.run_dir import BASE
from data.errors import InputError
from data.files import atomic_output
from model.lora import add_lora, merge_lora


def base_path(checkpoint: Path) -> Path:
    """Where the base of the checkpoint at `checkpoint` lies: in its run directory (a checkpoint
    in RUN/checkpoints/), else beside it."""
    parent = checkpoint.parent
    return (parent.parent if parent.name == "checkpoints" else parent) / BASE


def file_stat(path: Path) -> list[int]:
    """What changes whenever the file does (its inode's change time moves on any write, and
    cannot be set back): a match spares hashing gigabytes at every load."""
    st = path.stat()
    return [st.st_size, st.st_ino, st.st_ctime_ns]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def write_base(
    run_path: Path,
    init: Path,
    init_ckpt: dict[str, Any],
    weights: dict[str, torch.Tensor],
    link: bool = True,
) -> dict[str, str]:
    """RUN/base.pt: the weights the adapters start from (`weights`, the init's as loaded),
    once. Returns the record each checkpoint keeps ({"file", "sha256", "stat"}). `link` False: the
    weights are not the file's (new languages' rows), so they are written."""
    out = run_path / BASE
    tmp = out.with_name(f".{BASE}.tmp")
    tmp.unlink(missing_ok=True)
    weights_alone = link and "optimizer" not in init_ckpt and "base" not in init_ckpt
    try:
        if not weights_alone:
            raise OSError("the init holds more than weights")
        os.link(init, tmp)  # an import's step 0: the same bytes, no second copy
    except OSError:
        save_atomic(weights_only(weights), tmp)
    os.replace(tmp, out)
    return base_record(out)


def base_record(base: Path) -> dict[str, str]:
    """What each checkpoint of a run records of its base.pt at `base`: the file, its sha256
    and what changes whenever it does (`file_stat`)."""
    return {"file": BASE, "sha256": file_sha256(base), "stat": file_stat(base)}


def base_weights(ckpt: dict[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """The base weights of the adapted checkpoint at `path`, checked against its record.

    Raises:
        CheckpointError: the file is missing, or is not the one the adapters were trained on.
    """
    record, base = ckpt["base"], base_path(path)
    if not base.is_file():
        raise CheckpointError(
            f"{base}: missing, the base weights of {path} (a LoRA checkpoint holds only its "
            "adapters); restore the run's base.pt"
        )
    stat = file_stat(base)
    # Unchanged since it was recorded, or since a copy of it (a copied run) was hashed once.
    if stat not in (record.get("stat"), verified_copy(base, record["sha256"])):
        if file_sha256(base) != record["sha256"]:
            raise CheckpointError(
                f"{base}: changed since {path} was written (its sha256 is not the one "
                "recorded): the adapters were trained on other weights"
            )
        record_verified_copy(base, record["sha256"], stat)
    return load_checkpoint(base, mmap=True)["model"]


def verified_path(base: Path) -> Path:
    """Where a run records the copy of its base.pt last hashed: beside it."""
    return base.with_name(f"{base.stem}.verified.json")


def verified_copy(base: Path, sha256: str) -> list[int] | None:
    """The `file_stat` of the base at `base` when it was last hashed to `sha256` (a copy of
    the file the checkpoints recorded: another inode, another change time); None if never."""
    try:
        seen = json.loads(verified_path(base).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return seen.get("stat") if isinstance(seen, dict) and seen.get("sha256") == sha256 else None


def record_verified_copy(base: Path, sha256: str, stat: list[int]) -> None:
    """Record that the base at `base`, as `stat` says it is, hashed to `sha256`: later loads
    of a copied run compare its stat, not gigabytes. A run directory that cannot be written
    (read-only) is hashed at each load, as before."""
    try:
        with atomic_output(verified_path(base)) as f:
            f.write(json.dumps({"sha256": sha256, "stat": stat}))
    except (OSError, InputError):  # (`atomic_output` refuses a directory it cannot write)
        pass


def load_adapted(model: torch.nn.Module, ckpt: dict[str, Any], path: Path) -> None:
    """An adapted `model` (`cli.training.lora.adapt`) given the checkpoint's base and, over it,
    what it trained."""
    put_adapted(model, base_weights(ckpt, path), ckpt, path)


def put_adapted(
    model: torch.nn.Module, base: dict[str, torch.Tensor], ckpt: dict[str, Any], path: Path
) -> None:
    """An adapted `model` given the base weights `base` (base.pt's, read and checked) and,
    over them, what checkpoint `ckpt` (at `path`, named in errors) trained."""
    missing, unexpected = model.load_state_dict(base, strict=False)
    trained = ckpt["model"]
    if unexpected or set(missing) - set(trained):
        wrong = unexpected or sorted(set(missing) - set(trained))
        raise CheckpointError(f"{base_path(path)}: weights that do not fit the model ({wrong[0]})")
    rows = ckpt.get("rows", {})
    weights = model.state_dict()
    with torch.no_grad():
        for name in set(rows) & set(trained):  # the rows that trained, over the base's
            weights[name][rows[name] :].copy_(trained[name])
    trained = {k: v for k, v in trained.items() if k not in rows}
    missing, unexpected = model.load_state_dict(trained, strict=False)
    if unexpected:
        raise CheckpointError(f"{path}: adapters that do not fit the model ({unexpected[0]})")


def load_merged(
    model: torch.nn.Module,
    ckpt: dict[str, Any],
    path: Path,
    config: Config,
    base: dict[str, torch.Tensor] | None = None,
) -> None:
    """The adapted checkpoint's weights in a plain `model`: base and adapters merged (what
    inference, exports and averages read). `base`: the base weights where they were read
    already (validation reads base.pt once); else base.pt's, read and checked."""
    # The adapters' first values are the checkpoint's: drawn from a generator of their own,
    # not from the global one (a validation in the middle of training draws no dropout's).
    add_lora(model, config.train.lora, torch.Generator())
    put_adapted(model, base_weights(ckpt, path) if base is None else base, ckpt, path)
    merge_lora(model)
