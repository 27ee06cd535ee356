"""`train.shard`: FSDP2 over two Gloo ranks on CPU against DDP over the same batches; its
checkpoints, ordinary ones, resumed by one process and by two sharded ranks."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from test_distributed import COMMON, free_port, join, rank_trainer

from cli.config import ConfigError, load_config
from cli.training import distributed, shard
from cli.training.checkpoint import load_checkpoint
from cli.training.run import RunDir, TrainingError, start_run
from cli.training.trainer import Trainer

STEPS = 3
# Two micro-batches per update: the first under no_sync (FSDP2: no reduce-scatter), and a
# start-from-pad decoder (Marian's), whose pad row of the embeddings `zero_row` holds at zero.
SETS = ("train.update_freq=2", "train.clip_norm=1.0", "model.decoder_start=pad")
SETS += ("train.eval_bleu_sentences=4",)
# Not bit-exact: DDP all-reduces each gradient whole, FSDP2 reduce-scatters flattened shards
# and takes the norm as a sum of per-shard squares: the same sums in another order (float
# addition is not associative). Over 3 fp32 updates that stays within 1e-5.
RTOL, ATOL = 1e-5, 1e-6


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
    one more update trains."""
    dd, device = join(rank, world_size, port)
    trainer = Trainer(shard_config(prefix), RunDir(Path(run)), dd, device, resume=True)
    try:
        # Copies: the step counts are the optimizer's own tensors, which the update advances.
        loaded = copy.deepcopy(shard.model_state(trainer.model))
        moments = copy.deepcopy(shard.optimizer_state(trainer.model, trainer.optimizer))
        result = trainer.update(trainer.next_batches())
        if dd.main:
            saved = load_checkpoint(Path(run, "checkpoints", "last.pt"))
            assert_same(loaded, saved["model"])
            assert_same_optimizer(moments, saved["optimizer"])
            assert trainer.progress.step == STEPS and result["loss"] > 0
            Path(run, "resumed_by_two").touch()
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
    """The same 3 updates and validation by two DDP ranks and by two sharded ranks."""
    runs = {}
    for name, sets in (("ddp", ()), ("shard", ("train.shard=true",))):
        runs[name] = tmp_path_factory.mktemp("shard") / name
        args = (2, free_port(), tiny_prefix, str(runs[name]), *sets)
        mp.spawn(train_steps, args, nprocs=2)
    return runs


def test_sharded_ranks_train_as_ddp_ranks(two_runs):
    ddp, sharded = (json.loads(Path(two_runs[n], "losses.json").read_text()) for n in two_runs)
    assert ddp == pytest.approx(sharded, rel=RTOL)
    assert len(set(ddp)) == STEPS  # the updates changed the model
    a, b = (load_checkpoint(two_runs[n] / "checkpoints" / "last.pt") for n in two_runs)
    # Ordinary checkpoints: full weights, the plain optimizer state, equal to DDP's.
    assert_same(b["model"], a["model"], RTOL, ATOL)
    assert_same_optimizer(b["optimizer"], a["optimizer"], RTOL, ATOL)
    # The validation decoded the gathered model as DDP's rank 0 decoded its own.
    dev = [
        json.loads(Path(two_runs[n], "metrics.jsonl").read_text().splitlines()[-1])
        for n in two_runs
    ]
    assert dev[1]["dev_loss"] == pytest.approx(dev[0]["dev_loss"], rel=RTOL)
    assert dev[1]["dev_bleu"] == dev[0]["dev_bleu"]


def test_a_sharded_checkpoint_continues_in_two_sharded_ranks(two_runs, tiny_prefix):
    run = two_runs["shard"]
    mp.spawn(resume_sharded, (2, free_port(), tiny_prefix, str(run)), nprocs=2)
    assert (run / "resumed_by_two").exists()


def test_a_sharded_checkpoint_loads_in_one_process(two_runs, tiny_prefix, tmp_path, caplog):
    """Weights and optimiser load exactly in one process (shard on: nothing to shard), and the
    training continues from them. `--resume` itself keeps today's rule for DDP checkpoints: each
    rank's batch iterator continues its own share, so the world size must match."""
    saved = load_checkpoint(two_runs["shard"] / "checkpoints" / "last.pt")
    config = shard_config(tiny_prefix)
    start_run(config, tmp_path / "one", force=True)
    with caplog.at_level(logging.INFO, logger="cli.training.shard"):
        trainer = Trainer(config, RunDir(tmp_path / "one"), distributed.Dist(), torch.device("cpu"))
    assert "nothing to shard" in caplog.text
    assert not shard.is_sharded(trainer.model) and trainer.net is trainer.model
    shard.load_model_state(trainer.model, saved["model"])
    shard.load_optimizer_state(trainer.model, trainer.optimizer, saved["optimizer"])
    assert_same(trainer.model.state_dict(), saved["model"])
    assert_same_optimizer(trainer.optimizer.state_dict(), saved["optimizer"])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert trainer.update(trainer.next_batches())["loss"] > 0
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    trainer.close()
    with pytest.raises(TrainingError, match="written by 2 processes"):
        Trainer(config, RunDir(two_runs["shard"]), distributed.Dist(), torch.device("cpu"), True)


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
