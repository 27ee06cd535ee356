"""`tf train`: start, force or resume a run in its directory, then train it."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
from pathlib import Path

import torch

from cli.config import Config, save_config
from cli.training import distributed
from cli.training.preflight import check_settings
from cli.training.run import RunDir, check_restart, start_run
from cli.training.trainer import Trainer
from data.files import atomic_output
from data.pipeline import check_before_work

log = logging.getLogger(__name__)


def run_train(config: Config, out: Path, resume: bool, force: bool = False) -> str:
    """The `tf train` command; returns why training stopped."""
    dd, device = distributed.init(config.train.device, config.train.dist_timeout)
    try:
        check_settings(config, device)  # before the run directory, the tokenizer, the data
        check_before_work(config.data, config.model.decoder_start, resume_tokenizer(out, resume))
        reason = _train(config, out, resume, force, dd, device)
        # The trainer (its DDP reducer, its memory-mapped Arrow tables) is gone by now, and no
        # rank leaves while another still writes its last checkpoint: a rank tearing its
        # process group down early has aborted at exit ("terminate called without an active
        # exception") while rank 0 was saving.
        gc.collect()
        distributed.barrier(dd)
        return reason
    finally:
        distributed.shutdown(dd)


def resume_tokenizer(out: Path, resume: bool) -> Path | None:
    """A resumed run's own tokenizer (what `data.tokenizer` named was copied into it)."""
    return RunDir(out).tokenizer if resume else None


def _train(
    config: Config, out: Path, resume: bool, force: bool, dd: distributed.Dist, device: torch.device
) -> str:
    """Start or resume the run in `out` and train it to the end; returns why it stopped."""
    run = RunDir(out)
    restart = resume and not (run.checkpoints / "last.pt").is_file()
    if restart:
        # Killed before its first checkpoint: "kill, then --resume" still works.
        check_restart(config, run)
        log.info("%s: no checkpoint yet; starting the run from update 0 with its config", out)
        resume = False
        if dd.main:
            run.metrics.unlink(missing_ok=True)  # records of the killed session's updates
    before = set(os.listdir(out)) if out.is_dir() else None  # what a failed start keeps
    with distributed.main_first(dd):  # the others stop with it if it refuses
        if dd.main and not resume:
            start_run(config, out, force, restart)
    try:
        trainer = Trainer(config, run, dd, device, resume=resume, restart=restart)
    except BaseException:
        if dd.main and not resume:  # a start that failed (a corpus, the tokenizer, the data)
            undo_start(out, before)
        raise
    if dd.main and resume:  # the config it resumes with, once the checkpoint took it
        save_config(config, run.config)
    try:
        if dd.main:
            report_data(trainer.data.report, run)
            log.info(
                "model: %.2fM parameters on %s, autocast %s",
                trainer.model.num_parameters() / 1e6,
                device,
                trainer.dtype or "off",
            )
        with trainer.signals_stop():
            reason = trainer.fit()
    finally:
        trainer.close()  # the prefetching thread, whether training ended or failed
    log.info(
        "stopped (%s) at step %d; checkpoints in %s", reason, trainer.progress.step, run.checkpoints
    )
    return reason


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
