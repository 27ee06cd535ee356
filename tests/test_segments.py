"""A segment cut to the model's limit with nothing lost, and translations put back together
(data/segments.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data.segments import fit, flow, join, spread
from data.sentences import sentence_splitter

SPLIT = sentence_splitter("es")


def words(text: str) -> int:
    """A stand-in tokenizer: one piece a word, and an EOS."""
    return len(text.split()) + 1


def characters(text: str) -> int:
    """A stand-in tokenizer of one piece a character, and an EOS."""
    return len(text) + 1


class Counted:
    """A count that remembers how often, and how much text, it was asked to count."""

    def __init__(self, count) -> None:
        self.count, self.calls, self.chars = count, 0, 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        self.chars += len(text)
        return self.count(text)


def assert_partition(text: str, parts: list[tuple[int, int]]) -> None:
    assert parts[0][0] == 0 and parts[-1][1] == len(text)
    assert all(a < b for a, b in parts)
    assert all(b == c for (_, b), (c, _) in zip(parts, parts[1:]))
    assert "".join(text[a:b] for a, b in parts) == text


def pieces(text: str, parts, count) -> list[str]:
    return [text[a:b].strip() for a, b in parts]


@pytest.mark.parametrize("text", ["", "  ", "Hola.", "  Uno. Dos.  ", "a " * 20])
def test_a_segment_that_fits_is_one_part_all_of_it(text):
    count = Counted(words)
    assert fit(text, count, 64, SPLIT) == [(0, len(text))]
    assert count.calls == 1


def test_the_callers_count_spares_the_first_one():
    count = Counted(words)
    assert fit("Uno dos.", count, 8, SPLIT, pieces=3) == [(0, 8)]
    assert count.calls == 0


def test_a_long_segment_is_cut_at_its_sentences_each_alone():
    text = "Uno dos tres. Cuatro cinco seis. Siete ocho nueve.  Diez."
    parts = fit(text, words, 6, SPLIT)
    assert_partition(text, parts)
    assert pieces(text, parts, words) == [
        "Uno dos tres.",
        "Cuatro cinco seis.",
        "Siete ocho nueve.",
        "Diez.",
    ]


def test_a_sentence_still_too_long_is_cut_after_a_clause_mark():
    text = "Uno dos tres cuatro, cinco seis siete; ocho nueve diez once doce."
    parts = fit(text, words, 6, SPLIT)
    assert_partition(text, parts)
    assert pieces(text, parts, words) == [
        "Uno dos tres cuatro,",
        "cinco seis siete;",
        "ocho nueve diez once doce.",
    ]


def test_a_sentence_without_clause_marks_is_cut_at_a_space():
    text = "uno dos tres cuatro cinco seis siete ocho nueve"
    parts = fit(text, characters, 20, SPLIT)
    assert_partition(text, parts)
    assert pieces(text, parts, characters) == [
        "uno dos tres cuatro",
        "cinco seis siete",
        "ocho nueve",
    ]


def test_text_without_spaces_is_cut_between_characters_never_before_an_accent():
    text = "天地玄黄宇宙洪荒" * 10 + "e\u0301" * 40
    parts = fit(text, characters, 16, SPLIT)
    assert_partition(text, parts)
    assert all(characters(text[a:b].strip()) <= 16 for a, b in parts)
    assert all(text[a] != "\u0301" for a, _ in parts)


@pytest.mark.parametrize(
    "text, kind",
    [
        ("palabra " * 1_250_000, "words"),  # 10 MB with no sentence end
        ("a" * 10_000_000, "no space"),
    ],
)
def test_a_10_mb_line_with_no_sentence_end_is_cut_with_few_counts(text, kind):
    count = Counted(characters)
    parts = fit(text, count, 1024, SPLIT)
    assert_partition(text, parts)
    assert all(characters(text[a:b].strip()) <= 1024 for a, b in parts)
    # O(log n) counts a part, each of about a part's text: the text is counted a few times
    # over, never once per part as a whole (what makes it seconds, not hours).
    assert count.calls <= 2 + len(parts) * 2 * math.log2(len(text))
    assert count.chars <= 6 * len(text)


def test_a_long_paragraph_fits_a_real_tokenizer_with_every_character_kept(tiny_tokenizer):
    def count(text: str) -> int:
        return len(tiny_tokenizer.encode_src([text])[0])

    sentence = "Y dijo Dios: Produzcan las aguas reptil de ánima viviente, y aves que vuelen"
    text = " ".join([sentence + "."] * 100 + [sentence + ","] * 100)  # 3,000 words
    parts = fit(text, count, 64, sentence_splitter("spa_Latn"))
    assert_partition(text, parts)
    assert all(count(text[a:b].strip()) <= 64 for a, b in parts)


def test_a_limit_below_one_character_still_moves_on():
    text = "abc"
    parts = fit(text, lambda t: len(t) + 5, 3, SPLIT)
    assert parts == [(0, 1), (1, 2), (2, 3)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["uno", "dos", "tres.", "Sr.", ",", ";", " ", "  ", "\t", "中文", "。", "e\u0301", "x"]
        ),
        min_size=1,
        max_size=60,
    ).map("".join),
    st.integers(min_value=2, max_value=12),
)
def test_every_character_lands_in_one_part_within_the_limit(text, limit):
    parts = fit(text, characters, limit, SPLIT)
    assert_partition(text, parts)
    for a, b in parts:
        part = text[a:b].strip()
        # Over the limit only where one character with its marks is all there is.
        assert characters(part) <= limit or len(part.rstrip("\u0301")) <= 1


def test_one_parts_translation_is_returned_as_it_is():
    assert join("Hola.", [(0, 5)], [" Hello.  "]) == " Hello.  "


def test_translations_are_joined_with_the_sources_spaces_or_none_between_ideographs():
    text = "Uno.  Dos. Tres"
    parts = [(0, 6), (6, 11), (11, 15)]
    assert join(text, parts, ["One.", "Two.", "Three"]) == "One.  Two. Three"
    assert join(text, parts, ["一。", "二。", "三"]) == "一。二。三"
    assert join("一。二。", [(0, 2), (2, 4)], ["One.", "Two."]) == "One. Two."
    assert join(text, parts, ["One.", "", "Three"]) == "One. Three"


@pytest.mark.parametrize(
    "lines",
    [
        ["El Sr. Pérez", "llegó tarde", "ayer."],
        ["中文句子", "继续写", "完了。"],
        ["mezcla 中文", "文字 y", "más"],
        ["a"],
        ["e\u0301e", "\u0301x"],
    ],
)
def test_a_translation_equal_to_its_source_spreads_back_onto_its_lines(lines):
    weights = [sum(not c.isspace() for c in line) for line in lines]
    assert spread(flow(lines), weights) == lines


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["uno", "dos", "中", "文", "。", "e\u0301", "x"]), min_size=1)
        .flatmap(lambda ws: st.sampled_from([" ", ""]).map(lambda sep: sep.join(ws)))
        .filter(lambda s: s.strip() == s and s),
        min_size=1,
        max_size=6,
    )
)
def test_any_lines_flowed_and_spread_back_are_the_lines(lines):
    weights = [sum(not c.isspace() for c in line) for line in lines]
    assert spread(flow(lines), weights) == lines


def test_spread_gives_each_slot_a_word_and_cuts_near_the_proportions():
    assert spread("one two three four five six", [1, 1, 1]) == ["one two", "three four", "five six"]
    assert spread("one two three four", [10, 1, 1]) == ["one two", "three", "four"]
    assert spread("一二三四五六", [1, 1]) == ["一二三", "四五六"]


def test_spread_of_fewer_words_than_slots_leaves_slots_empty():
    assert spread("Sí.", [5, 3]) == ["Sí.", ""]
    assert spread("", [2, 2]) == ["", ""]
