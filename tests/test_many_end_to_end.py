"""The whole path of an NLLB-200 model in `tf` (issue 57): import the stand-in, fine-tune it on a
corpus list in two directions named with the model's codes, resume exactly after a stop,
translate with `--from`/`--to` and a constraint, distill a student, export to both formats.

The stand-in is `benchmarks.fairseq_standin`'s: a tiny `M2M100ForConditionalGeneration` at
NLLB-200's layout over an NLLB tokenizer of a SentencePiece model trained on the bundled corpus,
its outputs made to depend on their sources (`make_telling`), saved
with `save_pretrained`. No network anywhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_import import quiet_transformers

from benchmarks.fairseq_standin import make_model_standin, nllb_tokenizer, train_spm
from benchmarks.marian_standin import bundled_lines
from cli.runs.checkpoint import load_checkpoint
from data.text import read_file_lines

pytest.importorskip("transformers")
SPA, ENG = "spa_Latn", "eng_Latn"


@pytest.fixture(scope="module")
def nllb_run(tmp_path_factory) -> Path:
    """The NLLB-200 stand-in, imported."""
    quiet_transformers()
    root = tmp_path_factory.mktemp("nllb")
    src, tgt = bundled_lines(3000)  # pieces enough for the stand-in's outputs to vary
    tokenizer = nllb_tokenizer(root / "tokenizer", train_spm(src + tgt, root / "spm", 1000, "bpe"))
    standin = make_model_standin(root / "standin", "nllb", tokenizer)
    result = tf("import", standin, "-o", root / "run")
    assert result.exit_code == 0, result.output
    return root / "run"


def coded_corpora(tiny_prefix: str, root: Path) -> Path:
    """The fixture's pairs as NLLB's codes name them: root/train.spa_Latn, .eng_Latn, dev too."""
    for split, source in (("train", tiny_prefix), ("dev", f"{tiny_prefix}-dev")):
        shutil.copyfile(f"{source}.es", root / f"{split}.{SPA}")
        shutil.copyfile(f"{source}.en", root / f"{split}.{ENG}")
    return root


def both_ways(prefix: Path) -> str:
    """A corpus list of `prefix` in both directions, its languages the model's codes."""
    one = f'corpus: "{prefix}", src_lang: {SPA}, tgt_lang: {ENG}'
    return f"[{{{one}}}, {{{one}, reverse: true}}]"


def test_nllb_import_fine_tune_resume_constrain_distill_export(nllb_run, tmp_path, tiny_prefix):
    corpora = coded_corpora(tiny_prefix, tmp_path)
    common = [
        "--set", f"data.train={both_ways(corpora / 'train')}",
        "--set", f"data.dev={both_ways(corpora / 'dev')}",
        "--set", "train.max_tokens=512",
        "--set", "train.eval_every=2",
        "--set", "train.save_every=2",
        "--set", "train.eval_bleu_sentences=8",
        "--set", "train.deterministic=true",
        "--set", "train.precision=fp32",
        "--set", "train.lr=1e-4",  # a step that leaves the stand-in's outputs varied
    ]  # fmt: skip

    def fine_tune(out: Path, steps: int) -> None:
        result = tf(
            "train", "finetune", "--init", nllb_run, "--out", out, *common,
            "--set", f"train.max_steps={steps}",
        )  # fmt: skip
        assert result.exit_code == 0, result.output

    # A corpus named with another family's spelling is refused before anything runs.
    wrong = f'data.train=[{{corpus: "{corpora / "train"}", src_lang: spa, tgt_lang: {ENG}}}]'
    refused = tf("train", "finetune", "--init", nllb_run, "--out", tmp_path / "x", *common,
                 "--set", wrong)  # fmt: skip
    assert_user_error(refused, "spa", SPA)
    assert not (tmp_path / "x").exists()

    fine_tune(tmp_path / "straight", 4)
    stopped = tmp_path / "stopped"
    fine_tune(stopped, 2)
    again = tf("train", "--resume", stopped, "--set", "train.max_steps=4", "--allow-config-change")
    assert again.exit_code == 0, again.output
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(stopped / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 4
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    records = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in records if "dev_bleu" in r]
    assert [r["step"] for r in validated] == [0, 2, 4]  # step 0: the imported model as it came
    assert {f"dev_bleu/{SPA}-{ENG}", f"dev_bleu/{ENG}-{SPA}"} <= set(validated[-1])
    data = load_checkpoint(stopped / "checkpoints" / "last.pt")["config"]["data"]
    assert data["lang_token_side"] == "target" and len(data["languages"]) == 202

    # Both directions, the target's code forced first; a constraint holds in the output.
    source = "Y dijo Dios: Sea la luz.\n"
    into = {}
    for frm, to in ((SPA, ENG), (ENG, SPA)):
        result = tf("translate", stopped, "--from", frm, "--to", to, "--greedy", input=source)
        assert result.exit_code == 0, result.output
        into[to] = result.stdout
    assert into[ENG] != into[SPA]
    request = json.dumps({"text": "Y dijo Dios: Sea la luz.", "constraints": ["God"]}) + "\n"
    constrained = tf(
        "translate", stopped, "--from", SPA, "--to", ENG, "--input-format", "jsonl",
        "--beam", "4", input=request,
    )  # fmt: skip
    assert constrained.exit_code == 0, constrained.output
    assert "God" in constrained.stdout

    # A student of the spa->eng direction: the teacher's translations of its corpus into eng.
    distilled = tmp_path / "distilled"
    short = ["--set", "decode.max_len_a=0", "--set", "decode.max_len_b=12"]
    result = tf("distill", stopped, "--out", distilled, "--from", SPA, "--to", ENG,
                "--beam", "2", *short)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (distilled / f"train.{SPA}").is_file() and (distilled / f"train.{ENG}").is_file()
    assert read_file_lines(distilled / f"train.{SPA}") == read_file_lines(corpora / f"train.{SPA}")
    student = tmp_path / "student"
    trained_student = tf(
        "train", "tiny", "--out", student,
        "--set", f"data.train={distilled}/train",
        "--set", f"data.dev={corpora}/dev",
        "--set", f"data.src_lang={SPA}",
        "--set", f"data.tgt_lang={ENG}",
        "--set", "data.clean=false",  # a teacher of 4 updates repeats itself
        "--set", "data.max_len=255",
        "--set", "data.max_len_ratio=1000",
        "--set", "train.max_steps=2",
    )  # fmt: skip
    assert trained_student.exit_code == 0, trained_student.output

    # Both formats; CTranslate2's output is tf's, the target's code as its target prefix.
    for engine in ("huggingface", "ctranslate2"):
        result = tf("export", stopped, "--to", engine, "-o", tmp_path / engine)
        assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "huggingface" / "config.json").read_text())
    assert config["architectures"] == ["M2M100ForConditionalGeneration"]
    lines = "\n".join(read_file_lines(corpora / f"dev.{SPA}")[:10]) + "\n"
    greedy = ["--from", SPA, "--to", ENG, "--greedy", "--set", "decode.precision=fp32"]
    ours = tf("translate", stopped, *greedy, input=lines)
    theirs = tf("translate", tmp_path / "ctranslate2", *greedy, input=lines)
    assert ours.exit_code == theirs.exit_code == 0, ours.output + theirs.output
    assert theirs.stdout == ours.stdout and len(set(ours.stdout.splitlines())) > 1
