"""SubRip subtitles (.srt): the cues' text to translate, and the file written back around its
translation with the numbers, timings, blank lines and line ends as they were.

A file is cues separated by blank lines; a cue is its number, its timing line
(`00:00:01,000 --> 00:00:02,500`, maybe followed by a position) and lines of text, as many as
it has (none too). A cue's text lines keep their formatting tags at their ends (`<i>`, `{\\an8}`)
and a speaker's dash ("- ") outside the translated text, as a document's lines keep their list
markers (`data.documents`). A sentence spread over two cues is either translated once and put
back over them in proportion to their lengths (`across_cues`), or each cue is translated alone.

Overlapping cues (two speakers at once) and cues out of time order are kept as they are: they
occur in real files and players show them. What is refused, in one line naming the file and
line: a cue without its number, a bad timing line, a cue that ends before it starts, and a
timing line among a cue's text (the blank line before a cue missing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from data.documents import Flow, Line, with_line_ends
from data.errors import InputError
from data.sentences import Splitter
from data.text import BOM

_TIME = r"(\d{1,3}):([0-5]\d):([0-5]\d)[,.](\d{1,3})"
_TIMING = re.compile(rf"[^\S\n]*{_TIME}[^\S\n]*-->[^\S\n]*{_TIME}(?:[^\S\n].*)?")
_LOOKS_TIMED = re.compile(r".*-->")
# Formatting a line starts or ends with, kept outside its text: tags, ASS overrides, a dash.
_TAGS = r"(?:<[^<>\n]*>|\{[^{}\n]*\})"
_LINE_HEAD = re.compile(rf"[^\S\n]*(?:{_TAGS}[^\S\n]*)*(?:[-‐–—][^\S\n]+(?:{_TAGS}[^\S\n]*)*)?")
_LINE_TAIL = re.compile(rf"(?:[^\S\n]*{_TAGS})*\s*$")


@dataclass
class Subtitles:
    """A SubRip file read for translation (`parse_srt`).

    Attributes:
        pieces: the file in order: raw text kept as it is (the BOM, numbers, timing lines,
            blank lines), and the cues' text lines (`Line`).
        flow: the sentences of the text lines.
    """

    pieces: list[str | Line]
    flow: Flow

    @property
    def sentences(self) -> list[str]:
        """The text to translate, in file order."""
        return self.flow.sentences

    def render(self, translations: list[str]) -> str:
        """The file with its sentences replaced by `translations`, all else as read. A text
        line that a spread translation leaves empty is left out (an empty line would end its
        cue), so a cue may have fewer lines, or none, but the file stays valid SRT."""
        texts = iter(self.flow.translated(translations))
        out = []
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            text = next(texts)
            if text or (piece.head + piece.tail).strip() or not piece.text:
                out.append(piece.head + text + piece.tail)
        return "".join(out)


def parse_srt(text: str, source: str, split: Splitter, across_cues: bool = True) -> Subtitles:
    """A SubRip file's cues and the sentences of their text.

    Args:
        text: the file (decoded: `data.documents.decode`); BOM, CRLF and LF line ends kept.
        source: names the file in errors.
        split: the sentence splitter of its language (`data.sentences.sentence_splitter`).
        across_cues: a sentence that runs on from one cue into the next is one sentence,
            translated once and spread back over the cues; False: each cue's text alone.

    Raises:
        InputError: `source:LINE: problem`, for the first malformed cue.
    """
    bom = BOM if text.startswith(BOM) else ""
    lines = with_line_ends(text[len(bom) :])
    pieces: list[str | Line] = [bom] if bom else []
    n = 0
    while n < len(lines):
        if not lines[n].strip():
            pieces.append(lines[n])
            n += 1
            continue
        n = _read_cue(lines, n, source, pieces, across_cues)
    text_lines = [piece for piece in pieces if isinstance(piece, Line)]
    flow = Flow([line.text for line in text_lines], [line.opens for line in text_lines], split)
    return Subtitles(pieces, flow)


def _read_cue(
    lines: list[str], n: int, source: str, pieces: list[str | Line], across_cues: bool
) -> int:
    """Read the cue whose number is on `lines[n]` into `pieces`; the index of the line after
    its last text line."""
    number = lines[n].strip()
    if not number.isdigit() or not number.isascii():
        if _LOOKS_TIMED.match(lines[n]):
            raise InputError(f"{source}:{n + 1}: a cue without its number before its timing")
        raise InputError(f"{source}:{n + 1}: expected a cue number, found {_shown(number)}")
    if n + 1 >= len(lines) or not lines[n + 1].strip():
        raise InputError(f"{source}:{n + 1}: cue {number} has no timing line after its number")
    _check_timing(lines[n + 1], f"{source}:{n + 2}", number)
    pieces += [lines[n], lines[n + 1]]
    n += 2
    first = True
    while n < len(lines) and lines[n].strip():
        if _TIMING.fullmatch(lines[n].rstrip("\r\n")):
            raise InputError(
                f"{source}:{n + 1}: a timing line in cue {number}'s text "
                "(a blank line missing before a cue?)"
            )
        pieces.append(_text_line(lines[n], opens=first and not across_cues))
        first = False
        n += 1
    return n


def _check_timing(line: str, where: str, number: str) -> None:
    """InputError unless `line` is a timing line whose cue ends no earlier than it starts."""
    match = _TIMING.fullmatch(line.rstrip("\r\n"))
    if match is None:
        raise InputError(
            f"{where}: cue {number}'s timing line is not 'HH:MM:SS,mmm --> HH:MM:SS,mmm': "
            f"{_shown(line.strip())}"
        )
    start, end = _milliseconds(match.groups()[:4]), _milliseconds(match.groups()[4:])
    if end < start:
        raise InputError(
            f"{where}: cue {number} ends ({_clock(end)}) before it starts ({_clock(start)})"
        )


def _text_line(raw: str, opens: bool) -> Line:
    """A cue's text line: formatting at its ends outside its text. A speaker's dash starts a
    block of its own (another speaker's sentence)."""
    body = raw.rstrip()
    head = _LINE_HEAD.match(body).group()
    tail_at = _LINE_TAIL.search(body, len(head)).start()
    text = body[len(head) : tail_at]
    if not text.strip():
        return Line(body, "", raw[len(body) :], True)
    dash = bool(re.search(r"[-‐–—]", head))
    return Line(head, text, body[tail_at:] + raw[len(body) :], opens or dash)


def _milliseconds(parts: tuple[str, ...]) -> int:
    """hours, minutes, seconds and fraction (1 to 3 digits: "5" is 500 ms) in ms."""
    hours, minutes, seconds, fraction = parts
    ms = int(fraction.ljust(3, "0"))
    return ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1000 + ms


def _clock(ms: int) -> str:
    """ms as SubRip writes a time: 00:00:01,500."""
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def _shown(text: str, limit: int = 40) -> str:
    """`text` quoted for a message, cut at `limit` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
