"""Marian (OPUS-MT's `Helsinki-NLP/opus-mt-*`, any `MarianMTModel`): the family's record,
how `tf import` reads its files and how `tf export --to huggingface` writes its class.

Import. Its configuration is a Post-LN Marian with sinusoidal positions and scaled embeddings,
which is `tf`'s model with the switches of `model.marian.LAYOUT`; its tokenizer is its
SentencePiece models and vocab.json (`data.marian`); its languages are tokenizer_config.json's
(else the name's `opus-mt-SRC-TGT`), a multilingual model's target languages its `>>xxx<<`
tokens. A `tf export` of a run (its run config beside the weights) comes back as the run it
was, exactly.

Export. Marian is the same Post-LN encoder-decoder (embeddings x sqrt(D), sinusoidal
positions), with differences that are settings of `ModelConfig` or proven away by the tests;
the weights move by the name table of `model/marian.py` (positions, fused projections):

- The FFN's activation (`model.activation`: OPUS-MT's swish), `final_logits_bias`
  (`model.output_bias`), the decoder's first token (`model.decoder_start`: Marian's pad).
- Tokenizer: a `tf` model's sources carry no EOS, and MarianTokenizer appends one to every
  source: its export has a fast tokenizer of its own instead, which appends nothing
  (`cli.exporters.hf_tokenizer`). An imported model keeps Marian's own files.

The vocabulary is in OPUS-MT's layout, `<pad>` last (`vocabulary_order`): in the embeddings,
the output layer, `final_logits_bias`, the tokenizer and every special id of the configs, as
CTranslate2's converter (`ct2-transformers-converter`) and other OPUS-MT tools take for
granted. That converter also starts every decoder from a zero embedding: exact for a decoder
that starts from a zero `<pad>` (OPUS-MT's; `model.decoder_start: pad` as tf initialises it),
not for one that starts from a trained BOS (tf's default), which the model card and the
export's output say (`converter_problem`).

Beside them, the export keeps the run's config (`tf_config.yaml`) and its SentencePiece
model(s): `tf import` of the directory maps the ids back (by the pieces of tokenizer.json) and
gives back the same run, weights bit for bit. `generation_config.json` makes a bare
`generate(**inputs)` tf's greedy search (`cli.exporters.huggingface.generation_config`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from cli.config import TF_CONFIG, Config, DecodeConfig
from cli.exporters.huggingface import (
    check_shipped,
    generation_config,
    layer_settings,
    write_tokenizer_files,
)
from cli.exporters.published import save_published_config
from cli.families.family import Family
from cli.importers.generation import read_generation
from cli.importers.plan import Plan, checked, exported_run, index_of
from cli.importers.source import check_values, model_values, with_defaults
from cli.importers.weights import WeightFiles
from data.config import LANGUAGE_CODE, DataConfig, with_directions
from data.errors import InputError
from data.files import read_json_object
from data.marian import TOKENIZER_CONFIG, MarianTokenizer
from data.tokenizer_base import BaseTokenizer
from model import marian
from model.transformer import ModelConfig, Transformer, sinusoidal_positions

# What a hub download fetches of a Marian model besides config.json, the weights and the
# generation settings: its tokenizer, or a `tf export`'s SentencePiece model(s).
FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    TOKENIZER_CONFIG,
    "joint.model",
    "src.model",
    "tgt.model",
)
RATES = ("dropout", "attention_dropout", "activation_dropout")
FLAGS = ("share_encoder_decoder_embeddings", "tie_word_embeddings")
# Keys of older Marian configurations that describe another network than tf's (and than the
# one transformers runs): each with the value tf's model has.
VARIANTS = {
    "normalize_before": False,  # Pre-LN
    "normalize_embedding": False,  # a LayerNorm after the embeddings
    "add_final_layer_norm": False,
    "static_position_embeddings": True,  # learned positions otherwise
    "scale_embedding": True,  # embeddings x sqrt(D)
}
# The position tables older exports keep, which tf computes (`check_positions`).
POSITIONS = tuple(f"model.{stack}.embed_positions.weight" for stack in ("encoder", "decoder"))


# ------------------------------------------------------------------------------- the import


def marian_plan(directory: Path, hf: dict[str, Any], source: str) -> Plan:
    """What `tf import` makes of a Marian model's files (see the module docstring)."""
    hf = read_hf_config(hf, directory)
    generation = None
    order = None  # a `tf export`'s id i is its run's order[i] (OPUS-MT's layout, pad last)
    if (directory / TF_CONFIG).is_file():  # a `tf export`: the run it came from, exactly
        config, tokenizer, order, hf = exported_run(directory, hf)
    else:
        tokenizer = MarianTokenizer(directory)
        start = tokenizer.decoder_start_id("pad")
        generation = read_generation(
            directory, tokenizer.eos_id, start, tokenizer.tgt_pieces([start])[0]
        )
        config = run_config(
            model_config_of(hf, directory), directory, source, generation.decode, tokenizer.tags
        )
    check_vocabulary(hf, tokenizer, directory)
    return Plan(
        config=config,
        tokenizer=tokenizer,
        names=MARIAN.names,
        vocab_rows=(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size),
        computed=POSITIONS,
        check_weights=check_positions,
        index=None if order is None else index_of(order),
        generation=generation,
    )


