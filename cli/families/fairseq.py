"""NLLB-200, M2M100 and mBART-50, the many-language models fairseq trained: what their records
share (`cli.families.m2m100` and `cli.families.mbart` say what differs), the import and the
Hugging Face export.

Import. Each is a Pre-LN Transformer whose decoder starts from EOS, with the switches of its
model_type (the record's: `model.m2m100.LAYOUT`, `model.mbart.LAYOUT`) and config.json's
widths, dropouts, LayerDrop, activation and embedding scale. Its tokenizer (`data.fairseq`)
frames a source as `[code] X </s>`, its language's code first, and the decoder writes the
target language's code first (transformers' `forced_bos_token_id`): the run reads and writes
any of its languages (`data.languages`, `lang_token_side: target`), chosen per line with
--from and --to. config.json's vocabulary may be larger than the tokenizer's (NLLB-200:
256,206 rows for 256,204 ids; M2M100: 128,112 for 128,104: fairseq padded its dictionary with
words it never wrote): those rows no id names, and the run leaves them out. Fewer rows than ids
is an error.

Export. A `tf` model of their layout is written as the class that runs it, loaded as any
translation model is (`AutoTokenizer`, `AutoModelForSeq2SeqLM`, `generate`): Pre-LN
(`norm_first`) with fairseq's sinusoids from pad_token_id + 1 (`M2M100ForConditionalGeneration`,
NLLB-200's and M2M100's), or with learned positions from row 2 and a norm on the embeddings
(`MBartForConditionalGeneration`, mBART-50's, whose `final_logits_bias` holds
`model.output_bias`, zeros without one); one vocabulary and tied embeddings
(`tie_embeddings: all`). What the class cannot hold is refused in one line (`check_exportable`).
The weights move by the record's name table: its whole state dict, loaded strictly into the
class built on the meta device (no random initialisation of a 600M-parameter model, no second
copy of it). `config.json` is the class's: the widths, the activation, `scale_embedding`,
`max_position_embeddings`, the special ids, the decoder's start (`decoder_start_token_id`: EOS,
2, for all three families), the tokenizer's class (which CTranslate2's converter reads:
mBART-50's decoder starts from EOS, mBART-25's from the code). `generation_config.json` is tf's
greedy search and length limit (`cli.exporters.huggingface.generation_config`), with no
`forced_bos_token_id`: the target language is the caller's,
`generate(**batch, forced_bos_token_id=tokenizer.convert_tokens_to_ids(code))` per call, as the
published models are run. The tokenizer files are the run's own, as the original model had
them (`cli.exporters.huggingface.write_tokenizer_files`); beside them, the run's config
(`tf_config.yaml`), for `tf import` of the directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cli.config import TF_CONFIG, Config
from cli.exporters.huggingface import (
    check_shipped,
    generation_config,
    layer_settings,
    write_tokenizer_files,
)
from cli.exporters.published import save_published_config
from cli.families.family import Family
from cli.importers.generation import read_generation
from cli.importers.plan import Plan, checked, exported_run, few, index_of
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
    TokenizerFamily,
    family_of,
)
from data.files import read_json_object
from data.tokenizer_base import BaseTokenizer
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
# The tokenizers an export of either class ships as their own files: any of the three kinds'.
SHIPPED = tuple(family.classes[0] for family in FAMILIES.values())


def tokenizer_classes(*families: TokenizerFamily) -> tuple[str, ...]:
    """A record's `tokenizer_classes`: each tokenizer family's class (as `hf_class` names it)."""
    return tuple(family.classes[0] for family in families)


# ------------------------------------------------------------------------------- the import


def fairseq_plan(directory: Path, hf: dict[str, Any], source: str, family: Family) -> Plan:
    """What `tf import` makes of such a model's files (see the module docstring)."""
    hf = with_defaults(hf, family.config_class)
    where = directory / "config.json"
    check_values(hf, where, RATES, FLAGS)
    if (directory / TF_CONFIG).is_file():  # a `tf export`: the run it came from, exactly
        config, tokenizer, order, hf = exported_run(directory, hf)
        check_vocabulary(hf, tokenizer, where)
        rows = (hf["vocab_size"],) * 2
        return Plan(config, tokenizer, family.names, rows, index=index_of(order))
    tokenizer = read_tokenizer(directory, hf, family)
    check_vocabulary(hf, tokenizer, where)
    model = model_config(hf, family, where)
    eos = tokenizer.eos_id
    generation = read_generation(directory, eos, eos, tokenizer.tgt_pieces([eos])[0])
    data = data_config(tokenizer, directory, model.max_positions)
    config = checked(Config(data=data, model=model, decode=generation.decode), directory)
    left_out = hf["vocab_size"] - tokenizer.tgt_vocab_size
    return Plan(
        config=config,
        tokenizer=tokenizer,
        names=family.names,
        vocab_rows=(hf["vocab_size"],) * 2,
        generation=generation,
        notes=notes(data, hf["vocab_size"], left_out, tokenizer),
        record={"languages": data.languages, "rows_left_out": left_out},
    )


