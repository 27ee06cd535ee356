"""Corpus loading (every form through `datasets`), its errors, encoding and filtering."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import datasets
import numpy as np
import pytest

from data.corpus import BUNDLED_DIR, encode_corpus, filter_pairs, load_corpus, token_ids
from data.errors import InputError

PAIRS = [
    ("¿Qué pasó?", "What happened?"),
    ('Él dijo: "ven" y fue.', 'He said, "come" and went.'),
    ("Piña, jamón", "Pineapple, ham"),
]


def lines(path: str | Path) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def write_parallel(prefix: Path, pairs, compress: bool = False) -> None:
    for lang, side in (("es", 0), ("en", 1)):
        text = "".join(pair[side] + "\n" for pair in pairs).encode()
        if compress:
            Path(f"{prefix}.{lang}.gz").write_bytes(gzip.compress(text))
        else:
            Path(f"{prefix}.{lang}").write_bytes(text)


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def assert_pairs(ds: datasets.Dataset, pairs) -> None:
    assert isinstance(ds, datasets.Dataset)
    assert ds.column_names == ["src", "tgt"]
    assert list(zip(ds["src"], ds["tgt"], strict=True)) == [tuple(p) for p in pairs]


def assert_input_error(err: pytest.ExceptionInfo, *fragments: str) -> None:
    """One line that names every fragment (file, line, ...)."""
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# --- each form loads --------------------------------------------------------------------------


def test_prefix_loads_the_fixture_in_order(tiny_prefix):
    ds = load_corpus(tiny_prefix, "es", "en")
    assert_pairs(ds, zip(lines(f"{tiny_prefix}.es"), lines(f"{tiny_prefix}.en"), strict=True))
    assert len(ds) == 200
    assert ds.cache_files, "loaded through a datasets builder, memory-mapped from its cache"


def test_prefix_reads_gzip_and_either_direction(tmp_path):
    write_parallel(tmp_path / "c", PAIRS, compress=True)
    assert_pairs(load_corpus(str(tmp_path / "c"), "es", "en"), PAIRS)
    assert_pairs(load_corpus(str(tmp_path / "c"), "en", "es"), [(t, s) for s, t in PAIRS])


def test_prefix_prefers_plain_file_and_mixes_with_gzip(tmp_path):
    write_parallel(tmp_path / "c", PAIRS)
    Path(tmp_path / "c.en").rename(tmp_path / "c.en.orig")
    Path(tmp_path / "c.en.gz").write_bytes(gzip.compress((tmp_path / "c.en.orig").read_bytes()))
    assert_pairs(load_corpus(str(tmp_path / "c"), "es", "en"), PAIRS)


def test_tsv_keeps_quotes_and_reads_a_language_header(tmp_path):
    body = "".join(f"{s}\t{t}\n" for s, t in PAIRS)
    (tmp_path / "plain.tsv").write_text(body)
    (tmp_path / "header.tsv").write_text("es\ten\n" + body)
    (tmp_path / "swapped.tsv").write_text("en\tes\n" + "".join(f"{t}\t{s}\n" for s, t in PAIRS))
    for name in ("plain", "header", "swapped"):
        assert_pairs(load_corpus(str(tmp_path / f"{name}.tsv"), "es", "en"), PAIRS)


def test_jsonl_translation_format_and_flat_columns(tmp_path):
    nested = write_jsonl(
        tmp_path / "n.jsonl", [{"translation": {"es": s, "en": t}} for s, t in PAIRS]
    )
    flat = write_jsonl(
        tmp_path / "f.jsonl", [{"en": t, "es": s, "id": i} for i, (s, t) in enumerate(PAIRS)]
    )
    assert_pairs(load_corpus(str(nested), "es", "en"), PAIRS)
    assert_pairs(load_corpus(str(flat), "es", "en"), PAIRS)


def test_gzipped_tsv_and_jsonl(tmp_path):
    tsv = "".join(f"{s}\t{t}\n" for s, t in PAIRS).encode()
    jsonl = "".join(json.dumps({"es": s, "en": t}) + "\n" for s, t in PAIRS).encode()
    (tmp_path / "c.tsv.gz").write_bytes(gzip.compress(tsv))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(jsonl))
    assert_pairs(load_corpus(str(tmp_path / "c.tsv.gz"), "es", "en"), PAIRS)
    assert_pairs(load_corpus(str(tmp_path / "c.jsonl.gz"), "es", "en"), PAIRS)


def test_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path):
    write_parallel(tmp_path / "c", PAIRS)
    (tmp_path / "c.es").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "c.es").read_bytes())
    assert_pairs(load_corpus(str(tmp_path / "c"), "es", "en"), PAIRS)


def test_hf_spec_goes_through_load_dataset_on_a_local_dir(tmp_path):
    folder = tmp_path / "mydataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"translation": {"es": s, "en": t}} for s, t in PAIRS])
    write_jsonl(folder / "test.jsonl", [{"translation": {"es": "sí", "en": "yes"}}])
    assert_pairs(load_corpus(f"hf:{folder}", "es", "en"), PAIRS)  # split "train" by default
    assert_pairs(load_corpus(f"hf:{folder}@test", "es", "en"), [("sí", "yes")])
    assert_pairs(load_corpus(f"hf:{folder}@train[:2]", "es", "en"), PAIRS[:2])


def test_bundled_corpus(tmp_path):
    dev = load_corpus("bundled:bible-es-en/dev", "es", "en")
    assert len(dev) == 1000
    assert dev[0]["src"] == lines(BUNDLED_DIR / "bible-es-en" / "dev.es")[0]
    train = load_corpus("bundled:bible-es-en/train", "en", "es")  # gzipped, reversed
    assert len(train) == 28045
    with gzip.open(BUNDLED_DIR / "bible-es-en" / "train.en.gz", "rt", encoding="utf-8") as f:
        assert train[0]["src"] == f.readline().rstrip("\n")


# --- bad input: one line naming the file (and the line) ---------------------------------------


def test_corrupt_gzip(tmp_path):
    write_parallel(tmp_path / "c", PAIRS)
    (tmp_path / "c.en").unlink()
    (tmp_path / "c.en.gz").write_bytes(b"not gzip at all")
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c"), "es", "en")
    assert_input_error(err, str(tmp_path / "c.en.gz"), "gzip")


def test_unequal_line_counts_name_both_files_and_counts(tmp_path):
    write_parallel(tmp_path / "c", PAIRS)
    (tmp_path / "c.en").write_text("one\ntwo\n")
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c"), "es", "en")
    assert_input_error(err, str(tmp_path / "c.es"), "3", str(tmp_path / "c.en"), "2")
    write_parallel(tmp_path / "one", PAIRS[:1])
    (tmp_path / "one.en").write_text("one\ntwo\n")
    with pytest.raises(InputError, match="one.es: has 1 line but "):
        load_corpus(str(tmp_path / "one"), "es", "en")


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, compress):
    write_parallel(tmp_path / "c", PAIRS)
    bad = b"fine\nstill fine\nbad \xff byte\n"
    name = "c.en.gz" if compress else "c.en"
    (tmp_path / "c.en").unlink()
    (tmp_path / name).write_bytes(gzip.compress(bad) if compress else bad)
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c"), "es", "en")
    assert_input_error(err, f"{tmp_path / name}:3:", "UTF-8")


def test_invalid_utf8_in_tsv(tmp_path):
    (tmp_path / "c.tsv").write_bytes(b"a\tb\nc\t\xc3(\n")
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c.tsv"), "es", "en")
    assert_input_error(err, f"{tmp_path / 'c.tsv'}:2:")


@pytest.mark.parametrize("spec", ["missing", "missing.tsv", "missing.jsonl"])
def test_missing_file(tmp_path, spec):
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / spec), "es", "en")
    assert_input_error(err, str(tmp_path / spec), "no such file")


def test_prefix_with_one_side_missing(tmp_path):
    write_parallel(tmp_path / "c", PAIRS)
    (tmp_path / "c.en").unlink()
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c"), "es", "en")
    assert_input_error(err, str(tmp_path / "c.en"), "c.en.gz")


@pytest.mark.parametrize("bad_line", ["only one field", "a\tb\tc", ""])
def test_tsv_line_without_two_fields(tmp_path, bad_line):
    path = tmp_path / "c.tsv"
    path.write_text(f"a\tb\nc\td\n{bad_line}\ne\tf\n")
    with pytest.raises(InputError) as err:
        load_corpus(str(path), "es", "en")
    assert_input_error(err, f"{path}:3:", "2 tab-separated fields")


def test_jsonl_invalid_json_names_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"translation": {"es": "a", "en": "b"}}\n{"translation": {"es": "x"\n')
    with pytest.raises(InputError) as err:
        load_corpus(str(path), "es", "en")
    assert_input_error(err, f"{path}:2:", "not valid JSON")


@pytest.mark.parametrize(
    "rows",
    [
        [{"translation": {"es": "a", "en": "b"}}, {"translation": {"es": "c"}}],
        [{"es": "a", "en": "b"}, {"es": "c", "en": 3}],
        [{"es": "a", "en": "b"}, {"es": "c", "de": "d"}],
    ],
)
def test_jsonl_row_without_the_languages_names_line(tmp_path, rows):
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(InputError) as err:
        load_corpus(str(path), "es", "en")
    assert_input_error(err, f"{path}:2:", "'en'")


def test_jsonl_without_the_languages_at_all(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"translation": {"fr": "a", "de": "b"}}])
    with pytest.raises(InputError) as err:
        load_corpus(str(path), "es", "en")
    assert_input_error(err, f"{path}:1:", "'es'")


def test_unknown_hub_dataset_names_it():
    spec = "hf:no-such-user/no-such-dataset-tf-test"
    with pytest.raises(InputError) as err:
        load_corpus(spec, "es", "en")
    assert_input_error(err, spec, "'no-such-user/no-such-dataset-tf-test'")


def test_hub_dataset_without_the_languages(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"text": "hello"}])
    with pytest.raises(InputError) as err:
        load_corpus(f"hf:{tmp_path}", "es", "en")
    assert_input_error(err, f"hf:{tmp_path}", "'es'")


def test_unknown_hub_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"es": "a", "en": "b"}])
    with pytest.raises(InputError) as err:
        load_corpus(f"hf:{tmp_path}@nosplit", "es", "en")
    assert_input_error(err, f"hf:{tmp_path}@nosplit")


@pytest.mark.parametrize(
    ("spec", "src", "fragment"),
    [
        ("bundled:no-such-corpus/train", "es", "bible-es-en"),
        ("bundled:bible-es-en/nosplit", "es", "dev, test, train"),
        ("bundled:bible-es-en/dev", "de", "en, es"),
    ],
)
def test_bundled_errors(spec, src, fragment):
    with pytest.raises(InputError) as err:
        load_corpus(spec, src, "en" if src != "en" else "es")
    assert_input_error(err, spec, fragment)


def test_empty_corpus_is_an_error(tmp_path):
    write_parallel(tmp_path / "c", [])
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c"), "es", "en")
    assert_input_error(err, str(tmp_path / "c.es"), "empty")


# --- encoding and filtering -------------------------------------------------------------------


def test_encode_corpus_matches_the_tokenizer_and_is_cached(tiny_prefix, tiny_tokenizer):
    ds = load_corpus(tiny_prefix, "es", "en")
    encoded = encode_corpus(ds, tiny_tokenizer)
    assert encoded.column_names == ["src_ids", "tgt_ids"]
    assert encoded[:3]["src_ids"] == tiny_tokenizer.encode_src(ds[:3]["src"])
    assert encoded[:3]["tgt_ids"] == tiny_tokenizer.encode_tgt(ds[:3]["tgt"])
    again = encode_corpus(load_corpus(tiny_prefix, "es", "en"), tiny_tokenizer)
    assert again._fingerprint == encoded._fingerprint
    assert again.cache_files == encoded.cache_files  # the same Arrow file, not encoded twice


def test_encoding_fingerprint_follows_the_tokenizer(tiny_prefix, tiny_tokenizer, tmp_path):
    from data.tokenizer import train_tokenizer

    ds = load_corpus(tiny_prefix, "es", "en")
    other = train_tokenizer(ds["src"], ds["tgt"], tmp_path, vocab_size=120, seed=0)
    assert encode_corpus(ds, other)._fingerprint != encode_corpus(ds, tiny_tokenizer)._fingerprint


def test_filter_pairs_on_text_counts_each_reason():
    ds = datasets.Dataset.from_dict(
        {
            "src": ["hola", "  ", "a" * 50, "sí", "una frase larga", "ok"],
            "tgt": ["hello", "x", "b" * 50, "yes", "a", ""],
        }
    )
    kept, counts = filter_pairs(ds, max_len=20, max_len_ratio=3.0)
    assert counts == {"empty": 2, "too_long": 1, "ratio": 1, "kept": 2}
    assert kept["src"] == ["hola", "sí"]


def test_filter_pairs_on_token_lengths(tiny_prefix, tiny_tokenizer):
    encoded = encode_corpus(load_corpus(tiny_prefix, "es", "en"), tiny_tokenizer)
    kept, counts = filter_pairs(encoded, max_len=60)
    lengths = [
        max(len(s), len(t)) for s, t in zip(encoded["src_ids"], encoded["tgt_ids"], strict=True)
    ]
    assert counts["too_long"] == sum(n > 60 for n in lengths) > 0
    assert counts["kept"] == len(kept) == sum(n <= 60 for n in lengths)
    assert all(len(ids) <= 60 for ids in kept["src_ids"])
    # Ids load back in row order, also through the row selection filtering made.
    src = token_ids(kept, "src_ids")
    assert len(src) == len(kept)
    assert [src[i].tolist() for i in (0, len(kept) - 1)] == [
        kept[0]["src_ids"],
        kept[-1]["src_ids"],
    ]
    assert np.array_equal(src.lengths(), [len(ids) for ids in kept["src_ids"]])


def test_nothing_left_after_filtering_names_the_corpus(tiny_prefix, tiny_tokenizer):
    encoded = encode_corpus(load_corpus(tiny_prefix, "es", "en"), tiny_tokenizer)
    with pytest.raises(InputError) as err:
        filter_pairs(encoded, max_len=1, name=tiny_prefix)
    assert_input_error(err, tiny_prefix, "no sentence pairs left", "200 too long")


@pytest.mark.parametrize("inside", ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_only_a_line_feed_ends_a_line_in_every_reader(tmp_path, inside):
    """Python's splitlines (and the `datasets` text builder) also break at these; a source file
    and a target file with the same number of line feeds must stay aligned line by line."""
    from data.text import read_file_lines

    src = f"uno{inside}dos\r\ntres\n"  # one lone separator inside line 1; a CRLF line end
    prefix = tmp_path / "mixed"
    Path(f"{prefix}.es").write_text(src, encoding="utf-8", newline="")
    Path(f"{prefix}.en").write_text("one two\nthree\n", encoding="utf-8")
    ds = load_corpus(str(prefix), "es", "en")
    assert ds["src"] == [f"uno{inside}dos", "tres"]
    assert read_file_lines(Path(f"{prefix}.es")) == [f"uno{inside}dos", "tres"]
    tsv = tmp_path / "mixed.tsv"
    tsv.write_text(f"uno{inside}dos\tone two\r\ntres\tthree\n", encoding="utf-8", newline="")
    assert load_corpus(str(tsv), "es", "en")["tgt"] == ["one two", "three"]


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"", "empty"),
        (b'{"es": "a", "en": "b"}\n{"es": "\xff", "en": "c"}\n', ":2: not valid UTF-8"),
    ],
)
def test_jsonl_empty_or_not_utf8_is_named(tmp_path, content, fragment):
    (tmp_path / "c.jsonl").write_bytes(content)
    with pytest.raises(InputError) as err:
        load_corpus(str(tmp_path / "c.jsonl"), "es", "en")
    assert_input_error(err, str(tmp_path / "c.jsonl"), fragment)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1 << 20])
def test_corpora_read_their_lines_in_blocks_as_line_by_line_readers_do(tmp_path, size):
    """Training reads a block of lines at a time; translation and evaluation a line at a time.
    At any block size, even one that splits a character or a CRLF, both give the same lines."""
    import io

    from data.text import read_line_blocks, read_lines

    raw = "\ufeffuno\r\ndos\rtres\n\nñandú €\r\n\ufeffcuatro\r\n\r\nfin\r".encode()
    lines = [line for block in read_line_blocks(io.BytesIO(raw), "x", size) for line in block]
    assert lines == list(read_lines(io.BytesIO(raw), "x"))
    assert lines == ["uno", "dos\rtres", "", "ñandú €", "\ufeffcuatro", "", "fin\r"]
    bad = b"a\nb\r\nc\xffd\ne\n"
    with pytest.raises(InputError, match=r"^x:3: not valid UTF-8 \(byte 0xff\)$"):
        list(read_line_blocks(io.BytesIO(bad), "x", size))


def test_a_changed_corpus_file_is_read_again(tmp_path):
    """Read lines are cached by path, size and modification time: a rewrite is seen."""
    prefix = tmp_path / "c"
    Path(f"{prefix}.es").write_text("uno\ndos\n", encoding="utf-8")
    Path(f"{prefix}.en").write_text("one\ntwo\n", encoding="utf-8")
    assert load_corpus(str(prefix), "es", "en")["src"] == ["uno", "dos"]
    Path(f"{prefix}.es").write_text("tres\ncuatro\n", encoding="utf-8")
    assert load_corpus(str(prefix), "es", "en")["src"] == ["tres", "cuatro"]
