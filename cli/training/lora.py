"""LoRA runs (Hu et al., 2021; `train.lora`), the training side: the adapters `model.lora`
adds train, the pretrained weights stay frozen (held in the precision autocast trains in), and
a checkpoint keeps what trains alone, with its optimizer state; a resume keeps the run's LoRA
settings. The base weights' file (RUN/base.pt) and the merging of adapters into them on load,
what every reader of a checkpoint does: `cli.runs.adapted`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, ConfigError
from cli.runs.adapted import load_merged
from cli.runs.checkpoint import CheckpointError
from cli.training.new_languages import first_new_rows
from data.tokenizer_base import BaseTokenizer
from model.attention import MultiheadAttention
from model.lora import NEW_ROWS, add_lora, freeze_for_lora, rows_trained_alone


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
