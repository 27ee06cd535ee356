"""DistributedDataParallel through torch.distributed (Gloo on CPU), 2 processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from cli.config import load_config
from cli.runs.checkpoint import load_checkpoint
from cli.runs.run_dir import RunDir
from cli.training import distributed
from cli.training.run import TrainingError, check_world_size, start_run
from cli.training.trainer import Trainer
from data.batching import collate

ROOT = Path(__file__).resolve().parent.parent
# Adam's first step is about lr * sign(g): with the default eps, float noise in gradients that
# are zero in exact arithmetic (e.g. key biases) would flip signs between the two set-ups.
# A larger eps keeps such updates as small as the gradients, so weights compare to 1e-6.
COMMON = [
    "train.precision=fp32",
    "model.dropout=0.0",
    "train.clip_norm=0.0",
    "train.adam_eps=1e-3",
    "train.eval_every=0",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank: int, world_size: int, port: int) -> tuple[distributed.Dist, torch.device]:
    """This rank's process group, from the variables torchrun would set."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    return distributed.init("cpu")


def rank_trainer(rank: int, world_size: int, port: int, prefix: str, run: str, *sets: str):
    """This rank's process group and trainer, as `tf train` builds them under torchrun."""
    config = load_config("tiny", [f"data.train={prefix}", f"data.dev={prefix}-dev", *COMMON, *sets])
    dd, device = join(rank, world_size, port)
    if dd.main:
        start_run(config, Path(run), force=True)
    distributed.barrier(dd)
    return dd, Trainer(config, RunDir(Path(run)), dd, device)


def one_update(rank: int, world_size: int, port: int, prefix: str, run: str, out: str) -> None:
    """Build a trainer as `tf train` would on this rank; update once on this rank's half of a
    fixed batch (the whole batch when alone); the main rank saves the weights."""
    dd, trainer = rank_trainer(rank, world_size, port, prefix, run)
    try:
        if dd.active:  # no per-step broadcast of the constant positions; no gradient copy
            assert trainer.net.broadcast_buffers is False
            assert trainer.net.gradient_as_bucket_view is True
        # The same first batch of the single-process plan on every rank, then this rank's part.
        batch = first_batch(trainer)
        rows = list(range(batch.src.size(0)))
        mine = rows if world_size == 1 else rows[rank::world_size]
        trainer.update([sub_batch(batch, mine, trainer.tokenizer)])
        if dd.main:
            torch.save(trainer.model.state_dict(), out)
    finally:
        distributed.shutdown(dd)


def first_batch(trainer: Trainer):
    from data.batching import BatchIterator
    from data.corpus import encode_corpus, load_corpus, token_ids

    config, tok = trainer.config, trainer.tokenizer
    encoded = encode_corpus(load_corpus(config.data.train, "es", "en"), tok)
    it = BatchIterator(
        token_ids(encoded, "src_ids"),
        token_ids(encoded, "tgt_ids"),
        max_tokens=config.train.max_tokens,
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
        seed=0,
    )
    return next(iter(it))


def sub_batch(batch, rows: list[int], tok):
    src = [batch.src[i][~batch.src_pad_mask[i]].tolist() for i in rows]
    tgt = [batch.tgt_out[i][~batch.tgt_pad_mask[i]].tolist()[:-1] for i in rows]  # drop EOS
    return collate(src, tgt, tok.pad_id, tok.bos_id, tok.eos_id, rows)


