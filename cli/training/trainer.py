"""The training loop (paper section 5): label-smoothed cross-entropy, Adam with warmup, updates
of `update_freq` batches, validation, checkpoints, and the conditions that stop it.

One update = `update_freq` batches whose gradients are summed, the loss normalised by the real
target tokens of all of them (on all ranks), so accumulating k half-batches equals one update
on the whole batch. Everything that decides what happens next (weights, optimiser, schedule,
batch iterator position, every RNG) is in the checkpoint: a resumed run continues bit for bit.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import sys
import time
from collections.abc import Collection, Generator, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from cli.config import Config, DecodeConfig
from cli.device import autocast_dtype, configure_device, make_deterministic
from cli.inference.decoding import translate_ids
from cli.inference.requests import Guide
from cli.inference.scoring import score
from cli.training import distributed, lora, shard
from cli.training.checkpoint import (
    FORMAT,
    CheckpointError,
    build_model,
    load_checkpoint,
    load_weights,
    resolve_checkpoint,
    save_copies,
)
from cli.training.data import training_data
from cli.training.ema import WeightAverage
from cli.training.metrics import MetricsLog
from cli.training.new_languages import grown_init
from cli.training.optim import apply_settings, budget_used, build_optimizer
from cli.training.prefetch import Fetched, Prefetcher, training_batches
from cli.training.preflight import check_settings
from cli.training.run import RunDir, TrainingError, rng_state, set_rng_state
from data.batching import Batch
from data.errors import counted
from model.loss import IGNORE_INDEX

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Progress:
    """Counters that a checkpoint carries besides weights and optimiser."""

    step: int = 0
    elapsed: float = 0.0  # seconds of training wall time over all sessions of this run
    bad_steps: int = 0  # non-finite losses in a row
    best: float | None = None  # best validation metric so far
    evals_since_best: int = 0
    oom_splits: int = 0  # updates retried on smaller batches after running out of memory


def direction_scores(
    per_direction: dict[str, dict[str, Any]], watched: Collection[str] = ()
) -> dict[str, float]:
    """dev_bleu and dev_chrf: the mean over the directions, which early stopping and best.pt
    follow (a direction is not worth more for having more dev sentences), but for those
    `watched` (no corpus trains them: `DataConfig.watched_directions`), whose mean is
    watched_bleu; with several directions, each one's too, as dev_bleu/es-en."""
    followed = [way for way in per_direction if way not in watched]
    metrics = {}
    for name in ("bleu", "chrf"):
        for mean, ways in (("dev", followed), ("watched", list(watched))):
            if ways:
                metrics[f"{mean}_{name}"] = sum(per_direction[w][name] for w in ways) / len(ways)
        if len(per_direction) > 1:
            metrics.update({f"dev_{name}/{d}": s[name] for d, s in per_direction.items()})
    return metrics


def validation_decode(decode: DecodeConfig) -> DecodeConfig:
    """Greedy search, always: dev BLEU, early stopping and best.pt follow the model, never a
    random draw (a reverse model's config for back-translation may well set sampling)."""
    return replace(
        decode,
        beam_size=1,
        nbest=1,
        sampling_topk=0,
        sampling_topp=1.0,
        sampling_temperature=1.0,
    )


