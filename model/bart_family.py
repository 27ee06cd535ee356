"""A `Transformer`'s state dict under the names of Hugging Face's BART family, and back: one
table of names for both directions, so that an export imported again (or an import exported
again) is the same tensors. `MarianMTModel` (`model/marian.py`), `M2M100ForConditionalGeneration`
(NLLB-200 and M2M100, `model/m2m100.py`) and `MBartForConditionalGeneration` (mBART-50,
`model/mbart.py`) name their layers alike (`self_attn.{q,k,v,out}_proj`, `self_attn_layer_norm`,
`encoder_attn`, `fc1`, `fc2`, `final_layer_norm`); what a family adds is a switch of
`ModelConfig`, and the table holds it where the model has it:

- `encoder.norm`, `decoder.norm`: `model.{stack}.layer_norm`, where `norm_first` (M2M100, mBART);
- `{src,tgt}_embed.norm`: `model.{stack}.layernorm_embedding`, where `layernorm_embedding`
  (mBART);
- `{src,tgt}_embed.positions`: `model.{stack}.embed_positions.weight`, where `positions:
  learned` (mBART);
- `generator.bias`: `final_logits_bias` (1, V), where `output_bias` (Marian, mBART).

Pure torch: `cli/exporters` and `cli/importers` read and write the files. What the names hide:

- Our fused (3D, D) q/k/v matrices are their three, stacked in rows.
- Positions: the family lays sin and cos out in halves, [sin f_0 .. sin f_{D/2-1} | cos ...]
  (`ModelConfig.positions` "halves", "fairseq"); by default ours interleave them. Moving such
  a model to Marian permutes the model dimension (the residual stream) the same way
  everywhere, in embeddings, norms and the D-sized side of every projection: a network that
  computes exactly the same logits, whose positions are Marian's. Attention heads are
  untouched: only the residual side of Q, K, V is permuted. Coming back undoes it.
"""

from __future__ import annotations

import torch

from model.transformer import ModelConfig, Transformer


def half_split_permutation(d_model: int) -> torch.Tensor:
    """Their index i holds our index perm[i]: even (sin) dimensions first, then odd (cos)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def layer_parts(stack: str, i: int) -> list[tuple[str, str, str]]:
    """(kind, our prefix, their prefix) of each part of layer i of `stack`: both directions
    walk this one table."""
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


def stack_parts(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(kind, ours, theirs) of what surrounds each stack's layers, where `c` has it."""
    parts = []
    for stack, embed in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        theirs = f"model.{stack}."
        if c.norm_first:  # Pre-LN: each stack ends in a norm
            parts.append(("norm", f"{stack}.norm.", theirs + "layer_norm."))
        if c.layernorm_embedding:
            parts.append(("norm", f"{embed}.norm.", theirs + "layernorm_embedding."))
        if c.positions == "learned":
            parts.append(("positions", f"{embed}.positions", theirs + "embed_positions.weight"))
    return parts


def all_parts(c: ModelConfig) -> list[tuple[str, str, str]]:
    layers = [
        part
        for stack, n in (("encoder", c.n_encoder_layers), ("decoder", c.n_decoder_layers))
        for i in range(n)
        for part in layer_parts(stack, i)
    ]
    return layers + stack_parts(c)


def hf_weights(model: Transformer, logits_bias: bool = True) -> dict[str, torch.Tensor]:
    """Our weights under the family's names, the model dimension permuted where our positions
    are interleaved (see the module docstring). `logits_bias`: whether the family has
    `final_logits_bias` (Marian, mBART; M2M100 has none, so `model.output_bias` cannot go)."""
    c = model.config
    if c.output_bias and not logits_bias:
        raise ValueError("model.output_bias: this model family has no bias on its logits")
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    perm = _permutation(c)
    out: dict[str, torch.Tensor] = {}
    src, tgt = ours["src_embed.token.weight"][:, perm], ours["tgt_embed.token.weight"][:, perm]
    if c.tie_embeddings == "all":
        out["model.shared.weight"] = src
    out["model.encoder.embed_tokens.weight"] = src
    out["model.decoder.embed_tokens.weight"] = tgt
    out["lm_head.weight"] = ours["generator.weight"][:, perm]
    if logits_bias:
        V = model.generator.weight.size(0)
        out["final_logits_bias"] = ours.get("generator.bias", torch.zeros(V))[None]  # (1, V)
    for kind, src_p, dst in all_parts(c):
        OUT[kind](out, ours, src_p, dst, perm)
    return out


