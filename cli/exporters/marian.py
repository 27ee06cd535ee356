"""A `tf` model as a Hugging Face `MarianMTModel` directory with its tokenizer and a model card,
loaded as any translation model is (`AutoTokenizer`, `AutoModelForSeq2SeqLM`, `generate`).

Marian is the same Post-LN encoder-decoder (embeddings x sqrt(D), sinusoidal positions), with
differences that are settings of `ModelConfig` or proven away by the tests; the weights move by
the name table of `model/marian.py` (positions, fused projections):

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
export's output say (`model_card.ctranslate2_problem`).

Beside them, the export keeps the run's config (`tf_config.yaml`) and its SentencePiece
model(s): `tf import` of the directory maps the ids back (by the pieces of tokenizer.json) and
gives back the same run, weights bit for bit.

`generation_config.json` makes a bare `generate(**inputs)` tf's greedy search: one beam, EOS
blocked for `decode.min_len` tokens, `decode.no_repeat_ngram_size`'s n-grams banned, the
decoder's start token never chosen where it is pad (as tf's search), and tf's length limit,
which is one number for all sentences in `transformers` (`max_length`) but `a * len(src) + b`
per sentence in tf: exact when `decode.max_len_a` is 0, else the model's own limit, which only
a sentence that tf cuts at its limit (no EOS in sight) ever reaches.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cli.config import Config, DecodeConfig
from cli.exporters.hf_tokenizer import write_tokenizer
from cli.exporters.published import copy_tokenizer_models, save_published_config
from data.errors import InputError
from data.marian import TOKENIZER_CONFIG, MarianTokenizer
from data.tokenizer import Tokenizer
from model.marian import marian_weights, reorder_vocabulary
from model.transformer import ModelConfig, Transformer


def export_marian(model: Transformer, tokenizer: Tokenizer, config: Config, out: Path) -> None:
    """Write `model` as a MarianMTModel directory `out`, with its tokenizer: what
    `AutoModelForSeq2SeqLM` and `AutoTokenizer` load (the model card is written by the caller)."""
    from transformers import MarianMTModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": one shard, no news
    check_exportable(model.config)
    if not isinstance(tokenizer, MarianTokenizer) and not tokenizer.joint:
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
    marian = MarianMTModel(marian_config(model.config, tokenizer, special)).eval()
    weights = marian_weights(model)
    if moved:  # (a Marian tokenizer's ids stay as they are, on either side)
        weights = reorder_vocabulary(weights, torch.tensor(order))
    missing, unexpected = marian.load_state_dict(weights, strict=False)
    allowed = {"lm_head.weight"} | {
        k for k in marian.state_dict() if "embed_positions" in k or "embed_tokens" in k
    }
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"weights that do not fit Marian: {unexpected or missing}")
    marian.generation_config = generation_config(special, config.decode, model.config)
    marian.save_pretrained(out, safe_serialization=True)
    if isinstance(tokenizer, MarianTokenizer):
        write_marian_tokenizer(tokenizer, out, config)
    else:
        write_tokenizer(tokenizer, out, model.config.max_positions, order)
        copy_tokenizer_models(tokenizer, out)  # for `tf import`, which restores the run
    # What `tf import` of this directory needs to give back the run's model exactly: its
    # layout of positions, its decoder's start, every setting.
    save_published_config(config, out)


def vocabulary_order(tokenizer: Tokenizer) -> list[int]:
    """The export's id i is the tokenizer's id order[i]: `<pad>` last, the others in their
    order, as OPUS-MT's models have it and CTranslate2's Marian loader takes for granted (it
    drops the last id: the pad its decoders start from, as a zero embedding). An imported
    model's own Marian files keep their ids (OPUS-MT's pad is last already)."""
    ids = list(range(tokenizer.src_vocab_size))
    if isinstance(tokenizer, MarianTokenizer):
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


def marian_config(c: ModelConfig, tokenizer: Tokenizer, special: dict[str, int]):
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


def write_marian_tokenizer(tokenizer: MarianTokenizer, out: Path, config: Config) -> None:
    """An imported model's own tokenizer files, and the tokenizer_config.json that makes
    `AutoTokenizer` a MarianTokenizer over them."""
    copy_tokenizer_models(tokenizer, out)
    d = config.data
    ways = d.translates()  # one-way: its corpora's direction; else the languages it was named by
    src, tgt = ways[0] if len(ways) == 1 else (d.src_lang, d.tgt_lang)
    settings = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": src,
        "target_lang": tgt,
        "separate_vocabs": tokenizer.separate,
        "model_max_length": config.model.max_positions,
    }
    with open(out / TOKENIZER_CONFIG, "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=1)
