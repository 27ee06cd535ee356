"""Languages a pretrained model lacks, added by fine-tuning (`data.new_languages` with
`tf train --init`): the token of each joins the run's copy of the tokenizer at the next id
(`data.added_tokens`), and the embeddings (the output layer's too, tied or not) grow by one row
each, started from a named language's row or the mean of the model's language rows. Every id
there was keeps its id and its row, bit for bit.

The new ids follow the tokenizer's last id, not the rows a model's config may count past it
(NLLB-200's 2 spare rows of 256,206): `tf import` left those out, so the embeddings have one
row per id, and the exports' `vocab_size` is the tokenizer's size again.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cli.config import Config, ConfigError
from cli.runs.checkpoint import check_trained_with
from cli.runs.models import build_model, load_weights
from data.added_tokens import check_addable
from data.config import DataConfig, NewLanguage, corpus_name, lang_token
from data.errors import InputError
from data.tokenizer import Tokenizer
from data.tokenizer_base import BaseTokenizer

# The weights with a row per id: the source side's, the target side's.
SRC_ROWS = ("src_embed.token.weight",)
TGT_ROWS = ("tgt_embed.token.weight", "generator.weight", "generator.bias")


def with_new_languages(d: DataConfig, tokenizer: BaseTokenizer, path: Path) -> DataConfig:
    """`d` with every token the run adds to `tokenizer` (the init's, of checkpoint `path`) in
    `new_languages`: those the user names, checked (`check_new_languages`), then those of the
    model's own languages it lacks (`with_tokens_it_lacks`); all of them addable to it.

    Raises:
        ConfigError: a new language refused, or a token the tokenizer cannot take
            (`check_addable`: a piece it has already, a kind that cannot grow).
    """
    if d.new_languages:
        check_new_languages(d, tokenizer, path)
    d = with_tokens_it_lacks(d, tokenizer)
    if d.new_languages:
        try:
            check_addable(tokenizer, d.new_tokens())
        except InputError as e:
            raise ConfigError(str(e)) from None
    return d


def check_new_languages(d: DataConfig, tokenizer: BaseTokenizer, path: Path) -> None:
    """Each new language the user names is new, trained, and starts from a row the model has
    (whether its token can join the tokenizer: `with_new_languages`, once every token to add
    is listed).

    Args:
        d: the run's data section, with `train.init`'s languages recorded (`init_languages`).
        tokenizer: the init's tokenizer; path: the init's checkpoint (named in messages).

    Raises:
        ConfigError: a language no training corpus reads or writes, a source language of a
            model whose sources carry no token of their own (it needs none), a row to copy
            that is no language token of the model, a language twice.
    """
    langs = [n.lang for n in d.new_languages]
    trained = {lang for c in d.corpora() for lang in d.direction(c)}
    known = row_ids(d, tokenizer)
    for i, n in enumerate(d.new_languages):
        where = f"data.new_languages[{i}]"
        if langs.count(n.lang) > 1:
            raise ConfigError(f"{where}: {n.lang} is listed twice")
        if n.lang not in trained:
            names = ", ".join(corpus_name(d, j) for j in range(len(d.corpora())))
            raise ConfigError(
                f"{where}: no training corpus reads or writes {n.lang} ({names}): a new "
                "language's row learns from its corpora"
            )
        if d.lang_token_side == "source" and n.lang not in d.target_langs():
            raise ConfigError(
                f"{where}: {n.lang} is only read, and train.init {path} puts no token of a "
                "source's own language before it (data.lang_token_side: source): a new source "
                f"language needs none; drop it from data.new_languages (reading {n.lang} is "
                "transfer, as any corpus of another source language)"
            )
        if n.init != "mean" and not known:
            raise ConfigError(
                f"{where}.init {n.init!r}: train.init {path} has no language tokens (a one-way "
                "model), so no language row to copy: leave init out (the new row starts from "
                "the mean of all its rows)"
            )
        if n.init != "mean" and n.init not in known:
            listed = ", ".join(list(known)[:12]) + (", ..." if len(known) > 12 else "")
            raise ConfigError(
                f"{where}.init {n.init!r}: no language token of train.init {path} (whose row "
                f"would start the new one's): name one of {listed}, or mean"
            )


def with_tokens_it_lacks(d: DataConfig, tokenizer: BaseTokenizer) -> DataConfig:
    """`d` with each language of the model whose token the run puts and `tokenizer` (the
    init's) lacks first in `new_languages`, its row the mean's: a one-way model, whose
    sources need no token, given a second target language gains a token for its old target
    as for the new one (a run's languages have a token each, or none has)."""
    new = {n.lang for n in d.new_languages}
    tokens = {**d.lang_tokens(), **d.source_tokens()}
    lacking = [lang for lang, t in tokens.items() if lang not in new and t not in tokenizer.tags]
    if not lacking:
        return d
    return replace(d, new_languages=[*map(NewLanguage, lacking), *d.new_languages])


def row_ids(d: DataConfig, tokenizer: BaseTokenizer) -> dict[str, int]:
    """{language: the id of its token} of the model's languages that have a token (the
    tokenizer's tags in the run's form), the new ones left out."""
    new = {n.lang for n in d.new_languages}
    langs = [*d.target_langs(), *d.source_langs()]
    tokens = {lang: lang_token(d.lang_token, lang) for lang in langs if lang not in new}
    return {lang: tokenizer.tags[t] for lang, t in tokens.items() if t in tokenizer.tags}


def starting_rows(d: DataConfig, tokenizer: BaseTokenizer) -> list[list[int]]:
    """For each new language, the ids of the init's rows whose mean starts its row: one id for
    a named language; for "mean" every language token's, or where the model has none (a
    one-way model) every id's, as transformers' `resize_token_embeddings` starts new rows."""
    known = row_ids(d, tokenizer)
    mean = sorted(known.values()) or list(range(tokenizer.src_vocab_size))
    return [mean if n.init == "mean" else [known[n.init]] for n in d.new_languages]


def grow_rows(weights: dict[str, Tensor], rows: list[list[int]], sides: dict[str, int]) -> dict:
    """`weights` (a state dict) with one row per new language after the rows of each weight
    of `SRC_ROWS` and `TGT_ROWS` that has `sides[side]` rows less than wanted, each the mean
    of its rows `rows[i]`; every other tensor as it is (no copy).

    Args:
        sides: {"src": rows the model's source side wants, "tgt": the target side's}.
    """
    grown = dict(weights)
    for side, names in (("src", SRC_ROWS), ("tgt", TGT_ROWS)):
        for name in names:
            old = weights.get(name)
            if old is None or old.size(0) == sides[side]:
                continue  # absent (no output bias), or a side the new tokens do not reach
            extra = torch.stack([old[ids].float().mean(0).to(old.dtype) for ids in rows])
            grown[name] = torch.cat([old, extra])  # (V + k, ...)
    return grown


def grown_init(
    ckpt: dict[str, Any], path: Path, config: Config, tokenizer: BaseTokenizer
) -> dict[str, Any]:
    """Checkpoint `path`'s dict with its weights (an adapted one's merged) grown to the run's
    `tokenizer`: the init's tokenizer (`data.tokenizer`, which `with_init` set) and the new
    languages' tokens after it.

    Raises:
        CheckpointError: the checkpoint was trained with another tokenizer than the init's.
    """
    init_tokenizer = Tokenizer.load(config.data.tokenizer)
    check_trained_with(ckpt, path, init_tokenizer, init_tokenizer.directory)
    weights = ckpt["model"]
    if "base" in ckpt:  # a LoRA run's: base and adapters merged, in a model of its own shape
        model = build_model(config, init_tokenizer)
        load_weights(model, ckpt, path)
        weights = model.state_dict()
    rows = starting_rows(config.data, init_tokenizer)
    sizes = {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size}
    plain = {k: v for k, v in ckpt.items() if k != "base"}
    return plain | {"model": grow_rows(weights, rows, sizes)}


def first_new_rows(model: torch.nn.Module, tokenizer: BaseTokenizer, d: DataConfig) -> dict:
    """{parameter name: its first new row} of the weights the new languages grew (LoRA's
    `embeddings_of_new_languages` trains those rows alone): the source side's, and the target
    side's where it is the same vocabulary (a language token is a source piece)."""
    k = len(d.new_languages)
    names = [*SRC_ROWS, *(TGT_ROWS if tokenizer.joint else ())]
    params = dict(model.named_parameters(remove_duplicate=False))
    return {name: params[name].size(0) - k for name in names if k and name in params}
