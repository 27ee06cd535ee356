"""The run directory: its layout, its tokenizer, its metrics file, the RNG state a checkpoint
carries, and the policy for starting, forcing and resuming a run.

    RUN/config.yaml          the resolved config
    RUN/tokenizer/           the SentencePiece model(s), and settings.json: what they were
                             trained with (`data.pipeline` chooses them)
    RUN/metrics.jsonl        one JSON object per log line / validation
    RUN/checkpoints/last.pt, best.pt, step_N.pt   (see `cli.training.checkpoint`)
    RUN/base.pt              a LoRA run's frozen weights (see `cli.training.lora`)

Every path a run's config names is recorded absolute (`anchored`), so that it resumes from any
working directory.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cli.config import Config, config_diff, load_config, read_yaml, save_config, with_paths
from data.files import check_output

log = logging.getLogger(__name__)


BASE = "base.pt"  # a LoRA run's frozen weights, beside checkpoints/


class TrainingError(Exception):
    """Training cannot go on (non-finite losses, a refused resume); one line for the user."""


@dataclass
class RunDir:
    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tokenizer(self) -> Path:
        return self.path / "tokenizer"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def base(self) -> Path:
        return self.path / BASE

    @property
    def data_report(self) -> Path:
        return self.path / "data.json"  # per training corpus: read, removed by rule, kept

    def step_checkpoints(self) -> list[Path]:
        """`step_N.pt` files, oldest first."""
        found = [
            (int(m.group(1)), p)
            for p in self.checkpoints.glob("step_*.pt")
            if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))
        ]
        return [p for _, p in sorted(found)]


# ------------------------------------------------------------------------- a new or resumed run


def anchored(config: Config, like: Config | None = None) -> Config:
    """`config` with every setting that names files or folders (the schema marks them:
    `with_paths`) absolute, read from the working directory (corpus specs by
    `data.corpus.anchored_spec`, which leaves hub names and `bundled:` corpora as they are): a
    run records them so, and resumes from anywhere. `like`: a run's saved config, whose value
    of a setting is kept where it names the same place, as it is written (a run recorded
    before paths were anchored keeps its relative ones, which its checkpoint's corpus records
    and its tokenizer's settings name)."""
    from data.corpus import anchored_spec  # (`datasets`, which `tf translate` need not load)

    return with_paths(config, anchored_spec, like)


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
