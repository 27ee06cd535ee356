"""LoRA runs (Hu et al., 2021; `train.lora`): the adapters `model.lora` adds train, the
pretrained weights stay frozen, and a run keeps them once.

A run adapted from `train.init` holds its base weights in RUN/base.pt, written once at its
start (a hard link to the init's checkpoint where that file holds weights alone, an import's,
and the file system allows it), and every checkpoint records the file's sha256. Its
checkpoints' "model" holds only what trains (the adapters, the groups `train.trainable`
names) with their optimizer state: megabytes where the base is gigabytes. Whatever reads a
checkpoint's weights (`load_weights`: inference, export, `tf average`, `tf distill`, a later
`train.init`) gets the base with the adapters merged in, an ordinary model; a resume gets
them apart (`load_adapted`), to go on training the adapters alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, ConfigError
from cli.training.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_atomic
from cli.training.new_languages import first_new_rows
from cli.training.run import BASE  # beside checkpoints/ in the run directory
from data.errors import InputError
from data.files import atomic_output
from data.tokenizer_base import BaseTokenizer
from model.attention import MultiheadAttention
from model.lora import NEW_ROWS, add_lora, freeze_for_lora, merge_lora, rows_trained_alone


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
        save_atomic({"format": FORMAT, "model": weights}, tmp)
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


def adapt(
    model: torch.nn.Module, config: Config, tokenizer: BaseTokenizer | None = None
) -> list[str]:
    """Adapters on `model` (`train.lora`), everything else frozen but `train.trainable`'s
    groups; returns the names that train. The adapters' first values are drawn from a
    generator of the run's seed: the global one's draws (dropout's) stay as without LoRA.
    `tokenizer`: the run's, which says where new languages' rows start (`data.new_languages`)."""
    generator = torch.Generator().manual_seed(config.train.seed)
    add_lora(model, config.train.lora, generator)
    new_rows = first_new_rows(model, tokenizer, config.data) if tokenizer else None
    check_weight_decay(model, config, new_rows)
    return freeze_for_lora(model, config.train.trainable, new_rows)


def check_weight_decay(model: torch.nn.Module, config: Config, new_rows: dict | None) -> None:
    """A matrix that trains its new languages' rows alone (`rows_trained_alone`) keeps its
    other rows only without weight decay, which would move them (their gradient is zeroed, not
    the decay Adam adds to it); a matrix that another group trains whole (`embeddings` of a
    tied model: the output layer's too) may decay.

    Raises:
        ConfigError: naming the first such matrix.
    """
    alone = rows_trained_alone(model, config.train.trainable, new_rows)
    if alone and config.train.weight_decay:
        raise ConfigError(
            f"train.weight_decay would move the old rows of {next(iter(alone))}, whose new "
            f"languages' rows train alone (train.trainable {NEW_ROWS}): set it to 0"
        )


def trained_rows(model: torch.nn.Module, config: Config, tokenizer: BaseTokenizer) -> dict:
    """{parameter name: its first row that trains} where only the new languages' rows of a
    matrix train (`embeddings_of_new_languages`, no other group named training the matrix
    whole: `rows_trained_alone`, as `adapt` froze them); {} otherwise. The checkpoints keep
    those rows alone, and their moments: the others never move (their gradient is zeroed, and
    Adam without weight decay leaves such a row and its zero moments as they are)."""
    trainable = config.train.trainable
    if NEW_ROWS not in trainable:
        return {}
    return rows_trained_alone(model, trainable, first_new_rows(model, tokenizer, config.data))


def hold_frozen(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """The frozen matrices of `model`'s layers held in `dtype`, the precision autocast trains
    in (bf16, fp16; None: as they are). Autocast casts them to it for every matmul anyway, so
    the numbers are the same, and a weight that never updates needs no float32 copy: half
    their memory, and no cast at each step. Norms, biases and embeddings (whose lookup
    autocast leaves in float32) stay as they are. A frozen output layer tied to them gets a
    copy of its own in `dtype` (untied: neither ever changes): its matmul over the whole
    vocabulary casts no 256,206 x 1,024 matrix at each step either. The copy is a buffer, not
    a second parameter: the model's parameters (and their count) stay those of the model."""
    if dtype is None:
        return
    generator = getattr(model, "generator", None)
    if generator is not None and not generator.weight.requires_grad:
        held = generator.weight.detach().to(dtype)
        embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        if any(generator.weight is weight for weight in embeddings):
            del generator.weight  # (the embeddings' Parameter, which stays theirs)
            generator.register_buffer("weight", held)  # in state dicts under its name still
        else:
            generator.weight.data = held
    for module in model.modules():
        if isinstance(module, MultiheadAttention):
            weight = module.in_proj_weight
        elif isinstance(module, torch.nn.Linear) and module is not generator:
            weight = module.weight
        else:
            continue
        if not weight.requires_grad:
            weight.data = weight.data.to(dtype)


def load_adapted(model: torch.nn.Module, ckpt: dict[str, Any], path: Path) -> None:
    """An adapted `model` (`adapt`) given the checkpoint's base and, over it, what it trained."""
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


def merge_into(
    plain: torch.nn.Module,
    model: torch.nn.Module,
    base: dict[str, torch.Tensor],
    path: Path,
    names: list[str],
    rows: dict[str, int],
    config: Config,
) -> torch.nn.Module:
    """`plain`, a plain model of the adapted `model`'s shape (reused from one call to the
    next: merging leaves it plain again), given what a checkpoint of `model` written now at
    `path` would give every command: the base weights `base` (its base.pt's, read once) with
    the adapters (and groups) as they are, merged as `load_merged` merges them."""
    ckpt = {"model": trained_state(model, names, rows), "rows": rows}
    load_merged(plain, ckpt, path, config, base)
    return plain


def trained_state(
    model: torch.nn.Module, names: list[str], rows: dict[str, int]
) -> dict[str, torch.Tensor]:
    """What an adapted run's checkpoint keeps of `model`: the tensors that train, of a matrix
    whose new rows alone train (`trained_rows`) those rows (a copy: a view would save the
    whole matrix)."""
    keep = set(names)
    return {
        k: v[rows[k] :].clone() if k in rows else v
        for k, v in model.state_dict(keep_vars=False).items()
        if k in keep
    }


def trained_moments(state: dict[str, Any], names: list[str], rows: dict[str, int]) -> dict:
    """A plain `torch.optim` state dict (parameters numbered as `names`) with the moments of
    `rows`' matrices cut to the rows that train: every other row's are zero."""
    cut = {i: rows[n] for i, n in enumerate(names) if n in rows}
    moments = {
        i: {k: v[cut[i] :].clone() if i in cut and v.dim() else v for k, v in s.items()}
        for i, s in state["state"].items()
    }
    return {**state, "state": moments}


def whole_moments(
    state: dict[str, Any], params: list[torch.Tensor], names: list[str], rows: dict
) -> dict:
    """`trained_moments`' state with each cut moment whole again: zeros, then its rows."""
    moments = {}
    for i, s in state["state"].items():
        first = rows.get(names[i])
        if first is None:
            moments[i] = s
            continue
        moments[i] = {}
        for k, v in s.items():
            if v.dim():
                whole = v.new_zeros(params[i].shape)
                whole[first:] = v
                v = whole
            moments[i][k] = v
    return {**state, "state": moments}


def check_resume(ckpt: dict[str, Any], config: Config, path: Path) -> None:
    """A resume keeps the run's LoRA settings: adapters of another shape, or adapters on a run
    trained without them (or none on one trained with them), cannot continue it.

    Raises:
        CheckpointError: naming the checkpoint and what differs.
    """
    was = (ckpt.get("config", {}).get("train", {}) or {}).get("lora", {}) or {}
    now = asdict(config.train.lora)
    if "base" not in ckpt and config.train.lora.rank:
        raise CheckpointError(
            f"{path}: trained without LoRA; train.lora cannot start on a resume (fine-tune it "
            f"with --init {path.parent.parent} --out NEW_RUN instead)"
        )
    if "base" in ckpt and was != now:
        raise CheckpointError(
            f"{path}: trained with train.lora {was}; a resume keeps them (now {now})"
        )
    was_trainable = ckpt.get("config", {}).get("train", {}).get("trainable", [])
    if "base" in ckpt and was_trainable != config.train.trainable:
        raise CheckpointError(
            f"{path}: trained with train.trainable {was_trainable}; a resume keeps it "
            f"(now {config.train.trainable})"
        )
