"""Sentences of a text as exact character spans, split by the rules of its language.

The splitting is sentencex's (Wikimedia's rule-based segmenter: a compiled core, no model to
download, rules for about 30 languages and fallbacks from about 250 others to them). The
comparison with pysbd and blingfire that chose it is in docs/ (issue 69).

What this module adds is exactness: a span is a (start, end) pair of offsets into the text as
given, so that whatever lies between two sentences (spaces, an ideographic space, nothing) can be
written back byte for byte around their translations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import sentencex

Span = tuple[int, int]  # [start, end) offsets into a str: text[start:end]
Splitter = Callable[[str], list[Span]]

# sentencex keys its rules and fallbacks by ISO 639-1 codes ("es", "zh-hant"): a code it does not
# know gets its English rules, which still end sentences at every script's marks (. ? ! 。 । ؟).
# So a three-letter code (ISO 639-3 or 639-2, as NLLB's "spa_Latn" and OPUS-MT's "fra" write
# languages) needs its 639-1 name here only where sentencex has rules for that language or a
# fallback to them: the rules' own languages, then those it falls back from.
_RULES = """
    amh:am ara:ar arb:ar ars:ar acq:ar ajp:ar bul:bg ben:bn cat:ca dan:da deu:de ger:de ell:el
    gre:el eng:en spa:es fin:fi fra:fr fre:fr guj:gu hin:hi hye:hy arm:hy ita:it jpn:ja kaz:kk
    kan:kn mal:ml mar:mr mya:my bur:my nld:nl dut:nl pan:pa pol:pl por:pt rus:ru slk:sk slo:sk
    tam:ta tel:te ukr:uk
    abk:ab arg:an aym:ay ayr:ay bak:ba bam:bm ces:cs cze:cs che:ce chv:cv cos:co glg:gl grn:gn
    hat:ht kal:kl kom:kv ltz:lb lim:li lin:ln mlg:mg plt:mg oci:oc oss:os que:qu quy:qu roh:rm
    san:sa sag:sg tat:tt tah:ty wln:wa wol:wo ava:av
"""
ISO_639_1 = dict(pair.split(":") for pair in _RULES.split())

# Opening marks a splitter may leave at the end of a sentence when the next one starts with
# them (`"... God. “You shall ...`): they belong to the sentence they open.
_OPENERS = re.compile(r"\s+[“‘«„‚¿¡(\[{「『《〈\"']+$")


def splitter_language(code: str) -> str:
    """The language name sentencex is asked for, from a run's language code.

    Args:
        code: ISO 639-1 ("es"), a BCP 47 tag ("es-MX", "zh-Hant"), NLLB's "spa_Latn",
            mBART's "es_XX", a three-letter code ("spa", "fra"), or "" for none.

    Returns:
        The language part, lower case, in ISO 639-1 where sentencex knows it by that
        ("spa_Latn" -> "es", "es_XX" -> "es"); any other code as it is (sentencex falls back
        from many, e.g. "ast" -> Spanish, and reads the rest with its English rules); "en"
        for "".
    """
    language = re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0]
    return ISO_639_1.get(language, language) or "en"


def sentence_spans(text: str, language: str = "en") -> list[Span]:
    """The sentences of `text`, in order, as spans that hold no white space at either end.

    Only white space lies outside the spans (between them, before the first, after the last),
    so `text` is its spans and the white space around them, every character once; a text of
    white space only has no sentence. A text with no sentence end is one span however long.

    Args:
        text: any text; line breaks inside it are white space like any other.
        language: a language as sentencex names it (`splitter_language`).
    """
    spans: list[Span] = []
    at = 0
    for found in sentencex.get_sentence_boundaries(language, text):
        # Located by their text, not trusted offsets: robust to a library that counts in
        # bytes or normalises what it returns (the sentence then joins its neighbour).
        piece = found["text"].strip()
        start = text.find(piece, at) if piece else -1
        if start < 0:
            continue
        spans.append((start, start + len(piece)))
        at = start + len(piece)
    return _openers_forward(text, _cover(text, spans))


def sentence_splitter(code: str) -> Splitter:
    """`sentence_spans` for a run's language code (`splitter_language`), as a one-argument
    function for `data.pieces.fit`."""
    return partial(sentence_spans, language=splitter_language(code))


def _cover(text: str, spans: list[Span]) -> list[Span]:
    """`spans` widened so that only white space lies outside them: a character the library
    left out (it never should) joins the sentence before it, or the first one."""
    if not spans:
        return [_strip(text, 0, len(text))] if text.strip() else []
    out: list[Span] = []
    ends = [start for start, _ in spans[1:]] + [len(text)]
    for n, ((start, _), end) in enumerate(zip(spans, ends)):
        span = _strip(text, 0 if n == 0 else start, end)
        out.append(span)
    return out


def _openers_forward(text: str, spans: list[Span]) -> list[Span]:
    """Opening quotes and brackets at the end of a sentence moved to the next one."""
    out = list(spans)
    for n in range(len(out) - 1):
        start, end = out[n]
        moved = _OPENERS.search(text, start, end)
        if moved:
            opener = moved.start() + len(moved.group()) - len(moved.group().lstrip())
            out[n] = _strip(text, start, opener)
            out[n + 1] = (opener, out[n + 1][1])
    return out


def _strip(text: str, start: int, end: int) -> Span:
    """[start, end) less the white space at its ends."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
