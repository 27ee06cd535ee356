"""SubRip files: cue text to translate, numbers, timings and layout kept, bad files refused in one
line (data/subtitles.py). `srt` (a subtitle library, test extra) reads back what is written."""

from __future__ import annotations

from datetime import timedelta

import pytest
import srt
from hypothesis import given, settings
from hypothesis import strategies as st

from data.errors import InputError
from data.sentences import sentence_splitter
from data.subtitles import parse_srt

SPLIT = sentence_splitter("es")

FILM = (
    "1\n00:00:01,000 --> 00:00:02,500\nHola, ¿cómo\n\n"
    "2\n00:00:02,600 --> 00:00:04,000\nestás? Bien.\n\n"
    "3\n00:00:03,500 --> 00:00:05,000\n- ¿Y tú?\n- Yo también.\n\n"
    "4\n00:00:05,100 --> 00:00:07,000 X1:100 X2:200 Y1:10 Y2:20\n<i>Encima del todo.</i>\n"
)

HAND_MADE = {
    "film": FILM,
    "crlf and bom": "\ufeff" + FILM.replace("\n", "\r\n"),
    "no final line end": FILM.rstrip("\n"),
    "extra blank lines": "\n\n" + FILM.replace("\n\n", "\n \n\n") + "\n\n",
    "cue without text": (
        "1\n00:00:01,000 --> 00:00:02,000\n\n2\n00:00:03,000 --> 00:00:04,000\nSí.\n"
    ),
    "tags and overrides": "7\n00:00:01,000 --> 00:00:02,000\n{\\an8}<b>Arriba</b> y <i>abajo</i>\n",
    "dot milliseconds": "1\n0:00:01.5 --> 0:00:02.75\nVale.\n",
    "empty": "",
    "blank lines only": "\n \r\n\n",
}


@pytest.mark.parametrize("across", [True, False])
@pytest.mark.parametrize("name", list(HAND_MADE))
def test_the_identity_translation_writes_the_file_back_byte_for_byte(name, across):
    text = HAND_MADE[name]
    subtitles = parse_srt(text, "film.srt", SPLIT, across_cues=across)
    assert subtitles.render(subtitles.sentences) == text


def test_a_sentence_over_two_cues_is_translated_once_and_spread_back():
    subtitles = parse_srt(FILM, "film.srt", SPLIT, across_cues=True)
    assert subtitles.sentences == [
        "Hola, ¿cómo estás?",
        "Bien.",
        "¿Y tú?",
        "Yo también.",
        "Encima del todo.",
    ]
    out = subtitles.render(["Hello, how are you?", "Fine.", "And you?", "Me too.", "On top."])
    cues = list(srt.parse(out))
    assert [cue.content for cue in cues] == [
        "Hello, how",
        "are you? Fine.",
        "- And you?\n- Me too.",
        "<i>On top.</i>",
    ]


def test_each_cue_alone_translates_the_cues_text_by_itself():
    subtitles = parse_srt(FILM, "film.srt", SPLIT, across_cues=False)
    assert subtitles.sentences == [
        "Hola, ¿cómo",
        "estás?",
        "Bien.",
        "¿Y tú?",
        "Yo también.",
        "Encima del todo.",
    ]


def test_numbers_timings_and_positions_are_kept_and_the_file_parses_back():
    subtitles = parse_srt(FILM, "film.srt", SPLIT)
    out = subtitles.render(["Uno dos tres cuatro"] * len(subtitles.sentences))
    before, after = list(srt.parse(FILM)), list(srt.parse(out))
    assert [(c.index, c.start, c.end, c.proprietary) for c in after] == [
        (c.index, c.start, c.end, c.proprietary) for c in before
    ]


def test_overlapping_cues_are_kept_as_they_are():
    cues = list(srt.parse(parse_srt(FILM, "film.srt", SPLIT).render(["x"] * 5)))
    assert cues[2].start < cues[1].end  # cue 3 starts before cue 2 ends, as in the source
    assert cues[2].start == timedelta(seconds=3.5)


