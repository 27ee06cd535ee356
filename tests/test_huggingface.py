"""`tf export --to huggingface`, drop-in: loaded as any translation model is (`AutoTokenizer`,
`AutoModelForSeq2SeqLM`, `generate(**tokenizer(lines, padding=True))`, nothing else), it gives
`tf translate --greedy`'s output; and its model card says what a Hub reader needs."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from test_cli import tf
from test_export import SENTENCES, ending, exported, ours, sharp  # noqa: F401 - fixtures

from cli.inference.decoding import encode_sources
from cli.training.checkpoint import load_checkpoint, load_for_inference, save_atomic

# Lines of several lengths, in one padded batch.
LINES = [
    *SENTENCES,
    "La tierra",
    "Y fue la tarde y la mañana el día primero.",
    "Y llamó Dios a la luz Día, y a las tinieblas llamó Noche.",
]


def with_decode(run: Path, out: Path, **decode) -> Path:
    """A copy of `run` whose checkpoint's config has these decode settings."""
    shutil.copytree(run, out)
    path = out / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    ckpt["config"]["decode"].update(decode)
    save_atomic(ckpt, path)
    return out


def drop_in(directory: Path, lines: list[str]) -> list[str]:
    """What a `transformers` user runs, with no knowledge of tf."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSeq2SeqLM.from_pretrained(directory)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    return tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)


def tf_greedy(run: Path, lines: list[str]) -> list[str]:
    result = tf(
        "translate",
        run,
        "--greedy",
        "--set",
        "decode.precision=fp32",
        input="\n".join(lines) + "\n",
    )
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_the_export_translates_as_tf_greedy(ending, tmp_path_factory):  # noqa: F811
    """With a length limit that is one number (decode.max_len_a 0), every line: those that end
    and those cut at the limit."""
    run = with_decode(
        ending, tmp_path_factory.mktemp("uniform") / "run", max_len_a=0.0, max_len_b=12
    )
    directory = exported(run, "huggingface", tmp_path_factory)
    assert drop_in(directory, LINES) == tf_greedy(run, LINES)
    lengths = {len(t) for t in ours(run, beam_size=1, max_len_a=0.0, max_len_b=12)}
    assert len(lengths) > 1 and 12 in lengths  # some ended, some were cut


def test_the_export_translates_as_tf_greedy_what_tf_ends(ending, tmp_path_factory):  # noqa: F811
    """With tf's per-sentence limit (a * len(src) + b): every line that tf ends before it."""
    directory = exported(ending, "huggingface", tmp_path_factory)
    model, tok, config = load_for_inference(ending, torch.device("cpu"))
    src = encode_sources(tok, SENTENCES, model.config.max_positions, "test", 1)
    ended = [
        i
        for i, (ids, out) in enumerate(zip(src, ours(ending, beam_size=1)))
        if len(out) < int(config.decode.max_len_a * len(ids) + config.decode.max_len_b)
    ]
    assert ended  # the comparison below compares something
    got, expected = drop_in(directory, SENTENCES), tf_greedy(ending, SENTENCES)
    assert [got[i] for i in ended] == [expected[i] for i in ended]


def test_the_tokenizer_gives_the_model_what_tf_gives_it(sharp, tiny_prefix, tmp_path_factory):  # noqa: F811
    from transformers import AutoTokenizer

    directory = exported(sharp, "huggingface", tmp_path_factory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    _, tok, _ = load_for_inference(sharp, torch.device("cpu"))
    lines = Path(f"{tiny_prefix}.es").read_text().splitlines() + [" a  b ", "<s> </s>", "ﬁ ①"]
    assert tokenizer(lines)["input_ids"] == tok.encode_src(lines)  # nothing appended
    ids = tok.encode_tgt(Path(f"{tiny_prefix}.en").read_text().splitlines())
    (space,) = tok.tgt_piece_ids(["▁"])
    ids += [[tok.unk_id, 5, 6], [7, tok.unk_id], [space, space, 30]]  # unknown, leading "▁"s
    assert tokenizer.batch_decode(ids, skip_special_tokens=True) == tok.decode_tgt(ids)
    assert not any(f.name.endswith(".spm") for f in directory.iterdir())  # no MarianTokenizer


def test_the_model_card_says_what_a_hub_reader_needs(trained, tiny_prefix, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    card = export_card(run, tmp_path / "plain")
    assert card.startswith("---\nlanguage:\n- es\n- en\n")  # Hub metadata
    assert "AutoTokenizer.from_pretrained" in card and "AutoModelForSeq2SeqLM" in card
    assert f"`{tiny_prefix}`" in card and "d_model 32" in card
    assert "Not evaluated" in card
    scores = tf(
        "eval",
        run,
        "--src",
        f"{tiny_prefix}.es",
        "--ref",
        f"{tiny_prefix}.en",
        "--greedy",
        "--json",
        "--limit",
        "10",
    )
    assert scores.exit_code == 0, scores.output
    (run / "eval.json").write_text(scores.stdout)
    card = export_card(run, tmp_path / "scored")
    bleu = json.loads(scores.stdout)
    assert f"| BLEU | {bleu['bleu']:.2f} | `{bleu['bleu_signature']}` |" in card
    assert "chrF" in card and "10 test sentences" in card
    # Scores older than the checkpoint are not this model's.
    best = run / "checkpoints" / "best.pt"
    later = time.time() + 10
    os.utime(best, (later, later))
    assert "Not evaluated" in export_card(run, tmp_path / "stale")


def export_card(run: Path, out: Path) -> str:
    result = tf("export", run, "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    return (out / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_fast_tokenizers_of_other_sentencepiece_models(tiny_prefix, tmp_path, kind):
    """Unigram models, byte fallback and reserved tags encode and decode as SentencePiece."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    from cli.exporters.hf_tokenizer import write_tokenizer
    from data.tokenizer import train_tokenizer

    src = Path(f"{tiny_prefix}.es").read_text().splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text().splitlines()
    tok = train_tokenizer(
        src,
        tgt,
        tmp_path / "tok",
        vocab_size=400,
        seed=0,
        model_type=kind,
        byte_fallback=True,
        tags=["<bt>"],
    )
    write_tokenizer(tok, tmp_path / "hf", 256)
    fast = AutoTokenizer.from_pretrained(tmp_path / "hf")
    sp = spm.SentencePieceProcessor(model_file=str(tok.model_paths()[0]))
    lines = src + tgt + ["日本語 😀", "  a  ", ""]
    assert fast(lines)["input_ids"] == [sp.encode(line) for line in lines]
    # A tag is its id alone, wherever it stands, as tf encodes it (SentencePiece would put a
    # lone "▁" before it, which no training pair has).
    tagged = ["x<bt>y <bt> z", "<bt> a", " <bt>  <bt> b", "<bt>"]
    assert fast(tagged)["input_ids"] == tok.encode_src(tagged)
    assert tok.encode_src(["<bt> a"])[0] == [tok.tags["<bt>"], *sp.encode("a")]
    ids = [sp.encode(line) for line in lines]
    assert fast.batch_decode(ids, skip_special_tokens=True) == [sp.decode(i) for i in ids]
