"""`tf average`: the element-wise mean of several checkpoints' weights (paper, section 6.1)."""

from __future__ import annotations

from pathlib import Path

import torch

from cli.runs.checkpoint import (
    CheckpointError,
    checkpoint_dict,
    load_checkpoint,
    save_atomic,
)
from cli.runs.model_dirs import resolve_checkpoint
from cli.runs.models import load_for_inference
from cli.runs.run_dir import RunDir
from data.errors import InputError
from data.files import check_output
from data.tokenizer import Tokenizer


def checkpoints_to_average(sources: list[str], last: int) -> list[Path]:
    """RUN -> its last `last` step_N.pt files; otherwise the files given."""
    if len(sources) == 1 and Path(sources[0]).is_dir():
        run = RunDir(Path(sources[0]))
        found = run.step_checkpoints()
        if not found:
            raise CheckpointError(f"{run.path}: no step_N.pt checkpoints to average")
        return found[-last:]
    return [Path(s) for s in sources]


def average_state_dicts(
    states: list[dict[str, torch.Tensor]], paths: list[Path] | None = None
) -> dict[str, torch.Tensor]:
    """Mean of each floating tensor (accumulated in float64); other tensors from the last one.

    Raises:
        CheckpointError: a state holds other parameters, or shapes, than the first; naming
            its checkpoint (`paths`) and the first parameter that differs.
    """
    names = paths or [Path(f"checkpoint {i + 1}") for i in range(len(states))]
    first = states[0]
    for s, path in zip(states[1:], names[1:]):
        differs = sorted(first.keys() ^ s.keys()) or [
            k for k in first if first[k].shape != s[k].shape
        ]
        if differs:
            raise CheckpointError(
                f"{path}: holds different parameters than {names[0]} ({differs[0]}); "
                "the checkpoints to average must be of the same model"
            )
    out = {}
    for k in first:
        if states[-1][k].is_floating_point():
            total = sum(s[k].double() for s in states)
            out[k] = (total / len(states)).to(states[-1][k].dtype)
        else:
            out[k] = states[-1][k].clone()
    return out


def weights(ckpt: dict, path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights: a LoRA run's are its base with the adapters merged (the mean
    of merged models, not of the adapters' factors, whose product it is not)."""
    if "base" not in ckpt:
        return ckpt["model"]
    return load_for_inference(path, torch.device("cpu"))[0].state_dict()


def tokenizer_digest(ckpt: dict, path: Path) -> str | None:
    """The digest of the tokenizer `ckpt` was trained with, as today's tokenizers compute it: a
    checkpoint written before records its files' bytes' sha256 (`BaseTokenizer.digests`), which
    the run's tokenizer maps to its digest, so that the step checkpoints of a run resumed
    across that change compare equal."""
    recorded = ckpt.get("tokenizer_digest")
    try:
        tokenizer = Tokenizer.load(resolve_checkpoint(path)[1].tokenizer)
    except InputError:  # no tokenizer beside it: the record is all there is
        return recorded
    return tokenizer.digest() if recorded in tokenizer.digests() else recorded


def run_average(sources: list[str], last: int, output: Path) -> str:
    check_output(output)
    paths = checkpoints_to_average(sources, last)
    ckpts = [load_checkpoint(p) for p in paths]
    digests = [tokenizer_digest(c, p) for c, p in zip(ckpts, paths)]
    for digest, p in zip(digests[1:], paths[1:]):
        if digest != digests[0]:
            raise CheckpointError(
                f"{p}: was trained with another tokenizer than {paths[0]}; the checkpoints "
                "to average must share one"
            )
    newest = ckpts[-1]
    mean = average_state_dicts([weights(c, p) for c, p in zip(ckpts, paths)], paths)
    averaged_from = [str(p) for p in paths]
    averaged = checkpoint_dict(
        mean, newest["config"], digests[-1], newest.get("step"), averaged_from=averaged_from
    )
    save_atomic(averaged, output)
    return f"{output}: mean of {len(paths)} checkpoints ({', '.join(p.name for p in paths)})"
