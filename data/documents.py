"""Plain-text documents: the sentences to translate, and the document written back around their
translations with every other byte as it was.

A document is lines. A line's text is what lies between its head (indentation, a list marker,
heading marks, quote marks) and its tail (trailing white space and the line end, CRLF or LF);
a blank line, or one with no letter or digit (a rule of dashes), has none and is kept whole.
Text flows from line to line within a block (a paragraph, a list item, a heading): the block's
lines are read as one text, split into sentences (so a sentence wrapped over two lines is one
sentence), and each sentence's translation is spread back over the lines it came from, so every
line break stays where it was (`data.segments.spread`). Between two sentences on a line the
source's white space is kept as it was.

`Flow` does the sentences-over-lines part for any lines; `data.subtitles` uses it for cues.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from data.segments import flow, spread
from data.sentences import Splitter
from data.text import BOM, decode_text

# A line's head: indentation, then quote marks ("> "), then at most one marker followed by white
# space: a heading ("## "), a bullet ("- ", "* ", "• "), a number ("1. ", "2) "), a letter
# ("a) ", "(b) ") or a roman numeral up to 29 ("iv. ", "(ii) ").
_HEAD = re.compile(
    r"""[^\S\n]*(?:>[^\S\n]*)*
    (?P<marker>
        (?P<heading>\#{1,6})
        | [-*+•‣◦▪–—]
        | (?:\d{1,9}|(?=[ivx])x{0,2}(?:ix|iv|v?i{0,3})|(?=[IVX])X{0,2}(?:IX|IV|V?I{0,3}))[.)]
        | [A-Za-z]\)
        | \((?:\d{1,9}|[A-Za-z]|(?=[ivx])x{0,2}(?:ix|iv|v?i{0,3}))\)
    )?(?(marker)(?=\s)[^\S\n]*|)""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Line:
    """One line of a document: `head + text + tail` is the line as it was read.

    Attributes:
        head: what comes before the text and is kept: indentation, quote marks, a marker
            (the whole line, less its tail, when it has no text).
        text: the text to translate, without white space at its ends; "" for none.
        tail: the white space after the text and the line's end ("\\n", "\\r\\n", or "" for a
            last line without one).
        opens: the line starts a block: its text does not continue the line before's.
    """

    head: str
    text: str
    tail: str
    opens: bool


class Flow:
    """The sentences of consecutive lines' texts, and each line's text from their translations.

    The lines of a block (from a line that `opens` to the next that does, lines without text
    ending a block too) are joined into one text (`data.segments.flow`) and split into
    sentences by `split`; a sentence's translation goes back onto the lines it spans in
    proportion to its part on each (`data.segments.spread`).

    Attributes:
        sentences: every sentence of every block, in order: what to translate, as one list
            (so that a caller batches them across paragraphs).
    """

    def __init__(self, texts: list[str], opens: list[bool], split: Splitter) -> None:
        self.texts = texts
        self.sentences: list[str] = []
        self._parts: list[list[tuple[int, int, int]]] = []  # per sentence: (line, start, end)
        for block in _blocks(texts, opens):
            self._add_block(block, split)

    def _add_block(self, block: list[int], split: Splitter) -> None:
        """The sentences of one block of lines, with where each part of them lies. Sentences
        and lines both run forward, so a block of many lines costs one pass over them."""
        joined = flow([self.texts[i] for i in block])
        starts, at = [], 0
        for i in block:
            at = joined.index(self.texts[i], at)
            starts.append(at)
            at += len(self.texts[i])
        first = 0  # the first line the next sentence may lie on
        for start, end in split(joined):
            while starts[first] + len(self.texts[block[first]]) <= start:
                first += 1
            parts, n = [], first
            while n < len(block) and starts[n] < end:
                a = max(start, starts[n]) - starts[n]
                b = min(end, starts[n] + len(self.texts[block[n]])) - starts[n]
                if a < b:
                    parts.append((block[n], a, b))
                n += 1
            self.sentences.append(joined[start:end])
            self._parts.append(parts)

    def translated(self, translations: list[str]) -> list[str]:
        """Each line's text with its sentences' parts replaced by their translations: the
        white space between two sentences of a line kept; a part left empty (a translation
        with fewer words than the lines it spreads over) taken out with the space after it.

        Raises:
            ValueError: not one translation per sentence.
        """
        if len(translations) != len(self.sentences):
            raise ValueError(
                f"{len(translations)} translations for {len(self.sentences)} sentences"
            )
        on_line: list[list[tuple[int, int, str]]] = [[] for _ in self.texts]
        for parts, translation in zip(self._parts, translations):
            if len(parts) == 1:
                pieces = [translation.strip()]
            else:
                weights = [_letters(self.texts[i][a:b]) for i, a, b in parts]
                pieces = spread(translation, weights)
            for (i, a, b), piece in zip(parts, pieces):
                on_line[i].append((a, b, piece))
        return [_rebuild(text, parts) for text, parts in zip(self.texts, on_line)]


