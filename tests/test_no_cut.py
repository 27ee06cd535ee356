"""Nothing is cut (issue 69): a line longer than the model takes is translated in parts, at its
sentences, and joined, on both engines and through every command that translates
(cli/inference/decoding.py `encode_sources`, `Engine.stream`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.inference.decoding import Joined, Rows, encode_sources, source_ids
from cli.inference.engines import load_engine
from cli.inference.requests import Request
from data.errors import InputError
from data.sentences import sentence_spans

CPU = torch.device("cpu")
POSITIONS = 64


@pytest.fixture(scope="module")
def short(tmp_path_factory, tiny_prefix) -> Path:
    """A tiny run whose model takes 64 positions: a few verses fill it."""
    run = tmp_path_factory.mktemp("short") / "run"
    sets = [
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        f"model.max_positions={POSITIONS}",
        "data.max_len=48",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.save_every=2",
        "decode.max_len_b=4",  # short outputs: the test runs hundreds of sentences
    ]
    result = tf("train", "tiny", "--out", run, *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="module")
def short_ct2(short, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("short-ct2") / "ct2"
    result = tf("export", short, "--to", "ctranslate2", "-o", out)
    assert result.exit_code == 0, result.output
    return out


def paragraph(tiny_prefix: str, words: int = 3000) -> str:
    """The fixture's Spanish verses joined into one line of at least `words` words (only those
    that end a sentence, so that the paragraph's sentences are the verses' sentences)."""
    verses = [v for v in Path(f"{tiny_prefix}.es").read_text().splitlines() if v.endswith(".")]
    out, n = [], 0
    while sum(len(v.split()) for v in out) < words:
        out.append(verses[n % len(verses)])
        n += 1
    return " ".join(out)


def recording(engine) -> list[list[int]]:
    """The rows `engine` searches, recorded as it searches them."""
    rows: list[list[int]] = []
    search = engine.search

    def spy(src_ids, decode, guides=None):
        rows.extend(src_ids)
        return search(src_ids, decode, guides)

    engine.search = spy
    return rows


def per_sentence(rows: list[str], sentences: list[str]) -> int:
    """How many of `sentences` the rows' texts make, in order, each from one row or more
    (every row used)."""
    row = 0
    for n, sentence in enumerate(sentences):
        made = []
        while " ".join(made) != sentence:
            if row == len(rows) or len(" ".join(made)) >= len(sentence):
                return n
            made.append(rows[row])
            row += 1
    return len(sentences) if row == len(rows) else -1


@pytest.mark.parametrize("kind", ["tf", "ctranslate2"])
def test_a_3000_word_paragraph_is_translated_sentence_by_sentence_on_both_engines(
    kind, short, short_ct2, tiny_prefix
):
    engine = load_engine(str(short if kind == "tf" else short_ct2), CPU, [])
    assert engine.config.model.max_positions == POSITIONS
    text = paragraph(tiny_prefix)
    assert len(source_ids(engine.tokenizer, [text])[0]) > 20 * POSITIONS
    rows = recording(engine)
    ((ids, hyps),) = list(engine.stream([text], "p"))
    sentences = [text[a:b] for a, b in sentence_spans(text, "es")]
    # Every sentence searched, in one row or (one over the limit) in consecutive rows cut at
    # its clauses or spaces; no row over the model's limit, no text left out.
    assert len(sentences) > 100 and len(rows) >= len(sentences)
    assert all(len(row) <= POSITIONS for row in rows)
    assert per_sentence(engine.tokenizer.decode_src(rows), sentences) == len(sentences)
    assert ids == [i for row in rows for i in row]
    best = hyps[0]
    assert isinstance(best, Joined) and best.parts == len(rows)
    each = [engine.search([row], engine.config.decode)[0][0] for row in rows[:5]]
    texts = engine.tokenizer.decode_tgt([h.tokens for h in each])
    assert best.text.startswith(" ".join(t.strip() for t in texts if t.strip()))


def test_tf_translate_writes_a_long_line_whole_with_no_warning(
    short, tiny_prefix, tmp_path, caplog
):
    caplog.set_level("INFO")
    src = tmp_path / "src.es"
    text = paragraph(tiny_prefix, 400)
    src.write_text(f"hola\n{text}\nY dijo Dios.\n")
    result = tf("translate", short, "-i", src, "--greedy")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    assert "truncated" not in caplog.text
    assert "src.es: 1 line over the model's limit of 64 pieces, translated in parts" in caplog.text


def test_lines_that_fit_are_one_row_each_as_before(tiny_tokenizer):
    lines = ["Y dijo Dios.", "", "  hola  ", "En el principio crió Dios los cielos y la tierra."]
    rows = encode_sources(tiny_tokenizer, lines, 256, "x", 1)
    assert list(rows) == source_ids(tiny_tokenizer, lines)
    assert rows.cuts == {} and rows.line_ids() == list(rows)


def test_a_long_line_keeps_every_word_and_each_part_its_tags(tiny_tokenizer, tiny_prefix):
    tag = next(iter(tiny_tokenizer.tags), None)
    text = paragraph(tiny_prefix, 300)
    line = f"{tag} {text}" if tag else text
    rows = encode_sources(tiny_tokenizer, ["hola", line], POSITIONS, "x", 1, "es")
    assert rows.lines[0] == range(0, 1) and len(rows.lines[1]) > 5
    parts = [rows[r] for r in rows.lines[1]]
    assert all(len(p) <= POSITIONS for p in parts)
    cut, spans = rows.cuts[1]
    assert cut == text and "".join(cut[a:b] for a, b in spans) == text
    if tag:  # the tag leads every part, as it led the line
        assert all(p[0] == tiny_tokenizer.tags[tag] for p in parts)


class WordTokenizer:
    """A stand-in tokenizer of one piece a word (fast on 10 MB), no tags."""

    tags: dict[str, int] = {}

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return [[1] * len(text.split()) for text in texts]

    def truncate_src(self, ids: list[int], max_len: int) -> list[int]:
        raise AssertionError("nothing is cut")


def test_a_10_mb_line_with_no_sentence_end_is_fitted_without_losing_a_word():
    words = ["palabra", "otra", "más", "y", "sigue"]
    line = " ".join(words[i % 5] for i in range(2_000_000))
    assert len(line.encode()) > 10_000_000
    rows = encode_sources(WordTokenizer(), [line], 50_000, "big", 1, "es")
    cut, spans = rows.cuts[0]
    assert all(len(row) <= 50_000 for row in rows) and len(rows) >= 40
    assert sum(map(len, rows)) == 2_000_000  # every word in one part
    assert "".join(cut[a:b] for a, b in spans) == line


def test_a_prefix_goes_with_the_first_part_and_constraints_are_refused(short, tiny_prefix):
    engine = load_engine(str(short), CPU, [])
    text = paragraph(tiny_prefix, 200)
    rows = recording(engine)
    searched = []
    search = engine.search

    def guides_spy(src_ids, decode, guides=None):
        searched.append(guides)
        return search(src_ids, decode, guides)

    engine.search = guides_spy
    ((_, hyps),) = list(engine.stream([Request(text, prefix="And")], "p"))
    (guides,) = searched
    assert guides[0] is not None and guides[0].prefix
    assert all(g is None for g in guides[1:]) and len(guides) == len(rows)
    assert hyps[0].text.startswith("And")
    with pytest.raises(InputError, match=r"p:2: constraints on a line over the model's limit"):
        list(engine.stream(["hola", Request(text, constraints=("God",))], "p"))


def test_nbest_on_a_line_in_parts_joins_each_rank(short, tiny_prefix, tmp_path):
    src = tmp_path / "src.es"
    src.write_text(paragraph(tiny_prefix, 200) + "\n")
    result = tf("translate", short, "-i", src, "--beam", "3", "--nbest", "2", "--scores")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "1"]
    assert all(len(line.split(" ||| ")) == 3 for line in lines)


def test_attention_refuses_a_line_in_parts_naming_it(short, tiny_prefix, tmp_path):
    src = tmp_path / "src.es"
    src.write_text("hola\n" + paragraph(tiny_prefix, 200) + "\n")
    result = tf(
        "translate", short, "-i", src, "--attention", tmp_path / "pics", "-o", tmp_path / "o"
    )
    assert_user_error(result, "src.es:2: over the model's limit", "--attention")
    assert not (tmp_path / "o").exists()


def test_eval_and_backtranslate_translate_a_long_line_whole(short, tiny_prefix, tmp_path):
    src, ref = tmp_path / "src.es", tmp_path / "ref.en"
    src.write_text("hola\n" + paragraph(tiny_prefix, 200) + "\n")
    ref.write_text("hello\nAnd God said.\n")
    result = tf("eval", short, "--src", src, "--ref", ref, "--greedy", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bleu"] >= 0
    mono = tmp_path / "mono.en"
    mono.write_text("hello\n" + " ".join(["And God said: Let there be light."] * 60) + "\n")
    result = tf("backtranslate", short, mono, "--out", tmp_path / "bt", "--greedy")
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "bt" / "train.es").read_text().splitlines()) == 2


def test_rows_join_back_in_line_order():
    rows = Rows([[1], [2], [3], [4]], [range(0, 1), range(1, 3), range(3, 4)], {1: ("a. b.", [])})
    assert rows.owners() == [0, 1, 1, 2]
    assert rows.firsts() == [True, True, False, True]
    assert rows.line_ids() == [[1], [2, 3], [4]]
