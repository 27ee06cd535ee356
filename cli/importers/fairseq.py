"""NLLB-200, M2M100 and mBART-50, the many-language models fairseq trained, as `tf` runs: what
their imports share (`cli.importers.m2m100` and `cli.importers.mbart` say what differs).

Each is a Pre-LN Transformer whose decoder starts from EOS, with the switches of its
model_type (`model.m2m100.LAYOUT`, `model.mbart.LAYOUT`) and config.json's widths, dropouts,
LayerDrop, activation and embedding scale. Its tokenizer (`data.fairseq`) frames a source as
`[code] X </s>`, its language's code first, and the decoder writes the target language's code
first (transformers' `forced_bos_token_id`): the run reads and writes any of its languages
(`data.languages`, `lang_token_side: target`), chosen per line with --from and --to.

config.json's vocabulary may be larger than the tokenizer's (NLLB-200: 256,206 rows for
256,204 ids; M2M100: 128,112 for 128,104: fairseq padded its dictionary with words it never
wrote): those rows no id names, and the run leaves them out. Fewer rows than ids is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cli.config import TF_CONFIG, Config
from cli.importers.generation import read_generation
from cli.importers.plan import Plan, checked, exported_run, few
from cli.importers.source import check_values, model_values, with_defaults
from data.config import DataConfig
from data.errors import InputError
from data.fairseq import (
    CARRIED,
    FAMILIES,
    HF_CONFIG,
    SETTINGS,
    SPM,
    TOKENIZER_JSON,
    VOCAB,
    FairseqTokenizer,
    family_of,
)
from data.fairseq import Family as TokenizerFamily
from data.files import read_json_object
from data.tokenizer import Tokenizer
from model.transformer import ModelConfig, Transformer

# What a hub download fetches besides config.json, the weights and the generation settings.
FILES = (SPM, TOKENIZER_JSON, VOCAB, HF_CONFIG, *CARRIED, SETTINGS)
RATES = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "encoder_layerdrop",
    "decoder_layerdrop",
)
FLAGS = ("scale_embedding", "tie_word_embeddings")
# The languages transformers' tokenizers read a source in and write (their `src_lang`
# default, `prepare_seq2seq_batch`'s `tgt_lang`) where tokenizer_config.json names none:
# the run's `data.src_lang` and `data.tgt_lang`.
DEFAULT_LANGUAGES = {
    "nllb": ("eng_Latn", "fra_Latn"),
    "m2m100": ("en", "ro"),
    "mbart50": ("en_XX", "ro_RO"),
}


@dataclass(frozen=True)
class Layout:
    """What one model_type fixes.

    Attributes:
        config_class: transformers' config class, whose defaults fill config.json's silences.
        switches: `ModelConfig`'s switches of every such model (`model/`'s LAYOUT).
        names: the weight-name table (`model/`): the tensors its files hold for a model.
        tokenizers: the tokenizer families its models come with.
        position_offset: the position table's first row, of config.json's values.
    """

    config_class: str
    switches: dict[str, Any]
    names: Callable[[Transformer], dict[str, torch.Tensor]]
    tokenizers: tuple[TokenizerFamily, ...]
    position_offset: Callable[[dict[str, Any]], int]


def fairseq_plan(directory: Path, hf: dict[str, Any], source: str, layout: Layout) -> Plan:
    """What `tf import` makes of such a model's files (see the module docstring)."""
    hf = with_defaults(hf, layout.config_class)
    where = directory / "config.json"
    check_values(hf, where, RATES, FLAGS)
    if (directory / TF_CONFIG).is_file():  # a `tf export`: the run it came from, exactly
        config, tokenizer, order, hf = exported_run(directory, hf)
        check_vocabulary(hf, tokenizer, where)
        index = torch.argsort(torch.tensor(order))
        return Plan(config, tokenizer, layout.names, (hf["vocab_size"],) * 2, index=index)
    tokenizer = read_tokenizer(directory, hf, layout)
    check_vocabulary(hf, tokenizer, where)
    model = model_config(hf, layout, where)
    eos = tokenizer.eos_id
    generation = read_generation(directory, eos, eos, tokenizer.tgt_pieces([eos])[0])
    data = data_config(tokenizer, directory, model.max_positions)
    config = checked(Config(data=data, model=model, decode=generation.decode), directory)
    left_out = hf["vocab_size"] - tokenizer.tgt_vocab_size
    return Plan(
        config=config,
        tokenizer=tokenizer,
        names=layout.names,
        vocab_rows=(hf["vocab_size"],) * 2,
        generation=generation,
        notes=notes(data, hf["vocab_size"], left_out, tokenizer),
        record={"languages": data.languages, "rows_left_out": left_out},
    )