def tf_weights(hf: dict[str, torch.Tensor], c: ModelConfig) -> dict[str, torch.Tensor]:
    """A state dict of the family under our names, for a model of `c`: the inverse of
    `hf_weights` (no permutation for positions "halves", which every import has; a `tf`
    export's own layout restored). Tied matrices come from where transformers ties them:
    `model.shared` for one vocabulary, the decoder's embeddings for the generator."""
    inv = torch.argsort(_permutation(c))  # ours[:, i] = theirs[:, inv[i]]
    shared = hf.get("model.shared.weight")
    src = shared if shared is not None else hf["model.encoder.embed_tokens.weight"]
    tgt = shared if shared is not None else hf["model.decoder.embed_tokens.weight"]
    # Every name of a tied matrix is given (a strict load wants them all): one tensor each.
    ours = {"src_embed.token.weight": src[:, inv], "tgt_embed.token.weight": tgt[:, inv]}
    head = hf["lm_head.weight"] if c.tie_embeddings == "none" else tgt
    ours["generator.weight"] = head[:, inv]
    if c.output_bias:
        ours["generator.bias"] = hf["final_logits_bias"].reshape(-1)
    for kind, dst, src_p in all_parts(c):
        IN[kind](ours, hf, src_p, dst, inv)
    return ours


# The family's tensors with a row (a column for the bias) per vocabulary id.
VOCABULARY_ROWS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)


def reorder_vocabulary(hf: dict[str, torch.Tensor], order: torch.Tensor) -> dict:
    """`hf` with its vocabulary reordered: id i of the result is id order[i] of `hf` (an
    export puts `<pad>` last, as OPUS-MT does; an import of it takes the inverse)."""
    out = dict(hf)
    for name in VOCABULARY_ROWS:
        if name in out:
            out[name] = out[name][order]
    if "final_logits_bias" in out:
        out["final_logits_bias"] = out["final_logits_bias"][:, order]  # (1, V)
    return out


def _permutation(c: ModelConfig) -> torch.Tensor:
    """Their dimension i is ours perm[i] (see `half_split_permutation`)."""
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


def _attention_in(ours: dict, hf: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    names = ("q_proj", "k_proj", "v_proj")
    ours[dst + "in_proj_weight"] = torch.cat([hf[f"{src}{n}.weight"][:, inv] for n in names])
    ours[dst + "in_proj_bias"] = torch.cat([hf[f"{src}{n}.bias"] for n in names])
    ours[dst + "out_proj.weight"] = hf[src + "out_proj.weight"][inv]
    ours[dst + "out_proj.bias"] = hf[src + "out_proj.bias"][inv]


def _ffn_out(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst + "fc1.weight"] = ours[src + "linear1.weight"][:, perm]
    out[dst + "fc1.bias"] = ours[src + "linear1.bias"]
    out[dst + "fc2.weight"] = ours[src + "linear2.weight"][perm]
    out[dst + "fc2.bias"] = ours[src + "linear2.bias"][perm]


def _ffn_in(ours: dict, hf: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    ours[dst + "linear1.weight"] = hf[src + "fc1.weight"][:, inv]
    ours[dst + "linear1.bias"] = hf[src + "fc1.bias"]
    ours[dst + "linear2.weight"] = hf[src + "fc2.weight"][inv]
    ours[dst + "linear2.bias"] = hf[src + "fc2.bias"][inv]


def _norm_out(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst + "weight"] = ours[src + "weight"][perm]
    out[dst + "bias"] = ours[src + "bias"][perm]


def _norm_in(ours: dict, hf: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    ours[dst + "weight"] = hf[src + "weight"][inv]
    ours[dst + "bias"] = hf[src + "bias"][inv]


def _positions_out(out: dict, ours: dict, src: str, dst: str, perm: torch.Tensor) -> None:
    out[dst] = ours[src][:, perm]  # (P + offset, D): a learned table, row for row


def _positions_in(ours: dict, hf: dict, src: str, dst: str, inv: torch.Tensor) -> None:
    ours[dst] = hf[src][:, inv]


# Each kind of part, one way and the other.
OUT = {"attention": _attention_out, "norm": _norm_out, "ffn": _ffn_out, "positions": _positions_out}
IN = {"attention": _attention_in, "norm": _norm_in, "ffn": _ffn_in, "positions": _positions_in}