def read_tokenizer(directory: Path, hf: dict[str, Any], family: Family) -> FairseqTokenizer:
    """The model's tokenizer, of a tokenizer family its model_type comes with."""
    tokenizer_family = tokenizer_family_of(directory, hf)
    classes = " or ".join(family.tokenizer_classes)
    if tokenizer_family is None:
        raise InputError(
            f"{directory / HF_CONFIG}: missing, or names no tokenizer_class tf reads for a "
            f"{hf['model_type']} model ({classes}), nor does config.json"
        )
    if tokenizer_family.classes[0] not in family.tokenizer_classes:
        raise InputError(
            f"{directory / HF_CONFIG}: an {tokenizer_family.title} tokenizer beside a "
            f"{hf['model_type']} model, whose tokenizer is {classes}"
        )
    return FairseqTokenizer(directory, tokenizer_family)


def tokenizer_family_of(directory: Path, hf: dict[str, Any]) -> TokenizerFamily | None:
    """The tokenizer's family: tf_tokenizer.json's (a `tf` export's), else the one
    tokenizer_config.json's tokenizer_class names, else config.json's; None where none does."""
    if (directory / SETTINGS).is_file():
        return family_of(directory)
    named = read_json_object(directory / HF_CONFIG, default={}).get("tokenizer_class")
    named = named or hf.get("tokenizer_class")
    return next((f for f in FAMILIES.values() if named in f.classes), None)


def check_vocabulary(hf: dict[str, Any], tokenizer: BaseTokenizer, where: Path) -> None:
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


