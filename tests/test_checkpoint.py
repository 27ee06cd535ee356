import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from cli.commands.average import average_state_dicts, run_average
from cli.config import TrainConfig
from cli.runs.checkpoint import (
    FORMAT,
    CheckpointError,
    checkpoint_dict,
    load_checkpoint,
    save_atomic,
    weights_only,
)
from cli.runs.models import load_for_inference
from cli.training.optim import budget_decay, budget_used, build_optimizer, inverse_sqrt, noam


def test_noam_matches_the_paper_formula():
    d, warmup = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        expected = d**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert noam(step, d, warmup) == pytest.approx(expected, rel=1e-12)
    # The peak is at the end of warmup.
    assert noam(4000, d, warmup) > noam(3999, d, warmup) > noam(1, d, warmup)
    assert noam(4000, d, warmup) > noam(4001, d, warmup)


def test_inverse_sqrt_warms_up_linearly_then_decays():
    assert inverse_sqrt(1, 400) == pytest.approx(1 / 400)
    assert inverse_sqrt(200, 400) == pytest.approx(0.5)
    assert inverse_sqrt(400, 400) == pytest.approx(1.0)
    assert inverse_sqrt(1600, 400) == pytest.approx(0.5)


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_budget_schedules_warm_up_then_end_at_zero_with_the_budget(shape):
    train = TrainConfig(lr=1e-3, schedule=shape, warmup_steps=4, max_steps=20)
    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = build_optimizer([p], train, 16, torch.device("cpu"))
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"] / 1e-3)
        opt.step()
        sched.step()
    assert seen[:4] == pytest.approx([budget_decay(k, 4, k / 20, shape) for k in (1, 2, 3, 4)])
    assert seen[0] < seen[1] < seen[2] < seen[3] and max(seen) == seen[3]  # warmup, then decay
    assert all(a > b for a, b in zip(seen[3:], seen[4:]))
    assert seen[-1] == pytest.approx(0.0)  # the last update, at step 20 of 20
    assert budget_decay(10, 4, 0.5, shape) == pytest.approx(0.5)  # both shapes: half at half


def test_the_budget_is_the_nearest_of_steps_epochs_and_time():
    train = TrainConfig(max_steps=100, max_epochs=4, max_time=60.0)
    assert budget_used(train, 10, 0.0, 0.0) == pytest.approx(0.1)
    assert budget_used(train, 10, 30.0, 0.0) == pytest.approx(0.5)
    assert budget_used(train, 10, 30.0, 3.0) == pytest.approx(0.75)
    assert budget_used(TrainConfig(max_steps=0, max_time=0.0), 10**6, 1e6, 9.0) == 0.0
    assert budget_used(train, 200, 0.0, 0.0) == 1.0


def test_scheduler_gives_update_k_the_lr_of_step_k():
    train = TrainConfig(lr=2e-3, schedule="inverse_sqrt", warmup_steps=4)
    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = build_optimizer([p], train, 16, torch.device("cpu"))
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2e-3 * inverse_sqrt(k, 4) for k in range(1, 7)])
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9


def ckpt(value: float) -> dict:
    return {
        "format": FORMAT,
        "model": {"w": torch.full((3,), value), "n": torch.tensor([7])},
        "config": {},
        "step": int(value),
    }


def test_a_checkpoint_dict_holds_what_every_reader_takes_then_the_rest():
    """The format tag, the weights, the step (left out where there is none: a pruned
    model's), the config and the tokenizer's digest, then what the writer adds."""
    weights = {"w": torch.ones(2)}
    ckpt = checkpoint_dict(weights, {"model": {}}, "abc", 3, optimizer={}, corpora={"c": "d"})
    read = ["format", "model", "step", "config", "tokenizer_digest"]
    assert list(ckpt) == [*read, "optimizer", "corpora"]
    assert ckpt["format"] == FORMAT and ckpt["model"] is weights and ckpt["step"] == 3
    pruned = checkpoint_dict(weights, {}, "abc", pruned_from="RUN")
    assert "step" not in pruned and pruned["pruned_from"] == "RUN"
    assert weights_only(weights) == {"format": FORMAT, "model": weights}


@pytest.mark.parametrize("mmap", [False, True])
def test_save_and_load_round_trip(tmp_path, mmap):
    save_atomic(ckpt(1.0), tmp_path / "a.pt")
    loaded = load_checkpoint(tmp_path / "a.pt", mmap=mmap)
    assert torch.equal(loaded["model"]["w"], torch.ones(3))
    assert not [p for p in tmp_path.iterdir() if p.name != "a.pt"]  # no temporary left


