"""Resuming: on any device, with changed settings that take effect, a matching tokenizer, and
from a run killed before its first checkpoint."""

from __future__ import annotations

import json
import logging
import os
import random

import pytest
import torch
from typer.testing import CliRunner

from cli.config import load_config
from cli.main import app
from cli.runs.checkpoint import load_checkpoint
from cli.training import distributed
from cli.training.optim import inverse_sqrt
from cli.training.run import TrainingError, resume_config, start_run
from cli.training.trainer import Trainer
from data.corpus import load_corpus
from data.errors import InputError
from data.pipeline import choose_tokenizer
from data.tokenizer import Tokenizer


def config_for(prefix: str, *overrides: str):
    sets = [f"data.train={prefix}", f"data.dev={prefix}-dev", "train.precision=fp32"]
    return load_config("tiny", [*sets, "train.eval_every=0", *overrides])


def trained_run(tmp_path, prefix: str, *overrides: str) -> Trainer:
    """A run of 4 updates with last.pt saved."""
    config = config_for(prefix, "train.max_steps=4", *overrides)
    trainer = Trainer(config, start_run(config, tmp_path / "run", False), distributed.Dist(), cpu())
    trainer.fit()
    return trainer


def cpu() -> torch.device:
    return torch.device("cpu")


def test_restore_loads_to_the_cpu_whatever_the_device(tmp_path, tiny_prefix):
    """On CUDA, a checkpoint loaded with map_location=cuda brings the RNG states as CUDA
    tensors, which torch.set_rng_state refuses. Stand-in here: the `meta` device, which
    fails the same way for anything that is not moved deliberately."""
    first = trained_run(tmp_path, tiny_prefix)
    saved = load_checkpoint(first.run.checkpoints / "last.pt")
    config = config_for(tiny_prefix, "train.max_steps=4")
    again = Trainer(config, first.run, distributed.Dist(), cpu())
    again.device = torch.device("meta")  # what restore would map the checkpoint to
    torch.manual_seed(12345)
    again.restore(first.run.checkpoints / "last.pt")
    assert torch.equal(torch.get_rng_state(), saved["ranks"][0]["rng"]["torch"])
    assert random.getstate()[1] == tuple(saved["ranks"][0]["rng"]["python"][1])
    for k, v in again.model.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, saved["model"][k]), k


@pytest.mark.parametrize(
    "change, group_key, expected",
    [
        ("train.lr=0.01", "lr", 0.01 * inverse_sqrt(5, 10)),
        ("train.betas=[0.8, 0.9]", "betas", (0.8, 0.9)),
        ("train.adam_eps=1e-6", "eps", 1e-6),
        ("train.weight_decay=0.01", "weight_decay", 0.01),
        ("train.warmup_steps=2", "lr", 0.003 * inverse_sqrt(5, 2)),
    ],
)
def test_a_changed_optimiser_setting_takes_effect_at_the_next_update(
    tmp_path, tiny_prefix, change, group_key, expected
):
    first = trained_run(tmp_path, tiny_prefix)
    config = resume_config(first.run, None, ["train.max_steps=5", change], allow_changes=True)
    resumed = Trainer(config, first.run, distributed.Dist(), cpu(), resume=True)
    seen = {}

    def before_step(optimizer, args, kwargs) -> None:
        seen.update(optimizer.param_groups[0])

    resumed.optimizer.register_step_pre_hook(before_step)
    resumed.update(resumed.next_batches())
    assert seen[group_key] == pytest.approx(expected)


def test_an_unchanged_resume_keeps_the_schedule(tmp_path, tiny_prefix):
    first = trained_run(tmp_path, tiny_prefix)
    config = resume_config(first.run, None, [], allow_changes=False)
    resumed = Trainer(config, first.run, distributed.Dist(), cpu(), resume=True)
    assert resumed.lr() == first.lr() == pytest.approx(0.003 * inverse_sqrt(5, 10))


def test_a_time_budget_schedule_follows_the_clock_and_resumes_from_it(tmp_path, tiny_prefix):
    """schedule=linear with max_time: the lr of the next update is read off the run's elapsed
    time, which a resumed run takes from the checkpoint (not from zero)."""
    sets = ["train.schedule=linear", "train.warmup_steps=2", "train.max_time=1000"]
    first = trained_run(tmp_path, tiny_prefix, *sets)
    first.progress.elapsed = 500.0  # as if the 4 updates had taken half the budget
    first.save(["last.pt"])
    config = resume_config(first.run, None, ["train.max_steps=100000"], allow_changes=True)
    resumed = Trainer(config, first.run, distributed.Dist(), cpu(), resume=True)
    assert resumed.lr() == pytest.approx(0.003 * 0.5)  # warm, half the budget left
    resumed.progress.elapsed = 750.0
    resumed.update(resumed.next_batches())
    assert resumed.lr() == pytest.approx(0.003 * 0.25)


