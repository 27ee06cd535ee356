"""`tf translate --document` and `--input-format srt` (issue 69): the whole input parsed before
anything is written, its sentences translated together, the file written back with every byte
outside the translated text as it was (cli/commands/translate.py `translate_document`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import srt
from test_cli import assert_user_error, tf

from data.documents import parse_document, with_line_ends
from data.sentences import sentence_splitter

DOCUMENT = (
    "\ufeff# En el principio\r\n"
    "\r\n"
    "Y dijo Dios: Sea la luz. Y fue la luz.  Y vió Dios que la luz era buena.\r\n"
    "Y apartó Dios la luz de las tinieblas,\n"
    "  y llamó Dios á la luz Día.   \n"
    "\n"
    "\n"
    "- Y llamó Dios á la expansión Cielos.\n"
    "  2. Y fué la tarde y la mañana el día segundo.\n"
    "---\n"
    "\tY dijo Dios: Júntense las aguas."
)

SUBTITLES = (
    "\ufeff1\r\n"
    "00:00:01,000 --> 00:00:03,500\r\n"
    "Y dijo Dios: Sea la luz.\r\n"
    "\r\n"
    "2\r\n"
    "00:00:04,000 --> 00:00:06,000 X1:10 X2:20\r\n"
    "<i>Y vió Dios que la luz</i>\r\n"
    "- era buena.\r\n"
    "\r\n"
    "3\r\n"
    "00:00:05,500 --> 00:00:07,000\r\n"
    "Y fue la tarde y la mañana un día.\r\n"
)


def translate(run: Path, text: str, tmp_path: Path, *args: str, name: str = "doc.es"):
    src = tmp_path / name
    src.write_bytes(text.encode("utf-8"))
    out = tmp_path / "out.txt"
    result = tf("translate", run, "-i", src, "-o", out, "--greedy", *args)
    assert result.exit_code == 0, result.output
    return out.read_bytes().decode("utf-8")


def test_a_document_keeps_its_layout_byte_for_byte_around_the_translations(trained, tmp_path):
    out = translate(trained, DOCUMENT, tmp_path, "--document")
    source = parse_document(DOCUMENT, sentence_splitter("es"))
    lines = with_line_ends(out.removeprefix("\ufeff"))
    assert out.startswith("\ufeff") and len(lines) == len(source.lines)
    for line, written in zip(source.lines, lines):
        if not line.text:  # blank lines, a rule: as they were
            assert written == line.head + line.tail
        else:  # heads (markers, indentation) and tails (spaces, CRLF or LF) as they were
            assert written.startswith(line.head) and written.endswith(line.tail), written
    assert "Sea la luz" not in out  # the text itself was translated


def test_document_and_input_format_document_are_the_same(trained, tmp_path):
    first = translate(trained, DOCUMENT, tmp_path, "--document")
    assert translate(trained, DOCUMENT, tmp_path, "--input-format", "document") == first


def test_sentences_are_translated_as_lines_are(trained, tmp_path):
    """A document's sentences are translated in the usual batches: each as `tf translate`
    translates it alone on a line."""
    text = "Y dijo Dios: Sea la luz. Y fue la luz.\n\nY vió Dios que la luz era buena.\n"
    out = translate(trained, text, tmp_path, "--document")
    sentences = parse_document(text, sentence_splitter("es")).sentences
    alone = translate(trained, "\n".join(sentences) + "\n", tmp_path, name="lines.es")
    a, b, c = alone.splitlines()
    first = " ".join(t for t in (a, b) if t)  # an empty translation takes no room
    assert out == f"{first}\n\n{c}\n"


@pytest.mark.parametrize("cues", ["spread", "alone"])
def test_subtitles_keep_numbers_timings_and_parse_back(trained, tmp_path, cues):
    out = translate(trained, SUBTITLES, tmp_path, "--input-format", "srt", "--srt-cues", cues)
    kept = [line for line in with_line_ends(SUBTITLES) if "-->" in line or line.strip().isdigit()]
    written = with_line_ends(out)
    assert out.startswith("\ufeff1\r\n")
    assert [line for line in written if line in kept] == kept  # numbers and timings, in order
    parsed = list(srt.parse(out.removeprefix("\ufeff")))
    assert [c.index for c in parsed] == [1, 2, 3]
    assert [c.start.total_seconds() for c in parsed] == [1.0, 4.0, 5.5]
    assert "luz" not in out


@pytest.mark.parametrize(
    "text",
    ["", "\n\n  \n", "\r\n\r\n"],
    ids=["empty", "blank lines", "crlf blank lines"],
)
def test_an_empty_document_is_written_back_as_it_was(trained, tmp_path, text):
    assert translate(trained, text, tmp_path, "--document") == text


def test_a_malformed_srt_is_refused_in_one_line_and_the_output_untouched(trained, tmp_path):
    src = tmp_path / "bad.srt"
    src.write_text(
        "1\n00:00:01,000 --> 00:00:02,000\nHola.\n\n2\n00:00:03,000 -> 00:00:04\nAdiós.\n"
    )
    out = tmp_path / "out.srt"
    out.write_text("kept\n")
    result = tf("translate", trained, "-i", src, "-o", out, "--input-format", "srt")
    assert_user_error(result, "bad.srt:6:")
    assert out.read_text() == "kept\n"


def test_bad_utf8_in_a_document_is_refused_naming_its_line(trained, tmp_path):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"Hola.\n\nAdi\xf3s.\n")
    assert_user_error(tf("translate", trained, "-i", src, "--document"), "bad.txt:3:", "UTF-8")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--document", "--nbest", "2", "--beam", "2"], "--nbest 2"),
        (["--document", "--scores"], "--scores"),
        (["--input-format", "srt", "--attention", "pics"], "--attention"),
        (["--document", "--input-format", "jsonl"], "contradict"),
        (["--srt-cues", "alone"], "--srt-cues is for --input-format srt"),
        (["--input-format", "srt", "--srt-cues", "both"], "--srt-cues both"),
    ],
)
def test_what_has_no_meaning_for_a_document_is_refused(trained, tmp_path, args, message):
    src = tmp_path / "doc.txt"
    src.write_text("Hola.\n")
    out = tmp_path / "out.txt"
    out.write_text("kept\n")
    assert_user_error(tf("translate", trained, "-i", src, "-o", out, *args), message)
    assert out.read_text() == "kept\n"


def test_a_document_from_stdin_goes_to_stdout(trained):
    result = tf("translate", trained, "--document", "--greedy", input="Hola.\n\nAdiós.\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 3 and result.stdout.split("\n")[1] == ""
