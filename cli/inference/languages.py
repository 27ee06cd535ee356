"""The languages of a line: the output language of a multilingual model (`--to LANG` on the
command line, `"to"` in a JSONL line or a `tf serve` request) and, where the model reads it, the
source's (`--from`, `"from"`).

A multilingual model (a `tf` run whose corpora have more than one target language, or an
imported OPUS-MT model with several `>>xxx<<` tokens) reads the target language from a token
at the start of the source; `--to` puts it there. A line that already starts with one of the
model's target-language tokens is taken as it is. A line with neither is written into the
model's default output language where it records one (`default_target`: an imported NLLB-200's
`tgt_lang`), said once on stderr, else refused, naming the languages: the model would pick one
at random, and the first of a list is no one's choice.

Every language asked for, on the command line, in a request's body or in a line, passes one
check (`check_languages`): a line's "from" is held to what `--from` is.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from cli.config import Config
from data.config import DataConfig, with_directions
from data.errors import InputError
from data.tokenizer import Tokenizer


def with_languages(config: Config, tokenizer: Tokenizer) -> Config:
    """`config` with what its model translates recorded (`data.config.with_directions`: an
    older import's languages are its tokenizer's `>>xxx<<` pieces)."""
    return replace(config, data=with_directions(config.data, tokenizer.tags))


def default_target(d: DataConfig) -> str:
    """The language a model writes where nothing names one (--to, a line's "to" or token): the
    one it writes (a one-way model's), or a many-to-many model's recorded default,
    `data.tgt_lang` (`tf import` records tokenizer_config.json's `tgt_lang`, else the one
    transformers' tokenizer defaults to; a fine-tune keeps it unless its config names its
    own); "" for none, where --to must say. A model trained here into several languages has
    none: its `data.tgt_lang` only names the files of corpora that name no language (es<->en
    has no default direction), and no list's first entry is a choice."""
    targets = d.target_langs()
    if len(targets) == 1:
        return targets[0]
    return d.tgt_lang if d.languages and d.tgt_lang in targets else ""


def check_languages(
    to: str, frm: str, languages: dict[str, str], config: Config, where: tuple[str, str]
) -> None:
    """The one check of the languages asked for, wherever they are asked: --to and --from, a
    `tf serve` body's "to" and "from", a line's (JSONL, a request's item): `to` a language the
    model writes (`check_to`), `frm` one it reads (`check_from`), each named in errors as
    `where` says (("--to", "--from"), ('"to"', '"from"'), a line's place twice).

    Raises:
        InputError: naming where, the language asked for and the model's nearest ones.
    """
    check_to(to, languages, config, where[0])
    check_from(frm, config, where[1])


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
    raise InputError(needs_to(where, tokens, typed=True))


def needs_to(where: str, tokens: dict[str, str], line: bool = True, typed: bool = False) -> str:
    """The one line asking for the output language of a model that records no default: for
    a line (`line`: its "to" will do too; `typed`: so will its token, a model of source-side
    tokens'), or for a command (`where`) that writes a corpus."""
    flags = '--to (or "to")' if line else "--to"
    asked = (
        f"{where}: the model is multilingual and records no default output language: choose "
        f"it with {flags}, one of {short_list(tokens)}"
    )
    if not typed:
        return asked
    typed_tokens = short_list({t: t for t in tokens.values()})
    return f"{asked}, or start the line with its token ({typed_tokens})"


def short_list(tokens: dict[str, str]) -> str:
    """The keys of `tokens`, a dozen at most."""
    keys = list(tokens)
    return ", ".join(keys) if len(keys) <= 12 else f"{', '.join(keys[:12])}, ... ({len(keys)})"