def test_two_ranks_on_half_batches_equal_one_process_on_the_whole(tmp_path, tiny_prefix):
    single, double = tmp_path / "single.pt", tmp_path / "double.pt"
    mp.spawn(one_update, (1, free_port(), tiny_prefix, str(tmp_path / "r1"), str(single)), nprocs=1)
    mp.spawn(one_update, (2, free_port(), tiny_prefix, str(tmp_path / "r2"), str(double)), nprocs=2)
    a, b = torch.load(single), torch.load(double)
    moved = 0
    fresh = Trainer(
        load_config("tiny", [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", *COMMON]),
        RunDir(tmp_path / "r1"),
        distributed.Dist(),
        torch.device("cpu"),
    ).model.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
        moved += int(not torch.equal(a[k], fresh[k]))
    assert moved > 0  # the update did something


def torchrun(
    *args: str,
    program: tuple[str, ...] = ("-m", "cli.main"),
    timeout: float = 300,
    monitor_interval: float = 0.1,
) -> subprocess.CompletedProcess:
    """`tf train ARGS` in 2 processes under torchrun (`program`: another script that runs it;
    `monitor_interval`: how often torchrun looks whether a process has ended, its default)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{free_port()}",
        f"--monitor-interval={monitor_interval}",
        *program,
        "train",
        *args,
    ]
    # A rank killed by a signal prints every thread's Python stack: the failure message says where.
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_torchrun_two_processes_write_one_run_and_resume(tmp_path, tiny_prefix):
    run = tmp_path / "run"
    sets = [
        f"--set=data.train={tiny_prefix}",
        f"--set=data.dev={tiny_prefix}-dev",
        "--set=train.log_every=1",
        "--set=train.save_every=2",
        "--set=train.eval_every=4",
    ]
    done = torchrun("tiny", "--out", str(run), "--set=train.max_steps=4", *sets)
    assert done.returncode == 0, done.stderr[-8000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if "loss" in r]
    assert train_steps == [1, 2, 3, 4]  # one metrics file, each step once (rank 0 writes)
    assert [r["step"] for r in records if "dev_bleu" in r] == [4]
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and len(ckpt["ranks"]) == 2 and ckpt["step"] == 4
    assert [r["iterator"]["rank"] for r in ckpt["ranks"]] == [0, 1]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["best.pt", "last.pt", "step_2.pt", "step_4.pt"]

    resumed = torchrun("--resume", str(run), "--set=train.max_steps=6", "--allow-config-change")
    assert resumed.returncode == 0, resumed.stderr[-8000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 6

    # One process resumes it where it takes the two ranks' batches of an update, said in one line.
    def alone(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "cli.main", "train", "--resume", str(run), *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    refused = alone("--set=train.max_steps=7", "--allow-config-change")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--set train.update_freq=2 --allow-config-change" in refused.stderr
    more = ("--set=train.max_steps=7", "--set=train.update_freq=2", "--allow-config-change")
    resumed_alone = alone(*more)
    assert resumed_alone.returncode == 0, resumed_alone.stderr[-8000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 7

    # A checkpoint written by two processes translates in one.
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "translate", str(run), "--greedy"],
        input="Y dijo Dios.\n",
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 1


def nan_on_one_rank(rank: int, world_size: int, port: int, prefix: str, run: str) -> None:
    """Rank 1's weights turn NaN; saving must stop both ranks, not leave rank 0 waiting."""
    dd, trainer = rank_trainer(rank, world_size, port, prefix, run)
    try:
        if rank == 1:
            with torch.no_grad():
                trainer.model.generator.weight.fill_(float("nan"))
        try:
            trainer.save(["last.pt"])
        except TrainingError:
            Path(run, f"stopped_{rank}").touch()
    finally:
        distributed.shutdown(dd)


def clocks_apart(rank: int, world_size: int, port: int, prefix: str, run: str) -> None:
    """Each rank's clock says something else; the lr they step with must not."""
    sets = ("train.schedule=linear", "train.warmup_steps=1", "train.max_time=1000")
    sets += ("train.max_steps=0",)  # the clock is the only budget
    dd, trainer = rank_trainer(rank, world_size, port, prefix, run, *sets)
    try:
        trainer.progress.elapsed = 300.0 if rank == 0 else 400.0
        trainer.update(trainer.next_batches())
        Path(run, f"lr_{rank}").write_text(repr(trainer.lr()))
    finally:
        distributed.shutdown(dd)


def test_a_time_budget_schedule_gives_every_rank_the_main_ranks_lr(tmp_path, tiny_prefix):
    run = tmp_path / "run"
    mp.spawn(clocks_apart, (2, free_port(), tiny_prefix, str(run)), nprocs=2)
    lrs = [float(Path(run, f"lr_{rank}").read_text()) for rank in (0, 1)]
    assert lrs[0] == lrs[1] == pytest.approx(0.003 * (1 - 300 / 1000))


def test_a_non_finite_check_on_one_rank_stops_every_rank(tmp_path, tiny_prefix):
    run = tmp_path / "run"
    context = mp.start_processes(
        nan_on_one_rank,
        (2, free_port(), tiny_prefix, str(run)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        assert time.monotonic() < deadline, "a rank hung"
    assert (run / "stopped_0").exists() and (run / "stopped_1").exists()
    assert not (run / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize(
    "case, said",
    [
        ("a setting every rank refuses", "train.lr must be float"),
        ("a run rank 0 alone finds there", "already holds a run"),
        ("a corpus rank 0 alone reads first", "nowhere.es: no such file"),
    ],
)
def test_a_refusal_under_torchrun_is_one_line_from_rank_0_and_no_traceback(
    tmp_path, tiny_prefix, case, said
):
    """Every rank stops (where rank 0 refused alone, the others with it), rank 0 alone says
    why, and every process exits 0: torchrun reports any other exit with a traceback of its
    own (ChildFailedError) after each rank's."""
    run = tmp_path / "run"
    sets = [f"--set=data.train={tiny_prefix}", f"--set=data.dev={tiny_prefix}-dev"]
    if case.startswith("a setting"):
        sets.append("--set=train.lr=abc")
    elif case.startswith("a run"):
        run.mkdir()
        (run / "metrics.jsonl").write_text("")
    else:
        sets[0] = f"--set=data.train={tmp_path}/nowhere"
    refused = torchrun("tiny", "--out", str(run), *sets)
    lines = [line for line in refused.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], refused.stderr
    assert "Traceback" not in refused.stderr and "ChildFailedError" not in refused.stderr
    assert refused.returncode == 0


def test_resume_messages_count_one_process_and_one_batch():

    ckpt = {"world_size": 1, "config": {"train": {"update_freq": 1}}}
    with pytest.raises(TrainingError) as e:
        check_world_size(ckpt, Path("last.pt"), now=2, update_freq=1)
    assert "written by 1 process taking 1 batch an update" in str(e.value)
    ckpt = {"world_size": 2, "config": {"train": {"update_freq": 1}}}
    update_freq = load_config("tiny").train.update_freq
    with pytest.raises(TrainingError) as e:
        check_world_size(ckpt, Path("last.pt"), now=1, update_freq=update_freq)
    assert "in 1 process resume with --set train.update_freq=2 " in str(e.value)


# `tf train` with one failure planted on one rank (RANK): the code after the patch names where.
FAILING = """
import os
import sys

import torch

import cli.training.trainer as trainer
from cli.main import main
from cli.runs.checkpoint import CheckpointError

mine = os.environ["RANK"] == "{rank}"
build_model, accumulate = trainer.build_model, trainer.Trainer.accumulate_gradients


def build_model_or_refuse(config, tokenizer):  # the start: after the data, before DDP
    if mine:
        raise CheckpointError("a refusal of this rank alone")
    return build_model(config, tokenizer)


def out_of_memory_at_step_2(self, batches):  # training: this rank's update 2
    if mine and self.progress.step == 1:
        raise torch.OutOfMemoryError("CUDA out of memory (planted)")
    return accumulate(self, batches)


{patch}
sys.exit(main())
"""


def failing_on(tmp_path: Path, rank: int, patch: str) -> tuple[str, ...]:
    """The `program` of `torchrun` that fails on `rank` as `patch` plants it."""
    script = tmp_path / f"failing_on_{rank}.py"
    script.write_text(FAILING.format(rank=rank, patch=patch))
    return (str(script),)


def test_a_refusal_of_one_rank_alone_at_start_is_said_once_and_stops_every_rank(
    tmp_path, tiny_prefix
):
    """Rank 1 alone refuses while building its trainer (rank 0 has read the corpora and
    built its own): rank 0, at the next step of the start, stops with it, says rank 1's
    refusal in one line, and removes the run it started; every process exits 0 (rank 1 used
    to stop alone and silently, rank 0 then failing in DDP's first broadcast)."""
    run = tmp_path / "run"
    patch = "trainer.build_model = build_model_or_refuse"
    sets = [f"--set=data.train={tiny_prefix}", f"--set=data.dev={tiny_prefix}-dev"]
    refused = torchrun(
        "tiny", "--out", str(run), *sets, program=failing_on(tmp_path, 1, patch), timeout=180
    )
    lines = [line for line in refused.stderr.splitlines() if "error" in line.lower()]
    assert lines == ["error: a refusal of this rank alone"], refused.stderr
    assert "Traceback" not in refused.stderr and "ChildFailedError" not in refused.stderr
    assert refused.returncode == 0
    assert not run.exists()


@pytest.mark.parametrize("rank", [1, 0])
def test_a_rank_failing_alone_in_training_says_so_and_stops_the_group(tmp_path, tiny_prefix, rank):
    """Out of memory on one rank at update 2 (under DDP a rank cannot redo its part alone):
    that rank says so in one line, tagged with its rank, and exits 2, and torchrun stops the
    group at once (the other rank would wait for it in the next collective until
    train.dist_timeout, an hour here: the test's limit is minutes). The failing rank used to
    exit 0, silently where it was not rank 0. torchrun looks at its processes every 3 s here:
    by then each has ended on its own (the other's Gloo collective fails once the failing
    rank's connection closes), and the report shows each one's own exit status."""
    patch = "trainer.Trainer.accumulate_gradients = out_of_memory_at_step_2"
    sets = [
        f"--set=data.train={tiny_prefix}",
        f"--set=data.dev={tiny_prefix}-dev",
        "--set=train.max_steps=4",
        "--set=train.eval_every=0",
        "--set=train.dist_timeout=3600",
    ]
    failed = torchrun(
        "tiny", "--out", str(tmp_path / "run"), *sets,
        program=failing_on(tmp_path, rank, patch), timeout=180, monitor_interval=3,
    )  # fmt: skip
    tag = f"[rank {rank}] " if rank else ""
    said = f"{tag}error: step 2: out of memory under torchrun; resume with a lower train.max_tokens"
    assert [line for line in failed.stderr.splitlines() if line.startswith(said)], failed.stderr
    assert failed.returncode != 0
    # torchrun's report: each failed process's rank and exit status.
    exits = re.findall(
        r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", failed.stderr
    )
    assert (str(rank), "2") in exits, failed.stderr[-3000:]