@pytest.mark.parametrize(
    "change, key",
    [
        ("model.d_model=64", "model.d_model"),
        ("train.max_tokens=256", "train.max_tokens"),
        ("data.vocab_size=60", "data.vocab_size"),
        ("data.pad_multiple=4", "data.pad_multiple"),
        ("data.temperature=5", "data.temperature"),
    ],
)
def test_what_the_checkpoint_depends_on_cannot_change(tmp_path, tiny_prefix, change, key):
    config = config_for(tiny_prefix)
    run = start_run(config, tmp_path / "run", force=False)
    with pytest.raises(TrainingError, match=rf"cannot change when resuming \({key}:"):
        resume_config(run, None, [change], allow_changes=True)
    assert resume_config(run, None, ["model.dropout=0.2"], allow_changes=True).model.dropout == 0.2


def test_a_run_from_before_pad_multiple_resumes_with_its_batches(tmp_path, tiny_prefix):
    """A config.yaml written before `data.pad_multiple` existed (its batches were each side's
    own width): the run resumes without a flag, its batches planned as they were."""
    trainer = trained_run(tmp_path, tiny_prefix, "data.pad_multiple=1")
    config_file = trainer.run.config
    lines = config_file.read_text().splitlines()
    config_file.write_text("\n".join(x for x in lines if "pad_multiple" not in x) + "\n")
    config = resume_config(trainer.run, None, ["train.max_steps=6"], allow_changes=True)
    assert config.data.pad_multiple == 1
    resumed = Trainer(config, trainer.run, distributed.Dist(), cpu(), resume=True)
    assert resumed.data.train.state_dict() == trainer.data.train.state_dict()


def test_force_retrains_a_tokenizer_of_another_size(tmp_path, tiny_prefix):
    run = tmp_path / "run"
    common = [
        "train",
        "tiny",
        "--out",
        str(run),
        "--set",
        f"data.train={tiny_prefix}",
        "--set",
        f"data.dev={tiny_prefix}-dev",
        "--set",
        "train.max_steps=1",
        "--set",
        "train.eval_every=0",
    ]
    runner = CliRunner()
    assert runner.invoke(app, common).exit_code == 0
    assert Tokenizer.load(run / "tokenizer").src_vocab_size == 100
    again = runner.invoke(app, [*common, "--force", "--set", "data.vocab_size=120"])
    assert again.exit_code == 0, again.output
    assert Tokenizer.load(run / "tokenizer").src_vocab_size == 120
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["model"]["src_embed.token.weight"].shape[0] == 120
    settings = json.loads((run / "tokenizer" / "settings.json").read_text())
    assert settings["vocab_size"] == 120


def test_a_resumed_run_refuses_a_tokenizer_it_was_not_trained_with(tmp_path, tiny_prefix):
    config = config_for(tiny_prefix)
    run = start_run(config, tmp_path / "run", force=False)
    corpus = load_corpus(tiny_prefix, "es", "en")
    choose_tokenizer(config.data, run.tokenizer, corpus, seed=1, resume=False)
    other = config_for(tiny_prefix, "data.tokenizer_type=unigram")
    with pytest.raises(InputError, match=r"tokenizer_type 'bpe' \(config: 'unigram'\)"):
        choose_tokenizer(other.data, run.tokenizer, corpus, seed=1, resume=True)
    # A new run (or --force) retrains it instead.
    assert choose_tokenizer(other.data, run.tokenizer, corpus, seed=1, resume=False) is not None
    settings = json.loads((run.tokenizer / "settings.json").read_text())
    assert settings["tokenizer_type"] == "unigram"


def test_a_run_killed_before_its_first_checkpoint_resumes_from_zero(tmp_path, tiny_prefix, caplog):
    caplog.set_level(logging.INFO)
    config = config_for(tiny_prefix, "train.max_steps=3")
    run = start_run(config, tmp_path / "run", force=False)
    run.metrics.write_text('{"step": 1, "loss": 9.0}\n{"step": 2, "lo')  # the killed session's
    result = CliRunner().invoke(app, ["train", "--resume", str(run.path)])
    assert result.exit_code == 0, result.output
    assert "no checkpoint yet; starting the run from update 0" in caplog.text
    assert load_checkpoint(run.checkpoints / "last.pt")["step"] == 3
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    steps = [r["step"] for r in records]
    # The killed session's records (step 1, and step 2's cut short) are gone.
    assert steps == sorted(steps) and 1 not in steps and all(r.get("loss") != 9.0 for r in records)


def test_resume_of_a_missing_run_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["train", "--resume", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no such run directory" in result.stderr


def test_a_resume_replaces_config_yaml_whole_never_rewrites_it_in_place(tmp_path, tiny_prefix):
    """Written in place, a kill (or a full disk) mid-write leaves a truncated config.yaml and a
    run that cannot resume. Replaced by a rename, the old file is untouched until the new one
    is whole: a hard link to the old one keeps the old text."""
    first = trained_run(tmp_path, tiny_prefix)
    kept = tmp_path / "config-before.yaml"
    os.link(first.run.config, kept)
    before = kept.read_text()
    args = ["train", "--resume", str(first.run.path), "--allow-config-change"]
    result = CliRunner().invoke(app, [*args, "--set", "train.max_steps=5"])
    assert result.exit_code == 0, result.output
    assert kept.read_text() == before  # the old file was not truncated and rewritten
    assert load_config(first.run.config).train.max_steps == 5
    assert not list(first.run.path.glob(".config.yaml.*"))  # no temporary file left behind
