"""Back-translation: `make backtranslate` end to end on the tiny fixture, and `tf backtranslate`'s
record and resume (the bulk translator that `tf distill` shares)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_cli import assert_user_error, tf
from test_distill import FP32, STUDENT, killed_after

from cli.inference.bulk import complete_lines

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ("--greedy", "--set", "decode.sampling_topk=10", "--set", "decode.seed=3")


def backtranslated(run, mono: Path, out: Path, *args: str) -> list[str]:
    result = tf("backtranslate", run, mono, "--out", out, *FP32, *args)
    assert result.exit_code == 0, result.output
    return (out / "train.en").read_text().splitlines()


@pytest.fixture
def mono(tiny_prefix, tmp_path) -> Path:
    """Text in the run's source language (the tiny run stands in for a reverse model)."""
    path = tmp_path / "mono.es"
    path.write_text(Path(f"{tiny_prefix}.es").read_text())
    return path


def test_a_killed_sampled_backtranslation_resumes_as_if_never_killed(trained, mono, tmp_path):
    out = tmp_path / "bt"
    with pytest.MonkeyPatch.context() as mp:
        killed_after(mp, 70)
        assert tf("backtranslate", trained, mono, "--out", out, *FP32, *SAMPLE).exit_code == 130
    assert complete_lines(out / ".train.en.partial") == 70
    resumed = backtranslated(trained, mono, out, *SAMPLE)
    # A sample depends on its seed and sentence only: the resumed half matches an unbroken run.
    assert resumed == backtranslated(trained, mono, tmp_path / "fresh", *SAMPLE)
    assert (out / "train.es").read_text() == mono.read_text()  # the real side, as it was
    record = json.loads((out / "backtranslate.json").read_text())
    assert record["decode"]["sampling_topk"] == 10 and record["decode"]["seed"] == 3
    assert record["monolingual"] == str(mono) and record["pairs"] == len(resumed)
    other_seed = backtranslated(
        trained, mono, tmp_path / "seed4", *SAMPLE, "--set", "decode.seed=4"
    )
    assert other_seed != resumed
    again = tf("backtranslate", trained, mono, "--out", out, *FP32, *SAMPLE[:-1], "decode.seed=4")
    assert_user_error(again, "already back-translated with decode.seed=3")


def test_a_partial_file_of_other_text_starts_over(trained, mono, tmp_path, caplog):
    out = tmp_path / "bt"
    with pytest.MonkeyPatch.context() as mp:
        killed_after(mp, 20)
        tf("backtranslate", trained, mono, "--out", out, *FP32, "--greedy")
    (out / "train.es").unlink()  # the sources were written whole: another text this time
    other = tmp_path / "other.es"
    other.write_text("".join(f"{line} otra\n" for line in mono.read_text().splitlines()))
    translated = backtranslated(trained, other, out, "--greedy")
    assert translated == backtranslated(trained, other, tmp_path / "fresh", "--greedy")
    said = [r.getMessage() for r in caplog.records if "starting over" in r.getMessage()]
    assert said and "sources_sha256" in said[0]


def test_bad_monolingual_input_is_one_line(trained, tmp_path):
    bad = tmp_path / "bad.es"
    bad.write_bytes(b"hola\n\xff\n")
    assert_user_error(
        tf("backtranslate", trained, bad, "--out", tmp_path / "o"), f"{bad}:2: not valid UTF-8"
    )
    missing = tmp_path / "missing.es"
    assert_user_error(
        tf("backtranslate", trained, missing, "--out", tmp_path / "o"), "no such file"
    )


def test_make_backtranslate_runs_the_whole_recipe(tiny_prefix, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(STUDENT.format(dev=f"{tiny_prefix}-dev") + "  min_len: 1\n")
    lines = Path(f"{tiny_prefix}.en").read_text().splitlines()
    (tmp_path / "mono.en").write_text("\n".join(lines[:60]) + "\n")
    for lang in ("es", "en"):
        half = Path(f"{tiny_prefix}.{lang}").read_text().splitlines()[60:]
        (tmp_path / f"half.{lang}").write_text("\n".join(half) + "\n")
        (tmp_path / f"test.{lang}").write_text("\n".join(half[-20:]) + "\n")
    bt = tmp_path / "bt"
    make = [
        "make",
        "-s",
        "backtranslate",
        f"BT={bt}",
        f"BT_CONFIG={config}",
        f"PARALLEL={tmp_path / 'half'}",
        f"MONO={tmp_path / 'mono.en'}",
        f"SRC={tmp_path / 'test.es'}",
        f"REF={tmp_path / 'test.en'}",
    ]
    done = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    reverse = (bt / "reverse" / "config.yaml").read_text()
    assert "src_lang: en" in reverse and "tgt_lang: es" in reverse
    synthetic = bt / "synthetic"
    assert (synthetic / "train.en").read_text() == (tmp_path / "mono.en").read_text()
    assert len((synthetic / "train.es").read_text().splitlines()) == 60
    decode = json.loads((synthetic / "backtranslate.json").read_text())["decode"]
    assert decode["beam_size"] == 5 and decode["sampling_topk"] == 0  # the default: beam 5
    data = json.loads((bt / "forward" / "data.json").read_text())
    assert [c["tag"] for c in data["corpora"]] == [None, "<bt>"]
    assert "BLEU = " in done.stdout
    again = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already back-translated" in again.stdout
