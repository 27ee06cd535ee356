"""Sequence-level distillation: `make distill` end to end on the tiny fixture, and its parts."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from test_cli import assert_user_error, tf

from cli.inference.bulk import complete_lines
from cli.inference.engines import Engine
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
    config.write_text(
        STUDENT.format(dev=f"{tiny_prefix}-dev")
    )  # not the training pairs: cleaning would drop them all
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


def killed_after(monkeypatch, lines: int) -> None:
    """Make the engine's stream stop, as a kill (Ctrl-C) would, after `lines` translations."""
    real = Engine.stream

    def stream(self, *args, **kwargs):
        for n, item in enumerate(real(self, *args, **kwargs)):
            if n == lines:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(Engine, "stream", stream)


# fp32: the same numbers on every CPU, and fast (this tiny model's outputs run to the limit).
FP32 = ("--device", "cpu", "--set", "decode.precision=fp32")


def distilled(teacher, out: Path, *args: str) -> list[str]:
    result = tf("distill", teacher, "--out", out, *FP32, *args)
    assert result.exit_code == 0, result.output
    return (out / "train.en").read_text().splitlines()


def test_a_killed_distillation_restarts_after_its_last_whole_line(trained, tiny_prefix, tmp_path):
    out = tmp_path / "d"
    lines = Path(f"{tiny_prefix}.es").read_text().splitlines()
    partial = out / ".train.en.partial"
    with pytest.MonkeyPatch.context() as mp:
        killed_after(mp, 50)
        assert tf("distill", trained, "--out", out, "--beam", "1", *FP32).exit_code == 130
    assert complete_lines(partial) == 50 and (out / ".train.en.partial.json").is_file()
    kept = partial.read_text().splitlines()
    # Marks on the kept lines, and a last line the kill cut short.
    partial.write_text("\n".join(["first", "second", *kept[2:]]) + "\nhalf a li")
    translated = distilled(trained, out, "--beam", "1")
    fresh = distilled(trained, tmp_path / "fresh", "--beam", "1")
    assert translated[:2] == ["first", "second"] and len(translated) == len(lines)
    assert translated[2:] == fresh[2:]
    assert not partial.exists() and not (out / ".train.en.partial.json").exists()


def test_a_resume_with_other_settings_starts_over(trained, tmp_path, caplog):
    """150 greedy lines, then a resume at beam 2: the corpus is beam 2's throughout, and says so."""
    out = tmp_path / "d"
    with pytest.MonkeyPatch.context() as mp:
        killed_after(mp, 150)
        assert tf("distill", trained, "--out", out, "--beam", "1", *FP32).exit_code == 130
    greedy = (out / ".train.en.partial").read_text().splitlines()
    beam2 = distilled(trained, tmp_path / "beam2", "--beam", "2")
    assert len(greedy) == 150 and greedy != beam2[:150]  # the two searches differ here
    with caplog.at_level(logging.WARNING):
        resumed = distilled(trained, out, "--beam", "2")
    assert resumed == beam2
    assert json.loads((out / "distill.json").read_text())["decode"]["beam_size"] == 2
    (said,) = [r.getMessage() for r in caplog.records if "starting over" in r.getMessage()]
    assert "decode.beam_size=1" in said and "decode.beam_size=2" in said
    # Whole, it is not made again, nor passed off as another search's.
    again = tf("distill", trained, "--out", out, "--beam", "2", *FP32)
    assert again.exit_code == 0 and "already distilled" in again.stdout
    other = tf("distill", trained, "--out", out, "--beam", "1", *FP32)
    assert_user_error(other, "already distilled with decode.beam_size=2")
    assert (out / "train.en").read_text().splitlines() == beam2


def test_a_partial_file_without_a_record_starts_over(trained, tiny_prefix, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / ".train.en.partial").write_text("made\nby an unknown teacher\n")
    translated = distilled(trained, out, "--beam", "1")
    assert "made" not in translated
    assert len(translated) == len(Path(f"{tiny_prefix}.es").read_text().splitlines())


def test_make_distill_trains_the_students_own_tokenizer_when_asked():
    """STUDENT_TOKENIZER= (empty): the student trains a tokenizer of its config's size, as a
    small student of an imported teacher (OPUS-MT's 65k pieces) wants; by default the
    teacher's."""
    make = ["make", "-n", "distill", "TEACHER=runs/teacher"]
    own = subprocess.run([*make, "STUDENT_TOKENIZER="], cwd=ROOT, capture_output=True, text=True)
    default = subprocess.run(make, cwd=ROOT, capture_output=True, text=True)
    assert own.returncode == default.returncode == 0
    assert "data.tokenizer" not in own.stdout
    assert "--set data.tokenizer=runs/teacher/tokenizer" in default.stdout


