"""What a checkpoint carries of a training run besides its optimizer, schedule and batches: the
counters (`Progress`) and the weights, to which each way of training them contributes its own
part, chosen once (`training_weights`):

    Weights    every weight trains; "model" holds them
    Sharded    the same, sharded over the ranks (`train.shard`): gathered to write, scattered
               to read, gathered into a plain copy to validate
    Averaged   an exponential moving average beside them (`train.ema_decay`): "model" holds
               the average, "train_model" the trained weights
    Adapted    LoRA (`train.lora`): "model" holds what trains (the adapters, new languages'
               rows), "base" the record of RUN/base.pt; validation decodes them merged

Each part says what the updates run (`net`: DDP's wrapper, or the sharded model), what it
writes (`state`, `optimizer_state`), what it reads back on a resume (`restore`,
`restore_optimizer`), what validation decodes (`validated`) and what follows an update
(`after_update`); the trainer asks, never which part it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from cli.config import Config
from cli.runs import adapted
from cli.runs.checkpoint import check_trained_with, load_checkpoint
from cli.runs.model_dirs import resolve_checkpoint
from cli.runs.models import build_model, load_weights
from cli.runs.run_dir import RunDir
from cli.training import distributed, lora, shard
from cli.training.ema import WeightAverage
from cli.training.new_languages import grown_init
from data.tokenizer import Tokenizer

StateDict = dict[str, Tensor]


@dataclass
class Progress:
    """Counters that a checkpoint carries besides weights and optimiser."""

    step: int = 0
    elapsed: float = 0.0  # seconds of training wall time over all sessions of this run
    bad_steps: int = 0  # non-finite losses in a row
    best: float | None = None  # best validation metric so far
    evals_since_best: int = 0
    oom_splits: int = 0  # updates retried on smaller batches after running out of memory


def plain_model(config: Config, tokenizer: Tokenizer) -> nn.Module:
    """A new model of the run's shape, to hold a copy of its weights for validation. Its
    initial weights, overwritten, are drawn from a fork of the global generator: the dropout
    of the updates after a validation draws as if there had been none, as a resume from its
    checkpoint does."""
    with torch.random.fork_rng(devices=[]):
        return build_model(config, tokenizer)


class Weights:
    """Every weight of `model` trains; the checkpoint's "model" holds them all."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def of_record(self) -> nn.Module:
        """The weights saved as "model" and validated where no copy is made."""
        return self.model

    def state(self) -> tuple[StateDict, dict[str, Any]]:
        """The checkpoint's "model", and what this part keeps beside it."""
        return self.model.state_dict(), {}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def restore(self, ckpt: dict[str, Any], path: Path) -> None:
        """The trained weights of checkpoint `ckpt` (at `path`) into the model."""
        self.model.load_state_dict(ckpt.get("train_model", ckpt["model"]))

    def restore_optimizer(self, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any]) -> None:
        optimizer.load_state_dict(ckpt["optimizer"])

    def net(self, dd: distributed.Dist) -> nn.Module:
        """What the updates run: the model, under DDP when distributed."""
        if not dd.active:
            return self.model
        # The only buffers are the constant positional tables: nothing to broadcast each step.
        # Gradients as views of DDP's buckets save a gradient-sized copy.
        return DistributedDataParallel(
            self.model, broadcast_buffers=False, gradient_as_bucket_view=True
        )

    def validated(self) -> nn.Module | None:
        """What the main rank's validation decodes (every rank calls this; None where the
        rank decodes nothing)."""
        return self.of_record

    def after_update(self, step: int) -> None:
        """What follows optimizer update `step` (1 for the first)."""