def test_inference_maps_the_checkpoint_and_copies_the_weights_out(trained, monkeypatch):
    """Decoding reads only the weights it uses (the optimizer's moments are two thirds of a
    checkpoint), and loads them as the plain read does."""
    mapped, load = [], torch.load

    def spy(*args, **kwargs):
        mapped.append(kwargs.get("mmap"))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    model, _, _ = load_for_inference(trained, torch.device("cpu"))
    assert mapped == [True]
    weights = load_checkpoint(trained / "checkpoints" / "best.pt")["model"]
    for name, tensor in model.state_dict().items():
        if name in weights:
            assert torch.equal(tensor, weights[name]), name


@pytest.mark.parametrize("mmap", [False, True])
def test_truncated_foreign_and_missing_checkpoints_are_one_line_errors(tmp_path, mmap):
    save_atomic(ckpt(1.0), tmp_path / "a.pt")
    data = (tmp_path / "a.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    torch.save({"state_dict": {}}, tmp_path / "foreign.pt")
    (tmp_path / "text.pt").write_text("hello")
    for name, pattern in [
        ("cut.pt", "not a readable"),
        ("foreign.pt", "not a tf checkpoint"),
        ("text.pt", "not a readable"),
        ("none.pt", "no such checkpoint"),
    ]:
        with pytest.raises(CheckpointError, match=pattern) as e:
            load_checkpoint(tmp_path / name, mmap=mmap)
        assert name in str(e.value) and "\n" not in str(e.value)


def test_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    """SIGKILL a process in the middle of writing: the old checkpoint must still load."""
    path = tmp_path / "last.pt"
    save_atomic(ckpt(1.0), path)
    child = textwrap.dedent(f"""
        import time, torch
        from cli.runs.checkpoint import save_atomic
        real_save = torch.save
        def slow_save(obj, f):
            f.write(b"PK" * 1000)  # part of a file, then hang as if the disk were slow
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
        torch.save = slow_save
        save_atomic({{"format": "x"}}, __import__("pathlib").Path({str(path)!r}))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], torch.ones(3))


def test_average_of_two_checkpoints_is_their_mean(tmp_path):
    save_atomic(ckpt(1.0), tmp_path / "a.pt")
    save_atomic(ckpt(4.0), tmp_path / "b.pt")
    run_average([str(tmp_path / "a.pt"), str(tmp_path / "b.pt")], 5, tmp_path / "avg.pt")
    avg = load_checkpoint(tmp_path / "avg.pt")
    assert torch.equal(avg["model"]["w"], torch.full((3,), 2.5))
    assert torch.equal(avg["model"]["n"], torch.tensor([7]))


def test_average_rejects_different_models():
    with pytest.raises(CheckpointError, match="different parameters"):
        average_state_dicts([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])


def test_average_names_the_checkpoint_whose_tokenizer_or_parameters_differ(tmp_path):
    """Of three checkpoints, the one of another tokenizer is named, with the one it differs
    from (it used to say only that they differ); so is one of other parameters or shapes."""
    paths = [tmp_path / f"{name}.pt" for name in ("a", "b", "c")]
    for path, digest in zip(paths, ("x", "x", "y")):
        save_atomic({**ckpt(1.0), "tokenizer_digest": digest}, path)
    with pytest.raises(CheckpointError) as e:
        run_average([str(p) for p in paths], 5, tmp_path / "avg.pt")
    assert str(e.value).startswith(
        f"{paths[2]}: was trained with another tokenizer than {paths[0]}"
    )
    wider = {**ckpt(1.0), "model": {"w": torch.zeros(4), "n": torch.tensor([7])}}
    wider["tokenizer_digest"] = "x"
    save_atomic(wider, paths[2])
    with pytest.raises(CheckpointError) as e:
        run_average([str(p) for p in paths], 5, tmp_path / "avg.pt")
    assert str(e.value).startswith(f"{paths[2]}: holds different parameters than {paths[0]} (w)")
    assert not (tmp_path / "avg.pt").exists()


def test_average_of_a_run_takes_its_last_step_checkpoints(tmp_path):
    for step in (2, 10, 4, 6):
        save_atomic(ckpt(float(step)), tmp_path / "checkpoints" / f"step_{step}.pt")
    run_average([str(tmp_path)], 2, tmp_path / "avg.pt")
    avg = load_checkpoint(tmp_path / "avg.pt")
    assert avg["averaged_from"][-1].endswith("step_10.pt")
    assert torch.equal(avg["model"]["w"], torch.full((3,), 8.0))  # mean of steps 6 and 10
    assert math.isclose(avg["step"], 10)
