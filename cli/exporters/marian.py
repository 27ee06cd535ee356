"""A `tf` model as a Hugging Face `MarianMTModel` directory, and back: one table of names for
both directions, so that an export imported again (or an import exported again) is the same
tensors.

Marian is the same Post-LN encoder-decoder (embeddings x sqrt(D), sinusoidal positions), with
differences that are settings of `ModelConfig` or proven away by the tests:

- Positions: Marian lays sin and cos out in halves, [sin f_0 .. sin f_{D/2-1} | cos ...]
  (`model.positions: halves`, what an import gets); ours by default interleave them,
  [sin f_0, cos f_0, sin f_1, ...]. Exporting such a model permutes the model dimension (the
  residual stream) the same way everywhere, in embeddings, norms and the D-sized side of every
  projection, which gives a network that computes exactly the same logits with Marian's
  positions. Attention heads are untouched: only the residual side of Q, K, V is permuted.
- Separate q/k/v projections: our fused (3D, D) matrices are split in rows (stacked on import).
- The FFN's activation (`model.activation`: OPUS-MT's swish), `final_logits_bias`
  (`model.output_bias`), the decoder's first token (`model.decoder_start`: Marian's pad).
- Tokenizer: a `tf` model's sources carry no EOS, and MarianTokenizer appends one to every
  source: its export has a fast tokenizer of its own instead, which appends nothing
  (`cli.exporters.hf_tokenizer`). An imported model keeps Marian's own files.

Beside them, the export keeps the run's config (`tf_config.yaml`) and its SentencePiece
model(s): `tf import` of the directory gives back the same run, weights bit for bit.

`generation_config.json` makes a bare `generate(**inputs)` tf's greedy search: one beam, EOS
blocked for `decode.min_len` tokens, pad never chosen (as tf's search), and tf's length limit,
which is one number for all sentences in `transformers` (`max_length`) but `a * len(src) + b`
per sentence in tf: exact when `decode.max_len_a` is 0, else the model's own limit, which only
a sentence that tf cuts at its limit (no EOS in sight) ever reaches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from cli.config import Config, DecodeConfig, save_config
from cli.exporters.ctranslate2 import TF_CONFIG
from cli.exporters.hf_tokenizer import write_tokenizer
from data.errors import InputError
from data.marian import TOKENIZER_CONFIG, MarianTokenizer
from data.tokenizer import Tokenizer
from model.transformer import ModelConfig, Transformer

# model.activation -> MarianConfig.activation_function (transformers' ACT2FN names)
ACTIVATION_NAMES = {"relu": "relu", "swish": "swish", "gelu": "gelu"}


def half_split_permutation(d_model: int) -> torch.Tensor:
    """Marian's index i holds our index perm[i]: even (sin) dimensions first, then odd (cos)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def export_marian(model: Transformer, tokenizer: Tokenizer, config: Config, out: Path) -> None:
    """Write `model` as a MarianMTModel directory `out`, with its tokenizer: what
    `AutoModelForSeq2SeqLM` and `AutoTokenizer` load (the model card is written by the caller)."""
    from transformers import MarianMTModel

    check_exportable(model.config)
    start = tokenizer.decoder_start_id(model.config.decoder_start)
    special = dict(
        pad_token_id=tokenizer.pad_id,
        # Marian has no BOS: its configs name EOS, which nothing uses.
        bos_token_id=tokenizer.eos_id if tokenizer.bos_id is None else tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        forced_eos_token_id=tokenizer.eos_id,  # as our search: EOS forced at the length limit
        decoder_start_token_id=start,
    )
    marian = MarianMTModel(marian_config(model.config, tokenizer, special)).eval()
    missing, unexpected = marian.load_state_dict(marian_weights(model), strict=False)
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
        write_tokenizer(tokenizer, out, model.config.max_positions)
        for path in tokenizer.model_paths():  # for `tf import`, which restores the run
            shutil.copyfile(path, out / path.name)
    # What `tf import` of this directory needs to give back the run's model exactly: its
    # layout of positions, its decoder's start, every setting.
    save_config(config, out / TF_CONFIG)


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