class Sharded(Weights):
    """`model` sharded over the ranks (`cli.training.shard`): the checkpoint holds the full
    weights and the plain optimizer state, gathered to rank 0, and each rank reads back its
    shard of them; validation decodes a plain copy on rank 0 (`build` makes it)."""

    def __init__(self, model: nn.Module, build: Callable[[], nn.Module]) -> None:
        super().__init__(model)
        self.build = build

    def net(self, dd: distributed.Dist) -> nn.Module:
        return self.model  # each unit reduce-scatters its gradients itself: no DDP

    def state(self) -> tuple[StateDict, dict[str, Any]]:
        return shard.model_state(self.model), {}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return shard.optimizer_state(self.model, optimizer)

    def restore(self, ckpt: dict[str, Any], path: Path) -> None:
        shard.load_model_state(self.model, ckpt.get("train_model", ckpt["model"]))

    def restore_optimizer(self, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any]) -> None:
        shard.load_optimizer_state(self.model, optimizer, ckpt["optimizer"])

    def validated(self) -> nn.Module | None:
        # FSDP gathers a unit's weights only inside its forward: decoding on rank 0 alone
        # needs them whole, gathered by every rank into rank 0's plain copy.
        return shard.full_copy(self.model, self.build)


class Averaged(Weights):
    """An exponential moving average of the trained weights (`cli.training.ema`), the weights
    of record: saved as "model" and validated; the trained ones go under "train_model", which
    a resume continues (a run without an average starts one from its trained weights)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__(model)
        self.average = WeightAverage(model, decay)

    @property
    def of_record(self) -> nn.Module:
        return self.average.model

    def state(self) -> tuple[StateDict, dict[str, Any]]:
        trained = self.model.state_dict()
        return self.average.model.state_dict(), {"train_model": trained}

    def restore(self, ckpt: dict[str, Any], path: Path) -> None:
        super().restore(ckpt, path)
        self.average.model.load_state_dict(ckpt["model"])

    def after_update(self, step: int) -> None:
        self.average.update(step)


class Adapted(Weights):
    """A LoRA run's model (`cli.training.lora.adapt`): only `names` train (the adapters, the
    groups `train.trainable` names), over the base weights of RUN/base.pt, whose record
    (`base`) every checkpoint keeps. A matrix whose new languages' rows alone train keeps
    those rows and their moments ("rows"). Validation decodes the base with the adapters
    merged, as every command reads the checkpoint (`cli.runs.adapted.load_merged`)."""

    def __init__(
        self,
        model: nn.Module,
        names: list[str],
        base: dict[str, Any] | None,
        run: RunDir,
        config: Config,
        tokenizer: Tokenizer,
        dd: distributed.Dist,
        device: torch.device,
    ) -> None:
        super().__init__(model)
        self.names, self.base, self.run = names, base, run
        self.config, self.tokenizer, self.dist, self.device = config, tokenizer, dd, device
        # A plain copy to merge into, and base.pt's weights: made and read at the first
        # validation, kept for the next.
        self.copy: tuple[nn.Module, StateDict] | None = None

    @property
    def rows(self) -> dict[str, int]:
        """Where only the new languages' rows of a matrix train: its first such row, by name."""
        return lora.trained_rows(self.model, self.config, self.tokenizer)

    def state(self) -> tuple[StateDict, dict[str, Any]]:
        rows = self.rows
        kept = {"base": self.base, **({"rows": rows} if rows else {})}
        return lora.trained_state(self.model, self.names, rows), kept

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state, rows = optimizer.state_dict(), self.rows
        if rows:  # new languages' rows: those alone, and their moments
            names = shard.parameter_names(self.model, optimizer)
            state = lora.trained_moments(state, names, rows)
        return state

    def restore(self, ckpt: dict[str, Any], path: Path) -> None:
        """The base from RUN/base.pt (checked), the adapters over it."""
        adapted.load_adapted(self.model, ckpt, path)
        self.base = ckpt["base"]

    def restore_optimizer(self, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any]) -> None:
        state = ckpt["optimizer"]
        if ckpt.get("rows"):  # moments of the rows that trained: the others' are zero
            params = [p for group in optimizer.param_groups for p in group["params"]]
            names = shard.parameter_names(self.model, optimizer)
            state = lora.whole_moments(state, params, names, ckpt["rows"])
        optimizer.load_state_dict(state)

    def validated(self) -> nn.Module | None:
        """The model as every command decodes it: its base with the adapters merged, as
        `load_for_inference` merges them from a checkpoint (in float32 from RUN/base.pt, where
        the frozen weights trained held in bf16; `lora.merge_into`)."""
        if not self.dist.main:
            return None
        path = self.run.checkpoints / "last.pt"
        if self.copy is None:
            copy = plain_model(self.config, self.tokenizer).to(self.device)
            self.copy = (copy, adapted.base_weights({"base": self.base}, path))
        plain, base = self.copy
        return lora.merge_into(plain, self.model, base, path, self.names, self.rows, self.config)


