"""NLLB-200 and mBART-50 directories as `transformers` 5 saves them (issue 67, item 8):
tokenizer.json and tokenizer_config.json, no sentencepiece.bpe.model (`save_pretrained` of
today's `NllbTokenizer` and `MBart50Tokenizer` writes none). tf reads tokenizer.json with the
`tokenizers` library, to `AutoTokenizer`'s ids.

The stand-ins (`benchmarks.fairseq_standin`): SentencePiece models trained here on the bundled
corpus written in five scripts (Latin as it is; Cyrillic, Greek, Arabic, Devanagari letter for
letter; CJK ideographs without spaces), wrapped by transformers' own classes, then loaded with
`AutoTokenizer` and saved again as a transformers 5 user's fine-tune is. Ids compared on 1,000
lines of the dev and test sets in those scripts, both sides.
"""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path

import pytest
from test_cli import assert_user_error, tf
from test_ensemble import split
from test_import import imported, quiet_transformers

from benchmarks.fairseq_standin import (
    make_model_standin,
    mbart50_tokenizer,
    nllb_tokenizer,
    train_spm,
)
from benchmarks.marian_standin import bundled_lines
from data.fairseq import SPM, TOKENIZER_JSON, FairseqTokenizer
from data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

CORPUS = Path(__file__).parent.parent / "data" / "corpora" / "bible-es-en"
LATIN = "abcdefghijklmnopqrstuvwxyz"
# Each script's letter for a..z (Devanagari: consonants, the vowels their signs after one).
ALPHABETS = {
    "cyrillic": "абцдефгхийклмнопярстувшжыз",
    "greek": "αβψδεφγηιξκλμνοπθρστυϝωχϋζ",
    "arabic": "ابثدهفغحيجكلمنوپقرستعڤشخىز",
    "devanagari": "अबचदएफगहइजकलमनओपखरसतउवशषयझ",
}
DEVANAGARI_SIGNS = {"a": "ा", "e": "े", "i": "ि", "o": "ो", "u": "ु"}
CJK = [chr(0x4E00 + 97 * i) for i in range(26)]  # 26 ideographs far apart
SCRIPTS = ["latin", *ALPHABETS, "cjk"]
# What the corpus lacks: unknown characters, runs of spaces, spaces before punctuation, special
# tokens typed as text (read as text, as tf's SentencePiece-backed tokenizers read them),
# nothing at all.
EDGES = [
    "",
    "Él dijo ☃ y ☃☃ luego ☃x.",
    "  Dios   dijo  ,  sea la luz .",
    "日本語 ok\tｆｕｌｌ ① x\u200by a\u00a0b",
    "Привет , мир ! مرحبا ؟ नमस्ते । \u095b\u0930\u0942\u0930",  # (ज़ as one character)
]
# Each kind: its stand-in's class's source languages and a target language, as codes.
KINDS = {
    "nllb": ("spa_Latn", "eng_Latn", "fra_Latn"),
    "nllb-legacy": ("spa_Latn", "eng_Latn", "fra_Latn"),
    "nllb-today": ("spa_Latn", "eng_Latn", "fra_Latn"),
    "mbart50": ("es_XX", "en_XX", "fr_XX"),
}