def marian_config(c: ModelConfig, tokenizer: Tokenizer, special: dict[str, int]):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=tokenizer.src_vocab_size,
        decoder_vocab_size=tokenizer.tgt_vocab_size,
        share_encoder_decoder_embeddings=c.tie_embeddings == "all",
        tie_word_embeddings=c.tie_embeddings != "none",
        max_position_embeddings=c.max_positions,
        d_model=c.d_model,
        encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=ACTIVATION_NAMES[c.activation],
        scale_embedding=True,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        **special,
    )


def generation_config(special: dict[str, int], decode: DecodeConfig, c: ModelConfig):
    """What a bare `generate` does: tf's greedy search (see the module docstring)."""
    from transformers import GenerationConfig

    most = c.max_positions - 1  # tokens before the EOS, as `search_batch` clamps them
    tokens = max(1, min(int(decode.max_len_b), most)) if decode.max_len_a == 0 else most
    extra = {"min_new_tokens": decode.min_len} if decode.min_len else {}
    if special["pad_token_id"] != special["eos_token_id"]:  # tf's search never chooses pad
        extra["bad_words_ids"] = [[special["pad_token_id"]]]
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
    for path in tokenizer.model_paths():
        shutil.copyfile(path, out / path.name)
    settings = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": config.data.src_lang,
        "target_lang": config.data.tgt_lang,
        "separate_vocabs": tokenizer.separate,
        "model_max_length": config.model.max_positions,
    }
    with open(out / TOKENIZER_CONFIG, "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=1)


# ----------------------------------------------------------------------------- the name table


def layer_parts(stack: str, i: int) -> list[tuple[str, str, str]]:
    """(kind, our prefix, Marian's prefix) of each part of layer i of `stack`: both
    directions walk this one table."""
    ours, theirs = f"{stack}.layers.{i}.", f"model.{stack}.layers.{i}."
    parts = [("attention", "self_attn.", "self_attn."), ("norm", "norm1.", "self_attn_layer_norm.")]
    if stack == "decoder":
        parts += [
            ("attention", "multihead_attn.", "encoder_attn."),
            ("norm", "norm2.", "encoder_attn_layer_norm."),
        ]
    last_norm = "norm3." if stack == "decoder" else "norm2."
    parts += [("ffn", "", ""), ("norm", last_norm, "final_layer_norm.")]
    return [(kind, ours + a, theirs + b) for kind, a, b in parts]


def all_layer_parts(c: ModelConfig) -> list[tuple[str, str, str]]:
    return [
        part
        for stack, n in (("encoder", c.n_encoder_layers), ("decoder", c.n_decoder_layers))
        for i in range(n)
        for part in layer_parts(stack, i)
    ]


def marian_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, the model dimension permuted where our positions are
    interleaved (see the module docstring)."""
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    c = model.config
    perm = _permutation(c)
    out: dict[str, torch.Tensor] = {}
    src, tgt = ours["src_embed.token.weight"][:, perm], ours["tgt_embed.token.weight"][:, perm]
    if c.tie_embeddings == "all":
        out["model.shared.weight"] = src
    out["model.encoder.embed_tokens.weight"] = src
    out["model.decoder.embed_tokens.weight"] = tgt
    out["lm_head.weight"] = ours["generator.weight"][:, perm]
    V = model.generator.weight.size(0)
    out["final_logits_bias"] = ours.get("generator.bias", torch.zeros(V))[None]  # (1, V)
    for kind, src_p, dst in all_layer_parts(c):
        {"attention": _attention_out, "norm": _norm_out, "ffn": _ffn_out}[kind](
            out, ours, src_p, dst, perm
        )
    return out


def tf_weights(marian: dict[str, torch.Tensor], c: ModelConfig) -> dict[str, torch.Tensor]:
    """A Marian state dict under our names, for a model of `c`: the inverse of
    `marian_weights` (no permutation for positions "halves", which every import of a Marian
    model has; a `tf` export's own layout restored). Tied matrices come from where transformers
    ties them: `model.shared` for one vocabulary, the decoder's embeddings for the generator."""
    inv = torch.argsort(_permutation(c))  # ours[:, i] = marian[:, inv[i]]
    shared = marian.get("model.shared.weight")
    src = shared if shared is not None else marian["model.encoder.embed_tokens.weight"]
    tgt = shared if shared is not None else marian["model.decoder.embed_tokens.weight"]
    # Every name of a tied matrix is given (a strict load wants them all): one tensor each.
    ours = {"src_embed.token.weight": src[:, inv], "tgt_embed.token.weight": tgt[:, inv]}
    head = marian["lm_head.weight"] if c.tie_embeddings == "none" else tgt
    ours["generator.weight"] = head[:, inv]
    if c.output_bias:
        ours["generator.bias"] = marian["final_logits_bias"].reshape(-1)
    for kind, dst, src_p in all_layer_parts(c):
        {"attention": _attention_in, "norm": _norm_in, "ffn": _ffn_in}[kind](
            ours, marian, src_p, dst, inv
        )
    return ours


def _permutation(c: ModelConfig) -> torch.Tensor:
    """Marian's dimension i is ours perm[i] (see `half_split_permutation`)."""
    if c.positions == "interleaved":
        return half_split_permutation(c.d_model)
    return torch.arange(c.d_model)


def _attention_out(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    """Split W_q, W_k, W_v from the fused matrix; permute their residual (input) side and
    W_o's residual (output) side."""
    weight, bias = ours[src + "in_proj_weight"], ours[src + "in_proj_bias"]
    D = weight.size(0) // 3
    for n, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[f"{dst}{name}.weight"] = weight[n * D : (n + 1) * D][:, perm]
        out[f"{dst}{name}.bias"] = bias[n * D : (n + 1) * D]
    out[dst + "out_proj.weight"] = ours[src + "out_proj.weight"][perm]
    out[dst + "out_proj.bias"] = ours[src + "out_proj.bias"][perm]


def _attention_in(ours: dict, marian: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    names = ("q_proj", "k_proj", "v_proj")
    ours[dst + "in_proj_weight"] = torch.cat([marian[f"{src}{n}.weight"][:, inv] for n in names])
    ours[dst + "in_proj_bias"] = torch.cat([marian[f"{src}{n}.bias"] for n in names])
    ours[dst + "out_proj.weight"] = marian[src + "out_proj.weight"][inv]
    ours[dst + "out_proj.bias"] = marian[src + "out_proj.bias"][inv]


def _ffn_out(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst + "fc1.weight"] = ours[src + "linear1.weight"][:, perm]
    out[dst + "fc1.bias"] = ours[src + "linear1.bias"]
    out[dst + "fc2.weight"] = ours[src + "linear2.weight"][perm]
    out[dst + "fc2.bias"] = ours[src + "linear2.bias"][perm]


def _ffn_in(ours: dict, marian: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    ours[dst + "linear1.weight"] = marian[src + "fc1.weight"][:, inv]
    ours[dst + "linear1.bias"] = marian[src + "fc1.bias"]
    ours[dst + "linear2.weight"] = marian[src + "fc2.weight"][inv]
    ours[dst + "linear2.bias"] = marian[src + "fc2.bias"][inv]


def _norm_out(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst + "weight"] = ours[src + "weight"][perm]
    out[dst + "bias"] = ours[src + "bias"][perm]


def _norm_in(ours: dict, marian: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    ours[dst + "weight"] = marian[src + "weight"][inv]
    ours[dst + "bias"] = marian[src + "bias"][inv]