# ------------------------------------------------------------------------ the first weights


def training_weights(
    model: nn.Module,
    config: Config,
    tokenizer: Tokenizer,
    run: RunDir,
    dd: distributed.Dist,
    device: torch.device,
    dtype: torch.dtype | None,
    start: str,
) -> Weights:
    """The part that trains `model` (built for the run's tokenizer), given its first weights
    where it starts from `train.init`, on `device`. `start`: "new", "restart" (a run killed
    before its first checkpoint, from update 0) or "resume" (whose weights `restore` gives)."""
    t = config.train
    if t.lora.rank:
        return adapted_weights(model, config, tokenizer, run, dd, device, dtype, start)
    if t.init and start != "resume":
        load_init(model, config, tokenizer, run)
    model.to(device)
    if t.shard:  # before the optimizer, which holds the shards; rank 0's weights broadcast
        distributed.agree(dd)
        shard.shard_model(model, t.shard, dd, device)
    if shard.is_sharded(model):
        return Sharded(model, lambda: plain_model(config, tokenizer))
    return Averaged(model, t.ema_decay) if t.ema_decay else Weights(model)


def adapted_weights(
    model: nn.Module,
    config: Config,
    tokenizer: Tokenizer,
    run: RunDir,
    dd: distributed.Dist,
    device: torch.device,
    dtype: torch.dtype | None,
    start: str,
) -> Adapted:
    """A LoRA run's part: its base weights (a restart's from its own RUN/base.pt, the init's
    as it first loaded them, wherever the init went; else `train.init`'s, kept in base.pt),
    then the adapters on the model, the rest frozen and held in `dtype`."""
    base = None
    if start == "restart" and run.base.is_file():
        base = load_kept_base(model, tokenizer, run, dd)
    elif start != "resume" and config.train.init:
        path, ckpt = load_init(model, config, tokenizer, run)
        if dd.main:  # the adapters' base, kept once
            new = bool(config.data.new_languages)  # its rows grown: written, not linked
            base = adapted.write_base(run.path, path, ckpt, model.state_dict(), link=not new)
        base = distributed.broadcast_object(dd, base)
    names = lora.adapt(model, config, tokenizer)  # the optimizer holds what trains
    model.to(device)
    lora.hold_frozen(model, dtype)  # (validation decodes a merged copy: `Adapted.validated`)
    return Adapted(model, names, base, run, config, tokenizer, dd, device)


def load_init(
    model: nn.Module, config: Config, tokenizer: Tokenizer, run: RunDir
) -> tuple[Path, dict[str, Any]]:
    """Fine-tuning: the weights of checkpoint `train.init`, whose embeddings must belong to
    this run's tokenizer (`with_init` chose it; this is where weights and vocabulary meet).
    Returns the checkpoint's path and dict (its weights grown for new languages)."""
    path = resolve_checkpoint(config.train.init)[0]
    ckpt = load_checkpoint(path, mmap=True)  # copied into the model: never held twice
    if config.data.new_languages:  # its rows and one more per new language
        ckpt = grown_init(ckpt, path, config, tokenizer)
    else:
        check_trained_with(ckpt, path, tokenizer, run.tokenizer)
    load_weights(model, ckpt, path)
    return path, ckpt


def load_kept_base(
    model: nn.Module, tokenizer: Tokenizer, run: RunDir, dd: distributed.Dist
) -> dict[str, Any] | None:
    """A LoRA run restarted: the weights of its RUN/base.pt (written whole when it first
    started: the init's as loaded, new languages' rows grown); returns its record."""
    path = run.base
    ckpt = load_checkpoint(path, mmap=True)
    check_trained_with(ckpt, path, tokenizer, run.tokenizer)
    load_weights(model, ckpt, path)
    return distributed.broadcast_object(dd, adapted.base_record(path) if dd.main else None)
