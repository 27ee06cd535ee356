"""A Hugging Face Marian model (OPUS-MT's `Helsinki-NLP/opus-mt-*`, any `MarianMTModel`) as a
`tf` run: what differs from the other families (`cli.importers.plan` holds what they share).

Its configuration is a Post-LN Marian with sinusoidal positions and scaled embeddings, which is
`tf`'s model with the switches of `ModelConfig`; its tokenizer is its SentencePiece models and
vocab.json (`data.marian`); its languages are tokenizer_config.json's (else the name's
`opus-mt-SRC-TGT`), a multilingual model's target languages its `>>xxx<<` tokens. A `tf export`
of a run (its run config beside the weights) comes back as the run it was, exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from cli.config import TF_CONFIG, Config, DecodeConfig
from cli.importers.generation import read_generation
from cli.importers.plan import Family, Plan, checked, exported_run
from cli.importers.source import check_values, model_values, with_defaults
from cli.importers.weights import WeightFiles
from data.config import LANGUAGE_CODE, DataConfig, with_directions
from data.errors import InputError
from data.files import read_json_object
from data.marian import TOKENIZER_CONFIG, MarianTokenizer
from data.tokenizer import Tokenizer
from model.marian import marian_weights
from model.transformer import ModelConfig, sinusoidal_positions

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
        names=marian_weights,
        vocab_rows=(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size),
        computed=POSITIONS,
        check_weights=check_positions,
        index=None if order is None else torch.argsort(torch.tensor(order)),
        generation=generation,
    )


FAMILY = Family("Marian (OPUS-MT)", ("marian",), FILES, marian_plan)


def read_hf_config(hf: dict[str, Any], directory: Path) -> dict[str, Any]:
    """config.json, a Marian model's, with MarianConfig's defaults where it is silent (as
    transformers reads it: an absent `scale_embedding` is false, say), its values checked."""
    hf = with_defaults(hf, "MarianConfig")
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
        **model_values(hf, where),
        tie_embeddings=tying(hf, where),
        output_bias=True,
        decoder_start="pad",
        positions="halves",
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


def check_vocabulary(hf: dict[str, Any], tokenizer: Tokenizer, directory: Path) -> None:
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
    if isinstance(tokenizer, MarianTokenizer) and start != tokenizer.pad_id:
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