def in_script(line: str, script: str) -> str:
    """`line` written letter for letter in `script` (accents dropped; CJK without spaces)."""
    if script == "latin":
        return line
    plain = "".join(
        c for c in unicodedata.normalize("NFD", line.lower()) if not unicodedata.combining(c)
    )
    if script == "cjk":
        table = dict(zip(LATIN, CJK)) | {" ": "", ".": "。", ",": "，"}
        return "".join(table.get(c, c) for c in plain)
    table = dict(zip(LATIN, ALPHABETS[script]))
    out = []
    for n, c in enumerate(plain):
        after_letter = n > 0 and plain[n - 1] in LATIN
        if script == "devanagari" and c in DEVANAGARI_SIGNS and after_letter:
            out.append(DEVANAGARI_SIGNS[c])
        else:
            out.append(table.get(c, c))
    return "".join(out)


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """1,000 lines of the bundled dev and test sets (Spanish and English): 250 as they are,
    150 written in each of the five other scripts."""
    latin = [
        line
        for name in ("dev.es", "dev.en", "test.es", "test.en")
        for line in (CORPUS / name).read_text(encoding="utf-8").splitlines()[:100]
    ]
    others = [
        in_script(line, script)
        for n, script in enumerate(SCRIPTS[1:])
        for line in latin[n * 50 : n * 50 + 150]
    ]
    assert len(latin[:250] + others) == 1000
    return latin[:250] + others


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each kind's stand-in as published (sentencepiece.bpe.model beside tokenizer.json) and
    as transformers 5 saves it (`AutoTokenizer.from_pretrained(...).save_pretrained(...)`)."""
    quiet_transformers()
    root = tmp_path_factory.mktemp("saved")
    src, tgt = bundled_lines(1500)
    corpus = [in_script(line, script) for script in SCRIPTS for line in src + tgt]
    bpe = train_spm(corpus, root / "bpe", 2000, "bpe")
    # (unigram's training takes 20 times as long: every fifth line, every script)
    unigram = train_spm(corpus[::5], root / "unigram", 1000, "unigram")
    published = {
        "nllb": nllb_tokenizer(root / "nllb", bpe),
        "nllb-legacy": nllb_tokenizer(root / "nllb-legacy", bpe, legacy=True),
        "nllb-today": nllb_tokenizer(root / "nllb-today", bpe, layout="transformers"),
        "mbart50": mbart50_tokenizer(root / "mbart50", unigram),
    }
    pairs = {}
    for kind, directory in published.items():
        again = root / f"{kind}-saved"
        transformers.AutoTokenizer.from_pretrained(directory).save_pretrained(again)
        pairs[kind] = (directory, again)
    return pairs


def reference(directory: Path, src_lang: str):
    return transformers.AutoTokenizer.from_pretrained(directory, src_lang=src_lang)


def test_transformers_5_saves_tokenizer_json_and_no_sentencepiece_model(saved):
    """The premise: what `save_pretrained` writes for these classes today."""
    for _, again in saved.values():
        assert (again / TOKENIZER_JSON).is_file() and not (again / SPM).exists()


@pytest.mark.parametrize("kind", KINDS)
def test_source_ids_of_tokenizer_json_alone_equal_autotokenizers(saved, lines, kind):
    """A source, its language's code at the line's start, is `AutoTokenizer(src_lang=...)`'s
    ids on 1,000 lines in five scripts, for two source languages (the code where
    transformers puts it: first, or after </s> with `legacy_behaviour`)."""
    _, again = saved[kind]
    ours = Tokenizer.load(again)
    assert isinstance(ours, FairseqTokenizer)
    for lang in KINDS[kind][:2]:
        expected = reference(again, lang)(lines + EDGES)["input_ids"]
        code = ours.languages[lang]
        assert ours.encode_src([f"{code} {line}" for line in lines + EDGES]) == expected
    assert len({i for row in expected for i in row}) > 500  # the scripts' pieces, not <unk>


@pytest.mark.parametrize("kind", KINDS)
def test_target_ids_and_decoding_of_tokenizer_json_alone_equal_autotokenizers(saved, lines, kind):
    """A target is `AutoTokenizer(text_target=...)`'s ids less its code and </s>, and decodes
    as `decode(skip_special_tokens=True)`."""
    _, again = saved[kind]
    ours = Tokenizer.load(again)
    theirs = reference(again, KINDS[kind][0])
    theirs.tgt_lang = KINDS[kind][2]
    framed = theirs(text_target=lines + EDGES)["input_ids"]
    code, eos = ours.tags[ours.languages[KINDS[kind][2]]], ours.eos_id
    legacy = ours.settings.legacy_behaviour
    ids = ours.encode_tgt(lines + EDGES)
    assert [[*row, eos, code] if legacy else [code, *row, eos] for row in ids] == framed
    assert ours.decode_tgt(framed) == [
        theirs.decode(row, skip_special_tokens=True) for row in framed
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_json_alone_reads_as_the_sentencepiece_model_beside_it(saved, lines, kind):
    """The same ids, pieces and vocabulary as the published directory's tokenizer, which
    SentencePiece cuts, on these lines: a model imported from either folder reads them alike.
    (transformers' conversion of a SentencePiece model may cut a rare word otherwise: tf
    follows the folder, SentencePiece where fairseq's model is, tokenizer.json where alone.)"""
    published, again = (Tokenizer.load(d) for d in saved[kind])
    code = published.languages[KINDS[kind][0]]
    texts = [f"{code} {line}" for line in lines]
    assert again.encode_src(texts) == published.encode_src(texts)
    assert again.encode_tgt(lines) == published.encode_tgt(lines)
    assert again.src_pieces(texts[500]) == published.src_pieces(texts[500])
    assert again.tgt_vocabulary() == published.tgt_vocabulary()


@pytest.fixture(scope="module")
def models(saved, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """A tiny NLLB-200 model beside each folder of its tokenizer, the same weights."""
    root = tmp_path_factory.mktemp("models")
    published, again = saved["nllb"]
    return {
        "published": make_model_standin(root / "published", "nllb", published),
        "saved": make_model_standin(root / "saved", "nllb", again),
    }


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory) -> dict[str, Path]:
    """`tf import` of each folder of `models`."""
    return {name: imported(d, tmp_path_factory.mktemp(name)) for name, d in models.items()}


# Greedy, short, in float32 (CTranslate2's directory computes in float32 on a CPU).
SHORT = ["--greedy", "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=16"]
SHORT += ["--set", "decode.precision=fp32"]


def translated(model: Path, sources: list[str], *options: str) -> list[str]:
    """`tf translate MODEL --from spa_Latn --to eng_Latn` of `sources`, `SHORT`."""
    args = ["--from", "spa_Latn", "--to", "eng_Latn", *SHORT, *options]
    result = tf("translate", model, *args, input="\n".join(sources) + "\n")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_tf_import_of_a_transformers_5_directory_translates_as_the_published_one(
    models, runs, lines, tmp_path
):
    """`tf import` takes the folder with no SentencePiece model (it refused it: "needs
    sentencepiece.bpe.model"), and the run translates as the import of the same model's
    published folder; `tf export --to huggingface` writes what AutoTokenizer reads to the
    same ids."""
    assert not (runs["saved"] / "tokenizer" / SPM).exists()
    sources = lines[:10] + lines[600:610]
    saved = translated(runs["saved"], sources)
    assert saved == translated(runs["published"], sources)
    assert len(set(saved)) > 5  # outputs of their sources
    out = tmp_path / "export"
    result = tf("export", runs["saved"], "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    exported, original = (reference(d, "spa_Latn") for d in (out, models["saved"]))
    assert exported(lines).input_ids == original(lines).input_ids


def test_a_transformers_5_directory_exported_to_ctranslate2_translates_as_its_run(
    runs, lines, tmp_path
):
    """`tf export --to ctranslate2` of the import of a folder with tokenizer.json alone: the
    directory holds that tokenizer (and no SentencePiece model), `tf translate DIR` reads it,
    and CTranslate2 writes the run's greedy lines with the run's scores (within 1e-3), in
    several scripts."""
    ct2 = tmp_path / "ct2"
    result = tf("export", runs["saved"], "--to", "ctranslate2", "-o", ct2)
    assert result.exit_code == 0, result.output
    assert (ct2 / TOKENIZER_JSON).is_file() and not (ct2 / SPM).exists()
    sources = lines[:10] + lines[400:405] + lines[900:905]  # Latin, Greek, CJK
    (our_texts, our_scores), (their_texts, their_scores) = (
        split(translated(model, sources, "--scores")) for model in (runs["saved"], ct2)
    )
    assert their_texts == our_texts
    assert their_scores == pytest.approx(our_scores, abs=1e-3)
    assert len(set(our_texts)) > 5  # outputs of their sources


def test_an_unreadable_tokenizer_json_alone_is_one_line_naming_it(models, tmp_path):
    directory = shutil.copytree(models["saved"], tmp_path / "model")
    data = json.loads((directory / TOKENIZER_JSON).read_text())
    data["model"]["type"] = "Nonsense"
    (directory / TOKENIZER_JSON).write_text(json.dumps(data))
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(result, f"{directory / TOKENIZER_JSON}: not a tokenizer")
    assert not (tmp_path / "run").exists()
