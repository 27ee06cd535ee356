"""What a user asks of one sentence beyond its text: a target prefix (the translation starts
with it), terminology constraints (each phrase appears in it) and, of a multilingual model,
the output language (and the source's, where the model reads it), as `tf translate
--input-format jsonl` reads them, one object a line,

    {"text": "El perro come.", "prefix": "The dog", "constraints": ["eats"], "to": "en"}

and `tf serve` per sentence. Here they are checked and turned into piece ids (`Guide`); the
languages a line names are checked where the engine reads them, by the check of --to and
--from (`cli.inference.languages.check_languages`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from data.errors import InputError
from data.text import nul_problem
from data.tokenizer import Tokenizer

FIELDS = ("text", "prefix", "constraints", "to", "from")


@dataclass(frozen=True)
class Request:
    text: str
    prefix: str = ""
    constraints: tuple[str, ...] = ()
    to: str = ""  # the output language of a multilingual model (--to for this line)
    frm: str = ""  # the language the text is in, where the model reads it (--from for this line)


@dataclass(frozen=True)
class Guide:
    """A request's prefix and constraints as target piece ids, after `forced`: the target
    language's token a model writes first (`data.lang_token_side: target`), certain."""

    prefix: tuple[int, ...] = ()
    constraints: tuple[tuple[int, ...], ...] = ()
    forced: tuple[int, ...] = ()


def request_of(item: object, where: str) -> Request:
    """A Request from a JSON value (a string is the text alone); ValueError saying what is wrong,
    with `where` (e.g. "text[2]") naming the item."""
    if isinstance(item, str):
        return Request(_text(item, where))
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be a string or an object, got {type(item).__name__}")
    unknown = sorted(set(item) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}: only {', '.join(FIELDS)}")
    if not isinstance(item.get("text"), str):
        raise ValueError(f'{where}: "text" must be a string')
    prefix = item.get("prefix", "")
    if not isinstance(prefix, str):
        raise ValueError(f'{where}: "prefix" must be a string, got {type(prefix).__name__}')
    constraints = item.get("constraints", [])
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise ValueError(f'{where}: "constraints" must be a list of strings')
    langs = {key: item.get(key, "") for key in ("to", "from")}
    for key, lang in langs.items():
        if not isinstance(lang, str):
            raise ValueError(f'{where}: "{key}" must be a language code, got {type(lang).__name__}')
    return Request(
        _text(item["text"], f"{where}.text"),
        _text(prefix, f"{where}.prefix"),
        tuple(_text(c, f"{where}.constraints") for c in constraints),
        langs["to"].strip(),
        langs["from"].strip(),
    )


def _text(text: str, where: str) -> str:
    """One line of text (`check_text`): its white space collapsed."""
    return " ".join(check_text(text, where).split())


def check_text(text: str, where: str) -> str:
    """`text` as it is, or ValueError naming `where`: a lone surrogate (JSON's "\\ud800") is
    refused, for no tokenizer takes it (nor UTF-8 writes it back), and a NUL (JSON's
    "\\u0000"), as every reader of text does. A line's, or a whole document's (`tf serve`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: a lone surrogate at character {e.start}") from None
    if "\0" in text:
        raise ValueError(nul_problem(where))
    return text


def read_requests(lines: Iterable[str], source: str) -> Iterator[Request]:
    """`tf translate --input-format jsonl`: one JSON object (or string) a line."""
    for number, line in enumerate(lines, start=1):
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise InputError(f"{source}:{number}: not a JSON object ({e})") from None
        except ValueError:  # Python reads no integer of over 4,300 digits (as `tf serve` says)
            raise InputError(f"{source}:{number}: a number too long to read") from None
        try:
            yield request_of(item, f"{source}:{number}")
        except ValueError as e:
            raise InputError(str(e)) from None


def encode_guide(
    tokenizer: Tokenizer,
    request: Request,
    src_len: int,
    max_len: int,
    where: str,
    constraints_ok: bool = True,
) -> Guide | None:
    """The request's Guide (None when it asks nothing), checked: a source to translate, the
    prefix and every constraint spelled by known pieces, and the prefix and constraints within
    the output's length limit `max_len`.

    A prefix or constraints on an empty source (`src_len` 0 pieces) are refused rather than
    decoded or ignored: there is nothing to translate (training never shows the model an empty
    source: cleaning drops them, and its encoder would attend over no token at all) and an empty
    line's translation is empty on every engine, so the request could only be dropped silently.

    Raises:
        InputError: naming `where` (the line) and what is wrong.
    """
    if not request.prefix and not request.constraints:
        return None
    if src_len == 0:
        raise InputError(
            f"{where}: a prefix or constraints, but no text to translate (an empty line's "
            "translation is empty)"
        )
    if request.constraints and not constraints_ok:
        raise InputError(
            f"{where}: CTranslate2 has no lexical constraints; translate with the run itself"
        )
    for what, text in [
        ("prefix", request.prefix),
        *(("constraint", c) for c in request.constraints),
    ]:
        reserved = [tag for tag in tokenizer.tags if tag in text]
        if reserved:  # the piece would be copied into the translation as it is
            raise InputError(
                f"{where}: the {what} {text!r} holds {reserved[0]}, a reserved piece (a tag or "
                "target-language token) that no translation holds"
            )
    prefix, *phrases = tokenizer.encode_tgt([request.prefix, *request.constraints])
    if tokenizer.unk_id in prefix:  # it would come out as " ⁇ "
        raise InputError(f"{where}: the prefix {request.prefix!r} has pieces the tokenizer lacks")
    for text, ids in zip(request.constraints, phrases):
        if not ids:
            raise InputError(f"{where}: an empty constraint")
        if tokenizer.unk_id in ids:
            raise InputError(f"{where}: the constraint {text!r} has pieces the tokenizer lacks")
    needed = len(prefix) + sum(map(len, phrases))
    if needed > max_len:
        raise InputError(
            f"{where}: the prefix and constraints take {needed} pieces, over this line's "
            f"length limit of {max_len} (decode.max_len_a x source length + decode.max_len_b)"
        )
    return Guide(tuple(prefix), tuple(tuple(ids) for ids in phrases))