def read_tokenizer(directory: Path, hf: dict[str, Any], layout: Layout) -> FairseqTokenizer:
    """The model's tokenizer, of a family its model_type comes with."""
    family = tokenizer_family(directory, hf)
    classes = " or ".join(c for f in layout.tokenizers for c in f.classes[:1])
    if family is None:
        raise InputError(
            f"{directory / HF_CONFIG}: missing, or names no tokenizer_class tf reads for a "
            f"{hf['model_type']} model ({classes}), nor does config.json"
        )
    if family not in layout.tokenizers:
        raise InputError(
            f"{directory / HF_CONFIG}: an {family.title} tokenizer beside a {hf['model_type']} "
            f"model, whose tokenizer is {classes}"
        )
    return FairseqTokenizer(directory, family)


def tokenizer_family(directory: Path, hf: dict[str, Any]) -> TokenizerFamily | None:
    """The tokenizer's family: tf_tokenizer.json's (a `tf` export's), else the one
    tokenizer_config.json's tokenizer_class names, else config.json's; None where none does."""
    if (directory / SETTINGS).is_file():
        return family_of(directory)
    named = read_json_object(directory / HF_CONFIG, default={}).get("tokenizer_class")
    named = named or hf.get("tokenizer_class")
    return next((f for f in FAMILIES.values() if named in f.classes), None)


def check_vocabulary(hf: dict[str, Any], tokenizer: Tokenizer, where: Path) -> None:
    """The tokenizer against config.json: a row of the embeddings for every id, the special
    ids, the decoder's start (the EOS)."""
    size, rows = tokenizer.tgt_vocab_size, hf["vocab_size"]
    if rows < size:
        raise InputError(
            f"{where}: vocab_size {rows} is less than the tokenizer's {size} ids "
            f"({tokenizer.directory}): the embeddings have no row for ids {rows} to {size - 1}"
        )
    for key, ours, piece in (
        ("pad_token_id", tokenizer.pad_id, "<pad>"),
        ("eos_token_id", tokenizer.eos_id, "</s>"),
        ("decoder_start_token_id", tokenizer.eos_id, "</s>, where these decoders start"),
    ):
        if hf[key] != ours:
            raise InputError(f"{where}: {key} {hf[key]} is not the tokenizer's {ours} ({piece})")


def model_config(hf: dict[str, Any], layout: Layout, where: Path) -> ModelConfig:
    """tf's ModelConfig of the model: the model_type's switches, config.json's values."""
    if not hf["tie_word_embeddings"]:
        raise InputError(
            f"{where}: tie_word_embeddings false: an output layer of its own, where tf ties "
            "it to the embeddings these models share (model.tie_embeddings all)"
        )
    switches = dict(layout.switches, position_offset=layout.position_offset(hf))
    return ModelConfig(
        **model_values(hf, where),
        scale_embedding=hf["scale_embedding"],
        encoder_layerdrop=float(hf["encoder_layerdrop"]),
        decoder_layerdrop=float(hf["decoder_layerdrop"]),
        **switches,
    )


def data_config(tokenizer: FairseqTokenizer, directory: Path, max_positions: int) -> DataConfig:
    """The run's languages: every language of the tokenizer, any into any, each its code
    (`lang_token`), the source's first and the target's forced first; the default source
    and target (tokenizer_config.json's `src_lang` and `tgt_lang`, else transformers')."""
    languages = list(tokenizer.languages)
    if not languages:
        raise InputError(f"{tokenizer.directory}: the tokenizer has no language codes")
    default_src, default_tgt = DEFAULT_LANGUAGES[tokenizer.family.kind]
    named = read_json_object(directory / HF_CONFIG, default={}).get("tgt_lang")
    src = next((x for x in (tokenizer.src_lang, default_src) if x in languages), languages[0])
    others = [lang for lang in languages if lang != src] or languages
    tgt = next((x for x in (named, default_tgt) if x in others), others[0])
    return DataConfig(  # a model alone: no corpus of tf's trained it (fine-tuning names some)
        train=[],
        dev="",
        test="",
        src_lang=src,
        tgt_lang=tgt,
        languages=languages,
        lang_token=tokenizer.family.lang_token,
        lang_token_side="target",
        max_len=min(DataConfig.max_len, max_positions - 1),
    )


def notes(data: DataConfig, rows: int, left_out: int, tokenizer: Tokenizer) -> list[str]:
    """The report's lines: the languages (a few, and how to choose them), the rows left out."""
    lines = [
        f"languages ({len(data.languages)}), any into any: {few(data.languages)}; choose them "
        f"per line with --from and --to (tf translate RUN --from {data.src_lang} --to "
        f"{data.tgt_lang}), else {data.src_lang} is the source"
    ]
    if left_out:
        lines.append(
            f"config.json's vocab_size {rows}: {left_out} row(s) of the embeddings past the "
            f"tokenizer's {tokenizer.tgt_vocab_size} ids, which no id names, left out"
        )
    return lines
