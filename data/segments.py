"""A segment fitted to the model's limit, and translations put back together.

`fit` cuts a segment the model cannot take whole into parts it can: at its sentences, and a
sentence still too long at the best break short of the limit (a sentence mark, a clause mark,
a space; between two characters in a script written without spaces). Every character of the
segment is in exactly one part: nothing is lost. `join` writes the parts' translations back as
one; `spread` puts one translation back over several source slots (the lines a sentence was
wrapped over, the subtitle cues it spans) in proportion to their lengths.

Counting is the caller's (`count`: the tokenizer's length of a text, frame included), so this
module knows no tokenizer. Past one count of the segment and one of each sentence, a part is
counted O(log n) times (two or three in practice), each time only its own text, never the rest
of the segment: a line of 10 MB with no sentence end is cut in seconds.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Callable

from data.sentences import Span, Splitter

Count = Callable[[str], int]  # the pieces the model reads for a text (stripped of white space)

# Breaks, strongest first: a sentence mark the splitter did not cut at (inside quotes, say),
# then a clause mark, each followed by white space; the marks of scripts written without
# spaces need none after them.
_SENTENCE_MARK = re.compile(r"[.!?…।॥؟۔።]+[\"'”’»)\]]*(?=\s)|[。！？｡]+[」』”’）》〉]*")
_CLAUSE_MARK = re.compile(r"[,;:—–)\]،؛]+[\"'”’»]*(?=\s)|[，、；：）」』]+")
_SPACE = re.compile(r"\s+")
_SEARCH_TOLERANCE = 32  # a part may stop 1/32 of its length short of the limit: fewer counts


def spaceless(char: str) -> bool:
    """True for a character of a script written without spaces between words (Chinese,
    Japanese, Thai, Lao, Khmer, Myanmar, Tibetan) or their punctuation: text is joined
    and cut there with nothing between."""
    code = ord(char)
    return (
        0x0E00 <= code <= 0x0FFF  # Thai, Lao, Tibetan
        or 0x1000 <= code <= 0x109F  # Myanmar
        or 0x1780 <= code <= 0x17FF  # Khmer
        or 0x2E80 <= code <= 0x303F  # CJK radicals, ideographic punctuation
        or 0x3040 <= code <= 0x30FF  # kana
        or 0x3400 <= code <= 0x4DBF  # CJK extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
        or 0xF900 <= code <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # full-width forms (，。！？)
        or 0x20000 <= code <= 0x3FFFF  # CJK extensions B on
    )


def fit(
    text: str, count: Count, limit: int, split: Splitter, pieces: int | None = None
) -> list[Span]:
    """Cut `text` into consecutive parts of at most `limit` pieces each.

    A text that fits is one part, all of it: `[(0, len(text))]`, so it is translated as it
    would be without this. One that does not is cut at its sentences (`split`), each then
    translated alone, and a sentence still too long at the best break short of the limit
    (`_best_break`). Each part keeps the white space after it; strip a part's text before
    translating it. A character the limit cannot hold (a limit below the tokenizer's frame)
    is a part of its own, over the limit.

    Args:
        text: a segment (a line, a paragraph); line breaks in it are white space.
        count: the pieces the model reads for a text (stripped), frame included.
        limit: the most pieces a part may have (the model's positions).
        split: the sentences of a text (`data.sentences.sentence_splitter`).
        pieces: `count(text.strip())` where the caller has it already (the ids it encoded).

    Returns:
        (start, end) spans, in order, each starting where the one before ends, the first at
        0 and the last at `len(text)`.
    """
    pieces = count(text.strip()) if pieces is None else pieces
    if pieces <= limit:
        return [(0, len(text))]
    sentences = _sentence_parts(text, split)
    parts: list[Span] = []
    for start, end in sentences:
        if len(sentences) > 1:
            pieces = count(text[start:end].strip())
        if pieces <= limit:
            parts.append((start, end))
        else:
            parts += _cut(text, start, end, count, limit, (end - start) / max(1, pieces))
    return parts


def join(text: str, parts: list[Span], translations: list[str]) -> str:
    """The translations of `text`'s parts (`fit`) as one translation.

    One part's translation is returned as it is. Between two, the white space of the source
    where the parts meet (as wide as it was: two spaces after a full stop stay two), a space
    where the source has none (a cut between two ideographs translated into English), and
    nothing between two characters of scripts written without spaces. An empty translation
    adds no separator.
    """
    if len(translations) == 1:
        return translations[0]
    out: list[str] = []
    for (start, _), translation in zip(parts, translations):
        translation = translation.strip()
        if not translation:
            continue
        if out:
            out.append(_separator(out[-1][-1], translation[0], _gap_before(text, start)))
        out.append(translation)
    return "".join(out)


def spread(translation: str, weights: list[int]) -> list[str]:
    """One translation put back over several slots, in proportion to `weights` (the slots'
    source lengths: the non-space characters of each line or cue a sentence spans).

    Cuts fall where the translation has white space (dropped there) or between two characters
    of scripts written without spaces, each the nearest to its proportional point; every slot
    gets a word while there are words enough, else the slots nearest no cut stay empty. A
    translation equal to its source joined from the slots (`flow`) spreads back onto them
    exactly.

    Returns:
        One text per weight, stripped; "" for a slot left without a word.
    """
    translation = translation.strip()
    if len(weights) <= 1:
        return [translation] * len(weights)
    total = sum(1 for c in translation if not c.isspace())
    # Where a slot may end: the start, each break, the end (non-space characters before it).
    cuts = [(0, 0, 0), *_breaks(translation), (len(translation), len(translation), total)]
    seen = [letters for _, _, letters in cuts]  # rising: a bisection finds the nearest
    slots, enough = len(weights), len(cuts) - 1 >= len(weights)
    whole, before, chosen = sum(weights) or 1, 0, [0]
    for slot, weight in enumerate(weights[:-1], start=1):
        before += weight
        want = total * before / whole
        # With words enough, each slot ends strictly after the one before and leaves a word
        # for each slot after it; without, slots may end where the one before did (empty).
        low = chosen[-1] + 1 if enough else chosen[-1]
        high = len(cuts) - 1 - (slots - slot) if enough else len(cuts) - 1
        chosen.append(_nearest(seen, want, low, high))
    chosen.append(len(cuts) - 1)
    return [
        translation[cuts[a][1] : cuts[b][0]].strip() if b > a else ""
        for a, b in zip(chosen, chosen[1:])
    ]


def flow(texts: list[str]) -> str:
    """Texts (wrapped lines, cue lines) joined as the one text they continue: a space between
    two, or nothing between two characters of scripts written without spaces."""
    out: list[str] = []
    for text in texts:
        if out and text:
            out.append(_separator(out[-1][-1], text[0], ""))
        if text:
            out.append(text)
    return "".join(out)


def _nearest(values: list[int], want: float, low: int, high: int) -> int:
    """The index in [low, high] of the value nearest `want` in rising `values` (the first of
    two as near)."""
    at = min(max(bisect.bisect_left(values, want, low, high + 1), low), high)
    if at > low and want - values[at - 1] <= values[at] - want:
        return at - 1
    return at


def _sentence_parts(text: str, split: Splitter) -> list[Span]:
    """The sentences of `text` as consecutive parts: each from its sentence's start (the
    first from 0) to the next one's (the last to the end)."""
    starts = [start for start, _ in split(text)][1:]
    return list(zip([0, *starts], [*starts, len(text)]))


def _cut(text: str, start: int, end: int, count: Count, limit: int, per_piece: float) -> list[Span]:
    """[start, end) (one sentence, over the limit) cut into parts within it: each about the
    longest that fits (`_longest`), ended at its best break (`_best_break`)."""
    parts: list[Span] = []
    while start < end:
        space = _SPACE.match(text, start, end)  # (white space leading the segment)
        body = space.end() if space else start
        longest = _longest(text, body, end, count, limit, per_piece)
        if longest >= end:
            parts.append((start, end))
            break
        stop = _within(text, body, longest, count, limit)
        parts.append((start, stop))
        per_piece = max(1.0, (longest - body) / limit)
        start = stop
    return parts


def _within(text: str, start: int, longest: int, count: Count, limit: int) -> int:
    """The end of the part from `start`: its best break at or before `longest`, moved to an
    earlier one while the part counts over the limit (counts need not grow with the text: a
    longer word may be fewer pieces); one character (with its marks) if none makes it fit."""
    bound, first = longest, _next_character(text, start)
    while bound > start:
        stop = _best_break(text, start, bound)
        content_end = start + len(text[start:stop].rstrip())
        if content_end <= first or count(text[start:stop].strip()) <= limit:
            return stop
        bound = min(bound, content_end) - 1
    return first


def _longest(text: str, start: int, end: int, count: Count, limit: int, per_piece: float) -> int:
    """The end of about the longest prefix of text[start:end] within the limit: `end` if all
    of it fits, else one that fits while 1/32 of its length more does not, or one whose count
    is within 1/32 of the limit and more than 1/32 short of the end; `start` if not a
    character fits.

    Counts grow about in proportion to length, so each probe aims where the counts seen so far
    put the limit (the first where `per_piece` characters make a piece): most parts take two
    or three counts. Every other probe halves the bracket, so there are O(log n) of them at
    worst, each of a text about a part long, never the rest of a long text.
    """
    fits, over = start, end + 1  # fits: known within the limit; over: known over it
    fits_count, over_count = 0, 0
    probe, probes = min(end, start + max(1, int(limit * per_piece))), 0
    while True:
        pieces = count(text[start:probe].strip())
        probes += 1
        if pieces <= limit:
            fits, fits_count = probe, pieces
            if probe >= end:
                return end
        else:
            over, over_count = probe, pieces
        step = max(1, (fits - start) // _SEARCH_TOLERANCE)
        close = fits_count * _SEARCH_TOLERANCE >= limit * (_SEARCH_TOLERANCE - 1)
        if over - fits <= step or (close and end - fits > step):
            return fits
        if probes % 2 == 0 and over <= end:
            probe = (fits + over) // 2  # the bisection that bounds the probes
        elif over > end and close:  # near the limit and near the end: does all of it fit?
            probe = end
        elif over > end:  # no bound yet: aim by the rate so far, at most twice as far
            rate = (fits - start) / max(1, fits_count)
            probe = min(end, start + 2 * (fits - start), start + int(limit * rate))
        else:  # aim between the two by their counts
            rate = (over - fits) / max(1, over_count - fits_count)
            probe = fits + int((limit - fits_count) * rate)
        probe = min(max(probe, fits + 1), over - 1, end)


def _best_break(text: str, start: int, stop: int) -> int:
    """Where the part text[start:...] ends, at or before `stop`: after the last sentence
    mark, else the last clause mark, if in the part's second half; else before the last
    space; else after the last mark of either kind; else between two characters. Returned
    past the white space that follows, so that the next part starts at its text."""
    half = start + (stop - start) // 2
    sentence = _last_end(_SENTENCE_MARK, text, start, stop)
    clause = _last_end(_CLAUSE_MARK, text, start, stop)
    space = max((m.start() for m in _SPACE.finditer(text, start + 1, stop + 1)), default=0)
    if sentence > half:
        at = sentence
    elif clause > half:
        at = clause
    elif space > start and space <= stop:
        at = space
    elif max(sentence, clause) > start:
        at = max(sentence, clause)
    else:
        at = _character_break(text, start, stop)
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _last_end(pattern: re.Pattern, text: str, start: int, stop: int) -> int:
    """The end of the last match of `pattern` ending within text[start:stop] (its lookahead
    may see one character past), or 0."""
    ends = [m.end() for m in pattern.finditer(text, start, min(len(text), stop + 1))]
    return max((e for e in ends if e <= stop), default=0)


def _character_break(text: str, start: int, stop: int) -> int:
    """`stop`, or the nearest point before it that does not part a letter from the marks
    that follow it (an accent, a Thai vowel); past the first character and its marks."""
    at = stop
    while at > start + 1 and at < len(text) and _joins_previous(text[at]):
        at -= 1
    if at < len(text) and _joins_previous(text[at]):
        return _next_character(text, start)
    return at


def _next_character(text: str, start: int) -> int:
    """The end of the character at `start` with the marks that follow it."""
    at = start + 1
    while at < len(text) and _joins_previous(text[at]):
        at += 1
    return at


def _joins_previous(char: str) -> bool:
    """A combining mark, a variation selector or a zero-width joiner: part of the character
    before it."""
    return unicodedata.category(char).startswith("M") or char in "\u200d\ufe0f\ufe0e"


def _gap_before(text: str, start: int) -> str:
    """The white space before `start`."""
    at = start
    while at > 0 and text[at - 1].isspace():
        at -= 1
    return text[at:start]


def _separator(left: str, right: str, source_gap: str) -> str:
    """What goes between two joined texts ending in `left` and starting with `right`: nothing
    between two characters of scripts without spaces, else the source's spaces or tabs where
    it has them (as wide), else one space."""
    if spaceless(left) and spaceless(right) and not _joins_previous(right):
        return ""
    if source_gap and not source_gap.strip(" \t"):
        return source_gap
    return " "


def _breaks(text: str) -> list[tuple[int, int, int]]:
    """Where `text` may be cut for `spread`: each white-space run (dropped) and each point
    between two characters of scripts without spaces (not before a mark); as (start, end,
    non-space characters before it)."""
    breaks, seen, at = [], 0, 0
    while at < len(text):
        char = text[at]
        if char.isspace():
            end = at
            while end < len(text) and text[end].isspace():
                end += 1
            breaks.append((at, end, seen))
            at = end
            continue
        seen += 1
        at += 1
        if (
            at < len(text)
            and spaceless(char)
            and spaceless(text[at])
            and not _joins_previous(text[at])
        ):
            breaks.append((at, at, seen))
    return breaks
