"""A `tf` model as a Hugging Face `MarianMTModel` directory with a fast tokenizer, loaded as any
translation model is (`AutoTokenizer`, `AutoModelForSeq2SeqLM`, `generate`), with a model card.

Marian is the same Post-LN encoder-decoder (ReLU FFN, embeddings x sqrt(D), sinusoidal
positions), with three differences proven away by the tests:

- Positions: Marian lays sin and cos out in halves, [sin f_0 .. sin f_{D/2-1} | cos ...]; ours
  interleave them, [sin f_0, cos f_0, sin f_1, ...]. Permuting the model dimension (the residual
  stream) the same way everywhere, in embeddings, norms and the D-sized side of every
  projection, gives a network that computes exactly the same logits, whose positions are
  Marian's. Attention heads are untouched: only the residual side of Q, K, V is permuted.
- Separate q/k/v projections: our fused (3D, D) matrices are split in rows.
- Special tokens: the decoder starts from BOS (`decoder_start_token_id`), `final_logits_bias` is
  zero. Our sources carry no EOS, and MarianTokenizer appends one to every source: the export
  has a fast tokenizer of its own instead, which appends nothing (`cli.exporters.hf_tokenizer`).

`generation_config.json` makes a bare `generate(**inputs)` tf's greedy search: one beam, EOS
blocked for `decode.min_len` tokens, and tf's length limit, which is one number for all
sentences in `transformers` (`max_length`) but `a * len(src) + b` per sentence in tf: exact when
`decode.max_len_a` is 0, else the model's own limit, which only a sentence that tf cuts at its
limit (no EOS in sight) ever reaches.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cli.config import Config, DecodeConfig
from cli.exporters.hf_tokenizer import write_tokenizer
from data.errors import InputError
from data.tokenizer import Tokenizer
from model.transformer import Transformer


def half_split_permutation(d_model: int) -> torch.Tensor:
    """Marian's index i holds our index perm[i]: even (sin) dimensions first, then odd (cos)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def export_marian(model: Transformer, tokenizer: Tokenizer, config: Config, out: Path) -> None:
    """Write `model` as a MarianMTModel directory `out`, with its tokenizer: what
    `AutoModelForSeq2SeqLM` and `AutoTokenizer` load (the model card is written by the caller)."""
    from transformers import MarianConfig, MarianMTModel

    c = model.config
    if c.norm_first:
        raise InputError("Marian is Post-LN only: a Pre-LN (norm_first) model cannot be exported")
    if c.d_head and c.d_head * c.n_heads != c.d_model:
        raise InputError(
            "Marian's heads span d_model: a model with pruned heads cannot be exported"
        )
    tie = c.tie_embeddings
    special = dict(
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        forced_eos_token_id=tokenizer.eos_id,  # as our search: EOS forced at the length limit
        decoder_start_token_id=tokenizer.bos_id,
    )
    marian_config = MarianConfig(
        vocab_size=tokenizer.src_vocab_size,
        decoder_vocab_size=tokenizer.tgt_vocab_size,
        share_encoder_decoder_embeddings=tie == "all",
        tie_word_embeddings=tie != "none",
        max_position_embeddings=c.max_positions,
        d_model=c.d_model,
        encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function="relu",
        scale_embedding=True,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        **special,
    )
    marian = MarianMTModel(marian_config).eval()
    missing, unexpected = marian.load_state_dict(marian_weights(model), strict=False)
    allowed = {"final_logits_bias", "lm_head.weight"} | {
        k for k in marian.state_dict() if "embed_positions" in k or "embed_tokens" in k
    }
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"weights that do not fit Marian: {unexpected or missing}")
    marian.generation_config = generation_config(special, config.decode, c.max_positions)
    marian.save_pretrained(out, safe_serialization=True)
    write_tokenizer(tokenizer, out, c.max_positions)


def generation_config(special: dict[str, int], decode: DecodeConfig, max_positions: int):
    """What a bare `generate` does: tf's greedy search (see the module docstring)."""
    from transformers import GenerationConfig

    most = max_positions - 1  # tokens before the EOS, as `search_batch` clamps them
    tokens = max(1, min(int(decode.max_len_b), most)) if decode.max_len_a == 0 else most
    extra = {"min_new_tokens": decode.min_len} if decode.min_len else {}
    return GenerationConfig(
        **special,
        **extra,
        num_beams=1,
        do_sample=False,
        max_length=tokens + 2,  # BOS, the tokens, the EOS forced at the limit
    )


def marian_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, the model dimension permuted (see the docstring)."""
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    D = model.config.d_model
    perm = half_split_permutation(D)
    out: dict[str, torch.Tensor] = {}
    src, tgt = ours["src_embed.token.weight"][:, perm], ours["tgt_embed.token.weight"][:, perm]
    out["model.shared.weight"] = src
    out["model.encoder.embed_tokens.weight"] = src
    out["model.decoder.embed_tokens.weight"] = tgt
    out["lm_head.weight"] = ours["generator.weight"][:, perm]
    out["final_logits_bias"] = torch.zeros(1, model.generator.weight.size(0))
    positions = model.src_embed.positions.float().cpu()[:, perm]  # Marian's [sin | cos] table
    for stack in ("encoder", "decoder"):
        out[f"model.{stack}.embed_positions.weight"] = positions
    for i in range(model.config.n_encoder_layers):
        src_p, dst = f"encoder.layers.{i}.", f"model.encoder.layers.{i}."
        _attention(out, ours, src_p + "self_attn.", dst + "self_attn.", perm, D)
        _norm(out, ours, src_p + "norm1.", dst + "self_attn_layer_norm.", perm)
        _ffn(out, ours, src_p, dst, perm)
        _norm(out, ours, src_p + "norm2.", dst + "final_layer_norm.", perm)
    for i in range(model.config.n_decoder_layers):
        src_p, dst = f"decoder.layers.{i}.", f"model.decoder.layers.{i}."
        _attention(out, ours, src_p + "self_attn.", dst + "self_attn.", perm, D)
        _norm(out, ours, src_p + "norm1.", dst + "self_attn_layer_norm.", perm)
        _attention(out, ours, src_p + "multihead_attn.", dst + "encoder_attn.", perm, D)
        _norm(out, ours, src_p + "norm2.", dst + "encoder_attn_layer_norm.", perm)
        _ffn(out, ours, src_p, dst, perm)
        _norm(out, ours, src_p + "norm3.", dst + "final_layer_norm.", perm)
    return out


def _attention(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor, D: int) -> None:
    """Split W_q, W_k, W_v from the fused matrix; permute their residual (input) side and
    W_o's residual (output) side."""
    weight, bias = ours[src + "in_proj_weight"], ours[src + "in_proj_bias"]
    for n, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[f"{dst}{name}.weight"] = weight[n * D : (n + 1) * D][:, perm]
        out[f"{dst}{name}.bias"] = bias[n * D : (n + 1) * D]
    out[dst + "out_proj.weight"] = ours[src + "out_proj.weight"][perm]
    out[dst + "out_proj.bias"] = ours[src + "out_proj.bias"][perm]


def _ffn(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst + "fc1.weight"] = ours[src + "linear1.weight"][:, perm]
    out[dst + "fc1.bias"] = ours[src + "linear1.bias"]
    out[dst + "fc2.weight"] = ours[src + "linear2.weight"][perm]
    out[dst + "fc2.bias"] = ours[src + "linear2.bias"][perm]


def _norm(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst + "weight"] = ours[src + "weight"][perm]
    out[dst + "bias"] = ours[src + "bias"][perm]