def model_config(hf: dict[str, Any], family: Family, where: Path) -> ModelConfig:
    """tf's ModelConfig of the model: the family's switches, config.json's values."""
    if not hf["tie_word_embeddings"]:
        raise InputError(
            f"{where}: tie_word_embeddings false: an output layer of its own, where tf ties "
            "it to the embeddings these models share (model.tie_embeddings all)"
        )
    offset = family.position_offset(hf["pad_token_id"])
    return ModelConfig(
        **model_values(hf, where),
        scale_embedding=hf["scale_embedding"],
        encoder_layerdrop=float(hf["encoder_layerdrop"]),
        decoder_layerdrop=float(hf["decoder_layerdrop"]),
        **dict(family.switches, position_offset=offset),
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


def notes(data: DataConfig, rows: int, left_out: int, tokenizer: BaseTokenizer) -> list[str]:
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


# ------------------------------------------------------------------------------- the export


def check_exportable(family: Family, c: ModelConfig, tokenizer: BaseTokenizer) -> None:
    """What `family`'s class cannot hold, as one line naming the settings."""
    pad = tokenizer.pad_id
    wanted = {
        "position_offset": family.position_offset(pad),
        "layernorm_embedding": family.switches["layernorm_embedding"],
        # one `shared` matrix: both embeddings and the output layer
        "tie_embeddings": family.switches["tie_embeddings"],
        "norm_eps": 1e-5,
    }
    if not family.switches["output_bias"]:  # a class without `final_logits_bias`
        wanted["output_bias"] = False
    wrong = [f"model.{k} {getattr(c, k)!r}" for k, v in wanted.items() if getattr(c, k) != v]
    asked = [f"model.{k} {v!r}" for k, v in wanted.items()] + ["heads that span d_model"]
    if c.d_head and c.d_head * c.n_heads != c.d_model:
        wrong.append(f"model.d_head {c.d_head} (pruned heads)")
    if family.switches["positions"] == "fairseq":
        # M2M100 numbers the decoder's positions by its tokens other than pad: from a pad start
        # every position one below tf's (whose fairseq sinusoids skip pad's own only).
        asked.append("a decoder that starts from another token than pad")
        if tokenizer.decoder_start_id(c.decoder_start) == pad:
            wrong.append(f"model.decoder_start {c.decoder_start!r} (pad)")
    if wrong:
        raise InputError(
            f"{family.model_class} takes {', '.join(asked)}: this model has {', '.join(wrong)}"
        )


def export_pre_ln(
    family: Family,
    model: Transformer,
    tokenizer: BaseTokenizer,
    config: Config,
    out: Path,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write `model` as a `family` directory `out` (which exists), with its tokenizer: what
    `AutoModelForSeq2SeqLM` and `AutoTokenizer` load (the model card is the caller's).
    `extra`: config.json's keys beyond the class's own, as the published models carry them."""
    import transformers
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": one shard, no news
    c = model.config
    check_exportable(family, c, tokenizer)
    check_shipped(tokenizer, family.model_class, SHIPPED)
    special = special_ids(model, tokenizer)
    settings = hf_settings(c, model.generator.weight.size(0), special, tokenizer)
    settings.update(extra or {})
    hf_config = getattr(transformers, family.config_class)(**settings)
    with torch.device("meta"):  # no weights of its own: ours are assigned
        hf = getattr(transformers, family.model_class)(hf_config)
    hf.load_state_dict(family.names(model), strict=True, assign=True)
    hf.tie_weights()  # `shared`, both embeddings and `lm_head`: one matrix, saved once
    hf.generation_config = generation_config(special, config.decode, c)
    # (M2M100's sinusoids stay on the meta device: a buffer computed from the config, never
    # saved, which `from_pretrained` computes again.)
    hf.save_pretrained(out, safe_serialization=True)
    write_tokenizer_files(tokenizer, out, config)
    save_published_config(config, out)


def special_ids(model: Transformer, tokenizer: BaseTokenizer) -> dict[str, int]:
    """The special ids of the configs: the tokenizer's (fairseq's <s> <pad> </s> at 0-2 in all
    three families' tokenizers), the EOS forced at the length limit as tf's search does, and
    the decoder's start (`model.decoder_start`)."""
    bos = tokenizer.eos_id if tokenizer.bos_id is None else tokenizer.bos_id
    return dict(
        pad_token_id=tokenizer.pad_id,
        bos_token_id=bos,
        eos_token_id=tokenizer.eos_id,
        forced_eos_token_id=tokenizer.eos_id,
        decoder_start_token_id=tokenizer.decoder_start_id(model.config.decoder_start),
    )


def hf_settings(
    c: ModelConfig, vocab_size: int, special: dict[str, int], tokenizer: BaseTokenizer
) -> dict:
    """config.json's settings for a model of `c` with `vocab_size` rows (the embeddings', which
    may number more than the tokenizer's pieces: NLLB-200's 256,206 against 256,204)."""
    ids = {k: v for k, v in special.items() if k != "forced_eos_token_id"}  # generation's
    return dict(
        vocab_size=vocab_size,
        **layer_settings(c),
        scale_embedding=c.scale_embedding,
        encoder_layerdrop=c.encoder_layerdrop,
        decoder_layerdrop=c.decoder_layerdrop,
        tie_word_embeddings=True,
        # The class that reads the tokenizer's files: its own kind's, or tf's fast tokenizer.
        tokenizer_class=tokenizer.hf_class or "PreTrainedTokenizerFast",
        **ids,
    )


# CTranslate2's converter: its M2M100 loader starts the decoder where config.json says, its
# mBART loader from EOS (`cli.families.mbart.converter_problem`).
CONVERTER = (
    "`ct2-transformers-converter --model THIS_DIRECTORY --output_dir ct2` converts it "
    "exactly, as it converts the published models of its class; give the target "
    "language's token as the target prefix (`translate_batch(sources, "
    "target_prefix=[[token]] * len(sources))`), as `tf export RUN --to ctranslate2` "
    "and `tf translate` do."
)