@pytest.mark.parametrize("form", ["plain", "gz", "jsonl"])
def test_distill_corpus_needs_its_sources_alone(trained, tiny_prefix, tmp_path, form):
    """Item 16: `--corpus` names what the teacher translates; its target side is never read,
    so a corpus of sources alone (no PREFIX.en, no "en" key) is enough."""
    lines = Path(f"{tiny_prefix}-dev.es").read_text().splitlines()[:12]
    if form == "jsonl":
        spec = tmp_path / "only.jsonl"
        spec.write_text("".join(json.dumps({"es": line}) + "\n" for line in lines))
    else:
        spec = tmp_path / "only"
        text = "".join(line + "\n" for line in lines).encode()
        path = tmp_path / ("only.es.gz" if form == "gz" else "only.es")
        path.write_bytes(gzip.compress(text) if form == "gz" else text)
    out = tmp_path / "d"
    translated = distilled(trained, out, "--corpus", spec, "--beam", "1")
    assert (out / "train.es").read_text().splitlines() == lines and len(translated) == 12


@pytest.mark.parametrize("command", ["distill", "backtranslate"])
def test_an_out_that_is_a_file_or_under_one_is_one_line(trained, tiny_prefix, tmp_path, command):
    """Item 21: `--out afile` and `--out afile/sub` were a FileExistsError and a
    NotADirectoryError traceback; every other command's check says so in one line, before the
    model loads, and the file is left as it was."""
    afile = tmp_path / "afile"
    afile.write_text("kept\n")
    inputs = [Path(f"{tiny_prefix}.es")] if command == "backtranslate" else []
    for out, said in ((afile, f"{afile}: is a file"), (afile / "sub", f"{afile} is a file")):
        assert_user_error(tf(command, trained, *inputs, "--out", out, *FP32), said)
    assert afile.read_text() == "kept\n"


def test_a_reversed_corpus_gives_its_target_file_as_sources(tmp_path):
    """Item 16, read the other way: an es->en file pair listed with `reverse` trains en->es,
    so its sources are PREFIX.en, and PREFIX.es need not exist."""
    from cli.commands.distill import training_sources
    from data.config import CorpusConfig, DataConfig

    (tmp_path / "c.en").write_text("one\ntwo\n")
    d = DataConfig(train=[CorpusConfig(str(tmp_path / "c"), reverse=True)])
    assert training_sources(d, d.corpora()) == ["one", "two"]


def test_a_corpus_given_as_data_train_takes_one_is_that_corpus(trained, tiny_prefix, tmp_path):
    """Issue 67, item 14: `--corpus "{corpus: PREFIX, ...}"`, a corpus as data.train takes it,
    was read as a path ("...}.es: no such file"). Read by the config's schema, its own
    languages, `reverse` and a list of such corpora give the sources the spec alone gives;
    a weight (which would change nothing), an unknown key and a tag the teacher does not
    reserve are one line each, before anything is written."""
    lines = Path(f"{tiny_prefix}-dev.es").read_text().splitlines()[:6]
    (tmp_path / "only.es").write_text("\n".join(lines) + "\n")
    (tmp_path / "rev.es").write_text("\n".join(lines) + "\n")  # an en->es pair's target side
    only, rev = tmp_path / "only", tmp_path / "rev"
    plain = distilled(trained, tmp_path / "plain", "--corpus", only, "--beam", "1")
    for n, corpus in enumerate(
        [
            f"{{corpus: {only}, src_lang: es, tgt_lang: en}}",
            f"{{corpus: {only}}}",
            f"{{corpus: {rev}, src_lang: en, tgt_lang: es, reverse: true}}",
        ]
    ):
        out = tmp_path / f"mapped{n}"
        assert distilled(trained, out, "--corpus", corpus, "--beam", "1") == plain, corpus
        assert (out / "train.es").read_text().splitlines() == lines
    listed = f"[{{corpus: {only}}}, {{corpus: {only}}}]"
    twice = distilled(trained, tmp_path / "list", "--corpus", listed, "--beam", "1")
    assert twice == plain + plain
    for corpus, says in (
        (f"{{corpus: {only}, weight: 2}}", "a weight changes nothing here"),
        (f"{{corpus: {only}, wieght: 2}}", "unknown key 'corpus.wieght'"),
        (f"{{corpus: {only}, tag: '<bt>'}}", "tag '<bt>' is no reserved piece"),
        (f"{{corpus: {only}", "not a corpus in YAML"),
    ):
        out = tmp_path / "refused"
        assert_user_error(tf("distill", trained, "--out", out, "--corpus", corpus, *FP32), says)
        assert not out.exists()
