"""The training loop (paper section 5): label-smoothed cross-entropy, Adam with warmup, updates
of `update_freq` batches, validation, checkpoints, and the conditions that stop it.

One update = `update_freq` batches whose gradients are summed, the loss normalised by the real
target tokens of all of them (on all ranks), so accumulating k half-batches equals one update
on the whole batch. Everything that decides what happens next (weights, optimiser, schedule,
batch iterator position, every RNG) is in the checkpoint: a resumed run continues bit for bit.

What the weights contribute to it (full, sharded, averaged, LoRA-adapted) is their part's
(`cli.training.state`); validation, the stop rules, out-of-memory retries and the training log
are modules of their own.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Generator
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cli.config import Config
from cli.device import autocast_dtype, configure_device, make_deterministic
from cli.runs.checkpoint import checkpoint_dict, load_checkpoint, save_copies
from cli.runs.models import build_model
from cli.runs.run_dir import RunDir
from cli.training import distributed, out_of_memory, shard, stopping, validation
from cli.training.data import training_data
from cli.training.metrics import MetricsLog, TrainingLog, report_validation
from cli.training.optim import apply_settings, budget_used, build_optimizer
from cli.training.prefetch import Fetched, Prefetcher, training_batches
from cli.training.preflight import check_settings
from cli.training.run import TrainingError, check_resumable, rng_state, set_rng_state
from cli.training.state import Progress, training_weights
from data.batching import Batch
from model.loss import IGNORE_INDEX

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


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
        # The model to train, given its first weights (a fine-tune's) by the part that trains it.
        self.model = build_model(config, self.tokenizer).to(device)
        start = "resume" if resume else "restart" if restart else "new"
        self.weights = training_weights(
            self.model, config, self.tokenizer, run, dd, device, self.dtype, start
        )
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
        self.signals = stopping.Signals()
        self.resumed = resume

    def start(self, resume: bool) -> None:
        """The state to train on from: the last checkpoint's, or a new run's first batches."""
        if resume:
            self.restore(self.run.checkpoints / "last.pt")
            return
        self.open_metrics(None)
        self.start_batches()
        # Dropout differs between ranks; the initial weights do not (DDP broadcasts rank 0's).
        torch.manual_seed(self.config.train.seed + self.dist.rank)

    def training_module(self) -> torch.nn.Module:
        """What the updates run: the model, under DDP when distributed, compiled if asked."""
        net = self.weights.net(self.dist)
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
        """The checkpoint of this moment (every rank takes part: sharded weights and the
        per-rank states are gathered to the main rank)."""
        p = self.progress
        optimizer = self.weights.optimizer_state(self.optimizer)
        weights, kept = self.weights.state()
        return checkpoint_dict(
            weights,
            self.config.to_dict(),
            self.tokenizer.digest(),
            p.step,
            **kept,
            optimizer=optimizer,
            scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            epoch=round(self.epochs, 3),
            # Per rank, in rank order: where its share of the batches stands, and its RNGs.
            ranks=distributed.gather_to_main(
                self.dist, {"iterator": self.iterator_state, "rng": rng_state(self.device)}
            ),
            progress=asdict(p),
            corpora=self.data.digests,
            world_size=self.dist.world_size,
        )

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
        steps = self.run.step_checkpoints()  # the newest `keep_last` stay
        for old in steps[: max(0, len(steps) - self.config.train.keep_last)]:
            old.unlink(missing_ok=True)

    def restore(self, path: Path) -> None:
        """Continue from the checkpoint at `path`, with this session's config."""
        # Loaded to the CPU: the RNG states must stay CPU byte tensors (a CUDA map_location makes
        # torch.set_rng_state refuse them); weights and optimiser state are copied to the
        # parameters' device by load_state_dict.
        ckpt = load_checkpoint(path, map_location="cpu")
        config, dd = self.config, self.dist
        world_size, digests = dd.world_size, self.data.digests
        check_resumable(ckpt, path, self.run, config, world_size, self.tokenizer, digests)
        self.weights.restore(ckpt, path)
        self.weights.restore_optimizer(self.optimizer, ckpt)
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.progress = Progress(**ckpt["progress"])  # the budget schedules read it
        self.clock = self.progress.elapsed
        d_model = config.model.d_model
        apply_settings(self.optimizer, self.scheduler, config.train, d_model, self.budget_used)
        if self.scaler.is_enabled() and ckpt["scaler"]:  # empty when the run was not fp16
            self.scaler.load_state_dict(ckpt["scaler"])
        ranks = ckpt["ranks"]
        try:  # every rank had taken as many batches: rank 0's place is every rank's
            self.data.train.load_state_dict(ranks[0]["iterator"])
        except ValueError as e:
            raise TrainingError(f"{path}: cannot continue its batches: {e}") from None
        if dd.rank < len(ranks):
            set_rng_state(ranks[dd.rank]["rng"], self.device)
        else:  # a rank the run did not have: its dropout draws a stream of its own
            torch.manual_seed(config.train.seed + dd.rank + ckpt["step"])
        self.start_batches()
        self.open_metrics(ckpt["step"])
        log.info("resumed from %s at step %d", path, ckpt["step"])

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
        batch cut in halves (`out_of_memory.halved`). What follows the backward passes
        (GradScaler's unscale_, the norm, Adam's step, which allocates its two moments on the
        first update) needs memory for the weights, not for the batch: out of memory there is
        an error, never a retry, which would also unscale the optimiser's gradients a second
        time.

        Returns:
            what `optimizer_step` returns.
        """
        while True:
            try:
                sums = self.accumulate_gradients(batches)
                break
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)  # a half-done backward's gradients
                batches = out_of_memory.halved(batches, self.progress, self.dist, self.device)
        try:
            return self.optimizer_step(batches, sums, stop)
        except torch.OutOfMemoryError:
            self.optimizer.zero_grad(set_to_none=True)
            raise out_of_memory.in_optimizer_step(self.progress) from None

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
        """Scale the (checked, finite) gradients, take the optimiser and schedule step, and
        let the weights' part follow it (an average folds the new weights in)."""
        torch._foreach_mul_(grads, scale)
        self.hold_start_row()
        self.optimizer.step()  # gradients checked before, so GradScaler.step's check is not needed
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.weights.after_update(self.progress.step + 1)

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

    def validate(self, model: torch.nn.Module | None = None) -> dict[str, float]:
        """Validation's metrics (`validation.validate`) of `model` (default: the weights of
        record: the average if there is one)."""
        model = model or self.weights.of_record
        data, tokenizer, decode = self.data, self.tokenizer, self.config.decode
        metrics = validation.validate(model, data, tokenizer, decode, self.device, self.loss_of)
        self.model.train()
        return metrics

    def evaluate_and_save(self) -> None:
        """Validate on the main rank, log it, save last.pt (and best.pt, step_N.pt)."""
        p, t = self.progress, self.config.train
        best = False
        # Sharded: every rank gathers the weights into rank 0's plain copy, which decodes.
        model = self.weights.validated()
        if self.dist.main:  # the others wait in the next collective; early stopping reaches
            # them with the stop flag of the next update
            metrics = self.validate(model)
            best = stopping.record_validation(t, p, metrics)
            record = {"step": p.step, "epoch": round(self.epochs, 3), **metrics}
            record |= {"best": p.best, "wall": round(p.elapsed, 1)}
            report_validation(self.metrics, record, metrics)
        names = ["last.pt"] + (["best.pt"] if best else [])
        if t.save_every and p.step and p.step % t.save_every == 0:
            names.append(f"step_{p.step}.pt")
        self.save(names)

    # -- the loop

    def budget_used(self, step: int) -> float:
        """The fraction of the budget update `step` finds spent (for the linear and cosine
        schedules), by the main rank's clock as the previous update left it."""
        return budget_used(self.config.train, step, self.clock, self.epochs)

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def fit(self) -> str:
        """Train until a stopping condition; returns why it stopped."""
        t, p = self.config.train, self.progress
        report = TrainingLog(self.metrics, self.dist.main, t.max_steps or None, p.step)
        # Wall time, validation and checkpoints included, summed over resumed sessions.
        session_start, earlier = time.perf_counter(), p.elapsed
        if t.eval_on_start and not self.resumed:  # e.g. a pretrained model's, before any update
            self.evaluate_and_save()
        while not (reason := stopping.budget_spent(t, p, self.epochs)):
            wanted = stopping.stop_wanted(t, p, self.signals.requested)
            if wanted and not self.dist.active:
                reason = wanted
                break
            start = time.perf_counter()
            result = self.update(self.next_batches(), stop=wanted is not None)
            took = time.perf_counter() - start
            p.elapsed = earlier + time.perf_counter() - session_start
            if "skipped" in result:
                last = self.run.checkpoints / "last.pt"
                stopping.count_skipped(result["skipped"], p, t, last)
            else:
                self.record_update(result, took, report)
            if result["stop"]:  # this rank or another wanted to stop: all stop after this update
                reason = wanted or "another rank stopped"
                break
        if report.pending:
            report.record(p.step, self.epochs, self.lr(), p.elapsed)
        if reason != "signal" and (not t.eval_every or p.step % t.eval_every):
            self.evaluate_and_save()
        else:
            self.save(["last.pt"])
        report.close()
        return reason

    def record_update(self, result: dict[str, Any], took: float, report: TrainingLog) -> None:
        """Count an update: the training log, validation and checkpoints."""
        t, p = self.config.train, self.progress
        p.bad_steps = 0
        p.step += 1
        report.add(result, took, self.lr())
        if p.step % t.log_every == 0:
            report.say(report.record(p.step, self.epochs, self.lr(), p.elapsed))
        if t.eval_every and p.step % t.eval_every == 0:
            self.evaluate_and_save()
        elif t.save_every and p.step % t.save_every == 0:
            self.save(["last.pt", f"step_{p.step}.pt"])
