"""The output language of a multilingual model: `--to LANG` on the command line, `"to"` in a
JSONL line or a `tf serve` request.

A multilingual model (a `tf` run whose corpora have more than one target language, or an
imported OPUS-MT model with several `>>xxx<<` tokens) reads the target language from a token
at the start of the source; `--to` puts it there. A line that already starts with one of the
model's target-language tokens is taken as it is; a line with neither is refused, naming the
languages, for the model would pick one at random.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from cli.config import Config
from data.config import with_directions
from data.errors import InputError
from data.tokenizer import Tokenizer


def with_languages(config: Config, tokenizer: Tokenizer) -> Config:
    """`config` with what its model translates recorded (`data.config.with_directions`: an
    older import's languages are its tokenizer's `>>xxx<<` pieces)."""
    return replace(config, data=with_directions(config.data, tokenizer.tags))


def check_to(to: str, languages: dict[str, str], config: Config, where: str) -> None:
    """`--to`/"to" names one of the model's target languages (a one-way model's own is
    accepted, and changes nothing).

    Raises:
        InputError: naming `where`, the language asked for and the model's nearest ones.
    """
    if not to:
        return
    targets = list(languages) or config.data.target_langs()
    if targets == ["tgt"]:  # an imported model whose card named no language: any is its own
        return
    if to not in targets:
        raise InputError(unknown(to, targets, where, "translates into"))


def check_from(frm: str, config: Config, where: str) -> None:
    """`--from`/"from" names a language the model reads.

    Raises:
        InputError: naming `where`, the language asked for and the model's nearest ones.
    """
    sources = config.data.source_langs()
    if frm and sources != ["src"] and frm not in sources:  # "src": a card that named none
        raise InputError(unknown(frm, sources, where, "reads"))


def unknown(lang: str, known: list[str], where: str, does: str) -> str:
    """One line: `lang` is none of `known`, with the nearest named (NLLB's 202 codes are too
    many to list: "fr" -> fra_Latn)."""
    if len(known) <= 12:
        return (
            f"{where}: the model {does} {', '.join(known)}"
            + (" only" if len(known) == 1 else "")
            + f", not {lang!r}"
        )
    near = difflib.get_close_matches(lang, known, n=3, cutoff=0.0)
    near = near or [k for k in known if k.lower().startswith(lang.lower()[:2])][:3]
    return (
        f"{where}: the model {does} {len(known)} languages, not {lang!r} (nearest: "
        f"{', '.join(near)}; `tf import` listed them all)"
    )


def with_language(
    text: str,
    lang: str,
    tokens: dict[str, str],
    where: str,
    stated: str = "",
    flag: str = "to",
) -> str:
    """`text` as the model reads it: a language's token first (the language to write, or
    where the source says its own, `flag` "from", the language it is in). A token the text
    starts with wins over `lang` (a default, --to/--from), but not over `stated`, the
    language the line itself named (its "to"/"from").

    Raises:
        InputError: a token needed, no language given and none in the line; a line whose
            token and "to"/"from" disagree.
    """
    if not tokens:
        return text
    # The token it starts with, a space after it or not: the tokenizer splits "<2es>hola" so.
    starts = [token for token in tokens.values() if text.lstrip().startswith(token)]
    first = max(starts, key=len, default="")
    if first and stated and first != tokens[stated]:
        raise InputError(f'{where}: "{flag}" asks for {stated}, but the text starts with {first}')
    if first or not text.strip():
        return text  # the line chose (or, blank, needs nothing)
    if lang:
        return f"{tokens[lang]} {text}"
    if flag == "from":
        raise InputError(
            f"{where}: the model reads the source's language from its first token: name it "
            f'with --from (or "from"), one of {short_list(tokens)}, or start the line with '
            "its token"
        )
    raise InputError(
        f"{where}: the model is multilingual: choose the output language with --to (or "
        f'"to"), one of {short_list(tokens)}, or start the line with its token '
        f"({short_list({t: t for t in tokens.values()})})"
    )


def short_list(tokens: dict[str, str]) -> str:
    """The keys of `tokens`, a dozen at most."""
    keys = list(tokens)
    return ", ".join(keys) if len(keys) <= 12 else f"{', '.join(keys[:12])}, ... ({len(keys)})"