def read_hf_config(hf: dict[str, Any], directory: Path) -> dict[str, Any]:
    """config.json, a Marian model's, with MarianConfig's defaults where it is silent (as
    transformers reads it: an absent `scale_embedding` is false, say), its values checked."""
    hf = with_defaults(hf, MARIAN.config_class)
    check_values(hf, directory / "config.json", RATES, FLAGS)
    return hf


def model_config_of(hf: dict[str, Any], directory: Path) -> ModelConfig:
    """tf's ModelConfig of a MarianConfig (`read_hf_config`), or a one-line InputError saying
    why the model is not one `tf` runs."""
    where = directory / "config.json"
    for key, value in VARIANTS.items():
        if key in hf and hf[key] != value:
            raise InputError(
                f"{where}: {key}: {json.dumps(hf[key])} is a Marian variant tf's Post-LN model "
                f"does not run (it takes {json.dumps(value)})"
            )
    return ModelConfig(
        **model_values(hf, where), tie_embeddings=tying(hf, where), **MARIAN.switches
    )


def tying(hf: dict[str, Any], where: Path) -> str:
    """tie_embeddings from Marian's two flags."""
    shared, tied = hf["share_encoder_decoder_embeddings"], hf["tie_word_embeddings"]
    if shared and not tied:
        raise InputError(
            f"{where}: shared embeddings with an untied output layer; tf ties the output "
            "layer to the target embeddings whenever the embeddings are shared"
        )
    return "all" if shared else "decoder" if tied else "none"


def check_vocabulary(hf: dict[str, Any], tokenizer: BaseTokenizer, directory: Path) -> None:
    """The tokenizer against config.json: vocabulary sizes and special ids."""
    where = directory / "config.json"
    shared = hf["share_encoder_decoder_embeddings"]
    if shared and not tokenizer.joint:
        raise InputError(f"{where}: shared embeddings, but two vocabularies (separate_vocabs)")
    sizes = [("vocab_size", tokenizer.src_vocab_size, "source")]
    if not shared:
        sizes.append(("decoder_vocab_size", tokenizer.tgt_vocab_size, "target"))
    for key, size, side in sizes:
        if hf.get(key) != size:
            raise InputError(
                f"{tokenizer.directory}: the {side} vocabulary has {size} pieces, but "
                f"config.json's {key} is {hf.get(key)}"
            )
    # transformers pads both embeddings with pad_token_id: two vocabularies whose <pad> ids
    # differ name one of them (the one both hold); the decoder starts from the target's.
    pads = {tokenizer.pad_id, tokenizer.src_pad_id}
    if hf["pad_token_id"] not in pads:
        raise InputError(
            f"{where}: pad_token_id {hf['pad_token_id']} is not the tokenizer's <pad> "
            f"({' or '.join(map(str, sorted(pads)))})"
        )
    if hf["eos_token_id"] != tokenizer.eos_id:
        raise InputError(
            f"{where}: eos_token_id {hf['eos_token_id']} is not the tokenizer's ({tokenizer.eos_id}"
            f", {tokenizer.tgt_pieces([tokenizer.eos_id])[0]})"
        )
    start = hf["decoder_start_token_id"]
    if tokenizer.hf_class in MARIAN.tokenizer_classes and start != tokenizer.pad_id:
        raise InputError(
            f"{where}: decoder_start_token_id {start} is not the target vocabulary's <pad> "
            f"({tokenizer.pad_id}), where Marian's decoders start"
        )


def check_positions(files: WeightFiles) -> None:
    """The position tables a file keeps (older exports do) must be Marian's sinusoids, as
    stored in their dtype: learned positions would change every logit without a word."""
    for name in POSITIONS:
        if name in files and not is_sinusoid_table(files[name]):
            raise InputError(
                f"{files.found}: {name.removesuffix('.weight')} are not Marian's sinusoids "
                "(learned positions?); tf computes them"
            )


