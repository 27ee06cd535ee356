"""Training: accumulation, non-finite losses, kill-and-resume bit for bit, signals, refusals."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli.commands.train import run_train
from cli.config import load_config
from cli.runs.checkpoint import load_checkpoint
from cli.runs.models import load_for_inference
from cli.training import distributed
from cli.training.run import TrainingError, resume_config, start_run
from cli.training.trainer import Trainer
from data.batching import collate

ROOT = Path(__file__).resolve().parent.parent


def tiny_config(tiny_prefix: str, *overrides: str):
    return load_config(
        "tiny",
        [
            f"data.train={tiny_prefix}",
            f"data.dev={tiny_prefix}-dev",
            "train.precision=fp32",
            *overrides,
        ],
    )


def make_trainer(tmp_path, tiny_prefix, *overrides) -> Trainer:
    config = tiny_config(tiny_prefix, *overrides)
    run = start_run(config, tmp_path / "run", force=False)
    return Trainer(config, run, distributed.Dist(), torch.device("cpu"))


def split(batch, tokenizer_ids):
    """The two halves of a batch, re-padded on their own."""
    pad, bos, eos = tokenizer_ids
    rows = []
    for i in range(batch.src.size(0)):
        src = batch.src[i][~batch.src_pad_mask[i]].tolist()
        tgt = batch.tgt_out[i][~batch.tgt_pad_mask[i]].tolist()[:-1]  # drop EOS
        rows.append((src, tgt))
    half = len(rows) // 2
    return [
        collate([s for s, _ in part], [t for _, t in part], pad, bos, eos, list(range(len(part))))
        for part in (rows[:half], rows[half:])
    ]


def capture_gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Record the gradients the optimiser steps with (Adam's first step, about lr * sign(g),
    would turn float noise in near-zero gradients into visible weight differences)."""
    seen: dict[str, torch.Tensor] = {}

    def before_step(optimizer, args, kwargs) -> None:
        seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})

    trainer.optimizer.register_step_pre_hook(before_step)
    return seen


