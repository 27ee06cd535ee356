"""The output language of a multilingual model: `--to LANG` on the command line, `"to"` in a
JSONL line or a `tf serve` request.

A multilingual model (a `tf` run whose corpora have more than one target language, or an
imported OPUS-MT model with several `>>xxx<<` tokens) reads the target language from a token
at the start of the source; `--to` puts it there. A line that already starts with one of the
model's target-language tokens is taken as it is; a line with neither is refused, naming the
languages, for the model would pick one at random.
"""

from __future__ import annotations

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
        InputError: naming `where`, the language asked for and those the model has.
    """
    if not to:
        return
    if languages:
        if to not in languages:
            raise InputError(
                f"{where}: the model translates into {', '.join(languages)}, not {to!r}"
            )
        return
    (target,) = config.data.target_langs()  # one-way: one target language
    if to != target and target != "tgt":  # "tgt": an imported model whose card named none
        raise InputError(f"{where}: the model translates into {target} only, not {to!r}")


def with_language(
    text: str, to: str, languages: dict[str, str], where: str, stated: str = ""
) -> str:
    """`text` as the model reads it: its target-language token first. A token the text starts
    with wins over `to` (a default, --to), but not over `stated`, the language the line
    itself asked for (its "to").

    Raises:
        InputError: a multilingual model, no language asked for and none in the line; a line
            whose token and "to" disagree.
    """
    if not languages:
        return text
    # The token it starts with, a space after it or not: the tokenizer splits "<2es>hola" so.
    starts = [token for token in languages.values() if text.lstrip().startswith(token)]
    first = max(starts, key=len, default="")
    if first and stated and first != languages[stated]:
        raise InputError(f'{where}: "to" asks for {stated}, but the text starts with {first}')
    if first or not text.strip():
        return text  # the line chose (or, blank, needs nothing)
    if to:
        return f"{languages[to]} {text}"
    raise InputError(
        f"{where}: the model is multilingual: choose the output language with --to (or "
        f'"to"), one of {", ".join(languages)}, or start the line with its token '
        f"({', '.join(languages.values())})"
    )
