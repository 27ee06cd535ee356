"""Starting, forcing, restarting and resuming a training run in its directory
(`cli.runs.run_dir.RunDir`), and the RNG state a checkpoint carries.

A new run records its config (every path in it absolute: `anchored`); a resumed one continues
with its saved config, changes refused where the checkpoint depends on them.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, config_diff, load_config, read_yaml, save_config
from cli.runs.run_dir import BASE, RunDir, anchored
from cli.training import lora
from data.errors import counted
from data.files import check_output
from data.tokenizer_base import BaseTokenizer

log = logging.getLogger(__name__)


class TrainingError(Exception):
    """Training cannot go on (non-finite losses, a refused resume); one line for the user."""


# ------------------------------------------------------------------------- a new or resumed run


def start_run(config: Config, out: Path, force: bool, restart: bool = False) -> RunDir:
    """Lay out a new run directory; never clobber an existing run unless forced. `restart`: the
    run in `out`, killed before its first checkpoint, starts again: its base.pt stays."""
    run = RunDir(out)
    if out.exists() and not out.is_dir():
        raise TrainingError(f"{out}: is a file; --out needs a directory")
    check_output(run.config)
    if (run.checkpoints / "last.pt").exists() or run.metrics.exists():
        if not force:
            raise TrainingError(
                f"{out}: already holds a run; use --resume {out}, another --out, "
                "or --force to start it afresh"
            )
        shutil.rmtree(run.checkpoints, ignore_errors=True)
        run.metrics.unlink(missing_ok=True)
    if not restart:  # another run's weights, which a restart of this one must not take
        run.base.unlink(missing_ok=True)
    run.path.mkdir(parents=True, exist_ok=True)
    save_config(config, run.config)
    return run


def check_restart(config: Config, run: RunDir) -> None:
    """A run killed before its first checkpoint starts again from update 0 with its own copies
    of what it started from: its tokenizer (RUN/tokenizer) and, adapted by LoRA, its base
    weights (RUN/base.pt); a full fine-tune's first weights are still its init's.

    Raises:
        TrainingError: the init it needs is gone, before anything is touched.
    """
    init = config.train.init
    if not init or Path(init).exists() or (config.train.lora.rank and run.base.is_file()):
        return
    raise TrainingError(
        f"train.init {init}: gone (no such run directory or checkpoint); {run.path} was "
        "killed before its first checkpoint and starts again from that checkpoint's weights "
        f"(a LoRA run from its {BASE}, written once it has loaded them): restore it, or start "
        f"afresh from another: tf train CONFIG --init RUN --out {run.path} --force"
    )


# What a resumed run cannot change: the checkpoint's weights have the model's shapes, its
# embeddings belong to the tokenizer, and its batch positions name batches of this data cut by
# this budget and seed. Dropout can change; so can everything in `train` not listed here.
FIXED_ON_RESUME = (
    "model.",
    "data.train",
    "data.src_lang",
    "data.tgt_lang",
    "data.directions",  # its target-language tokens are pieces of the tokenizer
    "data.vocab_size",
    "data.tokenizer_type",
    "data.joint_vocab",
    "data.character_coverage",
    "data.tokenizer",
    "data.max_len",  # and data.max_len_ratio: the filters decide which pairs the batches hold
    "data.clean",
    "data.dev",  # and data.test: cleaning drops the training pairs found in them
    "data.test",
    "data.pad_multiple",
    "data.temperature",
    "data.lang_token",  # its tokens are pieces of the tokenizer
    "train.max_tokens",
    "train.max_sentences",
    "train.seed",
)
# Settings added after runs were made, and what a config.yaml written before them meant: a
# run resumes with the batches it was cut into.
BEFORE_THE_SETTING = {"data": {"pad_multiple": 1}}
CHANGEABLE_ON_RESUME = ("model.dropout:", "model.attention_dropout:", "model.activation_dropout:")


def resume_config(
    run: RunDir, config_path: str | None, overrides: list[str], allow_changes: bool
) -> Config:
    """The run's saved config plus any new overrides; a change is refused unless allowed, and
    a change of what the checkpoint depends on (FIXED_ON_RESUME) always."""
    if not run.path.is_dir():
        raise TrainingError(f"{run.path}: no such run directory")
    if not run.config.is_file():
        raise TrainingError(f"{run.path}: not a run directory (no config.yaml)")
    earlier = settings_it_predates(run.config)
    saved = load_config(run.config, earlier)
    if not saved.data.corpora():  # `tf import`'s: a model alone, trained on no corpus of ours
        raise TrainingError(
            f"{run.path}: an imported model, not a training run to resume; fine-tune it with "
            f"tf train configs/finetune.yaml --init {run.path} --out NEW_RUN"
        )
    wanted = (
        load_config(config_path, overrides)
        if config_path
        else load_config(run.config, [*earlier, *overrides])
    )
    wanted = anchored(wanted, like=saved)  # a path given now is read from here
    changes = config_diff(saved.to_dict(), wanted.to_dict())
    fixed = [
        c
        for c in changes
        if c.startswith(FIXED_ON_RESUME) and not c.startswith(CHANGEABLE_ON_RESUME)
    ]
    if fixed:
        raise TrainingError(
            f"{run.config}: cannot change when resuming ({'; '.join(fixed)}): the checkpoint's "
            "weights, tokenizer and batch positions depend on it; start a new run instead"
        )
    if changes:
        listing = "; ".join(changes)
        if not allow_changes:
            raise TrainingError(
                f"{run.config}: resuming with a changed config ({listing}); "
                "pass --allow-config-change to accept"
            )
        log.warning("resuming with a changed config: %s", listing)
    return wanted


def settings_it_predates(config_file: Path) -> list[str]:
    """`section.key=value` for each setting of BEFORE_THE_SETTING that `config_file` lacks."""
    raw = read_yaml(config_file)
    return [
        f"{section}.{key}={value}"
        for section, keys in BEFORE_THE_SETTING.items()
        for key, value in keys.items()
        if key not in (raw.get(section) or {})
    ]


def check_resumable(
    ckpt: dict[str, Any],
    path: Path,
    run: RunDir,
    config: Config,
    world_size: int,
    tokenizer: BaseTokenizer,
    corpora: dict[str, str],
) -> None:
    """Checkpoint `ckpt` (at `path`, the last of `run`) can continue with `config` in
    `world_size` processes: a training run's (not an import's), its batches the same
    (`check_world_size`), trained with `tokenizer` on the same pairs (`corpora`: their digests
    now), and its LoRA settings kept (`lora.check_resume`).

    Raises:
        TrainingError, CheckpointError: naming the checkpoint and what differs.
    """
    if "optimizer" not in ckpt:  # `tf import`'s step 0: weights, nothing to continue
        raise TrainingError(
            f"{path}: an imported model, not a training run to resume; fine-tune it with "
            f"tf train configs/finetune.yaml --init {run.path} --out NEW_RUN"
        )
    check_world_size(ckpt, path, world_size, config.train.update_freq)
    if ckpt.get("tokenizer_digest") not in tokenizer.digests():
        raise TrainingError(f"{path}: was trained with another tokenizer than {run.tokenizer}")
    check_same_corpora(ckpt.get("corpora"), corpora, path)
    lora.check_resume(ckpt, config, path)


def check_world_size(ckpt: dict[str, Any], path: Path, now: int, update_freq: int) -> None:
    """A run resumes in another number of processes (`now`, each taking `update_freq`
    batches an update) where its updates take the same batches: N ranks x update_freq F
    continue as M ranks x (N x F / M). The weights and the optimiser's state are whole in every
    checkpoint (sharded or not); the batches are one plan, cut for N x F batches an update
    (`BatchIterator.load_state_dict`)."""
    saved = ckpt.get("world_size", 1)
    if saved == now:
        return
    per_update = saved * ckpt["config"]["train"]["update_freq"]
    written = (
        f"{path}: written by {counted(saved, 'process', 'processes')} taking "
        f"{counted(per_update, 'batch', 'batches')} an update"
    )
    if per_update % now:
        raise TrainingError(
            f"{written}; resume in a number of processes that divides {per_update} (now {now})"
        )
    if now * update_freq != per_update:
        raise TrainingError(
            f"{written}; in {counted(now, 'process', 'processes')} resume with --set "
            f"train.update_freq={per_update // now} --allow-config-change to take the "
            "same batches"
        )
    log.info("resuming the run of %s in %d", counted(saved, "process", "processes"), now)


def check_same_corpora(recorded: dict[str, str] | None, found: dict[str, str], path: Path) -> None:
    """A resumed run's corpora hold the pairs its checkpoint's batches were cut from (a
    checkpoint from before corpora were recorded: not checked).

    Raises:
        TrainingError: naming the first corpus whose pairs changed.
    """
    for name, digest in (recorded or {}).items():
        if found.get(name) != digest:
            raise TrainingError(
                f"{name}: its pairs, as cleaned and encoded, are not those {path} was trained "
                "on (the file, or a dev or test set cleaning holds it against, changed since the "
                "run started); a resumed run continues its batches of the same pairs: restore "
                "them, or start a new run from this one's weights (--init)"
            )


# ------------------------------------------------------------------------ RNG state


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every RNG a training step draws from; on CUDA, this rank's device's generator only (a
    resume may see another number of visible GPUs)."""
    state = {"torch": torch.get_rng_state(), "python": python_rng_to_list(random.getstate())}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(python_rng_from_list(state["python"]))
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)


def python_rng_to_list(state: tuple) -> list:
    """random.getstate() as lists and ints, which `torch.load(weights_only=True)` accepts."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def python_rng_from_list(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
