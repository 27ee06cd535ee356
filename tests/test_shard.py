"""`train.shard`: FSDP2 over two Gloo ranks on CPU against DDP and against one process over
the same batches; its checkpoints, ordinary ones, resumed by two sharded ranks and by one
process taking the same batches an update."""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from test_distributed import COMMON, free_port, join, rank_trainer

from cli.config import ConfigError, load_config
from cli.runs.checkpoint import load_checkpoint
from cli.runs.run_dir import RunDir
from cli.training import distributed, shard
from cli.training.run import TrainingError
from cli.training.trainer import Trainer

STEPS = 3
# Two micro-batches per update: the first under no_sync (FSDP2: no reduce-scatter), and a
# start-from-pad decoder (Marian's), whose pad row of the embeddings `zero_row` holds at zero.
SETS = ("train.update_freq=2", "train.clip_norm=1.0", "model.decoder_start=pad")
SETS += ("train.eval_bleu_sentences=4",)
# One process taking both ranks' batches of an update: 2 ranks x 2 = 1 x 4.
ONE_PROCESS = "train.update_freq=4"
# Not bit-exact: DDP all-reduces each gradient whole, FSDP2 reduce-scatters flattened shards
# and takes the norm as a sum of per-shard squares, one process sums its four batches' gradients
# in its own order: the same sums in another order (float addition is not associative). Over
# 3 fp32 updates that stays within 1e-5.
RTOL, ATOL = 1e-5, 1e-6
CPU = torch.device("cpu")


def train_steps(rank: int, world_size: int, port: int, prefix: str, run: str, *sets: str) -> None:
    """STEPS updates on this rank's batches; the main rank writes their losses; then a
    validation and a checkpoint, as `tf train` makes them."""
    dd, trainer = rank_trainer(rank, world_size, port, prefix, run, *SETS, *sets)
    try:
        assert shard.is_sharded(trainer.model) == ("train.shard=true" in sets)
        losses = [trainer.update(trainer.next_batches())["loss"] for _ in range(STEPS)]
        trainer.progress.step = STEPS
        trainer.evaluate_and_save()
        if dd.main:
            Path(run, "losses.json").write_text(json.dumps(losses))
    finally:
        distributed.shutdown(dd)


def resume_sharded(rank: int, world_size: int, port: int, prefix: str, run: str) -> None:
    """Two sharded ranks resume the run: the weights they gather equal the checkpoint's, and
    one more update trains; the main rank writes its loss and the weights after it."""
    dd, device = join(rank, world_size, port)
    trainer = Trainer(shard_config(prefix), RunDir(Path(run)), dd, device, resume=True)
    try:
        # Copies: the step counts are the optimizer's own tensors, which the update advances.
        loaded = copy.deepcopy(shard.model_state(trainer.model))
        moments = copy.deepcopy(shard.optimizer_state(trainer.model, trainer.optimizer))
        result = trainer.update(trainer.next_batches())
        after = shard.model_state(trainer.model)
        if dd.main:
            saved = load_checkpoint(Path(run, "checkpoints", "last.pt"))
            assert_same(loaded, saved["model"])
            assert_same_optimizer(moments, saved["optimizer"])
            assert trainer.progress.step == STEPS and result["loss"] > 0
            torch.save({"loss": result["loss"], "model": after}, Path(run, "resumed_by_two.pt"))
    finally:
        distributed.shutdown(dd)


def shard_config(prefix: str, *sets: str):
    data = [f"data.train={prefix}", f"data.dev={prefix}-dev"]
    return load_config("tiny", [*data, *COMMON, *SETS, "train.shard=true", *sets])


def assert_same(a: dict, b: dict, rtol: float = 0, atol: float = 0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def assert_same_optimizer(a: dict, b: dict, rtol: float = 0, atol: float = 0) -> None:
    """Two plain `torch.optim` state dicts: the same numbering, settings and moments."""
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert_same(a["state"][i], b["state"][i], rtol, atol)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_prefix) -> dict[str, Path]:
    """The same 3 updates and validation by two DDP ranks, by two sharded ranks, and by one
    process taking both ranks' batches of each update."""
    runs = {}
    for name, world_size, sets in (
        ("ddp", 2, ()),
        ("shard", 2, ("train.shard=true",)),
        ("one", 1, (ONE_PROCESS,)),
    ):
        runs[name] = tmp_path_factory.mktemp("shard") / name
        args = (world_size, free_port(), tiny_prefix, str(runs[name]), *sets)
        mp.spawn(train_steps, args, nprocs=world_size)
    return runs