def test_accumulating_two_half_batches_equals_one_full_update(tmp_path, tiny_prefix):
    # No dropout, so both updates see the same function.
    common = ("model.dropout=0.0", "train.clip_norm=0.0")
    full = make_trainer(tmp_path / "a", tiny_prefix, *common)
    halves = make_trainer(tmp_path / "b", tiny_prefix, *common, "train.update_freq=2")
    halves.model.load_state_dict(full.model.state_dict())
    batch = full.next_batches()[0]
    tok = full.tokenizer
    parts = split(batch, (tok.pad_id, tok.bos_id, tok.eos_id))
    assert sum(p.n_tgt_tokens for p in parts) == batch.n_tgt_tokens
    grads_full, grads_halves = capture_gradients(full), capture_gradients(halves)
    a = full.update([batch])
    b = halves.update(parts)
    assert a["tokens"] == b["tokens"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert grads_full.keys() == grads_halves.keys() and grads_full
    for name, g in grads_full.items():
        torch.testing.assert_close(grads_halves[name], g, rtol=1e-4, atol=1e-7, msg=name)
    # The gradients are not trivially small: the comparison above has something to compare.
    assert max(g.abs().max().item() for g in grads_full.values()) > 1e-2


def test_an_update_out_of_memory_is_retried_on_halves_and_changes_nothing(
    tmp_path, tiny_prefix, caplog
):
    """On CUDA a batch too large for the memory raises torch.OutOfMemoryError; stand-in here:
    a forward hook raising it for batches over 3 sentences. The update is redone over halves
    (then quarters) and equals the update over the whole batch."""
    common = ("model.dropout=0.0", "train.clip_norm=0.0", "train.max_sentences=8")
    whole = make_trainer(tmp_path / "a", tiny_prefix, *common)
    split_up = make_trainer(tmp_path / "b", tiny_prefix, *common)
    split_up.model.load_state_dict(whole.model.state_dict())
    batch = whole.next_batches()[0]
    assert batch.src.size(0) > 3
    seen_rows = []

    def memory_limit(module, args):
        seen_rows.append(args[0].size(0))
        if args[0].size(0) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    split_up.model.register_forward_pre_hook(memory_limit)
    grads_whole, grads_split = capture_gradients(whole), capture_gradients(split_up)
    a = whole.update([batch])
    with caplog.at_level("WARNING"):
        b = split_up.update([batch])
    assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for name, g in grads_whole.items():
        torch.testing.assert_close(grads_split[name], g, rtol=1e-4, atol=1e-7, msg=name)
    assert max(seen_rows[-4:]) <= 3 and split_up.progress.oom_splits >= 1
    assert "out of memory; retrying as" in caplog.text
    assert split_up.progress.step == 0  # fit() counts the update, once


def test_out_of_memory_on_one_sentence_is_a_clear_error(tmp_path, tiny_prefix):
    trainer = make_trainer(tmp_path, tiny_prefix)

    def no_memory(module, args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    trainer.model.register_forward_pre_hook(no_memory)
    with pytest.raises(TrainingError, match="out of memory on a single sentence"):
        trainer.update(trainer.next_batches())


def test_out_of_memory_in_the_optimizer_step_under_fp16_is_one_line_not_a_retry(
    tmp_path, tiny_prefix, caplog
):
    """Adam allocates its moments in its first step, after GradScaler.unscale_: a retry on
    halves would unscale the same optimiser twice (RuntimeError), and smaller batches do not
    shrink what the step needs anyway."""
    trainer = make_trainer(tmp_path, tiny_prefix)
    trainer.scaler = torch.amp.GradScaler("cpu", enabled=True)  # what fp16 builds on CUDA
    batches = trainer.next_batches()
    assert batches[0].src.size(0) > 1  # halving would have been possible
    real_step = trainer.optimizer.step
    calls = []

    def step_out_of_memory(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(*args, **kwargs)

    trainer.optimizer.step = step_out_of_memory
    with caplog.at_level("WARNING"), pytest.raises(TrainingError) as raised:
        trainer.update(batches)
    message = str(raised.value)
    assert "out of memory in the optimiser step" in message and "\n" not in message
    assert "smaller batches" in message
    assert len(calls) == 1 and "retrying" not in caplog.text
    assert all(p.grad is None for p in trainer.model.parameters())  # memory given back
    assert trainer.progress.oom_splits == 0


def test_non_finite_loss_skips_the_update_then_stops(tmp_path, tiny_prefix, monkeypatch):
    trainer = make_trainer(
        tmp_path,
        tiny_prefix,
        "train.max_bad_steps=3",
        "train.max_steps=50",
        "train.eval_every=0",
        "train.save_every=2",
    )
    real = trainer.loss_of
    calls = {"n": 0}

    def poisoned(batch, net=None):
        calls["n"] += 1
        loss, nll = real(batch, net)
        if calls["n"] == 3 or calls["n"] >= 6:  # one bad update, later a run of bad ones
            return loss * float("nan"), nll
        return loss, nll

    monkeypatch.setattr(trainer, "loss_of", poisoned)
    with pytest.raises(TrainingError, match="3 non-finite losses in a row at step 5"):
        trainer.fit()
    # Updates 1, 2, (skipped), 3, 4 happened; the bad ones after step 4 changed no weight.
    assert trainer.progress.step == 4
    last = load_checkpoint(trainer.run.checkpoints / "last.pt")
    assert last["step"] == 4
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, last["model"][k]), k
        assert torch.isfinite(v).all()


def test_the_weight_average_is_validated_saved_and_translated(tmp_path, tiny_prefix):
    trainer = make_trainer(
        tmp_path, tiny_prefix, "train.ema_decay=0.25", "train.max_steps=3", "train.eval_every=0"
    )
    expected = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    step = 0

    def fold_in(optimizer, args, kwargs) -> None:  # the trained weights after each update
        nonlocal step
        step += 1
        decay = min(0.25, (1 + step) / (10 + step))  # 2/11, 3/12, then the cap (not 4/13)
        for n, p in trainer.model.named_parameters():
            expected[n] = decay * expected[n] + (1 - decay) * p.detach()

    trainer.optimizer.register_step_post_hook(fold_in)
    trainer.fit()
    assert step == 3
    average = dict(trainer.weights.average.model.named_parameters())
    for n, p in trainer.model.named_parameters():
        torch.testing.assert_close(average[n], expected[n], rtol=0, atol=1e-6, msg=n)
        assert not torch.equal(average[n], p), n  # an average, not the last weights
    assert trainer.weights.of_record is trainer.weights.average.model
    last = load_checkpoint(trainer.run.checkpoints / "last.pt")
    inference, _, _ = load_for_inference(trainer.run.path, torch.device("cpu"))
    for n, p in inference.named_parameters():
        assert torch.equal(p, average[n]) and torch.equal(last["model"][n], average[n]), n
        assert torch.equal(last["train_model"][n], trainer.model.state_dict()[n]), n


def tf_train(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "train", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early:\n{proc.stderr.read()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def losses(run: Path) -> list[dict]:
    """The logged numbers that must repeat exactly (not the timings)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "wall")} for r in records]


def test_sigkill_then_resume_continues_bit_for_bit(tmp_path, tiny_prefix):
    common = [
        f"--set=data.train={tiny_prefix}",
        f"--set=data.dev={tiny_prefix}-dev",
        "--set=train.deterministic=true",
        "--set=train.precision=fp32",
        "--set=train.save_every=3",
        "--set=train.eval_every=0",
        "--set=train.log_every=1",
        "--set=train.ema_decay=0.9",  # the average resumes exactly too
    ]
    killed = tmp_path / "killed"
    proc = tf_train("tiny", "--out", str(killed), "--set=train.max_steps=100000", *common)
    wait_for(killed / "checkpoints" / "step_3.pt", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = load_checkpoint(killed / "checkpoints" / "last.pt")["step"]
    assert step >= 3 and step % 3 == 0
    target = step + 4
    resumed = tf_train(
        "--resume", str(killed), f"--set=train.max_steps={target}", "--allow-config-change"
    )
    assert resumed.wait() == 0, resumed.stderr.read()

    straight = tmp_path / "straight"
    proc = tf_train("tiny", "--out", str(straight), f"--set=train.max_steps={target}", *common)
    assert proc.wait() == 0, proc.stderr.read()

    a = load_checkpoint(straight / "checkpoints" / "last.pt")
    b = load_checkpoint(killed / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == target
    for weights in ("model", "train_model"):
        for k in a[weights]:
            assert torch.equal(a[weights][k], b[weights][k]), (weights, k)
    assert losses(straight) == losses(killed)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, tiny_prefix):
    run = tmp_path / "run"
    proc = tf_train(
        "tiny",
        "--out",
        str(run),
        f"--set=data.train={tiny_prefix}",
        f"--set=data.dev={tiny_prefix}-dev",
        "--set=train.max_steps=100000",
        "--set=train.save_every=2",
        "--set=train.eval_every=0",
    )
    wait_for(run / "checkpoints" / "step_2.pt", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["step"] >= 2
    assert "SIGTERM" in proc.stderr.read()


def test_resume_with_a_changed_config_is_refused_unless_allowed(tmp_path, tiny_prefix):
    config = tiny_config(tiny_prefix)
    run = start_run(config, tmp_path / "run", force=False)
    with pytest.raises(TrainingError, match=r"train\.lr: 0\.003 -> 0\.5"):
        resume_config(run, None, ["train.lr=0.5"], allow_changes=False)
    assert resume_config(run, None, ["train.lr=0.5"], allow_changes=True).train.lr == 0.5
    assert resume_config(run, None, [], allow_changes=False) == config


def test_a_new_run_never_overwrites_an_old_one(tmp_path, tiny_prefix):
    config = tiny_config(tiny_prefix, "train.max_steps=2", "train.eval_every=0")
    run_train(config, tmp_path / "run", resume=False)
    before = (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(TrainingError, match="already holds a run"):
        run_train(config, tmp_path / "run", resume=False)
    assert (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes() == before


def test_after_training_the_trainer_is_released_and_the_signal_handlers_restored(
    tmp_path, tiny_prefix
):
    """Nothing of the run outlives `run_train` (the process group is torn down after it, and a
    handler left behind would keep the trainer, its model and data alive and swallow Ctrl-C)."""

    def trainers() -> int:
        gc.collect()
        return sum(type(o) is Trainer for o in gc.get_objects())

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    alive = trainers()
    config = tiny_config(tiny_prefix, "train.max_steps=2", "train.eval_every=0")
    run_train(config, tmp_path / "run", resume=False)
    assert {s: signal.getsignal(s) for s in before} == before
    assert trainers() == alive


def test_a_nan_gradient_with_a_finite_loss_is_skipped(tmp_path, tiny_prefix):
    trainer = make_trainer(tmp_path, tiny_prefix, "train.clip_norm=1.0")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    weight = trainer.model.generator.weight
    handle = weight.register_hook(lambda g: g * float("nan"))
    result = trainer.update(trainer.next_batches())
    handle.remove()
    assert result["skipped"] == "non-finite"
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert trainer.scheduler.last_epoch == 0 and not trainer.optimizer.state
    assert "loss" in trainer.update(trainer.next_batches())  # the next update goes ahead


def test_an_fp16_overflow_neither_counts_as_bad_nor_advances_the_schedule(tmp_path, tiny_prefix):
    """GradScaler skips a step whose fp16 gradients overflowed; the lr schedule and the step
    counter must skip it too. A scaler stub stands in for CUDA's."""
    trainer = make_trainer(tmp_path, tiny_prefix, "train.max_steps=2", "train.save_every=0")

    class SkippingScaler(torch.amp.GradScaler):
        def __init__(self) -> None:
            super().__init__("cpu", enabled=False)
            self.overflows = 2  # the first two updates overflow
            self.updates = 0

        def is_enabled(self) -> bool:
            return True

        def unscale_(self, optimizer) -> None:
            if self.overflows:
                self.overflows -= 1
                for p in trainer.model.parameters():
                    if p.grad is not None:
                        p.grad.fill_(float("inf"))

        def update(self, new_scale=None) -> None:
            self.updates += 1

    trainer.scaler = SkippingScaler()
    trainer.fit()
    assert trainer.progress.step == 2 and trainer.progress.bad_steps == 0
    assert trainer.scheduler.last_epoch == 2  # two real updates, not four
    assert trainer.scaler.updates == 4


def test_a_precision_the_device_lacks_is_refused_before_any_work(tmp_path, tiny_prefix):
    """decode.precision is first used by the first validation (500 updates into `small`): on a
    CPU, fp16 must be a one-line error at the start, before a tokenizer, data or an update."""
    from test_cli import assert_user_error, tf

    run = tmp_path / "run"
    for setting in ("decode.precision=fp16", "train.precision=fp16"):
        sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.device=cpu"]
        sets.append(setting)
        result = tf("train", "tiny", "--out", run, *[a for s in sets for a in ("--set", s)])
        assert_user_error(result, f"{setting.split('=')[0]}: fp16 needs a CUDA device")
        assert not run.exists()  # no run directory, no tokenizer, no checkpoint


def test_a_resume_checks_the_device_before_it_touches_the_run(tmp_path, tiny_prefix):
    """A run trained on a GPU in fp16 and resumed on a CPU: refused before any update, the run
    left as it was (its config.yaml and last.pt)."""
    from test_cli import assert_user_error, tf

    config = tiny_config(tiny_prefix, "train.max_steps=2", "train.eval_every=0")
    run_train(config, tmp_path / "run", resume=False)
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in (run / "config.yaml", run / "checkpoints" / "last.pt")}
    sets = ["--set", "decode.precision=fp16", "--set", "train.max_steps=4"]
    result = tf("train", "--resume", run, "--allow-config-change", *sets)
    assert_user_error(result, "decode.precision: fp16 needs a CUDA device")
    assert {p: p.read_bytes() for p in before} == before
