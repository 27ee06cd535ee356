"""Every bad input is one line on stderr, exit status 2, no traceback, found before any work,
and nothing already written is lost."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.runs.checkpoint import save_atomic

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("train.max_tokens=0", "train.max_tokens must be positive"),
        ("train.update_freq=0", "train.update_freq must be positive"),
        ("train.log_every=-1", "train.log_every must be positive"),
        ("train.max_steps=-5", "train.max_steps must be 0 or more"),
        ("train.warmup_steps=0", "train.warmup_steps must be positive"),
        ("train.lr=0", "train.lr must be positive"),
        ("train.betas=[0.9]", "train.betas must be two numbers"),
        ("train.label_smoothing=1.0", "train.label_smoothing must be in [0, 1)"),
        ("train.ema_decay=1.0", "train.ema_decay must be in [0, 1)"),
        ("model.d_model=0", "model.d_model must be positive"),
        ("model.d_model=30", "model.d_model 30 is not divisible by model.n_heads 4"),
        ("model.n_heads=3", "model.d_model 32 is not divisible by model.n_heads 3"),
        ("model.dropout=1.5", "model.dropout must be in [0, 1)"),
        ("model.tie_embeddings=both", "model.tie_embeddings must be one of"),
        ("data.joint_vocab=false", "model.tie_embeddings 'all' needs data.joint_vocab"),
        ("data.max_len=256", "data.max_len 256 must be below model.max_positions 256"),
        ("data.vocab_size=0", "data.vocab_size must be 8 or more"),
        ("decode.beam_size=0", "decode.beam_size must be positive"),
        ("decode.patience=-1", "decode.patience must be 0 or more"),
        ("decode.precision=fp8", "decode.precision must be"),
        ("train.device=tpu", "train.device 'tpu' is unknown"),
        ("train.lr=nan", "train.lr must be a finite number, got nan"),
        ("train.betas=[0.9,.inf]", "train.betas must be a finite number"),
        ("decode.patience=inf", "decode.patience must be a finite number, got inf"),
        ("decode.length_penalty=nan", "decode.length_penalty must be a finite number"),
        ("decode.max_len_a=-.inf", "decode.max_len_a must be a finite number"),
    ],
)
def test_config_values_out_of_range(tmp_path, tiny_prefix, setting, fragment):
    run = tmp_path / "run"
    result = tf(
        "train", "tiny", "--out", run, "--set", f"data.train={tiny_prefix}", "--set", setting
    )
    assert_user_error(result, fragment)
    assert not run.exists()  # refused before anything was written


def test_odd_d_model_is_refused():
    from cli.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.d_model 33 must be even"):
        load_config("tiny", ["model.d_model=33", "model.n_heads=3"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_it(tmp_path, tiny_prefix, trained):
    run = tmp_path / "run"
    result = tf(
        "train",
        "tiny",
        "--out",
        run,
        "--set",
        f"data.train={tiny_prefix}",
        "--set",
        "train.device=cuda",
    )
    assert_user_error(result, "device 'cuda': CUDA is not available")
    assert not (run / "tokenizer").exists()  # found before the tokenizer trained
    assert_user_error(tf("translate", trained, "--device", "cuda", input="hola\n"), "CUDA")


def test_unknown_device_for_translation(trained):
    assert_user_error(tf("translate", trained, "--device", "gpu", input="hola\n"), "'gpu'")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--beam", "0"], "--beam must be 1 or more, got 0"),
        (["--beam", "-2"], "--beam must be 1 or more, got -2"),
        (["--nbest", "0"], "--nbest must be 1 or more, got 0"),
        (["--greedy", "--beam", "3"], "contradict"),
        (["--set", "decode.beam_sise=3"], "did you mean 'decode.beam_size'"),
        (["--set", "train.lr=3"], "only decode.KEY can be set here"),
        (["--set", "decode.max_tokens=0"], "decode.max_tokens must be positive"),
        (["--lenpen", "x"], ""),
    ],
)
def test_bad_decoding_options(trained, flags, fragment):
    result = tf("translate", trained, *flags, input="hola\n")
    if flags[0] == "--lenpen":  # typer's own check of a number: exit 2 as well
        assert result.exit_code == 2
        return
    assert_user_error(result, fragment)


def test_decode_settings_from_the_command_line(trained):
    text = "Y dijo Dios: Sea la luz.\n"
    result = tf(
        "translate",
        trained,
        "--lenpen",
        "1.0",
        "--set",
        "decode.no_repeat_ngram_size=3",
        input=text,
    )
    assert result.exit_code == 0, result.output
    short = tf(
        "translate",
        trained,
        "--set",
        "decode.max_len_b=1",
        "--set",
        "decode.max_len_a=0",
        input=text,
    )
    assert short.exit_code == 0 and len(short.stdout.split()) <= 1


def test_a_huge_length_limit_is_capped_at_the_models_positions(trained):
    """1e300 x a source length made no limit of 1e300 tokens but, cast to an integer first,
    one of INT64_MIN: every translation came out empty."""
    lines = "hola\nadios\n"
    huge = tf("translate", trained, "--greedy", "--set", "decode.max_len_a=1e300", input=lines)
    capped = tf("translate", trained, "--greedy", "--set", "decode.max_len_a=1000", input=lines)
    assert huge.exit_code == 0 and capped.exit_code == 0, huge.output
    assert huge.stdout == capped.stdout and huge.stdout.strip()


def test_output_paths_are_checked_before_translating(tmp_path, trained):
    a_file = tmp_path / "file"
    a_file.write_text("keep\n")
    assert_user_error(
        tf("translate", trained, "-o", a_file / "out.en", input="hola\n"), "is a file"
    )
    assert_user_error(tf("translate", trained, "-o", tmp_path, input="hola\n"), "is a directory")
    assert_user_error(tf("average", trained, "-o", a_file / "avg.pt"), "is a file")
    assert_user_error(tf("plot", trained, "-o", a_file / "c.png"), "is a file")
    assert_user_error(tf("train", "tiny", "--out", a_file), "is a file")
    assert a_file.read_text() == "keep\n"


def test_output_goes_through_a_private_temporary_file(tmp_path, trained):
    """The old fixed name `.out.en.partial` could be a symlink (or another process's file)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out.en"
    (tmp_path / ".out.en.partial").symlink_to(victim)
    result = tf("translate", trained, "--greedy", "-o", out, input="hola\n")
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious\n"
    assert len(out.read_text().splitlines()) == 1
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~current_umask()


def test_an_output_that_is_a_symlink_or_a_pipe_is_written_through(tmp_path, trained):
    """A symlink names the file to replace; a FIFO (as `-o >(gzip > x)` gives) is written into:
    replacing either with a regular file would lose it."""
    target = tmp_path / "target.en"
    target.write_text("old\n")
    link = tmp_path / "link.en"
    link.symlink_to(target)
    result = tf("translate", trained, "--greedy", "-o", link, input="hola\nadios\n")
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and len(target.read_text().splitlines()) == 2

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    try:  # a FIFO replaced by a file leaves its reader waiting: the test fails, and ends it
        result = tf("translate", trained, "--greedy", "-o", fifo, input="hola\nadios\n")
        read, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and len(read.splitlines()) == 2


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_checkpoints_get_the_permissions_of_a_plain_file(tmp_path):
    path = tmp_path / "c.pt"
    save_atomic({"format": "x", "w": torch.zeros(1)}, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~current_umask()


def test_eval_limit_applies_to_a_hypothesis_file(tmp_path):
    ref = tmp_path / "ref.en"
    hyp = tmp_path / "hyp.en"
    ref.write_text("the cat sat on the mat\na dog ran in the park\nsomething else\n")
    hyp.write_text("the cat sat on the mat\na dog ran in the park\nnothing alike here\n")
    result = tf("eval", "--hyp", hyp, "--ref", ref, "--limit", "2", "--json")
    assert result.exit_code == 0, result.output
    assert '"bleu": 100.0' in result.stdout and '"sentences": 2' in result.stdout


def make_vars() -> dict[str, str]:
    """The Makefile's variables as `make` resolves them, with no overrides."""
    out = subprocess.run(
        ["make", "-pn", "-f", "Makefile", "clean"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    found = {}
    for line in out.splitlines():
        for name in ("SRC", "REF"):
            if line.startswith(f"{name} ?= ") or line.startswith(f"{name} = "):
                found[name] = line.split("=", 1)[1].strip()
    return found


def test_makefile_defaults_lie_inside_the_repository():
    found = make_vars()
    assert set(found) == {"SRC", "REF"}
    for path in found.values():
        assert (ROOT / path).is_file() and not path.startswith(".."), path


def test_make_eval_fails_when_tf_eval_fails(tmp_path):
    """Piped into `tee`, a failing eval used to report success and leave an empty eval.json."""
    run = tmp_path / "no-run"
    run.mkdir()
    result = subprocess.run(
        ["make", "-s", "eval", f"RUN={run}", f"BIN={ROOT / '.venv' / 'bin'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert not (run / "eval.json").exists()


def test_eval_of_empty_files_is_one_line(trained, tmp_path):
    """sacrebleu fails with an IndexError on no sentences: tf says so first."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_user_error(tf("eval", "--hyp", empty, "--ref", empty), f"{empty}: no lines")
    assert_user_error(tf("eval", trained, "--src", empty, "--ref", empty), f"{empty}: no lines")


# Item 22: a NUL byte is no text (SentencePiece made it <unk>, and the run trained on), refused
# as invalid UTF-8 is, naming FILE:LINE, by every reader. JSON's "\u0000" escape decodes to one.
NUL_CORPORA = {
    "plain": ({"c.es": b"uno\ndos\ntr\x00es\n", "c.en": b"one\ntwo\nthree\n"}, "c", "c.es:3"),
    "gz": (
        {"c.es.gz": gzip.compress(b"uno\ndos\ntr\x00es\n"), "c.en": b"one\ntwo\nthree\n"},
        "c",
        "c.es.gz:3",
    ),
    "tsv": ({"p.tsv": b"es\ten\nuno\tone\ndos\ttw\x00o\n"}, "p.tsv", "p.tsv:3"),
    "jsonl": (
        {"p.jsonl": b'{"es": "uno", "en": "one"}\n{"es": "d\x00os", "en": "two"}\n'},
        "p.jsonl",
        "p.jsonl:2",
    ),
    "jsonl escaped": (
        {"p.jsonl": b'{"es": "uno", "en": "one"}\n\n{"es": "dos", "en": "t\\u0000wo"}\n'},
        "p.jsonl",
        "p.jsonl:3",  # the file's line: the blank one, which the reader skips, counted
    ),
}


@pytest.mark.parametrize("form", NUL_CORPORA)
def test_a_nul_byte_in_a_corpus_is_refused_naming_its_line(tmp_path, form):
    files, spec, where = NUL_CORPORA[form]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    run = tmp_path / "run"
    result = tf("train", "tiny", "--out", run, "--set", f"data.train={tmp_path / spec}")
    assert_user_error(result, f"{tmp_path / where}: ", "NUL")
    assert not (run / "tokenizer").exists()


@pytest.mark.parametrize(
    "text, flags, where",
    [
        ("hola\nad\x00ios\n", [], "<stdin>:2"),
        ('{"text": "hola"}\n{"text": "ad\x00ios"}\n', ["--input-format", "jsonl"], "<stdin>:2"),
        ('{"text": "ad\\u0000ios"}\n', ["--input-format", "jsonl"], "<stdin>:1"),
        ('{"text": "hola", "prefix": "a\\u0000"}\n', ["--input-format", "jsonl"], "<stdin>:1"),
    ],
)
def test_a_nul_byte_in_translate_input_is_refused_naming_its_line(trained, text, flags, where):
    assert_user_error(tf("translate", trained, *flags, input=text), f"{where}", "NUL")


@pytest.mark.parametrize("option", ["--hyp", "--ref", "--src"])
def test_a_nul_byte_in_an_eval_file_is_refused_naming_its_line(trained, tmp_path, option):
    files = {name: tmp_path / name for name in ("--hyp", "--ref", "--src")}
    for flag, path in files.items():
        path.write_bytes(b"a line\nx\x00y\n" if flag == option else b"a line\nanother\n")
    if option == "--src":
        args = [trained, "--src", files["--src"], "--ref", files["--ref"]]
    else:
        args = ["--hyp", files["--hyp"], "--ref", files["--ref"]]
    assert_user_error(tf("eval", *args), f"{files[option]}:2: ", "NUL")


@pytest.mark.parametrize("form", ["tsv", "tsv.gz", "jsonl", "jsonl.gz"])
def test_a_tag_in_a_corpus_is_named_by_the_files_own_line(tmp_path, tiny_prefix, form):
    """Item 23: a TSV's header line, and the blank lines the JSON reader skips, are lines of
    the file: the tag on line 6 is named as line 6 (it said 5)."""
    pairs = [("uno", "one"), ("dos", "two"), ("tres", "three"), ("cuatro", "four")]
    pairs.append(("Y dijo <bt> Dios", "And God said"))
    if form.startswith("tsv"):
        text = "es\ten\n" + "".join(f"{s}\t{t}\n" for s, t in pairs)
    else:
        lines = [json.dumps({"es": s, "en": t}) for s, t in pairs]
        text = "\n".join(lines[:2] + [""] + lines[2:]) + "\n"
    path = tmp_path / f"mixed.{form}"
    path.write_bytes(gzip.compress(text.encode()) if form.endswith(".gz") else text.encode())
    mix = f'[{{corpus: "{path}"}}, {{corpus: "{tiny_prefix}", tag: "<bt>"}}]'
    result = tf("train", "tiny", "--out", tmp_path / "run", "--set", f"data.train={mix}")
    assert_user_error(result, f"{path}:6: holds the text '<bt>'")


def test_a_nul_in_a_served_request_is_refused():
    """`tf serve` reads its requests' text through the same check as `tf translate`'s JSONL."""
    from cli.inference.requests import request_of

    with pytest.raises(ValueError, match=r"text\[1\]: holds a NUL"):
        request_of("ad\0ios", "text[1]")
    with pytest.raises(ValueError, match=r"text\[0\]\.constraints: holds a NUL"):
        request_of({"text": "hola", "constraints": ["a\0"]}, "text[0]")


# Item 26: options that were ignored or blamed on another.
def test_nbest_above_the_runs_beam_names_nbest_and_beam(trained):
    """The tiny run decodes at beam 2: `--nbest 3` alone asks more hypotheses than it keeps
    (the error said "--set: decode.nbest 3 ...", an option never given)."""
    result = tf("translate", trained, "--nbest", "3", input="hola\n")
    assert_user_error(result, "--nbest 3 needs --beam 3 or more")
    assert "--set" not in result.stderr
    assert_user_error(tf("translate", trained, "--beam", "1", "--nbest", "2", input="hola\n"))
    # A beam narrower than the run's own nbest, through either spelling.
    result = tf("translate", trained, "--set", "decode.nbest=3", input="hola\n")
    assert_user_error(result, "--nbest 3 needs --beam 3 or more", "decode.nbest 3")
    assert tf("translate", trained, "--nbest", "2", input="hola\n").exit_code == 0


def test_a_lenpen_that_is_no_number_names_lenpen(trained):
    result = tf("translate", trained, "--lenpen", "nan", input="hola\n")
    assert_user_error(result, "--lenpen must be a finite number, got nan")


@pytest.mark.parametrize("flags", [["--attention-head", "1"], ["--attention-layer", "0"]])
def test_attention_options_without_attention_are_refused(trained, flags):
    """`--attention-head` / `--attention-layer` choose what `--attention DIR` draws: alone
    they were ignored without a word."""
    result = tf("translate", trained, *flags, input="hola\n")
    assert_user_error(result, f"{flags[0]} needs --attention DIR")


@pytest.mark.parametrize(
    "extra, named",
    [
        (["RUN"], "RUN"),
        (["--src", "SRC"], "--src"),
        (["--beam", "3"], "--beam"),
        (["--greedy"], "--greedy"),
        (["--set", "decode.beam_size=3"], "--set"),
        (["--to", "en"], "--to"),
        (["--int8"], "--int8"),
    ],
)
def test_eval_of_a_hypothesis_file_refuses_what_only_a_model_uses(trained, tmp_path, extra, named):
    """`tf eval --hyp` scores a file: no model translates, so RUN (and --src, the decoding
    options) were ignored without a word; now refused, in one line, before any reading."""
    ref = tmp_path / "ref.en"
    ref.write_text("the light\n")
    extra = [{"RUN": trained, "SRC": ref}.get(a, a) for a in extra]
    assert_user_error(tf("eval", "--hyp", ref, "--ref", ref, *extra), "--hyp", named)


def test_a_count_of_one_is_said_in_the_singular(tmp_path):
    """ "1 lines" nowhere: eval's unequal files say "1 line" (`data.errors.counted`)."""
    from cli.inference.scoring import check_parallel
    from data.errors import InputError

    with pytest.raises(InputError, match=r"^s has 1 line but r has 2$"):
        check_parallel(Path("s"), ["a"], Path("r"), ["a", "b"])