def is_sinusoid_table(table: torch.Tensor) -> bool:
    """Whether `table` (P, D) holds Marian's sinusoids as its dtype stores them: rounded to
    that dtype, within its machine epsilon (fp16 9.8e-4, bf16 7.8e-3, where rounding moves a
    value near 1 by up to 2.4e-4 and 2e-3; float32 tables computed in another order differ by
    ~1e-5, under the 1e-4 kept for them)."""
    if table.dim() != 2 or not table.is_floating_point():
        return False
    expected = sinusoidal_positions(table.size(0), table.size(1), "halves").to(table.dtype)
    tolerance = max(1e-4, torch.finfo(table.dtype).eps)
    return torch.allclose(table.float(), expected.float(), rtol=0, atol=tolerance)


def run_config(
    model_config: ModelConfig,
    directory: Path,
    source: str,
    decode: DecodeConfig,
    tags: Iterable[str] = (),
) -> Config:
    """The imported run's config: the model, its languages (tokenizer_config.json's, else the
    name's `opus-mt-SRC-TGT`; a multilingual model's directions into its `>>xxx<<` tokens'
    languages, `tags`), and `decode`, its generation settings (`read_generation`)."""
    tokenizer_config = directory / TOKENIZER_CONFIG
    langs = read_json_object(tokenizer_config) if tokenizer_config.is_file() else {}
    src_lang, tgt_lang = langs.get("source_lang"), langs.get("target_lang")
    for key, lang in (("source_lang", src_lang), ("target_lang", tgt_lang)):
        if lang not in (None, "") and not (isinstance(lang, str) and LANGUAGE_CODE.fullmatch(lang)):
            raise InputError(
                f"{tokenizer_config}: {key} must be a language code (letters, digits, _ or -), "
                f"got {lang!r}"
            )
    named = re.search(r"opus-mt-([a-z_]+)-([a-z_]+)$", source.rstrip("/"), re.IGNORECASE)
    if not (src_lang and tgt_lang) and named:
        src_lang, tgt_lang = named.groups()
    data = DataConfig(  # a model alone: no corpus of tf's trained it (fine-tuning names some)
        train=[],
        dev="",
        test="",
        src_lang=src_lang or "src",
        tgt_lang=tgt_lang or "tgt",
        max_len=min(DataConfig.max_len, model_config.max_positions - 1),
    )
    data = with_directions(data, tags)
    return checked(Config(data=data, model=model_config, decode=decode), directory)


# ------------------------------------------------------------------------------- the export


def export_marian(model: Transformer, tokenizer: BaseTokenizer, config: Config, out: Path) -> None:
    """Write `model` as a MarianMTModel directory `out`, with its tokenizer: what
    `AutoModelForSeq2SeqLM` and `AutoTokenizer` load (the model card is written by the caller)."""
    from transformers import MarianMTModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": one shard, no news
    check_exportable(model.config)
    check_shipped(tokenizer, MARIAN.model_class, MARIAN.tokenizer_classes)
    if tokenizer.hf_class is None and not tokenizer.joint:
        raise InputError("Marian takes one vocabulary: export needs a joint tokenizer")
    order = vocabulary_order(tokenizer)
    moved = {old: new for new, old in enumerate(order) if old != new}

    def exported(i: int) -> int:  # tf's id -> the export's
        return moved.get(i, i)

    start = tokenizer.decoder_start_id(model.config.decoder_start)
    special = dict(
        # One id for both embeddings' padding rows: where two vocabularies pad at other ids (an
        # import's), the lower, which both hold (transformers takes it for either).
        pad_token_id=exported(min(tokenizer.pad_id, tokenizer.src_pad_id)),
        # Marian has no BOS: its configs name EOS, which nothing uses.
        bos_token_id=exported(tokenizer.eos_id if tokenizer.bos_id is None else tokenizer.bos_id),
        eos_token_id=exported(tokenizer.eos_id),
        forced_eos_token_id=exported(tokenizer.eos_id),  # as our search: EOS forced at the limit
        decoder_start_token_id=exported(start),
    )
    hf = MarianMTModel(marian_config(model.config, tokenizer, special)).eval()
    weights = MARIAN.names(model)
    if moved:  # (a Marian tokenizer's ids stay as they are, on either side)
        weights = marian.reorder_vocabulary(weights, torch.tensor(order))
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    allowed = {"lm_head.weight"} | {
        k for k in hf.state_dict() if "embed_positions" in k or "embed_tokens" in k
    }
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"weights that do not fit Marian: {unexpected or missing}")
    hf.generation_config = generation_config(special, config.decode, model.config)
    hf.save_pretrained(out, safe_serialization=True)
    write_tokenizer_files(tokenizer, out, config, order)
    # What `tf import` of this directory needs to give back the run's model exactly: its
    # layout of positions, its decoder's start, every setting.
    save_published_config(config, out)


