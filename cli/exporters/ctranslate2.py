"""A `tf` model as a CTranslate2 model directory, through CTranslate2's own spec API.

Our parameters map one to one onto `TransformerSpec`: the fused (3D, D) self-attention
projection is CTranslate2's fused `linear[0]`; cross-attention splits the same matrix into the
query rows and the fused key/value rows, as CTranslate2 expects; Post-LN is `pre_norm=False`
(each sub-layer's norm after its residual, no final norm), Pre-LN adds the final norms. Every
attention is told its heads' width and its queries' scale, 1 / sqrt(d_head), which CTranslate2
would otherwise take from d_model / n_heads: not a pruned model's (`tf prune --heads`). Our own
position table is written into the model, from its first position on (`model.positions`: a
sinusoidal table in the model's layout, or mBART's learned ones), with the switches of the
embeddings (`model.scale_embedding`, `model.layernorm_embedding`); a source's pad, which
fairseq's sinusoids place nowhere, is never attended to, and a decoder that starts from pad
under them has a zero first row. Sources carry what `tf`'s tokenizer gives them (no BOS or
EOS; an imported Marian model's end in EOS) and the decoder starts from `model.decoder_start`'s
token, as in `tf`. Where that token is pad (Marian's models), pad is never an output (tf's
search bans it): its logit gets a bias so low that no softmax ever gives it any probability,
which shares pad's out among the others as `decode.renormalize` does (`ct2_decode`).

The directory also holds the SentencePiece model(s) and `tf_config.yaml` (the run's config,
its decode settings as CTranslate2 searches), so that `tf translate DIR` runs it with the same
tokenizer and decode settings.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from cli.config import Config, DecodeConfig
from cli.exporters.published import copy_tokenizer_models, save_published_config
from data.errors import InputError
from data.tokenizer import Tokenizer
from model.transformer import Embedding, ModelConfig, Transformer

# model.activation -> CTranslate2's Activation
CT2_ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}
# A logit this far below the others has a probability of exactly 0 in float32 and float16 alike
# (exp(-1e4) underflows both), and stays finite where -inf could make a kernel's NaN.
PAD_BIAS = -1e4


def export_ctranslate2(
    model: Transformer, tokenizer: Tokenizer, config: Config, out: Path, quantization: str | None
) -> list[str]:
    """Write `model` as a CTranslate2 directory `out` (which must not exist yet); returns the
    decode settings changed for CTranslate2 (`ct2_decode`), as "key: old -> new"."""
    import ctranslate2

    class TfConverter(ctranslate2.converters.Converter):
        def _load(self):
            return transformer_spec(model, tokenizer)

    TfConverter().convert(str(out), quantization=quantization)
    copy_tokenizer_models(tokenizer, out)
    start = tokenizer.decoder_start_id(model.config.decoder_start)
    decode, changed = ct2_decode(config.decode, bans_pad(tokenizer, start))
    save_published_config(replace(config, decode=decode), out)
    return changed


def ct2_decode(decode: DecodeConfig, pad_banned: bool) -> tuple[DecodeConfig, list[str]]:
    """The run's decode settings as CTranslate2 runs them: its beam search stops by patience
    alone (an imported model's transformers rule, `beam_stop: current_length`, and patience 0
    are tf's own), so the directory gets CTranslate2's default of patience 1 there. What it
    forbids, it takes out before its softmax (`decode.renormalize` true), where tf's default
    bans after it: a decoder's start token where that is pad (`pad_banned`, `PAD_BIAS`), EOS
    before `decode.min_len`, repeated n-grams."""
    changes: dict[str, object] = {}
    if decode.beam_stop != "bound":
        changes["beam_stop"] = "bound"
    if decode.patience <= 0:
        changes["patience"] = 1.0
    forbids = pad_banned or decode.min_len > 0 or decode.no_repeat_ngram_size > 0
    if forbids and not decode.renormalize:
        changes["renormalize"] = True
    listed = [f"decode.{k}: {getattr(decode, k)!r} -> {v!r}" for k, v in changes.items()]
    return replace(decode, **changes), listed


def transformer_spec(model: Transformer, tokenizer: Tokenizer):
    """The `TransformerSpec` holding `model`'s weights and `tokenizer`'s vocabularies."""
    c = model.config
    if c.norm_eps != 1e-5:
        raise InputError(f"CTranslate2's LayerNorms use eps 1e-5: model.norm_eps is {c.norm_eps:g}")
    spec = _empty_spec(c)
    start = tokenizer.decoder_start_id(c.decoder_start)
    # Copies: CTranslate2 may change the arrays in place (quantization), never our weights.
    weights = {k: v.detach().float().cpu().numpy().copy() for k, v in model.state_dict().items()}
    _embeddings(spec.encoder, model.src_embed, weights, "src_embed.", c.scale_embedding)
    _embeddings(spec.decoder, model.tgt_embed, weights, "tgt_embed.", c.scale_embedding, start)
    for i, layer in enumerate(spec.encoder.layer):
        p = f"encoder.layers.{i}."
        _self_attention(layer.self_attention, weights, p + "self_attn.", p + "norm1.")
        _ffn(layer.ffn, weights, p, p + "norm2.")
    inner = c.n_heads * _d_head(c)  # rows of W_q: d_model unless pruned
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder.layers.{i}."
        _self_attention(layer.self_attention, weights, p + "self_attn.", p + "norm1.")
        cross = layer.attention
        w, b = (
            weights[p + "multihead_attn.in_proj_weight"],
            weights[p + "multihead_attn.in_proj_bias"],
        )
        _linear(cross.linear[0], w[:inner], b[:inner])  # queries from the decoder
        _linear(cross.linear[1], w[inner:], b[inner:])  # keys and values from the encoder, fused
        _linear(cross.linear[2], *_pair(weights, p + "multihead_attn.out_proj."))
        _norm(cross.layer_norm, weights, p + "norm2.")
        _ffn(layer.ffn, weights, p, p + "norm3.")
    if c.norm_first:  # Pre-LN stacks end in a norm of their own
        _norm(spec.encoder.layer_norm, weights, "encoder.norm.")
        _norm(spec.decoder.layer_norm, weights, "decoder.norm.")
    spec.decoder.projection.weight = weights["generator.weight"]
    spec.decoder.projection.bias = output_bias(weights, tokenizer, start)
    spec.register_source_vocabulary(tokenizer.src_vocabulary())
    spec.register_target_vocabulary(tokenizer.tgt_vocabulary())
    pieces = tokenizer.tgt_vocabulary()
    spec.config.unk_token = pieces[tokenizer.unk_id]
    spec.config.bos_token = pieces[start if tokenizer.bos_id is None else tokenizer.bos_id]
    spec.config.eos_token = pieces[tokenizer.eos_id]
    spec.config.decoder_start_token = pieces[start]
    spec.config.add_source_bos = spec.config.add_source_eos = False  # the tokenizer's business
    return spec


def _d_head(c: ModelConfig) -> int:
    """The width of a head: d_model / n_heads, unless pruned (`tf prune --heads` keeps the
    heads' width with fewer of them: `model.d_head`)."""
    return c.d_head or c.d_model // c.n_heads


def _empty_spec(c: ModelConfig):
    """The spec of a model of `c`, its weights to come. Every attention is told its heads'
    width (how its projections split into heads) and its queries' scale, 1 / sqrt(d_head)
    (section 3.2.1): CTranslate2 takes d_model / n_heads for both unless told, which a pruned
    model's heads are not (its scores were off by up to 0.17; one head left failed outright)."""
    import numpy as np
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    width = _d_head(c)
    shared = dict(
        pre_norm=c.norm_first,
        activation=getattr(common_spec.Activation, CT2_ACTIVATIONS[c.activation]),
        layernorm_embedding=c.layernorm_embedding,
        head_dim=width,
    )
    spec = ts.TransformerSpec(
        ts.TransformerEncoderSpec(c.n_encoder_layers, c.n_heads, **shared),
        ts.TransformerDecoderSpec(c.n_decoder_layers, c.n_heads, **shared),
    )
    scale = np.float32(1 / math.sqrt(width))
    for layer in [*spec.encoder.layer, *spec.decoder.layer]:
        layer.self_attention.queries_scale = scale
        if hasattr(layer, "attention"):  # the decoder's cross-attention
            layer.attention.queries_scale = scale
    return spec


def output_bias(weights: dict, tokenizer: Tokenizer, start: int):
    """The generator's bias (`model.output_bias`, else zeros); where the decoder starts from
    pad (Marian's models), pad's set out of reach, as tf's search bans it."""
    rows = weights["generator.weight"].shape[0]
    bias = weights.get("generator.bias", torch.zeros(rows).numpy()).copy()
    if bans_pad(tokenizer, start):
        bias[tokenizer.pad_id] = PAD_BIAS
    return bias


def bans_pad(tokenizer: Tokenizer, start: int) -> bool:
    """Whether a decoder that starts from `start` has pad banned from its outputs: where it
    starts from pad (Marian's models), which no target ever was (`search_batch`)."""
    return start == tokenizer.pad_id != tokenizer.eos_id


def _embeddings(
    stack, embed: Embedding, weights: dict, prefix: str, scale: bool, start: int | None = None
) -> None:
    """A stack's token embeddings, their scale (x sqrt(D), section 3.4, or none:
    `model.scale_embedding`), its position table and the norm after them (mBART's). CTranslate2
    numbers positions from its table's row 0: ours from row `model.position_offset` on (M2M100's
    and mBART's 2, as CTranslate2's own converter cuts theirs), learned (mBART's) or computed
    in the model's layout (`model.positions`). The decoder's row 0 is only ever its `start`
    token's: a zero row where that is pad and the positions fairseq's, which place pad nowhere
    (CTranslate2 adds a position to every token)."""
    embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
    embeddings.weight = weights[prefix + "token.weight"]
    stack.scale_embeddings = scale
    table = embed.positions.detach().float().cpu().numpy()  # (P + offset, D)
    table = table[embed.offset :].copy()  # (P, D)
    if embed.pad_has_no_position and start == embed.token.padding_idx:
        table[0] = 0.0
    stack.position_encodings.encodings = table
    if embed.norm is not None:
        _norm(stack.layernorm_embedding, weights, prefix + "norm.")


def _pair(weights: dict, prefix: str):
    return weights[prefix + "weight"], weights[prefix + "bias"]


def _linear(spec, weight, bias) -> None:
    spec.weight, spec.bias = weight, bias


def _norm(spec, weights: dict, prefix: str) -> None:
    spec.gamma, spec.beta = _pair(weights, prefix)


def _self_attention(spec, weights: dict, prefix: str, norm: str) -> None:
    _linear(spec.linear[0], weights[prefix + "in_proj_weight"], weights[prefix + "in_proj_bias"])
    _linear(spec.linear[1], *_pair(weights, prefix + "out_proj."))
    _norm(spec.layer_norm, weights, norm)


def _ffn(spec, weights: dict, prefix: str, norm: str) -> None:
    _linear(spec.linear_0, *_pair(weights, prefix + "linear1."))
    _linear(spec.linear_1, *_pair(weights, prefix + "linear2."))
    _norm(spec.layer_norm, weights, norm)
