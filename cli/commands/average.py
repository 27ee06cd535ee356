"""`tf average`: the element-wise mean of several checkpoints' weights (paper, section 6.1)."""

from __future__ import annotations

from pathlib import Path

import torch

from cli.training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_for_inference,
    save_atomic,
)
from cli.training.run import RunDir
from data.files import check_output


def checkpoints_to_average(sources: list[str], last: int) -> list[Path]:
    """RUN -> its last `last` step_N.pt files; otherwise the files given."""
    if len(sources) == 1 and Path(sources[0]).is_dir():
        run = RunDir(Path(sources[0]))
        found = run.step_checkpoints()
        if not found:
            raise CheckpointError(f"{run.path}: no step_N.pt checkpoints to average")
        return found[-last:]
    return [Path(s) for s in sources]


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Mean of each floating tensor (accumulated in float64); other tensors from the last one."""
    keys = states[0].keys()
    for s in states[1:]:
        if s.keys() != keys:
            raise CheckpointError("the checkpoints hold different parameters; same model needed")
    out = {}
    for k in keys:
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


def run_average(sources: list[str], last: int, output: Path) -> str:
    check_output(output)
    paths = checkpoints_to_average(sources, last)
    ckpts = [load_checkpoint(p) for p in paths]
    digests = {c.get("tokenizer_digest") for c in ckpts}
    if len(digests) > 1:
        raise CheckpointError("the checkpoints were trained with different tokenizers")
    newest = ckpts[-1]
    averaged = {
        "format": newest["format"],
        "model": average_state_dicts([weights(c, p) for c, p in zip(ckpts, paths)]),
        "config": newest["config"],
        "tokenizer_digest": newest.get("tokenizer_digest"),
        "step": newest.get("step"),
        "averaged_from": [str(p) for p in paths],
    }
    save_atomic(averaged, output)
    return f"{output}: mean of {len(paths)} checkpoints ({', '.join(p.name for p in paths)})"
