"""What every Hugging Face export shares, whichever class its family writes (`cli.families`):
config.json's widths, depths and dropouts, generation_config.json (tf's greedy search), and the
tokenizer's files (the kind's own, or tf's SentencePiece model as a fast tokenizer).

`generation_config` makes a bare `generate(**inputs)` tf's greedy search: one beam, EOS blocked
for `decode.min_len` tokens, `decode.no_repeat_ngram_size`'s n-grams banned, the decoder's
start token never chosen where it is pad (as tf's search), and tf's length limit, which is one
number for all sentences in `transformers` (`max_length`) but `a * len(src) + b` per sentence
in tf: exact when `decode.max_len_a` is 0, else the model's own limit, which only a sentence
that tf cuts at its limit (no EOS in sight) ever reaches.
"""

from __future__ import annotations

from pathlib import Path

from cli.config import Config, DecodeConfig
from cli.exporters.hf_tokenizer import write_tokenizer
from cli.exporters.published import copy_tokenizer_models
from data.errors import InputError
from data.tokenizer_base import BaseTokenizer
from model.transformer import ModelConfig


def layer_settings(c: ModelConfig) -> dict:
    """config.json's widths, depths and dropouts of a model of `c`: the keys Marian's, M2M100's
    and mBART's configs share."""
    return dict(
        max_position_embeddings=c.max_positions,
        d_model=c.d_model,
        encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,  # relu, swish, gelu: transformers' names too
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
    )


def generation_config(special: dict[str, int], decode: DecodeConfig, c: ModelConfig):
    """What a bare `generate` does: tf's greedy search (see the module docstring)."""
    from transformers import GenerationConfig

    most = c.max_positions - 1  # tokens before the EOS, as `search_batch` clamps them
    tokens = max(1, min(int(decode.max_len_b), most)) if decode.max_len_a == 0 else most
    extra: dict = {"min_new_tokens": decode.min_len} if decode.min_len else {}
    if decode.no_repeat_ngram_size:
        extra["no_repeat_ngram_size"] = decode.no_repeat_ngram_size
    start = special["decoder_start_token_id"]
    if c.decoder_start == "pad" and start != special["eos_token_id"]:  # as tf bans it
        extra["bad_words_ids"] = [[start]]
    return GenerationConfig(
        **special,
        **extra,
        num_beams=1,
        do_sample=False,
        max_length=tokens + 2,  # the start token, the tokens, the EOS forced at the limit
    )


def check_shipped(tokenizer: BaseTokenizer, model_class: str, classes: tuple[str, ...]) -> None:
    """A one-line InputError where `model_class`'s export cannot ship the tokenizer: its own
    kind's files are of none of `classes` (tf's own kind ships as a fast tokenizer anywhere)."""
    if tokenizer.hf_class is not None and tokenizer.hf_class not in classes:
        raise InputError(
            f"{model_class} ships tf's own tokenizer or a {' or '.join(classes)}: this model's "
            f"is a {tokenizer.hf_class} ({tokenizer.directory})"
        )


def write_tokenizer_files(
    tokenizer: BaseTokenizer, out: Path, config: Config, order: list[int] | None = None
) -> None:
    """What `AutoTokenizer` loads: an imported kind's own files as the original model had them,
    with the tokenizer_config.json that names their class (`save_hf_config`); tf's own
    SentencePiece model as a fast tokenizer that appends nothing, its id i the tokenizer's
    order[i] (`write_tokenizer`), beside the model(s) that `tf import` of the export reads."""
    max_positions = config.model.max_positions
    if tokenizer.hf_class is None:
        write_tokenizer(tokenizer, out, max_positions, order)
        copy_tokenizer_models(tokenizer, out)
        return
    copy_tokenizer_models(tokenizer, out)
    d = config.data
    ways = d.translates()  # one-way: its corpora's direction; else the languages it was named by
    src, tgt = ways[0] if len(ways) == 1 else (d.src_lang, d.tgt_lang)
    tokenizer.save_hf_config(out, max_positions, src, tgt)
