"""`tf train`: start, force or resume a run in its directory, then train it."""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import shutil
from pathlib import Path

import torch

from cli.config import Config, load_config, save_config
from cli.runs.run_dir import RunDir, anchored
from cli.training import distributed
from cli.training.init import with_init
from cli.training.preflight import check_settings
from cli.training.run import TrainingError, check_restart, resume_config, start_run
from cli.training.trainer import Trainer
from data.files import atomic_output
from data.pipeline import check_before_work

log = logging.getLogger(__name__)


def train_config(
    name: str | None, sets: list[str], resume: Path | None, allow_change: bool, init: str | None
) -> Config:
    """The config `tf train` runs: a resumed run's (`resume_config`), or the file or shipped
    recipe `name` with `sets` overrides and `--init`'s model (`with_init`), every path in it
    absolute (`anchored`). Under torchrun every rank reads the same files, before any process
    group: a refusal here is alike on each, said once (`distributed.agreed_start`)."""
    with distributed.agreed_start(distributed.Dist()):
        if resume is not None:
            return resume_config(RunDir(resume), name, sets, allow_change)
        if name is None:
            raise TrainingError("tf train needs a CONFIG (e.g. configs/small.yaml) or --resume RUN")
        config = anchored(load_config(name, sets + ([f"train.init={init}"] if init else [])))
        return with_init(config)


def run_train(config: Config, out: Path, resume: bool, force: bool = False) -> str:
    """The `tf train` command; returns why training stopped.

    Under torchrun its start (up to the trainer built) ends alike on every rank
    (`distributed.agreed_start`): a refusal there is said once and every rank stops. What fails
    on one rank after that, while training, stops that rank with its error.
    """
    with distributed.agreed_start(distributed.Dist()):  # no process group yet
        dd, device = distributed.init(config.train.device, config.train.dist_timeout)
    try:
        trainer = start(config, out, resume, force, dd, device)
        try:
            with trainer.signals.caught():  # SIGINT/SIGTERM: last.pt saved, then stop
                reason = trainer.fit()
        finally:
            trainer.close()  # the prefetching thread, whether training ended or failed
        log.info(
            "stopped (%s) at step %d; checkpoints in %s",
            reason,
            trainer.progress.step,
            trainer.run.checkpoints,
        )
        # The trainer (its DDP reducer, its memory-mapped Arrow tables) is gone by now, and no
        # rank leaves while another still writes its last checkpoint: a rank tearing its
        # process group down early has aborted at exit ("terminate called without an active
        # exception") while rank 0 was saving.
        del trainer
        gc.collect()
        distributed.barrier(dd)
        return reason
    finally:
        distributed.shutdown(dd)


def resume_tokenizer(out: Path, resume: bool) -> Path | None:
    """A resumed run's own tokenizer (what `data.tokenizer` named was copied into it)."""
    return RunDir(out).tokenizer if resume else None


def start(
    config: Config, out: Path, resume: bool, force: bool, dd: distributed.Dist, device: torch.device
) -> Trainer:
    """The run in `out` started, restarted or resumed, and its trainer built, every rank
    agreeing (`distributed.agreed_start`); where any rank fails, what the start wrote into
    `out` is removed (`undo_start`) and the trainer closed."""
    run, trainer, undo = RunDir(out), None, None
    try:
        with distributed.agreed_start(dd):
            check_settings(config, device)  # before the run directory, the tokenizer, the data
            check_before_work(
                config.data, config.model.decoder_start, resume_tokenizer(out, resume)
            )
            restart = resume and restarting(config, run, dd)
            resume = resume and not restart
            if dd.main and not resume:  # what a failed start keeps
                undo = functools.partial(
                    undo_start, out, set(os.listdir(out)) if out.is_dir() else None
                )
            with distributed.main_first(dd):
                if dd.main and not resume:
                    start_run(config, out, force, restart)
            trainer = Trainer(config, run, dd, device, resume=resume, restart=restart)
            if dd.main:
                if resume:  # the config it resumes with, once the checkpoint took it
                    save_config(config, run.config)
                report_start(trainer, run, device)
    except BaseException:
        if trainer is not None:
            trainer.close()
        if undo is not None:  # a start that failed (a corpus, the tokenizer, the data)
            undo()
        raise
    return trainer


def restarting(config: Config, run: RunDir, dd: distributed.Dist) -> bool:
    """Whether the run resumed was killed before its first checkpoint: then it starts again
    from update 0 with its config ("kill, then --resume" still works), without the records of
    the killed session's updates."""
    if (run.checkpoints / "last.pt").is_file():
        return False
    check_restart(config, run)
    log.info("%s: no checkpoint yet; starting the run from update 0 with its config", run.path)
    if dd.main:
        run.metrics.unlink(missing_ok=True)
    return True


def report_start(trainer: Trainer, run: RunDir, device: torch.device) -> None:
    """What the run trains on and with: the data's report, the model's size."""
    report_data(trainer.data.report, run)
    log.info(
        "model: %.2fM parameters on %s, autocast %s",
        trainer.model.num_parameters() / 1e6,
        device,
        trainer.dtype or "off",
    )


def undo_start(out: Path, before: set[str] | None) -> None:
    """Remove what a failed start wrote into `out`: the directory if it made it, else the
    entries it added (its config, a tokenizer half trained): nothing is left behind."""
    if before is None:
        shutil.rmtree(out, ignore_errors=True)
        return
    for name in set(os.listdir(out)) - before if out.is_dir() else ():
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def report_data(report: dict, run: RunDir) -> None:
    """What each training corpus gave, in the log and in RUN/data.json."""
    for c in report["corpora"]:
        removed = ", ".join(f"{rule} {n}" for rule, n in c["removed"].items())
        sampled = f", {c['sampled_weight']:.3g} after temperature" if "sampled_weight" in c else ""
        log.info(
            "%s: read %d, removed %s; kept %d, %d per epoch (weight %g%s)",
            f"{c['spec']} ({c['direction']})" if "direction" in c else c["spec"],
            c["read"],
            removed,
            c["kept"],
            c["per_epoch"],
            c["weight"],
            sampled,
        )
    with atomic_output(run.data_report) as f:
        json.dump(report, f, indent=1)
