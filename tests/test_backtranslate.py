"""Back-translation: `make backtranslate` end to end on the tiny fixture, and `tf backtranslate`'s
record and resume (the bulk translator that `tf distill` shares)."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from test_cli import assert_user_error, tf
from test_distill import FP32, STUDENT, killed_after

from cli.inference import bulk, engines
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


def other_text(mono: Path, tmp_path: Path) -> Path:
    """As many lines as MONO, other text."""
    other = tmp_path / "other.es"
    other.write_text("".join(f"{line} otra\n" for line in mono.read_text().splitlines()))
    return other


def test_starting_over_with_other_sources_rewrites_both_sides(trained, mono, tmp_path):
    """issue 35 item 1: a run killed on one text, then given another of as many lines, said it
    started over and translated the new text, but train.es still held the old one: a corpus
    misaligned line for line, reported done."""
    out = tmp_path / "bt"
    with pytest.MonkeyPatch.context() as mp:
        killed_after(mp, 20)
        assert tf("backtranslate", trained, mono, "--out", out, *FP32, "--greedy").exit_code == 130
    other = other_text(mono, tmp_path)
    translated = backtranslated(trained, other, out, "--greedy")
    assert (out / "train.es").read_text() == other.read_text()
    assert translated == backtranslated(trained, other, tmp_path / "fresh", "--greedy")


def test_a_finished_corpus_is_checked_side_by_side_before_it_is_reported_done(
    trained, mono, tmp_path
):
    """issue 35 item 1: a whole OUT whose real side is not this run's sources, or whose sides
    differ in length (no record to compare, say), is refused, not reported "already done"."""
    out = tmp_path / "bt"
    translated = backtranslated(trained, mono, out, "--greedy")
    real = (out / "train.es").read_text()
    (out / "train.es").write_text(other_text(mono, tmp_path).read_text())
    again = ("backtranslate", trained, mono, "--out", out, *FP32, "--greedy")
    assert_user_error(tf(*again), f"{out / 'train.es'}: not the sources this run translates")
    (out / "train.es").write_text(real)
    (out / "backtranslate.json").unlink()  # made by other means: nothing to compare but sides
    (out / "train.en").write_text("".join(f"{line}\n" for line in translated[:-1]))
    assert_user_error(
        tf(*again), f"{out / 'train.en'}: {len(translated) - 1} translations for the "
        f"{len(translated)} lines of train.es"
    )  # fmt: skip


def test_a_resume_knows_its_input_by_content_not_by_its_path(
    trained, mono, tmp_path, monkeypatch, caplog
):
    """issue 35 item 2: MONO given as a relative path after an absolute one (or an identical
    copy) threw the partial work away and started over; a whole corpus asked for again through
    a copy was refused."""
    out = tmp_path / "bt"
    partial = out / ".train.en.partial"
    with pytest.MonkeyPatch.context() as mp:
        killed_after(mp, 30)
        tf("backtranslate", trained, mono, "--out", out, *FP32, "--greedy")
    kept = partial.read_text().splitlines()
    partial.write_text("\n".join(["first", "second", *kept[2:]]) + "\n")  # marks: kept or not
    monkeypatch.chdir(mono.parent)
    with caplog.at_level(logging.WARNING):
        resumed = backtranslated(trained, Path(mono.name), out, "--greedy")
    assert resumed[:2] == ["first", "second"]
    assert len(resumed) == len(mono.read_text().splitlines())
    assert not [r for r in caplog.records if "starting over" in r.getMessage()]
    copy = tmp_path / "copy.es"
    shutil.copyfile(mono, copy)
    again = tf("backtranslate", trained, copy, "--out", out, *FP32, "--greedy")
    assert again.exit_code == 0 and "already back-translated" in again.stdout, again.output


def test_an_empty_monolingual_file_is_a_one_line_error(trained, tmp_path):
    """issue 35 item 15: it reported "0 pairs" and wrote empty files, for training to fail on."""
    for text in ("", "\n  \n"):
        empty = tmp_path / "empty.es"
        empty.write_text(text)
        result = tf("backtranslate", trained, empty, "--out", tmp_path / "o")
        assert_user_error(result, f"{empty}: no text to back-translate")
        assert not (tmp_path / "o").exists()


def test_a_kill_loses_at_most_one_group_of_lines(trained, mono, tmp_path, monkeypatch):
    """issue 35 item 15: nothing reached the partial file before a whole 4,096-line chunk was
    translated, so a kill (SIGKILL: no buffer flushed) lost it all. Now the lines are searched
    FLUSH_EVERY at a time, and each search starts with every line before it on disk."""
    monkeypatch.setattr(bulk, "FLUSH_EVERY", 16)
    partial = tmp_path / "bt" / ".train.en.partial"
    searched, on_disk = [], []
    real = engines.translate_ids

    def translate_ids(model, tokenizer, src_ids, *args, **kwargs):
        # What a SIGKILL now would leave: the bytes that reached the file, not Python's buffer.
        on_disk.append(partial.read_bytes().count(b"\n"))
        searched.append(len(src_ids))
        return real(model, tokenizer, src_ids, *args, **kwargs)

    monkeypatch.setattr(engines, "translate_ids", translate_ids)
    backtranslated(trained, mono, tmp_path / "bt", "--greedy")
    assert sum(searched) == len(mono.read_text().splitlines()) and max(searched) == 16
    assert on_disk == list(itertools.accumulate([0, *searched[:-1]]))


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
