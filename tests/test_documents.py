"""Plain-text documents: their sentences, and the document written back around translations with
every byte outside them as it was (data/documents.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data.documents import decode, parse_document
from data.errors import InputError
from data.sentences import sentence_splitter

SPLIT = sentence_splitter("es")

HAND_MADE = {
    "empty": "",
    "blank lines only": "\n\n\n",
    "blank lines of spaces": "  \n\t\n \r\n",
    "one line, no line end": "Hola. Adiós.",
    "crlf": "Uno. Dos.\r\n\r\nTres.\r\n",
    "mixed line ends": "Uno.\r\nDos.\nTres.\r\n\nCuatro.",
    "bom": "\ufeffPrimera línea.\nSegunda.\n",
    "trailing spaces": "Hola.   \nAdiós.\t \n",
    "two spaces between sentences": "El Sr. Pérez llegó.  Luego se fue.",
    "wrapped paragraph": (
        "Y dijo Dios: Produzcan las aguas\nreptil de ánima viviente, y aves\n"
        "que vuelen sobre la tierra.\n"
    ),
    "list": "- uno dos.\n* tres\n+ cuatro\n  sigue.\n1. cinco\n2) seis\na) siete\n(iv) ocho\n",
    "headings": "# Título\n## Subtítulo dos\nTexto del párrafo.\n",
    "indented": "    Sangría de cuatro.\n\tCon tabulador.\n",
    "quote": "> Cita uno.\n> - lista en cita\n",
    "rules": "Arriba.\n---\n***\n===\nAbajo.\n",
    "chinese wrapped": "中文句子。第二句\n继续写完。\n",
    "lone carriage return inside a line": "Uno.\rDos.\n",
    "only markers": "- \n# \n1. \n",
}


@pytest.mark.parametrize("name", list(HAND_MADE))
def test_the_identity_translation_writes_the_document_back_byte_for_byte(name):
    text = HAND_MADE[name]
    document = parse_document(text, SPLIT)
    assert document.render(document.sentences) == text


@pytest.mark.parametrize("text", ["", "\n\n\n", " \r\n\t\n", "\ufeff", "\ufeff\n\n"])
def test_a_document_without_text_has_no_sentence_and_is_written_back(text):
    document = parse_document(text, SPLIT)
    assert document.sentences == []
    assert document.render([]) == text


def test_sentences_of_every_paragraph_come_in_one_list_in_order():
    text = "Uno. Dos.\n\nTres.\n\n\nCuatro. Cinco.\n"
    assert parse_document(text, SPLIT).sentences == ["Uno.", "Dos.", "Tres.", "Cuatro.", "Cinco."]


def test_a_sentence_wrapped_over_lines_is_one_sentence_and_keeps_its_line_breaks():
    text = "Y salió Caín de delante de Jehová,\ny habitó en tierra de Nod. Fin.\n"
    document = parse_document(text, SPLIT)
    assert document.sentences == [
        "Y salió Caín de delante de Jehová, y habitó en tierra de Nod.",
        "Fin.",
    ]
    out = document.render(
        ["And Cain went out from the presence of Yahweh, and lived in Nod.", "End."]
    )
    # 28 of the sentence's 49 letters are on the first line: 29.7 of the translation's 52.
    assert out == "And Cain went out from the presence\nof Yahweh, and lived in Nod. End.\n"


def test_markers_headings_and_indentation_stay_outside_the_translation():
    text = "# Título\n\n  - uno.\n  - dos.\n1. tres.\n> cita.\n"
    document = parse_document(text, SPLIT)
    assert document.sentences == ["Título", "uno.", "dos.", "tres.", "cita."]
    out = document.render([s.upper() for s in document.sentences])
    assert out == "# TÍTULO\n\n  - UNO.\n  - DOS.\n1. TRES.\n> CITA.\n"


def test_each_list_item_and_a_heading_are_blocks_of_their_own():
    text = "# Un título\nsin punto\n- un punto\n- otro punto\n  que sigue\n"
    assert parse_document(text, SPLIT).sentences == [
        "Un título",
        "sin punto",
        "un punto",
        "otro punto que sigue",
    ]


def test_spaces_between_sentences_and_line_ends_are_kept_around_translations():
    text = "\ufeffUno.  Dos.\tTres.   \r\n\r\nCuatro.\n"
    document = parse_document(text, SPLIT)
    assert document.render(["One.", "Two.", "Three.", "Four."]) == (
        "\ufeffOne.  Two.\tThree.   \r\n\r\nFour.\n"
    )


def test_a_line_without_letters_is_kept_and_not_translated():
    document = parse_document("Arriba.\n---\n* * *\nAbajo.\n", SPLIT)
    assert document.sentences == ["Arriba.", "Abajo."]
    assert document.render(["Up.", "Down."]) == "Up.\n---\n* * *\nDown.\n"


def test_a_short_translation_over_several_lines_keeps_every_line():
    text = "Uno dos\ntres cuatro.\nFin.\n"
    document = parse_document(text, SPLIT)
    out = document.render(["Sí.", "End."])
    assert out.count("\n") == text.count("\n")
    assert out == "\nSí.\nEnd.\n"  # the word nearer the longer line


def test_a_10_mb_line_with_no_sentence_end_is_one_sentence_written_back_whole():
    text = "Título\n\n" + "palabra " * 1_250_000 + "\n"
    document = parse_document(text, SPLIT)
    assert [len(s) for s in document.sentences] == [6, 10_000_000 - 1]
    assert document.render(document.sentences) == text


def test_a_translation_per_sentence_is_required():
    document = parse_document("Uno. Dos.", SPLIT)
    with pytest.raises(ValueError, match="1 translations for 2 sentences"):
        document.render(["One."])


def test_invalid_utf8_is_refused_naming_its_line():
    with pytest.raises(InputError, match=r"^doc\.txt:2: not valid UTF-8 \(byte 0xff\)$"):
        decode(b"Uno.\nDos \xff.\n", "doc.txt")


def test_decoding_keeps_the_bom_and_carriage_returns():
    assert decode("\ufeffUno.\r\n".encode(), "doc.txt") == "\ufeffUno.\r\n"


DOCUMENT_PIECES = st.sampled_from(
    [
        "Uno.", "dos", "Sr.", "3.5", "¿Qué?", "中文。", "文字", "e\u0301", "x",
        " ", "  ", "\t", "\u3000", "\n", "\r\n", "\r", "\n\n", " \n",
        "- ", "* ", "# ", "1. ", "a) ", "> ", "---", "“", "”",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(DOCUMENT_PIECES, max_size=40).map("".join))
def test_any_document_is_written_back_byte_for_byte(bom, text):
    text = ("\ufeff" if bom else "") + text
    document = parse_document(text, SPLIT)
    assert document.render(document.sentences) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(DOCUMENT_PIECES, max_size=40).map("".join), st.sampled_from(["X", "", "a b c d"]))
def test_any_translation_keeps_every_line_and_every_line_end(text, word):
    document = parse_document(text, SPLIT)
    out = document.render([word] * len(document.sentences))
    # Line ends: each line feed, with or without a carriage return before it (a lone one is data).
    ends = [line.endswith("\r") for line in text.split("\n")[:-1]]
    assert [line.endswith("\r") for line in out.split("\n")[:-1]] == ends