def vocabulary_order(tokenizer: BaseTokenizer) -> list[int]:
    """The export's id i is the tokenizer's id order[i]: `<pad>` last, the others in their
    order, as OPUS-MT's models have it and CTranslate2's Marian loader takes for granted (it
    drops the last id: the pad its decoders start from, as a zero embedding). An imported
    model's own Marian files keep their ids (OPUS-MT's pad is last already)."""
    ids = list(range(tokenizer.src_vocab_size))
    if tokenizer.hf_class is not None:
        return ids
    return [i for i in ids if i != tokenizer.pad_id] + [tokenizer.pad_id]


def check_exportable(c: ModelConfig) -> None:
    """What MarianMTModel cannot hold, as one line."""
    if c.norm_first:
        raise InputError("Marian is Post-LN only: a Pre-LN (norm_first) model cannot be exported")
    if c.d_head and c.d_head * c.n_heads != c.d_model:
        raise InputError(
            "Marian's heads span d_model: a model with pruned heads cannot be exported"
        )
    if c.norm_eps != 1e-5:
        raise InputError(f"Marian's LayerNorms use eps 1e-5: model.norm_eps is {c.norm_eps:g}")
    plain = c.positions in ("interleaved", "halves") and not c.position_offset
    if not (plain and c.scale_embedding and not c.layernorm_embedding):
        raise InputError(
            "Marian embeds as the paper (x sqrt(d_model), sinusoids from position 0, no norm): "
            "a model with other model.positions, position_offset, scale_embedding or "
            "layernorm_embedding cannot be exported"
        )


def marian_config(c: ModelConfig, tokenizer: BaseTokenizer, special: dict[str, int]):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=tokenizer.src_vocab_size,
        decoder_vocab_size=tokenizer.tgt_vocab_size,
        share_encoder_decoder_embeddings=c.tie_embeddings == "all",
        tie_word_embeddings=c.tie_embeddings != "none",
        scale_embedding=True,
        **layer_settings(c),
        **special,
    )


# -------------------------------------------------------------- CTranslate2's converter


CONVERTER = (
    "`ct2-transformers-converter --model THIS_DIRECTORY --output_dir ct2` converts it "
    "exactly (`<pad>` is the last id and its embedding zero, as the converter assumes): "
    "greedy search gives the same tokens. The converter removes `<pad>` from the output "
    "layer, so its beam search normalises over the other tokens, where `transformers` bans "
    "`<pad>` after the softmax: beams may rank otherwise."
)


def converter_problem(model: Transformer, tokenizer: BaseTokenizer) -> str | None:
    """Why CTranslate2's converter would not give this model, or None: its Marian loader drops
    the last id (`<pad>` in OPUS-MT's layout, the export's) and starts every decoder from a
    zero embedding, whatever `decoder_start_token_id` says."""
    start = model.config.decoder_start
    pad = tokenizer.pad_id
    last = (tokenizer.src_vocab_size - 1, tokenizer.tgt_vocab_size - 1)
    keeps_ids = tokenizer.hf_class is not None  # its own files' ids (`vocabulary_order`)
    if keeps_ids and (tokenizer.src_pad_id, pad) != last:
        return "it expects `<pad>` as the last id, which this vocabulary has elsewhere"
    if start != "pad":
        piece = tokenizer.tgt_pieces([tokenizer.decoder_start_id(start)])[0]
        return (
            "its Marian loader starts every decoder from a zero embedding (OPUS-MT's start "
            f"from a zero `<pad>`), this model's from its trained {start.upper()}, "
            f"`{piece}`: the converted model would translate otherwise"
        )
    if model.tgt_embed.token.weight[pad].any():
        return (
            "its Marian loader starts every decoder from a zero embedding, and this model's "
            "`<pad>`, where its decoder starts, is not zero: the converted model would "
            "translate otherwise"
        )
    return None


MARIAN = Family(
    title="Marian (OPUS-MT)",
    model_types=("marian",),
    config_class="MarianConfig",
    model_class="MarianMTModel",
    switches=marian.LAYOUT,
    position_offset=marian.position_offset,
    names=marian.marian_weights,
    tokenizer_classes=(MarianTokenizer.hf_class,),
    files=FILES,
    plan=marian_plan,
    export=export_marian,
    converter=CONVERTER,
    converter_problem=converter_problem,
)
