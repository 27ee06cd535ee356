"""A `Transformer`'s state dict under the names of Hugging Face's `MarianMTModel`, and back: one
table of names for both directions, so that an export imported again (or an import exported
again) is the same tensors. Pure torch: `cli/exporters` and `cli/importers` read and write the
files.

The two networks compute the same function (see `cli/exporters/marian.py` for the switches);
what the names hide:

- Our fused (3D, D) q/k/v matrices are Marian's three, stacked in rows.
- Positions: Marian lays sin and cos out in halves, [sin f_0 .. sin f_{D/2-1} | cos ...]
  (`ModelConfig.positions` "halves", what an import gets); by default ours interleave them.
  Moving such a model to Marian permutes the model dimension (the residual stream) the same
  way everywhere, in embeddings, norms and the D-sized side of every projection: a network
  that computes exactly the same logits, whose positions are Marian's. Attention heads are
  untouched: only the residual side of Q, K, V is permuted. Coming back undoes it.
"""

from __future__ import annotations

import torch

from model.transformer import ModelConfig, Transformer


def half_split_permutation(d_model: int) -> torch.Tensor:
    """Marian's index i holds our index perm[i]: even (sin) dimensions first, then odd (cos)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


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


# Marian's tensors with a row (a column for the bias) per vocabulary id.
VOCABULARY_ROWS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)


def reorder_vocabulary(marian: dict[str, torch.Tensor], order: torch.Tensor) -> dict:
    """`marian` with its vocabulary reordered: id i of the result is id order[i] of `marian`
    (an export puts `<pad>` last, as OPUS-MT does; an import of it takes the inverse)."""
    out = dict(marian)
    for name in VOCABULARY_ROWS:
        if name in out:
            out[name] = out[name][order]
    if "final_logits_bias" in out:
        out["final_logits_bias"] = out["final_logits_bias"][:, order]  # (1, V)
    return out


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
