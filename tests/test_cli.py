"""The `tf` commands end to end on the 200-pair fixture, and their one-line errors."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from cli.runs.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def tf(*args: str, input: str | None = None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    return result


def test_help_lists_every_command():
    result = tf("--help")
    assert result.exit_code == 0
    for command in ("tokenizer", "train", "translate", "eval", "average", "plot"):
        assert command in result.output


def test_train_lays_out_a_self_contained_run(trained):
    assert (trained / "config.yaml").is_file()
    assert (trained / "tokenizer" / "joint.model").is_file()
    names = sorted(p.name for p in (trained / "checkpoints").glob("*.pt"))
    assert names == ["best.pt", "last.pt", "step_4.pt", "step_6.pt"]  # keep_last 2
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "dev_bleu" in r]
    assert [r["step"] for r in evals] == [3, 6]
    logs = [r for r in records if "loss" in r]
    assert logs and all(
        {"step", "epoch", "loss", "nll", "ppl", "lr", "tokens_per_s"} <= set(r) for r in logs
    )
    ckpt = load_checkpoint(trained / "checkpoints" / "last.pt")
    for key in (
        "model",
        "optimizer",
        "scheduler",
        "step",
        "epoch",
        "ranks",
        "config",
        "tokenizer_digest",
    ):
        assert key in ckpt
    assert ckpt["step"] == 6


def test_checkpoint_loads_with_plain_torch_weights_only(trained):
    ckpt = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)
    assert isinstance(ckpt["model"], dict)


def test_translate_stdin_to_stdout_keeps_lines_and_order(trained, tiny_prefix):
    lines = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()[:5]
    text = "\n".join([lines[0], "", lines[1], lines[2]]) + "\n"
    result = tf("translate", trained, "--greedy", input=text)
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert len(out) == 4 and out[1] == ""
    # Translating each line alone gives the same output: batching changes nothing.
    alone = [
        tf("translate", trained, "--greedy", input=line + "\n").stdout.strip()
        for line in (lines[0], lines[1], lines[2])
    ]
    assert [out[0], out[2], out[3]] == alone


def test_translate_defaults_to_the_runs_beam_and_equals_greedy_at_beam_1(trained):
    import cli.inference.decoding as decoding

    text = "Y dijo Dios: Sea la luz.\nEn el principio crió Dios los cielos y la tierra.\n"
    default = tf("translate", trained, input=text)  # tiny.yaml: decode.beam_size 2
    assert default.exit_code == 0, default.output
    assert len(default.stdout.splitlines()) == 2
    greedy = tf("translate", trained, "--greedy", input=text).stdout
    # --beam 1 takes the greedy path too; force it through beam search so the two differ in code.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decoding, "is_greedy", lambda decode: False)
        assert tf("translate", trained, "--beam", "1", input=text).stdout == greedy
    bad = tf("translate", trained, "--greedy", "--nbest", "2", input=text)
    assert bad.exit_code == 2 and "--nbest 2" in bad.stderr


def test_translate_files_nbest_and_scores(trained, tiny_prefix, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join(Path(f"{tiny_prefix}.es").read_text().splitlines()[:3]) + "\n")
    out = tmp_path / "out.en"
    result = tf(
        "translate", trained, "-i", src, "-o", out, "--beam", "3", "--nbest", "2", "--scores"
    )
    assert result.exit_code == 0, result.output
    rows = out.read_text().splitlines()
    assert len(rows) == 6
    assert [r.split(" ||| ")[0] for r in rows] == ["0", "1"] * 3
    scores = [float(r.split(" ||| ")[2]) for r in rows]
    assert all(scores[i] >= scores[i + 1] for i in range(0, 6, 2))


def test_eval_json_and_hyp_agree_with_sacrebleu_cli(trained, tiny_prefix, tmp_path):
    src, ref = Path(f"{tiny_prefix}.es"), Path(f"{tiny_prefix}.en")
    result = tf("eval", trained, "--src", src, "--ref", ref, "--greedy", "--json")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert {"bleu", "chrf", "bleu_signature", "chrf_signature", "decoding"} <= set(scores)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")

    hyp = tmp_path / "hyp.en"
    hyp.write_text(
        "\n".join(
            line.upper() if i % 3 else line for i, line in enumerate(ref.read_text().splitlines())
        )
        + "\n"
    )
    ours = json.loads(tf("eval", "--hyp", hyp, "--ref", ref, "--json").stdout)
    theirs = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sacrebleu",
                str(ref),
                "-i",
                str(hyp),
                "-m",
                "bleu",
                "chrf",
                "-w",
                "2",
                "-b",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )  # [bleu, chrf]
    assert 0 < theirs[0] < 100
    assert [ours["bleu"], ours["chrf"]] == pytest.approx(theirs, abs=0.01)


def test_average_cli(trained, tmp_path):
    out = trained / "checkpoints" / "avg.pt"
    result = tf("average", trained, "--last", "2", "-o", out)
    assert result.exit_code == 0, result.output
    avg = load_checkpoint(out)["model"]
    a = load_checkpoint(trained / "checkpoints" / "step_4.pt")["model"]
    b = load_checkpoint(trained / "checkpoints" / "step_6.pt")["model"]
    for k in avg:
        torch.testing.assert_close(avg[k], (a[k] + b[k]) / 2)
    assert tf("translate", out, "--greedy", input="Y dijo Dios.\n").exit_code == 0


def test_tokenizer_train_command(tmp_path, tiny_prefix):
    out = tmp_path / "tok"
    result = tf(
        "tokenizer",
        "train",
        "tiny",
        "--out",
        out,
        "--set",
        f"data.train={tiny_prefix}",
        "--set",
        "data.joint_vocab=false",
        "--set",
        "model.tie_embeddings=decoder",  # "all" needs one joint vocabulary
    )
    assert result.exit_code == 0, result.output
    assert (out / "src.model").is_file() and (out / "tgt.model").is_file()


# --- bad input: one line on stderr naming the file (and line), exit 2, no traceback ----------


def assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in err, err


def test_bad_inputs_give_one_line_errors(tmp_path, trained, tiny_prefix):
    short = tmp_path / "short"
    Path(f"{short}.es").write_text("uno\ndos\n")
    Path(f"{short}.en").write_text("one\n")
    assert_user_error(
        tf("train", "tiny", "--out", tmp_path / "r1", "--set", f"data.train={short}"),
        "short.es",
        "short.en",
        "2",
        "1",
    )

    bad = tmp_path / "bad"
    Path(f"{bad}.es").write_bytes(b"uno\ndos \xff\n")
    Path(f"{bad}.en").write_text("one\ntwo\n")
    assert_user_error(
        tf("train", "tiny", "--out", tmp_path / "r2", "--set", f"data.train={bad}"),
        "bad.es:2",
        "UTF-8",
    )

    assert_user_error(
        tf("train", "tiny", "--out", tmp_path / "r3", "--set", "data.train=nowhere/none"),
        "nowhere/none",
    )

    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("hola\thello\nsolo una columna\n")
    assert_user_error(
        tf("train", "tiny", "--out", tmp_path / "r4", "--set", f"data.train={tsv}"), "pairs.tsv:2"
    )

    empty = tmp_path / "empty"
    Path(f"{empty}.es").write_text("\n\nhola\n")
    Path(f"{empty}.en").write_text("a\n\n\n")
    assert_user_error(
        tf("train", "tiny", "--out", tmp_path / "r5", "--set", f"data.train={empty}"),
        "no sentence pairs left",
    )

    assert_user_error(tf("train", "tiny", "--set", "train.max_stepz=3"), "train.max_steps")
    assert_user_error(tf("train", "tiny", "--set", "train.max_steps=many"), "train.max_steps")
    assert_user_error(
        tf(
            "train",
            "tiny",
            "--out",
            tmp_path / "r6",
            "--set",
            "data.train=hf:no-such-dataset-anywhere",
        ),
        "no-such-dataset-anywhere",
    )


def test_bad_checkpoints_and_eval_files(tmp_path, trained, tiny_prefix):
    cut = tmp_path / "cut.pt"
    data = (trained / "checkpoints" / "last.pt").read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    assert_user_error(tf("translate", cut, input="hola\n"), "cut.pt")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    assert_user_error(tf("translate", foreign, input="hola\n"), "foreign.pt", "not a tf")
    assert_user_error(tf("translate", tmp_path / "missing.pt", input="hola\n"), "missing.pt")
    assert_user_error(tf("translate", trained, "-i", tmp_path / "none.es"), "none.es")

    ref = Path(f"{tiny_prefix}.en")
    two = tmp_path / "two.es"
    two.write_text("uno\ndos\n")
    assert_user_error(tf("eval", trained, "--src", two, "--ref", ref), "two.es", "tiny.en")
    bad = tmp_path / "bad.es"
    bad.write_bytes(b"uno\n\xc3\x28\n")
    assert_user_error(tf("translate", trained, "-i", bad), "bad.es:2")


def test_failed_translation_leaves_existing_output_intact(tmp_path, trained):
    out = tmp_path / "out.en"
    out.write_text("precious\n")
    bad = tmp_path / "bad.es"
    bad.write_bytes(b"uno\n\xff\n")
    assert_user_error(tf("translate", trained, "-i", bad, "-o", out), "bad.es:2")
    assert out.read_text() == "precious\n"


def test_gzip_corpus_and_jsonl_train(tmp_path, tiny_prefix):
    src = Path(f"{tiny_prefix}.es").read_text().splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text().splitlines()
    jsonl = tmp_path / "pairs.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        for s, t in zip(src, tgt):
            f.write(json.dumps({"translation": {"es": s, "en": t}}, ensure_ascii=False) + "\n")
    result = tf(
        "train",
        "tiny",
        "--out",
        tmp_path / "run",
        "--set",
        f"data.train={jsonl}",
        "--set",
        f"data.dev={tiny_prefix}-dev",
        "--set",
        "train.max_steps=2",
        "--set",
        "train.eval_every=0",
    )
    assert result.exit_code == 0, result.output


def test_streaming_in_chunks_changes_nothing(trained, tiny_prefix, monkeypatch):
    import cli.inference.decoding as decoding
    import cli.inference.engines as engines

    lines = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()[:7]
    text = "\n".join(lines) + "\n"
    whole = tf("translate", trained, "--greedy", input=text).stdout
    sizes = []
    real_translate_ids = engines.translate_ids

    def counting(model, tokenizer, src_ids, *args, **kwargs):
        sizes.append(len(src_ids))
        return real_translate_ids(model, tokenizer, src_ids, *args, **kwargs)

    monkeypatch.setattr(engines, "translate_ids", counting)
    monkeypatch.setattr(decoding, "CHUNK_LINES", 3)  # 7 lines -> chunks of 3, 3, 1
    assert tf("translate", trained, "--greedy", input=text).stdout == whole
    assert sizes == [3, 3, 1]  # the chunking really happened


def test_over_long_line_is_translated_in_parts_not_cut(trained, caplog):
    """Issue 69: a line over the model's limit is translated in parts and joined, with one
    note; nothing is cut (it was, with a warning)."""
    caplog.set_level("INFO")
    long_line = " ".join(["palabra"] * 400)  # far over tiny.yaml's max_positions 256
    result = tf("translate", trained, "--greedy", input=f"hola\n{long_line}\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2
    assert not [r for r in caplog.records if "truncated" in r.getMessage()]
    notes = [r.getMessage() for r in caplog.records if "in parts" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("<stdin>: 1 line over the model's limit")


def test_tf_keeps_the_memory_it_frees_for_its_next_allocations():
    """`tf` (cli.main.main) sets glibc to reuse freed large blocks: allocating a 100-MB tensor
    again after freeing it reuses pages, where the default hands it back and faults every
    page in anew. (glibc places the first few blocks anew while its free ones fragment: over
    30 allocations most reuse.)"""
    import subprocess
    import sys

    probe = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from cli.device import keep_freed_memory
    keep_freed_memory()
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(25_000_000)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults[1:])
"""
    counts = {}
    for way in ("keep", "default"):
        done = subprocess.run(
            [sys.executable, "-c", probe, way], capture_output=True, text=True, check=True
        )
        counts[way] = [int(n) for n in done.stdout.split()]
    assert min(counts["default"]) > 20_000  # 100 MB of 4-kB pages, faulted in every time
    assert sum(n < 1_000 for n in counts["keep"]) >= len(counts["keep"]) // 2
    assert sum(counts["keep"]) < sum(counts["default"]) / 2


def test_tf_sets_memory_reuse_before_any_command(monkeypatch):
    """`tf`'s entry point calls keep_freed_memory before the command runs (the test above
    shows what the call does)."""
    import cli.device
    import cli.main

    calls = []
    monkeypatch.setattr(cli.device, "keep_freed_memory", lambda: calls.append("keep"))
    monkeypatch.setattr(cli.main, "app", lambda: calls.append("command"))
    cli.main.main()
    assert calls == ["keep", "command"]


def test_translating_imports_no_datasets(trained):
    """`datasets` (half a second to import, with pandas and pyarrow) is for reading corpora:
    `tf translate` starts without it."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli.main", "translate", str(trained)],
        input="hola\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert done.stdout.strip() and "torch" in imported and "sentencepiece" in imported
    assert "datasets" not in imported and "pandas" not in imported


def test_reading_a_corpus_keeps_datasets_quiet():
    """What `datasets` would log or draw while tf reads corpora stays quiet: set where every
    corpus is read (`data.corpus`), not at start-up."""
    import logging

    import datasets

    import data.corpus  # noqa: F401

    assert datasets.logging.get_verbosity() == logging.ERROR
    assert not datasets.is_progress_bar_enabled()