def test_a_line_a_spread_leaves_empty_is_left_out_and_the_file_stays_valid():
    text = (
        "1\n00:00:01,000 --> 00:00:02,000\nSí, yo\n\n2\n00:00:02,000 --> 00:00:03,000\nlo haré.\n"
    )
    subtitles = parse_srt(text, "film.srt", SPLIT)
    assert subtitles.sentences == ["Sí, yo lo haré."]
    out = subtitles.render(["Yes."])  # one word: to the longer cue
    assert out == "1\n00:00:01,000 --> 00:00:02,000\n\n2\n00:00:02,000 --> 00:00:03,000\nYes.\n"
    assert [cue.content for cue in srt.parse(out)] == ["", "Yes."]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "1\n00:00:01,000 -> 00:00:02,000\nHola.\n",
            "film.srt:2: cue 1's timing line is not 'HH:MM:SS,mmm --> HH:MM:SS,mmm': "
            "'00:00:01,000 -> 00:00:02,000'",
        ),
        (
            "1\n00:00:61,000 --> 00:01:02,000\nHola.\n",
            "film.srt:2: cue 1's timing line is not",
        ),
        (
            "1\n00:00:01,000 --> 00:00:02,000\nHola.\n\n00:00:03,000 --> 00:00:04,000\nAdiós.\n",
            "film.srt:5: a cue without its number before its timing",
        ),
        ("Hola.\n", "film.srt:1: expected a cue number, found 'Hola.'"),
        ("\ufeff\r\n7\r\n\r\n", "film.srt:2: cue 7 has no timing line after its number"),
        ("3\n", "film.srt:1: cue 3 has no timing line after its number"),
        (
            "1\n00:00:05,000 --> 00:00:02,000\nHola.\n",
            "film.srt:2: cue 1 ends (00:00:02,000) before it starts (00:00:05,000)",
        ),
        (
            "1\n00:00:01,000 --> 00:00:02,000\nHola.\n2\n00:00:03,000 --> 00:00:04,000\nAdiós.\n",
            "film.srt:5: a timing line in cue 1's text (a blank line missing before a cue?)",
        ),
    ],
)
def test_a_malformed_file_is_refused_in_one_line_naming_file_and_line(text, message):
    with pytest.raises(InputError) as refused:
        parse_srt(text, "film.srt", SPLIT)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_a_zero_length_cue_is_accepted():
    text = "1\n00:00:01,000 --> 00:00:01,000\nYa.\n"
    assert parse_srt(text, "film.srt", SPLIT).sentences == ["Ya."]


CUE_LINES = st.lists(
    st.sampled_from(["Hola", "¿qué tal?", "Bien.", "- Sí.", "<i>no</i>", "中文。", "y", " eso "]),
    min_size=0,
    max_size=3,
).map(lambda words: [w for w in words if w.strip()])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(CUE_LINES, st.integers(0, 5000), st.integers(0, 3000)), max_size=6),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
    st.booleans(),
)
def test_any_valid_file_round_trips_and_a_translation_parses_back(cues, end, bom, across):
    def clock(ms: int) -> str:
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"

    blocks = [
        f"{n}{end}{clock(start)} --> {clock(start + length)}{end}" + "".join(t + end for t in lines)
        for n, (lines, start, length) in enumerate(cues, start=1)
    ]
    text = ("\ufeff" if bom else "") + end.join(blocks)
    subtitles = parse_srt(text, "film.srt", SPLIT, across_cues=across)
    assert subtitles.render(subtitles.sentences) == text
    out = subtitles.render(["una frase traducida"] * len(subtitles.sentences))
    parsed = list(srt.parse(out))
    assert [(c.index, c.start, c.end) for c in parsed] == [
        (c.index, c.start, c.end) for c in srt.parse(text)
    ]