@dataclass
class Document:
    """A plain-text document read for translation (`parse_document`).

    Attributes:
        bom: the byte-order mark the document starts with, or "".
        lines: its lines (`Line`), every character of the document after the BOM in one.
        flow: the sentences of the lines' texts.
    """

    bom: str
    lines: list[Line]
    flow: Flow

    @property
    def sentences(self) -> list[str]:
        """The sentences to translate, in document order."""
        return self.flow.sentences

    def render(self, translations: list[str]) -> str:
        """The document with its sentences replaced by `translations` (one per sentence, in
        order), every character outside them as read: `render(sentences)` is the document."""
        texts = self.flow.translated(translations)
        return self.bom + "".join(
            line.head + text + line.tail for line, text in zip(self.lines, texts)
        )


def parse_document(text: str, split: Splitter) -> Document:
    """A plain-text document's lines and sentences.

    Paragraphs are separated by blank lines (white space only); a line starting with a list
    marker or heading marks starts a block of its own, and a heading's block is the heading
    alone. Only a line feed ends a line (a carriage return before it is part of the line's
    tail, so CRLF, LF and a mix of them are written back as they were).

    Args:
        text: the document (decoded: `decode`), empty or not.
        split: the sentence splitter of its language (`data.sentences.sentence_splitter`).
    """
    bom = BOM if text.startswith(BOM) else ""
    lines: list[Line] = []
    before_opens_next = True
    for raw in with_line_ends(text[len(bom) :]):
        line, opens_next = _parse_line(raw, before_opens_next)
        lines.append(line)
        before_opens_next = opens_next
    return Document(
        bom, lines, Flow([line.text for line in lines], [line.opens for line in lines], split)
    )


def decode(raw: bytes, source: str) -> str:
    """A document's bytes as text (UTF-8).

    Raises:
        InputError: `source:LINE: not valid UTF-8 (byte 0x..)`, or a NUL character.
    """
    return decode_text(raw, 0, source)


def with_line_ends(text: str) -> list[str]:
    """The lines of `text`, each with its line feed (the last without one, if it has none);
    none for "". Only a line feed ends a line, as `data.text` reads lines."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    return out + [lines[-1]] if lines[-1] else out


def _parse_line(raw: str, opened: bool) -> tuple[Line, bool]:
    """One line as a `Line` (`opened`: the line before ended a block), and whether the next
    line starts a block (after a heading, or a line without text)."""
    body = raw.rstrip()
    tail = raw[len(body) :]
    head = _HEAD.match(body)
    text = body[head.end() :]
    if not any(char.isalnum() for char in text):
        return Line(body, "", tail, True), True
    marked = head.group("marker") is not None
    return Line(head.group(), text, tail, opened or marked), head.group("heading") is not None


def _blocks(texts: list[str], opens: list[bool]) -> list[list[int]]:
    """The indices of lines with text, in blocks: a block ends before a line that opens one
    and at a line without text."""
    blocks: list[list[int]] = []
    current: list[int] = []
    for i, (text, opening) in enumerate(zip(texts, opens)):
        if not text or opening:
            if current:
                blocks.append(current)
            current = []
        if text:
            current.append(i)
    if current:
        blocks.append(current)
    return blocks


def _letters(text: str) -> int:
    """The non-space characters of `text`: a part's weight when a translation is spread."""
    return sum(1 for char in text if not char.isspace())


def _rebuild(text: str, parts: list[tuple[int, int, str]]) -> str:
    """`text` with each (start, end) part replaced by its new text, the white space between
    two parts kept; a part left empty is taken out with the white space before it (after it,
    for the first)."""
    if not parts:
        return text
    out, end = "", 0
    for start, stop, new in sorted(parts):
        if new:
            out += (text[end:start] if out else text[:start] if end == 0 else "") + new
        end = stop
    return out + text[end:]
