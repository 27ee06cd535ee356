"""LoRA (Hu et al., 2021, "Low-Rank Adaptation of Large Language Models"): fine-tune a frozen
model through a trainable low-rank update of some of its weights, W x + (alpha / r) B A x.

`add_lora` gives every encoder and decoder layer adapters on the projections a user names
(`LORA_TARGETS`): `q`, `k`, `v` (rows of the attention's fused `in_proj_weight`), `o`
(`out_proj`) and `ffn` (`linear1` and `linear2`). A starts as peft's (kaiming-uniform,
a = sqrt(5)), B at zero, so an adapted model computes exactly what its base does until B
trains. The base weights keep their names and Parameters: a base state dict loads into an
adapted model with `strict=False`, only the adapters' keys missing. Training runs the low-rank
path, W x + scale B (A dropout(x)), never W + BA, so a frozen W gets no gradient matmul.
`merge_lora` folds the adapters into W and removes them: the model is an ordinary Transformer
again, for export, averaging, pruning and packing. Written for `tf`'s modules rather than
through peft, whose adapters wrap `nn.Linear` layers by name: `tf`'s W_q, W_k and W_v are
rows of one fused Parameter, which peft cannot adapt one by one.

Adapters live in their base weight's dtype and device, as every other parameter of a `tf`
model (which trains in float32, autocast making its matmuls bf16). Add them before the model
is wrapped (DistributedDataParallel, `torch.compile`) and its optimizer built.

Who reads weights directly: the model's own forward, `decode_step` and so every search apply
the adapters (in_proj's through `MultiheadAttention._in_proj`, packed or not; `LoraLinear`
through its forward, `linear_activation` included); the generator is never adapted, so the
loss's direct read of `generator.weight` is right. Pruning (`tf prune`), the exporters,
`tf average` and int8 quantisation read or copy `.weight` alone: they must be given merged
models (`merge_lora`).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from data.ranges import first_out_of_range, ranged
from model.attention import MultiheadAttention
from model.dropout import Dropout
from model.packed import PackedLinear
from model.transformer import (
    DecoderLayer,
    Embedding,
    EncoderLayer,
    ModelConfig,
    Transformer,
    dropped,
)

# What a user names: W_q, W_k, W_v (rows of in_proj), W_o (out_proj); ffn: linear1 and linear2.
LORA_TARGETS = ("q", "k", "v", "o", "ffn")
# What `freeze_for_lora` leaves trainable beside the adapters, when named: the groups add up
# (a parameter trains wherever one of the groups named trains it).
NEW_ROWS = "embeddings_of_new_languages"  # some rows of matrices, where the others are whole
TRAINABLE_GROUPS = ("norms", "output_bias", "embeddings", "positions", NEW_ROWS)


@dataclass
class LoraConfig:
    """`train.lora`: each number declares its range (`ranged`: `data.ranges`), which the
    config's loader checks (`cli/config.py`) and `check_lora` too."""

    # 0: LoRA off (the default: a full fine-tuning, as before).
    rank: int = ranged(0, "[0, inf)")
    # The update is (alpha / rank) B A, as Hu et al. 2021 and peft.
    alpha: float = ranged(16.0, "(0, inf)")
    # On the adapter's input only, as peft's lora_dropout.
    dropout: float = ranged(0.0, "[0, 1)")
    targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "o"])