def batch_loss(net: torch.nn.Module, batch: Batch, label_smoothing: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and NLL of a batch: the output layer and the loss at the real
    target positions only, as one step inside `Transformer.forward` (DDP needs every parameter
    used under forward). What training computes, and what benchmarks/train_bench.py times."""
    return net(
        batch.src,
        batch.tgt_in,
        batch.src_pad_mask,
        batch.tgt_pad_mask,
        batch.tgt_index,
        batch.real_targets(IGNORE_INDEX),
        label_smoothing,
    )


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


class Trainer:
    """Holds the model, optimiser, data and run directory of one training session."""

    def __init__(
        self,
        config: Config,
        run: RunDir,
        dd: distributed.Dist,
        device: torch.device,
        resume: bool = False,
        restart: bool = False,
    ) -> None:
        """`restart`: the run in `run` was killed before its first checkpoint and starts again
        from update 0, its own copies of its init's tokenizer and (LoRA) weights standing in
        for the init's (`check_restart`), which may be gone."""
        self.config = config
        self.run = run
        self.dist, self.device = dd, device
        t = config.train
        check_settings(config, device)  # before the tokenizer and the data, not at step 500
        configure_device(device)
        if t.deterministic:
            make_deterministic(device)
        seed_everything(t.seed)
        # A restart keeps the run's copy of an adopted tokenizer (written whole, new language
        # tokens in it); one it trained is checked against its settings as at any start.
        own_tokenizer = resume or (restart and bool(config.data.tokenizer))
        with distributed.main_first(dd):  # one rank trains the tokenizer and fills the caches
            self.data = training_data(config, run.tokenizer, dd, own_tokenizer)
        self.tokenizer = self.data.tokenizer
        self.dtype = autocast_dtype(t.precision, self.device)
        self.prepare_model(resume, restart)
        # The weights of record: validated, saved as "model", translated.
        self.average = WeightAverage(self.model, t.ema_decay) if t.ema_decay else None
        # Read by the budget schedules; `clock` is the main rank's elapsed time (see update).
        self.progress, self.epochs, self.clock = Progress(), 0.0, 0.0
        self.optimizer, self.scheduler = build_optimizer(
            [p for p in self.model.parameters() if p.requires_grad],
            t,
            config.model.d_model,
            self.device,
            self.budget_used,
        )
        self.scaler = torch.amp.GradScaler(enabled=self.dtype == torch.float16)
        self.batch_stream: Prefetcher | Generator[Fetched, None, None] | None = None
        self.metrics: MetricsLog | None = None  # the main rank's (restore opens it on resume)
        try:
            self.start(resume)
            distributed.agree(dd)  # (DDP's first broadcast: every rank is ready for it)
            self.net = self.training_module()
        except BaseException:
            self.close()  # a prefetching thread started above
            raise
        self.stop_requested = False
        self.resumed = resume

    def prepare_model(self, resume: bool, restart: bool) -> None:
        """The model to train (`self.model`): built for the run's tokenizer, given its first
        weights (a fine-tune's), LoRA's adapters, then sharded if asked."""
        t = self.config.train
        self.model = build_model(self.config, self.tokenizer).to(self.device)
        self.base: dict[str, str] | None = None  # a LoRA run's base.pt record
        # A LoRA run's validation: a plain copy to merge into, and base.pt's weights.
        self.validation_copy: tuple[torch.nn.Module, dict[str, Tensor]] | None = None
        if t.init and not resume:
            self.load_starting_weights(restart)
        # LoRA: adapters on the model, the rest frozen; the optimizer holds what trains.
        self.trained = lora.adapt(self.model, self.config, self.tokenizer) if t.lora.rank else []
        self.model.to(self.device)
        if t.shard:  # before the optimizer, which holds the shards; rank 0's weights broadcast
            distributed.agree(self.dist)
            shard.shard_model(self.model, t.shard, self.dist, self.device)
        if t.lora.rank:  # (validation decodes a merged copy: `validated_model`)
            lora.hold_frozen(self.model, self.dtype)

    def start(self, resume: bool) -> None:
        """The state to train on from: the last checkpoint's, or a new run's first batches."""
        if resume:
            self.restore(self.run.checkpoints / "last.pt")
            return
        self.open_metrics(None)
        self.start_batches()
        # Dropout differs between ranks; the initial weights do not (DDP broadcasts rank 0's).
        torch.manual_seed(self.config.train.seed + self.dist.rank)

    def load_starting_weights(self, restart: bool) -> None:
        """A fine-tune's first weights: a LoRA run restarted before its first checkpoint takes
        its own base.pt, the init's weights as it first loaded them (the init may be gone);
        any other start, `train.init`'s checkpoint."""
        t = self.config.train
        if restart and t.lora.rank and self.run.base.is_file():
            self.load_kept_base()
        else:
            self.load_init_weights(t.init)

    @property
    def rows(self) -> dict[str, int]:
        """Where only the new languages' rows of a matrix train: its first such row, by name."""
        if not self.config.train.lora.rank:
            return {}
        return lora.trained_rows(self.model, self.config, self.tokenizer)

    def load_init_weights(self, init: str) -> None:
        """Fine-tuning: the weights of checkpoint `init`, whose embeddings must belong to this
        run's tokenizer (`with_init` chose it; this is where weights and vocabulary meet)."""
        path = resolve_checkpoint(init)[0]
        ckpt = load_checkpoint(path, mmap=True)  # copied into the model: never held twice
        new = bool(self.config.data.new_languages)
        if new:  # its rows and one more per new language (data.new_languages)
            ckpt = grown_init(ckpt, path, self.config, self.tokenizer)
        elif ckpt.get("tokenizer_digest") not in (None, *self.tokenizer.digests()):
            raise CheckpointError(
                f"{path}: was trained with another tokenizer than {self.run.tokenizer}"
            )
        load_weights(self.model, ckpt, path)
        if self.config.train.lora.rank and self.dist.main:  # the adapters' base, kept once
            weights = self.model.state_dict()
            self.base = lora.write_base(self.run.path, path, ckpt, weights, link=not new)
        if self.config.train.lora.rank:
            self.base = distributed.broadcast_object(self.dist, self.base)

    def load_kept_base(self) -> None:
        """A LoRA run restarted: the weights of its RUN/base.pt (written whole when it first
        started: the init's as loaded, new languages' rows grown), wherever its init went."""
        path = self.run.base
        ckpt = load_checkpoint(path, mmap=True)
        if ckpt.get("tokenizer_digest") not in (None, *self.tokenizer.digests()):
            raise CheckpointError(
                f"{path}: was trained with another tokenizer than {self.run.tokenizer}"
            )
        load_weights(self.model, ckpt, path)
        if self.dist.main:
            self.base = lora.base_record(path)
        self.base = distributed.broadcast_object(self.dist, self.base)

    def training_module(self) -> torch.nn.Module:
        """What the updates run: the model, under DDP when distributed, compiled if asked."""
        net: torch.nn.Module = self.model
        if self.dist.active and not shard.is_sharded(self.model):
            # The only buffers are the constant positional tables: nothing to broadcast each step.
            # Gradients as views of DDP's buckets save a gradient-sized copy.
            net = DistributedDataParallel(
                self.model, broadcast_buffers=False, gradient_as_bucket_view=True
            )
        if self.config.train.compile:
            net = torch.compile(net)
        return net

    def open_metrics(self, resumed_at: int | None) -> None:
        if self.dist.main:
            self.metrics = MetricsLog(self.run.path, self.config.train.tensorboard, resumed_at)

    def close(self) -> None:
        """Stop the batch stream and close the metrics' event files."""
        self.stop_batches()
        if self.metrics is not None:
            self.metrics.close()

    def stop_batches(self) -> None:
        """Stop the batch stream: on a GPU its thread, which holds the training iterator (its
        Arrow tables) and pinned batches, would otherwise outlive the trainer."""
        if self.batch_stream is not None:
            self.batch_stream.close()
            self.batch_stream = None

    # -- checkpoints

    def state(self) -> dict[str, Any]:
        p = self.progress
        # "model" is what inference, export and `train.init` read; with a weight average on,
        # the trained weights go under "train_model" for a resume.
        trained = {"train_model": self.model.state_dict()} if self.average else {}
        optimizer = shard.optimizer_state(self.model, self.optimizer)
        if self.base:  # a LoRA run keeps what trains, and the record of its base
            trained = {"base": self.base}
        rows = self.rows
        if self.base and rows:  # new languages' rows: those alone, and their moments
            trained["rows"] = rows
            names = shard.parameter_names(self.model, self.optimizer)
            optimizer = lora.trained_moments(optimizer, names, rows)
        weights = (
            lora.trained_state(self.model, self.trained, rows)
            if self.base
            else shard.model_state(self.model_of_record)
        )
        return {
            "format": FORMAT,
            "model": weights,
            **trained,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": p.step,
            "epoch": round(self.epochs_done(), 3),
            # Per rank, in rank order: where its share of the batches stands, and its RNGs.
            "ranks": distributed.gather_to_main(
                self.dist, {"iterator": self.iterator_state, "rng": rng_state(self.device)}
            ),
            "progress": asdict(p),
            "config": self.config.to_dict(),
            "tokenizer_digest": self.tokenizer.digest(),
            "corpora": self.data.digests,
            "world_size": self.dist.world_size,
        }

    def save(self, names: list[str]) -> None:
        """Write the state under each name in checkpoints/ (only the main rank writes), in order:
        last.pt comes first, so a step_N.pt on disk means last.pt is at least as new."""
        # Every rank checks (DDP keeps the weights equal) and all stop together if one must.
        finite = all(
            torch.isfinite(shard.local(v)).all()
            for v in self.model.state_dict().values()
            if v.is_floating_point()
        )
        if distributed.any_rank(self.dist, not finite, self.device):
            raise TrainingError("the weights hold NaN or inf; no checkpoint was written")
        state = self.state()  # every rank takes part: the per-rank states are gathered
        if not self.dist.main:
            return
        save_copies(state, [self.run.checkpoints / name for name in names])
        self.prune_step_checkpoints()

    def prune_step_checkpoints(self) -> None:
        steps = self.run.step_checkpoints()
        for old in steps[: max(0, len(steps) - self.config.train.keep_last)]:
            old.unlink(missing_ok=True)

    def restore(self, path: Path) -> None:
        """Continue from the checkpoint at `path`, with this session's config."""
        # Loaded to the CPU: the RNG states must stay CPU byte tensors (a CUDA map_location makes
        # torch.set_rng_state refuse them); weights and optimiser state are copied to the
        # parameters' device by load_state_dict.
        ckpt = load_checkpoint(path, map_location="cpu")
        if "optimizer" not in ckpt:  # `tf import`'s step 0: weights, nothing to continue
            raise TrainingError(
                f"{path}: an imported model, not a training run to resume; fine-tune it with "
                f"tf train configs/finetune.yaml --init {self.run.path} --out NEW_RUN"
            )
        self.check_world_size(ckpt, path)
        if ckpt.get("tokenizer_digest") not in self.tokenizer.digests():
            raise TrainingError(
                f"{path}: was trained with another tokenizer than {self.run.tokenizer}"
            )
        check_same_corpora(ckpt.get("corpora"), self.data.digests, path)
        lora.check_resume(ckpt, self.config, path)
        if "base" in ckpt:  # the base from RUN/base.pt (checked), the adapters over it
            lora.load_adapted(self.model, ckpt, path)
            self.base = ckpt["base"]
        else:
            shard.load_model_state(self.model, ckpt.get("train_model", ckpt["model"]))
        if self.average:  # a run without one starts its average from the trained weights
            self.average.model.load_state_dict(ckpt["model"])
        optimizer = ckpt["optimizer"]
        if ckpt.get("rows"):  # moments of the rows that trained: the others' are zero
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            names = shard.parameter_names(self.model, self.optimizer)
            optimizer = lora.whole_moments(optimizer, params, names, ckpt["rows"])
        shard.load_optimizer_state(self.model, self.optimizer, optimizer)
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.progress = Progress(**ckpt["progress"])  # the budget schedules read it
        self.clock = self.progress.elapsed
        apply_settings(
            self.optimizer,
            self.scheduler,
            self.config.train,
            self.config.model.d_model,
            self.budget_used,
        )
        if self.scaler.is_enabled() and ckpt["scaler"]:  # empty when the run was not fp16
            self.scaler.load_state_dict(ckpt["scaler"])
        ranks = ckpt["ranks"]
        try:  # every rank had taken as many batches: rank 0's place is every rank's
            self.data.train.load_state_dict(ranks[0]["iterator"])
        except ValueError as e:
            raise TrainingError(f"{path}: cannot continue its batches: {e}") from None
        if self.dist.rank < len(ranks):
            set_rng_state(ranks[self.dist.rank]["rng"], self.device)
        else:  # a rank the run did not have: its dropout draws a stream of its own
            torch.manual_seed(self.config.train.seed + self.dist.rank + ckpt["step"])
        self.start_batches()
        self.open_metrics(ckpt["step"])
        log.info("resumed from %s at step %d", path, ckpt["step"])

    def check_world_size(self, ckpt: dict[str, Any], path: Path) -> None:
        """A run resumes in another number of processes where its updates take the same
        batches: N ranks x update_freq F continue as M ranks x (N x F / M). The weights and the
        optimiser's state are whole in every checkpoint (sharded or not); the batches are one
        plan, cut for N x F batches an update (`BatchIterator.load_state_dict`)."""
        saved, now = ckpt.get("world_size", 1), self.dist.world_size
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
        if now * self.config.train.update_freq != per_update:
            raise TrainingError(
                f"{written}; in {counted(now, 'process', 'processes')} resume with --set "
                f"train.update_freq={per_update // now} --allow-config-change to take the "
                "same batches"
            )
        log.info("resuming the run of %s in %d", counted(saved, "process", "processes"), now)

    # -- one update

    def loss_of(self, batch: Batch, net: torch.nn.Module | None = None) -> tuple[Tensor, Tensor]:
        """Summed smoothed loss and NLL of a batch, computed by `net` (default: the training
        wrapper, DDP's when distributed) in the run's precision."""
        net = net or self.net
        ctx = torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else nullcontext()
        with ctx:
            return batch_loss(net, batch, self.config.train.label_smoothing)

    def start_batches(self) -> None:
        """Stream the training batches from where the iterator stands now."""
        it = self.data.train
        # Where the batches consumed so far leave the iterator (a prefetching thread runs ahead).
        try:  # (its first epoch is planned here)
            self.iterator_state = it.state_dict()
        except ValueError as e:  # fewer pairs than ranks
            raise TrainingError(f"data.train: {e}") from None
        self.epochs = it.epoch + it.position / len(it)
        self.stop_batches()  # a stream started before (a restore after start) stops first
        self.batch_stream = training_batches(it, prefetch=self.device.type == "cuda")

    def next_batches(self) -> list[Batch]:
        """The `update_freq` batches of the next update, crossing into the next epoch as needed,
        on the device (asynchronously from pinned memory on a GPU)."""
        batches = []
        for _ in range(self.config.train.update_freq):
            fetched = next(self.batch_stream)
            self.iterator_state, self.epochs = fetched.state, fetched.epochs
            batches.append(fetched.batch.to(self.device, non_blocking=True))
        return batches

    def update(self, batches: list[Batch], stop: bool = False) -> dict[str, Any]:
        """One optimiser update over `batches` (gradients summed).

        Out of memory in a forward or backward pass, the gradients are computed again over each
        batch cut in halves (the loss is a sum over a constant divisor, so the update is the
        same), until they fit or a batch is one sentence. Under DDP a rank cannot redo its part
        of a collective alone: there the error stops the run, from its last checkpoint.

        What follows the backward passes (GradScaler's unscale_, the norm, Adam's step, which
        allocates its two moments on the first update) needs memory for the weights, not for
        the batch: out of memory there is an error, never a retry, which would also unscale the
        optimiser's gradients a second time.

        Returns:
            what `optimizer_step` returns.
        """
        while True:
            try:
                sums = self.accumulate_gradients(batches)
                break
            except torch.OutOfMemoryError:
                batches = self.halve_after_out_of_memory(batches)
        try:
            return self.optimizer_step(batches, sums, stop)
        except torch.OutOfMemoryError:
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(
                f"step {self.progress.step + 1}: out of memory in the optimiser step (the "
                "weights, their gradients and Adam's two moments), which smaller batches do not "
                "shrink; train a smaller model or on a device with more free memory"
            ) from None

    def halve_after_out_of_memory(self, batches: list[Batch]) -> list[Batch]:
        """The batches of an update that ran out of memory in a forward or backward pass, each
        cut in halves; an error where that cannot help."""
        self.optimizer.zero_grad(set_to_none=True)  # a half-done backward's gradients
        if self.dist.active:
            raise TrainingError(
                f"step {self.progress.step + 1}: out of memory under torchrun; resume "
                "with a lower train.max_tokens (and a higher train.update_freq)"
            ) from None
        if all(b.src.size(0) == 1 for b in batches):
            raise TrainingError(
                f"step {self.progress.step + 1}: out of memory on a single sentence; "
                "lower data.max_len"
            ) from None
        batches = [half for b in batches for half in b.halves() if half.src.size(0)]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.progress.oom_splits += 1
        log.warning(
            "step %d: out of memory; retrying as %d smaller batches (%d splits so far)",
            self.progress.step + 1,
            len(batches),
            self.progress.oom_splits,
        )
        return batches

    @property
    def loss_divisor(self) -> int:
        """Backward runs on loss / (a constant, the same on every rank), which keeps fp16
        gradients in range; `optimizer_step` applies the exact per-token mean once the token
        count of all ranks is known."""
        return self.config.train.max_tokens * self.config.train.update_freq

    def accumulate_gradients(self, batches: list[Batch]) -> Tensor:
        """Forward and backward passes over `batches`, gradients summed (all-reduced under DDP
        on the last one); returns the summed smoothed loss and NLL, on the device. Shape: (2,)."""
        sums = torch.zeros(2, device=self.device)
        self.net.train()
        for i, batch in enumerate(batches):
            sync = i == len(batches) - 1  # all-reduce only on the last micro-batch
            keep = self.dist.active and not sync  # gradients kept here: DDP's or FSDP's no_sync
            with shard.no_sync(self.net, self.model) if keep else nullcontext():
                loss, nll = self.loss_of(batch)
                self.scaler.scale(loss / self.loss_divisor).backward()
            sums += torch.stack([loss.detach(), nll.detach()])
        return sums

    def optimizer_step(self, batches: list[Batch], sums: Tensor, stop: bool) -> dict[str, Any]:
        """The optimiser step over the gradients of `batches`, whose summed losses are `sums`.

        The loss is the mean over the real target tokens of all the batches on all ranks. The
        token count, the losses, the gradient norm and `stop` (this rank wants to stop) travel
        in one collective and reach the host together: one wait for the device per update.

        Returns:
            {"loss", "nll", "tokens", "stop"}: "stop" is true if any rank wanted to stop. If
            the loss or the gradient is not finite, nothing changes but a lower fp16 loss scale,
            and the result is {"skipped", "stop"}, "skipped" being "overflow" (fp16 gradients
            past the loss scale: routine, GradScaler's own remedy) or "non-finite".
        """
        t = self.config.train
        # The main rank's clock goes along (others add 0): every rank, one time-budgeted lr.
        clock = self.progress.elapsed if self.dist.main else 0.0
        counts = [sum(b.n_tgt_tokens for b in batches), float(stop), clock]
        stats = distributed.sum_with_counts(self.dist, sums, counts)  # (5,) on the device
        self.scaler.unscale_(self.optimizer)  # fp16 only; records inf gradients for update()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = shard.replicated(torch.nn.utils.get_total_norm(grads))  # the same on all ranks
        loss_sum, nll_sum, tokens, stops, self.clock, raw_norm = torch.cat(
            [stats, grad_norm[None].to(stats)]
        ).tolist()
        # DDP averaged the ranks' gradients of loss / divisor: this makes them the gradient of
        # the summed loss over the summed tokens.
        scale = self.dist.world_size * self.loss_divisor / tokens
        grad_norm = raw_norm * scale
        if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
            # A NaN gradient with a finite loss would turn every weight into NaN through
            # clipping or Adam: skipped like a NaN loss.
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()  # fp16: a lower loss scale next time
            overflow = self.scaler.is_enabled() and math.isfinite(loss_sum)
            return {"skipped": "overflow" if overflow else "non-finite", "stop": stops > 0}
        if t.clip_norm > 0:  # as clip_grad_norm_, folded into the one pass over the gradients
            scale *= min(1.0, t.clip_norm / (grad_norm + 1e-6))
        self.apply_gradients(grads, scale)
        return {
            "loss": loss_sum / tokens,
            "nll": nll_sum / tokens,
            "tokens": int(tokens),
            "stop": stops > 0,
        }

    def apply_gradients(self, grads: list[Tensor], scale: float) -> None:
        """Scale the (checked, finite) gradients, take the optimiser and schedule step, fold the
        new weights into the average."""
        torch._foreach_mul_(grads, scale)
        self.hold_start_row()
        self.optimizer.step()  # gradients checked before, so GradScaler.step's check is not needed
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average:
            self.average.update(self.progress.step + 1)

    def hold_start_row(self) -> None:
        """A decoder that starts from pad (`model.decoder_start`) starts from that row of the
        target embeddings, zero from the start (Marian's decoder starts from a zero vector,
        which CTranslate2's converter assumes): no gradient reaches it, so it stays zero. A
        tied output layer would give it the pad logit's, which this drops."""
        if self.config.model.decoder_start != "pad":
            return
        weight = self.model.tgt_embed.token.weight
        if weight.grad is not None:
            shard.zero_row(weight.grad, self.model.pad_id)

    # -- validation

    @property
    def model_of_record(self) -> torch.nn.Module:
        """The weights validated and saved as "model": the average if there is one."""
        return self.average.model if self.average else self.model

    def plain_model(self) -> torch.nn.Module:
        """A new model of this run's shape (`shard.full_copy` fills it for validation). Its
        initial weights, overwritten, are drawn from a fork of the global generator: the
        dropout of the updates after a validation draws as if there had been none, as a
        resume from its checkpoint does."""
        with torch.random.fork_rng(devices=[]):
            return build_model(self.config, self.tokenizer)

    def validated_model(self) -> torch.nn.Module | None:
        """What validation decodes where it is not the model of record: a LoRA run's model as
        every command decodes it, its base with the adapters merged, as `load_for_inference`
        merges them from a checkpoint (in float32 from RUN/base.pt, where the frozen weights
        trained held in bf16; `lora.merge_into`). The copy it merges into and base.pt's
        weights are made and read once, at the first validation. None otherwise."""
        if not self.base:
            return None
        path = self.run.checkpoints / "last.pt"
        if self.validation_copy is None:
            self.validation_copy = (
                self.plain_model().to(self.device),
                lora.base_weights({"base": self.base}, path),
            )
        plain, base = self.validation_copy
        names, rows = self.trained, self.rows
        return lora.merge_into(plain, self.model, base, path, names, rows, self.config)

    @torch.no_grad()
    def validate(self, model: torch.nn.Module | None = None) -> dict[str, float]:
        """Dev loss/perplexity over the dev sets, BLEU/chrF of greedy decoding of a subset of
        each direction's, of `model` (default: the model of record); the watched directions'
        apart (their loss and mean as watched_*: `direction_scores`)."""
        model = model or self.model_of_record
        model.eval()
        per_set = {}
        for dev in self.data.dev_sets:
            # A decoder that writes the target language first is made to, as `tf translate`.
            guides = [Guide(forced=tuple(dev.forced))] * len(dev.src_ids) if dev.forced else None
            decode = validation_decode(self.config.decode)
            hyps = translate_ids(
                model, self.tokenizer, dev.src_ids, decode, self.device, guides=guides
            )
            texts = self.tokenizer.decode_tgt([h[0].tokens for h in hyps])
            per_set[dev.name] = score(texts, dev.refs)
        watched = [dev.name for dev in self.data.dev_sets if dev.watched]
        metrics = {
            **self.mean_loss(model, self.data.dev_batches, "dev"),
            **direction_scores(per_set, watched),
        }
        if self.data.watched_batches:
            metrics.update(self.mean_loss(model, self.data.watched_batches, "watched"))
        self.model.train()
        return metrics

    def mean_loss(self, model: torch.nn.Module, batches: list[Batch], name: str) -> dict:
        """NAME_loss, NAME_nll, NAME_ppl: per target token of `batches`."""
        sums = torch.zeros(2, device=self.device)  # smoothed loss, NLL
        tokens = 0
        for batch in batches:
            batch = batch.to(self.device)
            sums += torch.stack(self.loss_of(batch, model))
            tokens += batch.n_tgt_tokens
        loss, nll = sums.tolist()
        return {
            f"{name}_loss": loss / tokens,
            f"{name}_nll": nll / tokens,
            f"{name}_ppl": math.exp(min(nll / tokens, 50)),
        }

    # -- the loop

    def epochs_done(self) -> float:
        """Training epochs completed, with the fraction of the current one."""
        return self.epochs

    def budget_used(self, step: int) -> float:
        """The fraction of the budget update `step` finds spent (for the linear and cosine
        schedules), by the main rank's clock as the previous update left it."""
        return budget_used(self.config.train, step, self.clock, self.epochs_done())

    def budget_spent(self) -> str | None:
        """max_steps or max_epochs reached: the same answer on every rank at the same step."""
        t, p = self.config.train, self.progress
        if t.max_steps and p.step >= t.max_steps:
            return "max_steps"
        if t.max_epochs and self.epochs_done() >= t.max_epochs:
            return "max_epochs"
        return None

    def stop_wanted(self) -> str | None:
        """A reason this rank alone may see (a signal, its clock, the main rank's validation):
        under DDP it travels to the others with the next update's collective."""
        t, p = self.config.train, self.progress
        if self.stop_requested:
            return "signal"
        if t.max_time and p.elapsed >= t.max_time:
            return "max_time"
        if t.patience and p.evals_since_best >= t.patience:
            return "early_stop"
        return None

    def record_validation(self, metrics: dict[str, float]) -> bool:
        """Update best/patience from a validation; True if it is the best so far."""
        t, p = self.config.train, self.progress
        value = metrics[
            "dev_loss" if t.early_stop_metric == "loss" else f"dev_{t.early_stop_metric}"
        ]
        sign = -1.0 if t.early_stop_metric == "loss" else 1.0  # higher is better after the sign
        if p.best is None or sign * value > sign * p.best:
            p.best, p.evals_since_best = value, 0
            return True
        p.evals_since_best += 1
        return False

    def fit(self) -> str:
        """Train until a stopping condition; returns why it stopped."""
        t, p = self.config.train, self.progress
        bar = self.progress_bar()
        window = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "updates": 0, "time": 0.0}
        # Wall time, validation and checkpoints included, summed over resumed sessions.
        session_start, earlier = time.perf_counter(), p.elapsed
        if t.eval_on_start and not self.resumed:  # e.g. a pretrained model's, before any update
            self.evaluate_and_save()
        while not (reason := self.budget_spent()):
            wanted = self.stop_wanted()
            if wanted and not self.dist.active:
                reason = wanted
                break
            start = time.perf_counter()
            result = self.update(self.next_batches(), stop=wanted is not None)
            took = time.perf_counter() - start
            p.elapsed = earlier + time.perf_counter() - session_start
            if "skipped" in result:
                self.count_skipped(result["skipped"])
            else:
                self.record_update(result, took, window, bar)
            if result["stop"]:  # this rank or another wanted to stop: all stop after this update
                reason = wanted or "another rank stopped"
                break
        if window["updates"]:
            self.log_window(window)
        if reason != "signal" and (not t.eval_every or p.step % t.eval_every):
            self.evaluate_and_save()
        else:
            self.save(["last.pt"])
        if bar is not None:
            bar.close()
        return reason

    def count_skipped(self, why: str) -> None:
        """Log an update that was skipped; stop after `max_bad_steps` non-finite ones in a row."""
        p = self.progress
        if why == "overflow":
            log.debug("step %d: fp16 gradient overflow, loss scale lowered", p.step + 1)
            return
        p.bad_steps += 1
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row)",
            p.step + 1,
            p.bad_steps,
        )
        if p.bad_steps >= self.config.train.max_bad_steps:
            raise TrainingError(
                f"{p.bad_steps} non-finite losses in a row at step "
                f"{p.step + 1}; lower train.lr or use train.precision=fp32 "
                f"(last good checkpoint: {self.run.checkpoints / 'last.pt'})"
            )

    def record_update(self, result: dict[str, Any], took: float, window: dict, bar) -> None:
        """Count an update: the progress bar, the metrics window, validation and checkpoints."""
        t, p = self.config.train, self.progress
        p.bad_steps = 0
        p.step += 1
        for k in ("loss", "nll", "tokens"):
            window[k] += result[k] * (result["tokens"] if k != "tokens" else 1)
        window["updates"] += 1
        window["time"] += took
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                loss=f"{result['loss']:.3f}",
                lr=f"{self.lr():.2e}",
                tok_s=f"{result['tokens'] / took:.0f}",
                refresh=False,
            )
        if p.step % t.log_every == 0:
            record = self.log_window(window)
            if self.dist.main and (bar is None or bar.disable):  # no terminal: a log line
                log.info(
                    "step %d: loss %.3f  nll %.3f  lr %.2e  %.0f tokens/s",
                    p.step,
                    record["loss"],
                    record["nll"],
                    record["lr"],
                    record["tokens_per_s"],
                )
        if t.eval_every and p.step % t.eval_every == 0:
            self.evaluate_and_save()
        elif t.save_every and p.step % t.save_every == 0:
            self.save(["last.pt", f"step_{p.step}.pt"])

    def evaluate_and_save(self) -> None:
        """Validate on the main rank, log it, save last.pt (and best.pt, step_N.pt)."""
        p, t = self.progress, self.config.train
        best = False
        # Sharded: every rank gathers the weights into rank 0's plain copy, which decodes.
        full = shard.full_copy(self.model, self.plain_model)
        if self.dist.main:  # the others wait in the next collective; early stopping reaches
            # them with the stop flag of the next update
            metrics = self.validate(full if full is not None else self.validated_model())
            best = self.record_validation(metrics)
            record = {"step": p.step, "epoch": round(self.epochs_done(), 3), **metrics}
            if self.metrics is not None:
                full = {**record, "best": p.best, "wall": round(p.elapsed, 1)}
                self.metrics.write(full, scalars=metrics)
            log.info("step %d: %s", p.step, "  ".join(f"{k} {v:.2f}" for k, v in metrics.items()))
        names = ["last.pt"] + (["best.pt"] if best else [])
        if t.save_every and p.step and p.step % t.save_every == 0:
            names.append(f"step_{p.step}.pt")
        self.save(names)

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def log_window(self, window: dict[str, float]) -> dict[str, Any]:
        """Write the averages of the updates since the last log line, reset the window."""
        p = self.progress
        tokens = window["tokens"]
        record = {
            "step": p.step,
            "epoch": round(self.epochs_done(), 3),
            "loss": window["loss"] / tokens,
            "nll": window["nll"] / tokens,
            "ppl": math.exp(min(window["nll"] / tokens, 50)),
            "lr": self.lr(),
            "tokens_per_s": tokens / window["time"],
            "wall": round(p.elapsed, 1),
        }
        if self.metrics is not None:
            self.metrics.write(record, scalars=[k for k in record if k not in ("step", "wall")])
        for k in window:
            window[k] = 0 if k == "updates" else 0.0
        return record

    def progress_bar(self):
        if not self.dist.main:
            return None
        from tqdm import tqdm

        t = self.config.train
        return tqdm(
            total=t.max_steps or None,
            initial=self.progress.step,
            unit="step",
            desc="train",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None,
        )  # None: off when stderr is no terminal

    @contextmanager
    def signals_stop(self) -> Iterator[None]:
        """Inside the block SIGINT/SIGTERM finish the current update, save last.pt and exit
        cleanly; the previous handlers come back after it (they would keep the trainer alive)."""

        def request_stop(signum, frame):
            if self.stop_requested:  # a second signal: stop now
                raise KeyboardInterrupt
            log.warning("%s: saving a checkpoint, then stopping", signal.Signals(signum).name)
            self.stop_requested = True

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, signal.SIG_DFL if handler is None else handler)
