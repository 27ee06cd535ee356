"""Sentences as exact spans, split by the rules of the language a run reads (data/sentences.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data.sentences import sentence_spans, sentence_splitter, splitter_language


def texts(text: str, language: str = "en") -> list[str]:
    return [text[a:b] for a, b in sentence_spans(text, language)]


def assert_exact(text: str, spans: list[tuple[int, int]]) -> None:
    """Spans in order, stripped, non-empty, and only white space outside them."""
    at = 0
    for start, end in spans:
        assert at <= start < end <= len(text)
        assert not text[at:start].strip(), text[at:start]
        assert not text[start].isspace() and not text[end - 1].isspace()
        at = end
    assert not text[at:].strip()


@pytest.mark.parametrize(
    "code, language",
    [
        ("es", "es"),
        ("ES", "es"),
        ("es-MX", "es"),
        ("es_XX", "es"),  # mBART-50
        ("spa_Latn", "es"),  # NLLB-200
        ("spa", "es"),  # ISO 639-3, OPUS-MT
        ("deu_Latn", "de"),
        ("fra", "fr"),
        ("zho_Hans", "zho"),  # no rules of its own: sentencex's defaults, which know 。
        ("ast_Latn", "ast"),  # sentencex falls back from Asturian to Spanish itself
        ("xx", "xx"),
        ("", "en"),
    ],
)
def test_run_language_codes_map_to_the_splitters_names(code, language):
    assert splitter_language(code) == language


@pytest.mark.parametrize("code", ["de", "deu_Latn", "de_DE", "deu"])
def test_three_letter_and_regional_codes_get_their_languages_rules(code):
    # German rules keep an ordinal ("3. Oktober") inside its sentence; English ones cut there.
    text = "Er kam am 3. Oktober nach Berlin. Dann ging er."
    split = sentence_splitter(code)
    assert [text[a:b] for a, b in split(text)] == [
        "Er kam am 3. Oktober nach Berlin.",
        "Dann ging er.",
    ]


def test_spans_are_exact_offsets_into_the_text_as_given():
    text = "  El Sr. Pérez llegó.   ¿Vienes?\t¡Sí!\u3000Fin.  "
    spans = sentence_spans(text, "es")
    assert_exact(text, spans)
    assert [text[a:b] for a, b in spans] == ["El Sr. Pérez llegó.", "¿Vienes?", "¡Sí!", "Fin."]


@pytest.mark.parametrize("text", ["", " ", "\t \u3000 ", "\n\n"])
def test_white_space_only_has_no_sentence(text):
    assert sentence_spans(text, "es") == []


def test_text_without_a_sentence_end_is_one_sentence():
    text = "esto es un texto sin puntuación que sigue y sigue " * 1000
    assert sentence_spans(text, "es") == [(0, len(text.rstrip()))]


@pytest.mark.parametrize(
    "text, language, expected",
    [
        ("Pagó 3.5 euros. Se fue.", "es", ["Pagó 3.5 euros.", "Se fue."]),
        ("Vino la Sra. Gómez. Se fue.", "es", ["Vino la Sra. Gómez.", "Se fue."]),
        ("Espera... no sé. Bueno.", "es", ["Espera... no sé.", "Bueno."]),
        ("今天天气很好。你想喝茶吗？好！", "zh", ["今天天气很好。", "你想喝茶吗？", "好！"]),
        ("राम बाज़ार गया। क्या तुमने देखा?", "hi", ["राम बाज़ार गया।", "क्या तुमने देखा?"]),
        ("هل رأيت أخاه؟ لا أعرف.", "ar", ["هل رأيت أخاه؟", "لا أعرف."]),
        ("Он купил хлеб. Почему он ушёл?", "ru", ["Он купил хлеб.", "Почему он ушёл?"]),
    ],
)
def test_sentence_ends_of_each_script_and_no_cut_at_abbreviations_or_numbers(
    text, language, expected
):
    assert texts(text, language) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "He shall be healed. “If a man borrows anything, he shall pay.",
            ["He shall be healed.", "“If a man borrows anything, he shall pay."],
        ),
        (
            "He offers a male. “‘When anyone offers, it is fine.",
            ["He offers a male.", "“‘When anyone offers, it is fine."],
        ),
    ],
)
def test_an_opening_quote_goes_with_the_sentence_it_opens(text, expected):
    # sentencex leaves an unclosed opening quote at the end of the sentence before it.
    assert texts(text) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "Sr.",
                "palabra",
                "3.5",
                "...",
                "¿qué?",
                "¡sí!",
                "“",
                "”",
                "«",
                "»",
                "。",
                "中文",
                " ",
                "  ",
                "\t",
                "\n",
                "\u3000",
                ".",
                ",",
                "e\u0301",
                "(",
                ")",
                '"',
                "A.",
            ]
        ),
        max_size=30,
    ).map("".join)
)
def test_any_text_is_its_sentences_and_white_space_between(text):
    assert_exact(text, sentence_spans(text, "es"))
