"""Sequence-level distillation: `make distill` end to end on the tiny fixture, and its parts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from test_cli import tf

from cli.commands.distill import complete_lines
from data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
STUDENT = """
model:
  d_model: 16
  n_heads: 4
  d_ff: 32
  n_encoder_layers: 2
  n_decoder_layers: 1
  max_positions: 256
data:
  max_len: 64
  dev: {dev}
train:
  max_tokens: 512
  max_steps: 3
  eval_every: 0
  eval_bleu_sentences: 10
  save_every: 0
decode:
  beam_size: 2
  max_len_b: 10
"""


def test_make_distill_runs_the_whole_pipeline(trained, tiny_prefix, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(trained, teacher)
    config = tmp_path / "student.yaml"
    config.write_text(STUDENT.format(dev=tiny_prefix))
    for lang in ("es", "en"):  # the comparison's test set: a few lines keep it fast
        lines = Path(f"{tiny_prefix}.{lang}").read_text().splitlines()[-20:]
        (tmp_path / f"test.{lang}").write_text("\n".join(lines) + "\n")
    make = [
        "make",
        "-s",
        "distill",
        f"TEACHER={teacher}",
        f"STUDENT_CONFIG={config}",
        f"SRC={tmp_path / 'test.es'}",
        f"REF={tmp_path / 'test.en'}",
        "BEAM=2",
    ]
    done = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    distilled = teacher / "distilled"
    sources = (distilled / "train.es").read_text().splitlines()
    assert sources == Path(f"{tiny_prefix}.es").read_text().splitlines()  # the teacher's corpus
    assert len((distilled / "train.en").read_text().splitlines()) == len(sources)
    record = json.loads((distilled / "distill.json").read_text())
    assert record["decode"]["beam_size"] == 2 and record["checkpoint"].endswith(".pt")
    student = Path(f"{teacher}-student")
    assert (student / "checkpoints" / "last.pt").is_file()
    same = (
        Tokenizer.load(student / "tokenizer").digest()
        == Tokenizer.load(teacher / "tokenizer").digest()
    )
    assert same  # the student needs no tokenizer of its own
    assert f"train: {distilled / 'train'}" in (student / "config.yaml").read_text()
    assert "parameters" in done.stdout and str(student) in done.stdout  # the comparison table
    again = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already distilled" in again.stdout  # every step resumes


def test_a_killed_distillation_restarts_after_its_last_whole_line(trained, tiny_prefix, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    lines = Path(f"{tiny_prefix}.es").read_text().splitlines()
    partial = out / ".train.en.partial"
    partial.write_text("first\nsecond\nhalf a li")  # the kill cut the third line
    assert complete_lines(partial) == 2 and partial.read_text() == "first\nsecond\n"
    result = tf("distill", trained, "--out", out, "--beam", "1")
    assert result.exit_code == 0, result.output
    translated = (out / "train.en").read_text().splitlines()
    assert translated[:2] == ["first", "second"] and len(translated) == len(lines)
    assert not partial.exists()
