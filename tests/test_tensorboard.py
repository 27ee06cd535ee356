"""TensorBoard: the event files of a run hold what metrics.jsonl holds, step for step, read
back with tensorboard's own reader; a resumed run writes each step once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli import tf

pytest.importorskip("tensorboard")  # an optional extra; `make install` installs it
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def events(run: Path) -> dict[str, dict[int, list[float]]]:
    """Every scalar of RUN/tensorboard: {tag: {step: [values]}}."""
    reader = EventAccumulator(str(run / "tensorboard"))
    reader.Reload()
    scalars: dict[str, dict[int, list[float]]] = {}
    for tag in reader.Tags()["scalars"]:
        for event in reader.Scalars(tag):
            scalars.setdefault(tag, {}).setdefault(event.step, []).append(event.value)
    return scalars


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same(run: Path) -> None:
    scalars = events(run)
    seen = 0
    for record in records(run):
        validation = any(key.startswith("dev_") for key in record)
        for key, value in record.items():
            if key in ("step", "wall", "best") or validation and key == "epoch":
                continue  # the x axis, bookkeeping, and the epoch its log line gives
            assert scalars[key][record["step"]] == [pytest.approx(value, rel=1e-6)], key
            seen += 1
    assert seen == sum(len(steps) for steps in scalars.values())  # nothing else either
    for key in ("loss", "lr", "tokens_per_s", "dev_loss", "dev_bleu"):
        assert key in scalars


def test_event_files_hold_the_metrics_of_every_step(trained):
    assert_same(trained)
    assert sorted(events(trained)["dev_loss"]) == [3, 6]


def test_a_resumed_run_writes_each_step_once(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    # As if killed after step 6's events were written but before step 6 was saved: the last
    # checkpoint is step 4's.
    shutil.copy(run / "checkpoints" / "step_4.pt", run / "checkpoints" / "last.pt")
    result = tf("train", "--resume", run)
    assert result.exit_code == 0, result.output
    assert_same(run)
    assert [r["step"] for r in records(run) if "dev_loss" in r] == [3, 6]


def test_off_writes_no_events(tiny_prefix, tmp_path):
    sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.max_steps=1"]
    sets.append("train.tensorboard=false")
    flags = [a for s in sets for a in ("--set", s)]
    result = tf("train", "tiny", "--out", tmp_path / "run", *flags)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_tensorboard_reads_the_runs_folder_as_the_readme_shows(trained):
    """`tensorboard --logdir runs` (its --inspect mode reads the events and exits)."""
    import subprocess
    import sys

    tensorboard = Path(sys.executable).parent / "tensorboard"
    done = subprocess.run(
        [str(tensorboard), "--inspect", "--logdir", str(trained.parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tensorboard" in done.stdout and "last_step            6" in done.stdout
