"""The tokenizers of NLLB-200, M2M100 and mBART-50 (`data.fairseq`) against transformers' own
classes on the same files: stand-ins built by `benchmarks.fairseq_standin` (a SentencePiece
model trained once per session on the bundled corpus, wrapped and saved by transformers), ids
and decoding compared on 1,000 lines of the bundled dev and test sets, both languages."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from benchmarks.fairseq_standin import (
    m2m100_tokenizer,
    mbart50_tokenizer,
    nllb_tokenizer,
    train_spm,
)
from benchmarks.marian_standin import bundled_lines
from data.errors import InputError
from data.fairseq import M2M100, MBART50, NLLB, SETTINGS, FairseqTokenizer
from data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

CORPUS = Path(__file__).parent.parent / "data" / "corpora" / "bible-es-en"
# What the corpus lacks: unknown characters (one, several in a row, inside a word), runs of
# spaces, spaces before punctuation (which transformers' decode may clean up), nothing at all.
# (No space at a line's end: tf strips lines; transformers 5's NLLB would keep one as a "▁",
# where SentencePiece, which the model was trained with, drops it.)
EDGES = [
    "",
    "Él dijo ☃ y ☃☃ luego ☃x.",
    "  Dios   dijo  ,  sea la luz .",
    "¿ Quién es ? ¡ Nadie ! don't it 's we 're I 'm you 've ' quoted ' .",
    "日本語 ok\tｆｕｌｌ ① x\u200by a\u00a0b",
]


@pytest.fixture(scope="session")
def lines() -> list[str]:
    """1,000 lines: 250 of each of dev.es, dev.en, test.es, test.en."""
    files = ["dev.es", "dev.en", "test.es", "test.en"]
    return [
        line
        for name in files
        for line in (CORPUS / name).read_text(encoding="utf-8").splitlines()[:250]
    ]


@pytest.fixture(scope="session")
def standins(tmp_path_factory) -> dict[str, Path]:
    """Every stand-in, of two SentencePiece models (BPE, unigram) trained once, small."""
    root = tmp_path_factory.mktemp("fairseq")
    src, tgt = bundled_lines(3000)
    bpe = train_spm(src + tgt, root / "bpe", 1000, "bpe")
    unigram = train_spm(src + tgt, root / "unigram", 1000, "unigram")
    return {
        "nllb": nllb_tokenizer(root / "nllb", bpe),
        "nllb-legacy": nllb_tokenizer(root / "nllb-legacy", bpe, legacy=True),
        "nllb-today": nllb_tokenizer(root / "nllb-today", bpe, layout="transformers"),
        "m2m100": m2m100_tokenizer(root / "m2m100", bpe, src[:1000] + tgt[:1000]),
        "mbart50": mbart50_tokenizer(root / "mbart50", unigram),
        "mbart50-spm": mbart50_tokenizer(root / "mbart50-spm", unigram, tokenizer_json=False),
    }


def theirs(standin: Path, cls: str, src_lang: str):
    return getattr(transformers, cls).from_pretrained(standin, src_lang=src_lang)


CASES = [  # stand-in, transformers class, two source languages (as transformers names them)
    ("nllb", "NllbTokenizer", ["spa_Latn", "eng_Latn"]),
    ("nllb", "NllbTokenizerFast", ["spa_Latn", "eng_Latn"]),
    ("nllb-legacy", "NllbTokenizer", ["spa_Latn", "eng_Latn"]),
    ("nllb-legacy", "NllbTokenizerFast", ["spa_Latn", "eng_Latn"]),
    ("nllb-today", "NllbTokenizer", ["spa_Latn", "eng_Latn"]),
    ("m2m100", "M2M100Tokenizer", ["es", "en"]),
    ("mbart50", "MBart50TokenizerFast", ["es_XX", "en_XX"]),
    ("mbart50", "MBart50Tokenizer", ["es_XX", "en_XX"]),
    ("mbart50-spm", "MBart50TokenizerFast", ["es_XX", "en_XX"]),
]


@pytest.mark.parametrize("name, cls, langs", CASES)
def test_source_ids_equal_transformers_for_two_source_languages(standins, lines, name, cls, langs):
    """tf reads the language's code at the start of the line (with a space after it or not);
    transformers takes it as `src_lang`: the ids are the same, the code where transformers
    puts it (before the text, or after its </s> in NLLB's legacy order)."""
    ours = Tokenizer.load(standins[name])
    for lang in langs:
        reference = theirs(standins[name], cls, lang)
        code = ours.languages[lang]
        expected = reference(lines + EDGES)["input_ids"]
        assert ours.encode_src([f"{code} {line}" for line in lines + EDGES]) == expected
        assert ours.encode_src([f"{code}{line}" for line in lines[:50]]) == expected[:50]
        assert expected[0][0 if not ours.settings.legacy_behaviour else -1] == ours.tags[code]


@pytest.mark.parametrize("name, cls, langs", CASES)
def test_target_ids_and_decoding_equal_transformers(standins, lines, name, cls, langs):
    """A target is transformers' ids less its code and </s> (tf's batching adds the </s>, the
    run forces the code); decoding drops what `decode(skip_special_tokens=True)` drops."""
    ours = Tokenizer.load(standins[name])
    reference = theirs(standins[name], cls, langs[0])
    reference.tgt_lang = langs[1]
    framed = reference(text_target=lines + EDGES)["input_ids"]
    code, eos = ours.tags[ours.languages[langs[1]]], ours.eos_id
    ids = ours.encode_tgt(lines + EDGES)
    legacy = ours.settings.legacy_behaviour
    assert [[*row, eos, code] if legacy else [code, *row, eos] for row in ids] == framed
    expected = [reference.decode(row, skip_special_tokens=True) for row in framed]
    assert ours.decode_tgt(framed) == expected
    assert ours.decode_src(framed) == expected


@pytest.mark.parametrize("name, cls, langs", [CASES[i] for i in (0, 4, 5, 6, 8)])
def test_decoding_any_ids_equals_transformers(standins, name, cls, langs):
    """What a model may write is any sequence of ids: the specials, the codes, <mask> and
    every piece, in any order, decode as transformers decodes them."""
    ours = Tokenizer.load(standins[name])
    reference = theirs(standins[name], cls, langs[0])
    rng = random.Random(0)
    rows = [
        [rng.randrange(ours.tgt_vocab_size) for _ in range(rng.randrange(12))] for _ in range(300)
    ]
    rows += [[ours.tags[code], 5, ours.unk_id, 6, ours.eos_id, ours.pad_id] for code in ours.tags]
    (space,) = ours.tgt_piece_ids(["\u2581"])  # a lone "▁" first, last, twice, alone
    rows += [[space, 7, space], [space, space, 8, space, space], [space], [ours.unk_id, space, 9]]
    assert ours.decode_tgt(rows) == [
        reference.decode(row, skip_special_tokens=True) for row in rows
    ]


@pytest.mark.parametrize("name, cls, langs", [CASES[0], CASES[2], CASES[5], CASES[6]])
def test_truncation_keeps_the_code_and_eos_as_transformers(standins, lines, name, cls, langs):
    ours = Tokenizer.load(standins[name])
    reference = theirs(standins[name], cls, langs[0])
    code = ours.languages[langs[0]]
    for max_len in (3, 5, 12):
        expected = reference(lines[:200], truncation=True, max_length=max_len)["input_ids"]
        encoded = ours.encode_src([f"{code} {line}" for line in lines[:200]])
        assert [ours.truncate_src(row, max_len) for row in encoded] == expected


def test_a_line_without_a_code_is_its_text_and_eos(standins):
    for name in ("nllb", "nllb-legacy", "m2m100", "mbart50"):
        ours = Tokenizer.load(standins[name])
        assert ours.encode_src(["Hola"]) == [[*ours.encode_tgt(["Hola"])[0], ours.eos_id]]


def test_the_loader_picks_each_kind_and_its_ids_where_the_files_put_them(standins):
    """The codes and <mask> are numbered as the files number them: the published layout
    (codes after the pieces, <mask> last), today's transformers' (<mask> first), M2M100's
    (after vocab.json, whose order is not SentencePiece's)."""
    kinds = {name: Tokenizer.load(path) for name, path in standins.items()}
    assert all(isinstance(tok, FairseqTokenizer) for tok in kinds.values())
    assert [kinds[n].family for n in ("nllb", "m2m100", "mbart50")] == [NLLB, M2M100, MBART50]
    nllb, today = kinds["nllb"], kinds["nllb-today"]
    pieces = nllb.tgt_vocab_size - len(nllb.tags) - 1
    assert (nllb.bos_id, nllb.pad_id, nllb.eos_id, nllb.unk_id) == (0, 1, 2, 3)
    assert nllb.tags["ace_Arab"] == pieces and nllb.tgt_vocabulary()[-1] == "<mask>"
    assert today.tags["ace_Arab"] == pieces + 1 and today.tgt_vocabulary()[pieces] == "<mask>"
    assert nllb.encode_tgt(["Dios"]) == today.encode_tgt(["Dios"])
    m2m = kinds["m2m100"]
    assert m2m.tags["__af__"] == m2m.tgt_vocab_size - 100 and m2m.languages["es"] == "__es__"
    spm_order = [m2m._spm.id_to_piece(i) for i in range(3, 20)]
    assert m2m.tgt_vocabulary()[4:21] != spm_order  # vocab.json's order is read, not assumed
    assert kinds["mbart50"].tags["en_XX"] == kinds["mbart50-spm"].tags["en_XX"]


def test_without_tokenizer_json_nllb_is_numbered_as_the_published_files(standins, tmp_path, lines):
    """fairseq's layout (pieces + 1, the codes, <mask>) where no tokenizer.json numbers them:
    the published tokenizer.json's numbers (transformers 5 would read every code as <unk>)."""
    shutil.copytree(standins["nllb"], tmp_path / "nllb")
    (tmp_path / "nllb" / "tokenizer.json").unlink()
    fallback, published = Tokenizer.load(tmp_path / "nllb"), Tokenizer.load(standins["nllb"])
    assert fallback.tgt_vocabulary() == published.tgt_vocabulary()
    texts = [f"spa_Latn {line}" for line in lines]
    assert fallback.encode_src(texts) == published.encode_src(texts)


def test_settings_are_written_for_an_import_and_read_back(standins, tmp_path, lines):
    """`settings.save` writes tf_tokenizer.json beside the copied files; the run's tokenizer
    reads it (tokenizer_config.json gone) and encodes as the model's own files do."""
    source = Tokenizer.load(standins["nllb-legacy"])
    run = tmp_path / "tokenizer"
    run.mkdir()
    for path in source.model_paths():
        shutil.copyfile(path, run / path.name)
    (run / "tokenizer_config.json").unlink()
    source.settings.save(run)
    imported = Tokenizer.load(run)
    assert imported.settings == source.settings and imported.settings.legacy_behaviour
    assert imported.encode_src(lines[:100]) == source.encode_src(lines[:100])
    assert run / SETTINGS in imported.model_paths() and imported.digest() != source.digest()


EITHER = "needs sentencepiece.bpe.model or tokenizer.json)"  # (transformers 5 saves the one)


@pytest.mark.parametrize(
    "name, missing, needs",
    [
        ("nllb", ["sentencepiece.bpe.model", "tokenizer.json"], EITHER),
        ("m2m100", ["sentencepiece.bpe.model"], "needs sentencepiece.bpe.model and vocab.json"),
        ("m2m100", ["vocab.json"], "needs sentencepiece.bpe.model and vocab.json"),
        ("mbart50", ["sentencepiece.bpe.model", "tokenizer.json"], EITHER),
    ],
)
def test_a_missing_file_is_one_line_naming_it(standins, tmp_path, name, missing, needs):
    shutil.copytree(standins[name], tmp_path / name)
    for file in missing:
        (tmp_path / name / file).unlink()
    assert Tokenizer.found_in(tmp_path / name)
    with pytest.raises(InputError) as err:
        Tokenizer.load(tmp_path / name)
    assert str(err.value).startswith(f"{tmp_path / name / missing[0]}: missing")
    assert needs in str(err.value) and "\n" not in str(err.value)


def test_files_that_do_not_belong_together_are_one_line(standins, tmp_path):
    """A SentencePiece model nothing names, another model's tokenizer.json beside it, a
    tf_tokenizer.json of another kind: each refused, naming the file."""
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copyfile(standins["nllb"] / "sentencepiece.bpe.model", bare / "sentencepiece.bpe.model")
    with pytest.raises(InputError, match="tokenizer_config.json: no tokenizer_class"):
        Tokenizer.load(bare)
    mixed = shutil.copytree(standins["nllb"], tmp_path / "mixed")
    shutil.copyfile(
        standins["mbart50"] / "sentencepiece.bpe.model", mixed / "sentencepiece.bpe.model"
    )
    with pytest.raises(InputError, match=r"tokenizer.json: lacks \d+ pieces of sentencepiece"):
        Tokenizer.load(mixed)
    odd = shutil.copytree(standins["nllb"], tmp_path / "odd")
    (odd / SETTINGS).write_text('{"kind": "t5", "codes": []}')
    with pytest.raises(InputError, match="tf_tokenizer.json: kind must be one of nllb, m2m100"):
        Tokenizer.load(odd)


def test_languages_name_the_codes_and_their_ids(standins):
    """Each family's languages as its users write them, the id of each code (the decoder's
    forced first token), and an unknown one refused naming the closest."""
    nllb, m2m, mbart = (Tokenizer.load(standins[n]) for n in ("nllb", "m2m100", "mbart50"))
    assert (len(nllb.languages), len(m2m.languages), len(mbart.languages)) == (202, 100, 52)
    reference = transformers.NllbTokenizer.from_pretrained(standins["nllb"])
    assert nllb.language_id("fra_Latn") == reference.convert_tokens_to_ids("fra_Latn")
    reference = transformers.M2M100Tokenizer.from_pretrained(standins["m2m100"])
    assert m2m.language_id("fr") == reference.get_lang_id("fr") == m2m.tags["__fr__"]
    assert mbart.languages["fr_XX"] == "fr_XX" and nllb.src_lang == "eng_Latn"
    with pytest.raises(
        InputError, match="no language 'fr' among the tokenizer's 202; closest: fra"
    ):
        nllb.language_id("fr")
    with pytest.raises(InputError, match="closest: fr$"):
        m2m.language_id("fra_Latn")