def _nearest(name: str, names: tuple[str, ...]) -> str:
    """' (did you mean X?)' for the valid name nearest `name`, or '' when none is near."""
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.0)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _widths(model: ModelConfig) -> dict[str, int]:
    """min(in, out) features of each target's layers: the largest rank that is not a waste."""
    inner = model.n_heads * (model.d_head or model.d_model // model.n_heads)  # D unless pruned
    attention = min(model.d_model, inner)  # W_q, W_k, W_v (inner, D); W_o (D, inner)
    ffn = min(model.d_model, model.d_ff)  # linear1 (d_ff, D), linear2 (D, d_ff)
    return {"q": attention, "k": attention, "v": attention, "o": attention, "ffn": ffn}


def check_lora(lora: LoraConfig, model: ModelConfig) -> None:
    """Raise ValueError, one line for the user, on settings that make no sense for `model`.

    Rank 0 (LoRA off) is valid; the target names, alpha and dropout are checked at any rank
    (a typo shows before it matters), a missing target and a rank above a targeted layer's
    width only where LoRA is on.
    """
    _check_settings(lora)
    if lora.rank == 0:
        return
    widths = _widths(model)
    for name in dict.fromkeys(lora.targets):
        if lora.rank > widths[name]:
            raise ValueError(
                f"rank {lora.rank} is above the width of target {name!r}: "
                f"{widths[name]} (min of its layers' in and out features)"
            )


def _check_settings(lora: LoraConfig) -> None:
    """`check_lora`'s checks that need no model: all but the widths. Each number in the range
    its field declares (`data.ranges`: a config file's were checked so already)."""
    problem = first_out_of_range(lora)
    if problem:
        raise ValueError(problem)
    for name in lora.targets:
        if name not in LORA_TARGETS:
            raise ValueError(
                f"unknown target {name!r}{_nearest(name, LORA_TARGETS)}; "
                f"the targets are {', '.join(LORA_TARGETS)}"
            )
    if lora.rank > 0 and not lora.targets:
        raise ValueError(f"no target: name one or more of {', '.join(LORA_TARGETS)}")


class LoraAdapter(nn.Module):
    """The low-rank update of a weight W (out, in): x (..., in) -> scale B A dropout(x)
    (..., out), scale = alpha / rank. Parameters A (rank, in) and B (out, rank)."""

    def __init__(
        self,
        weight: Tensor,
        lora: LoraConfig,
        generator: torch.Generator | None = None,
    ):
        """weight: the (out, in) weight (or rows of one) it updates: its shape, dtype, device."""
        super().__init__()
        out_features, in_features = weight.shape
        # peft's initialisation (that of nn.Linear): uniform in +-1/sqrt(in), drawn on the CPU
        # (where a seeded `generator` lives) whatever the device: the same A on any.
        a = torch.empty(lora.rank, in_features, dtype=weight.dtype)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.A = nn.Parameter(a.to(weight.device))
        like = dict(dtype=weight.dtype, device=weight.device)
        self.B = nn.Parameter(torch.zeros(out_features, lora.rank, **like))
        self.scale = lora.alpha / lora.rank
        self.dropout = Dropout(lora.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) -> (..., out), through the rank-wide product only: scaled there, where it
        is narrowest."""
        return F.linear(F.linear(dropped(self.dropout, x), self.A) * self.scale, self.B)

    def delta(self, dtype: torch.dtype) -> Tensor:
        """scale B A (out, in) in `dtype`, what merging adds to W."""
        return self.scale * (self.B.detach().to(dtype) @ self.A.detach().to(dtype))


class LoraLinear(nn.Linear):
    """An nn.Linear with an adapter: y = x W^T + b + `lora`(x). It shares the layer's own
    `weight` and `bias` Parameters, which keep their names in a state dict (`lora` adds
    `lora.A` and `lora.B`).

    Code that reads `.weight` directly sees the base weight alone: `pack_linears` leaves
    these layers unpacked (it packs exact `nn.Linear`s only), so a packed adapted model still
    computes its update; pruning (`tf prune`), the exporters, `tf average` and int8
    quantisation (`model.int8.quantize_linears`, which also skips this type) must be
    given merged models (`merge_lora`).
    """

    def __init__(self, base: nn.Linear, lora: LoraAdapter):
        # On "meta": no weight allocated nor initialised, the base's Parameters replace them.
        super().__init__(base.in_features, base.out_features, base.bias is not None, device="meta")
        self.weight, self.bias = base.weight, base.bias
        self.lora = lora

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora(x)

    def plain(self) -> nn.Linear:
        """An nn.Linear holding the same Parameters, without the adapter."""
        linear = nn.Linear(
            self.in_features, self.out_features, self.bias is not None, device="meta"
        )
        linear.weight, linear.bias = self.weight, self.bias
        return linear


def _adapted_layers(model: nn.Module):
    """Each encoder and decoder layer of `model`, in module order."""
    return [m for m in model.modules() if isinstance(m, (EncoderLayer, DecoderLayer))]


def _refuse_packed(model: nn.Module, doing: str) -> None:
    """Packed copies of weights (`model.packed.pack_linears`) would not follow a merge, nor
    an adapted out_proj or FFN layer its packed twin: adapt and merge before packing."""
    for module in model.modules():
        if isinstance(module, PackedLinear) or getattr(module, "packed", None):
            raise ValueError(f"{doing} a packed model: do it before `pack_linears`")


def add_lora(
    model: nn.Module, lora: LoraConfig, seed_generator: torch.Generator | None = None
) -> list[str]:
    """Give `model` adapters, in place, on every targeted layer of every encoder and decoder
    layer: self-attention, cross-attention (its W_q on the decoder states, W_k and W_v on the
    encoder's output) and the feed-forward.

    Args:
        model: a Transformer (or a module holding its layers), unpacked, without adapters.
        lora: the settings; rank 0 does nothing.
        seed_generator: where A's random values come from (torch's global generator if None;
            drawing from it moves what dropout draws next).

    Returns:
        The adapters' parameter names, as `model.named_parameters()` gives them; [] at rank 0.
    """
    if lora.rank == 0:
        return []
    if isinstance(model, Transformer):
        check_lora(lora, model.config)
    else:
        _check_settings(lora)
    if lora_parameters(model):
        raise ValueError("the model has LoRA adapters already")
    _refuse_packed(model, "adding LoRA to")
    targets = set(lora.targets)
    for layer in _adapted_layers(model):
        _adapt_attention(layer.self_attn, targets, lora, seed_generator)
        if isinstance(layer, DecoderLayer):
            _adapt_attention(layer.multihead_attn, targets, lora, seed_generator)
        if "ffn" in targets:
            layer.linear1 = _adapted_linear(layer.linear1, lora, seed_generator)
            layer.linear2 = _adapted_linear(layer.linear2, lora, seed_generator)
    return lora_parameters(model)


def _adapt_attention(
    attention: MultiheadAttention,
    targets: set[str],
    lora: LoraConfig,
    generator: torch.Generator | None,
) -> None:
    """Adapters on the attention's targeted projections: `lora_q`, `lora_k`, `lora_v` on its
    rows of in_proj (which `MultiheadAttention._in_proj` adds to its part's columns), and
    `out_proj` made a `LoraLinear`."""
    for i, part in enumerate("qkv"):
        if part in targets:
            rows = attention.in_proj_weight[_part_rows(attention, i)]
            setattr(attention, f"lora_{part}", LoraAdapter(rows, lora, generator))
    if "o" in targets:
        attention.out_proj = _adapted_linear(attention.out_proj, lora, generator)


def _adapted_linear(
    base: nn.Linear, lora: LoraConfig, generator: torch.Generator | None
) -> LoraLinear:
    return LoraLinear(base, LoraAdapter(base.weight, lora, generator))


def _part_rows(attention: MultiheadAttention, i: int) -> slice:
    """in_proj's rows of W_q (i = 0), W_k (1) or W_v (2)."""
    return slice(i * attention.inner, (i + 1) * attention.inner)


def lora_parameters(model: nn.Module) -> list[str]:
    """The names of the adapters' parameters in `model`, in `named_parameters()` order."""
    adapters = [m for m in model.modules() if isinstance(m, LoraAdapter)]
    ids = {id(p) for adapter in adapters for p in adapter.parameters()}
    return [name for name, p in model.named_parameters() if id(p) in ids]


@torch.no_grad()
def _fold(weight: Tensor, adapter: LoraAdapter) -> None:
    """weight (or a view of its rows) += scale B A, in place, computed in float32 (or the
    weight's dtype where wider) and rounded once to the weight's dtype."""
    dtype = torch.promote_types(weight.dtype, torch.float32)
    weight.copy_(weight.to(dtype) + adapter.delta(dtype))


def merge_lora(model: nn.Module) -> None:
    """Fold every adapter into its base weight (W += alpha / rank B A) and remove it, in place.

    The model is an ordinary Transformer again: the state dict keys and shapes of one that
    never had LoRA, the same Parameters (their requires_grad as they were). What reads weights
    directly (the exporters, `tf average`, `tf prune`, `pack_linears`, int8 quantisation)
    should see merged models only. A model without adapters is left as it is; a packed one
    with adapters is refused (its packed copies would keep the unmerged weights): merge first.
    """
    if not lora_parameters(model):
        return
    _refuse_packed(model, "merging LoRA in")
    for module in list(model.modules()):
        if isinstance(module, MultiheadAttention):
            for i, part in enumerate("qkv"):
                adapter = getattr(module, f"lora_{part}")
                if adapter is not None:
                    _fold(module.in_proj_weight[_part_rows(module, i)], adapter)
                    delattr(module, f"lora_{part}")  # a plain None again: read at no cost
                    setattr(module, f"lora_{part}", None)
        for name, child in list(module.named_children()):
            if isinstance(child, LoraLinear):
                _fold(child.weight, child.lora)
                setattr(module, name, child.plain())


def _group_parameters(model: nn.Module, group: str) -> list[nn.Parameter]:
    """The parameters of one of `TRAINABLE_GROUPS`."""
    modules = list(model.modules())
    if group == "norms":
        norms = [m for m in modules if isinstance(m, nn.LayerNorm)]
        return [p for m in norms for p in (m.weight, m.bias) if p is not None]
    if group == "output_bias":
        bias = getattr(getattr(model, "generator", None), "bias", None)
        return [] if bias is None else [bias]
    if group == "embeddings":  # tied ones are one Parameter (the generator's too, when tied)
        return [m.weight for m in modules if isinstance(m, nn.Embedding)]
    tables = [m.positions for m in modules if isinstance(m, Embedding)]
    return [table for table in tables if isinstance(table, nn.Parameter)]  # learned ones


def freeze_for_lora(
    model: nn.Module, trainable: list[str], new_rows: dict[str, int] | None = None
) -> list[str]:
    """Set requires_grad False on every parameter but the adapters and the `trainable` groups.

    Args:
        trainable: names of `TRAINABLE_GROUPS`: "norms" (every LayerNorm's weight and bias),
            "output_bias" (the generator's bias, where the model has one), "embeddings" (the
            token embeddings, tied ones once), "positions" (learned position tables),
            "embeddings_of_new_languages" (the rows `new_rows` names, alone).
        new_rows: {parameter name: its first row of a new language}: those parameters train,
            where no other group trains them whole (`rows_trained_alone`), a gradient hook
            zeroing every earlier row's gradient (Adam without weight decay then leaves those
            rows exactly as they are: its moments stay zero).

    Returns:
        The names of the parameters left trainable, in `named_parameters()` order.
    """
    for group in trainable:
        if group not in TRAINABLE_GROUPS:
            raise ValueError(
                f"unknown trainable group {group!r}{_nearest(group, TRAINABLE_GROUPS)}; "
                f"the groups are {', '.join(TRAINABLE_GROUPS)}"
            )
    adapters = set(lora_parameters(model))
    keep = {id(p) for name, p in model.named_parameters() if name in adapters}
    keep |= _whole(model, trainable)
    keep |= _train_new_rows(model, rows_trained_alone(model, trainable, new_rows))
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _whole(model: nn.Module, trainable: list[str]) -> set[int]:
    """The ids of the parameters that the groups `trainable` names train whole."""
    groups = [group for group in dict.fromkeys(trainable) if group != NEW_ROWS]
    return {id(p) for group in groups for p in _group_parameters(model, group)}


def rows_trained_alone(
    model: nn.Module, trainable: list[str], new_rows: dict[str, int] | None
) -> dict[str, int]:
    """The entries of `new_rows` ({parameter name: its first new row}) whose parameter trains
    its new rows alone: none unless `trainable` names `embeddings_of_new_languages`, and none
    of a parameter that another group it names trains whole (`embeddings`: the token
    embeddings; `output_bias`): the groups add up, the whole matrix winning."""
    if NEW_ROWS not in trainable or not new_rows:
        return {}
    whole = _whole(model, trainable)
    params = dict(model.named_parameters(remove_duplicate=False))
    return {name: first for name, first in new_rows.items() if id(params[name]) not in whole}


def _train_new_rows(model: nn.Module, new_rows: dict[str, int]) -> set[int]:
    """Hooks on the parameters `new_rows` names that keep only their new rows' gradient; the
    ids of those parameters. A tied matrix (named twice) gets one hook."""
    params = dict(model.named_parameters(remove_duplicate=False))
    hooked: set[int] = set()
    for name, first in new_rows.items():
        p = params[name]
        if id(p) in hooked:
            continue
        keep = torch.zeros(p.size(0), *([1] * (p.dim() - 1)), dtype=p.dtype, device=p.device)
        keep[first:] = 1  # (V, 1) or (V,): the new rows' gradient, the others' zeroed
        p.register_hook(lambda grad, keep=keep: grad * keep.to(grad.dtype))
        hooked.add(id(p))
    return hooked