def losses_of(run: Path) -> list[float]:
    return json.loads(Path(run, "losses.json").read_text())


@pytest.mark.parametrize("other", ["ddp", "one"])
def test_sharded_ranks_train_as_ddp_ranks_and_as_one_process(two_runs, other):
    sharded, reference = losses_of(two_runs["shard"]), losses_of(two_runs[other])
    assert sharded == pytest.approx(reference, rel=RTOL)
    assert len(set(sharded)) == STEPS  # the updates changed the model
    a, b = (load_checkpoint(two_runs[n] / "checkpoints" / "last.pt") for n in (other, "shard"))
    # Ordinary checkpoints: full weights, the plain optimizer state, equal to the reference's.
    assert_same(b["model"], a["model"], RTOL, ATOL)
    assert_same_optimizer(b["optimizer"], a["optimizer"], RTOL, ATOL)
    # The validation decoded the gathered model as the reference decoded its own.
    dev = [
        json.loads(Path(two_runs[n], "metrics.jsonl").read_text().splitlines()[-1])
        for n in (other, "shard")
    ]
    assert dev[1]["dev_loss"] == pytest.approx(dev[0]["dev_loss"], rel=RTOL)
    assert dev[1]["dev_bleu"] == dev[0]["dev_bleu"]


@pytest.fixture(scope="module")
def resumed_by_two(two_runs, tiny_prefix, tmp_path_factory) -> dict:
    """The sharded run's checkpoint resumed by two sharded ranks for one update (in a copy:
    a resume rewrites the run's metrics)."""
    run = tmp_path_factory.mktemp("resumed") / "shard"
    shutil.copytree(two_runs["shard"], run)
    mp.spawn(resume_sharded, (2, free_port(), tiny_prefix, str(run)), nprocs=2)
    return torch.load(run / "resumed_by_two.pt")


def test_a_sharded_checkpoint_continues_in_two_sharded_ranks(resumed_by_two):
    assert resumed_by_two["loss"] > 0


def test_a_sharded_checkpoint_resumes_in_one_process_over_the_same_batches(
    two_runs, resumed_by_two, tiny_prefix, tmp_path, caplog
):
    """`--resume` in one process taking both ranks' batches an update: the weights and the
    optimiser load exactly (shard on: nothing to shard), and the next update takes the batches
    the two ranks took, to the same loss and weights."""
    run = tmp_path / "shard"
    shutil.copytree(two_runs["shard"], run)
    saved = load_checkpoint(run / "checkpoints" / "last.pt")
    with pytest.raises(TrainingError, match="written by 2 processes taking 4 batches an upd") as e:
        Trainer(shard_config(tiny_prefix), RunDir(run), distributed.Dist(), CPU, True)
    assert "--set train.update_freq=4 " in str(e.value) and "\n" not in str(e.value)

    config = shard_config(tiny_prefix, ONE_PROCESS)
    with caplog.at_level(logging.INFO, logger="cli.training"):
        trainer = Trainer(config, RunDir(run), distributed.Dist(), CPU, resume=True)
    assert (
        "nothing to shard" in caplog.text and "resuming the run of 2 processes in 1" in caplog.text
    )
    assert not shard.is_sharded(trainer.model) and trainer.net is trainer.model
    assert_same(trainer.model.state_dict(), saved["model"])
    assert_same_optimizer(trainer.optimizer.state_dict(), saved["optimizer"])
    result = trainer.update(trainer.next_batches())
    trainer.close()
    assert result["loss"] == pytest.approx(resumed_by_two["loss"], rel=RTOL)
    assert_same(trainer.model.state_dict(), resumed_by_two["model"], RTOL, ATOL)


@pytest.mark.parametrize(
    "settings, named",
    [
        (["train.ema_decay=0.999"], "train.ema_decay"),
        (["train.precision=fp16"], "train.precision"),
        (["train.lora.rank=4", "train.init=runs/pretrained"], "train.lora"),
    ],
)
def test_shard_with_what_it_cannot_do_is_one_line(settings, named, tiny_prefix):
    with pytest.raises(ConfigError, match=f"{named}.*train.shard") as e:
        shard_config(tiny_prefix, *settings)
    assert "\n" not in str(e.value)
