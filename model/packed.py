"""Linear layers for decoding on a CPU, through oneDNN with their weights packed once.

PyTorch runs a float32 linear layer on the CPU through MKL's sgemm; oneDNN with the weight
reordered once into its blocked layout (the kernels `torch.compile` uses on CPUs,
`mkldnn._linear_pointwise`) runs a decoding step's shapes faster, the same float32 arithmetic
in another order (its errors against float64 of the same size as MKL's). Under bf16 autocast,
a weight packed in bf16 gives autocast's result exactly, without its cast of the weight and
its reorder at every call. `pack_linears` gives a model such layers for decoding; training,
other dtypes and anything needing gradients go through `F.linear` on the weights they keep,
so a packed model computes anything a plain one does. (The rates and times measured are in
docs/performance.md.)

oneDNN builds a kernel per input shape, as in half precision: decoding a packed model pads
its shapes (`cli.inference.shapes`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

# Below this many multiply-adds (rows x inputs x outputs) a float32 layer runs MKL's sgemm on
# its plain weight: a call to oneDNN costs a fixed time more than one to MKL, which it wins
# back on larger products only (the crossing measured: docs/performance.md).
SMALL_MACS = 1 << 22


def can_pack(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this PyTorch has oneDNN's packed linear kernels, in bf16 only where the CPU
    computes it natively (as autocast's own matmuls use oneDNN only there)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(
        torch.ops.mkldnn, "_linear_pointwise"
    ):
        return False
    return dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """y = x W^T + b with W packed for oneDNN in `dtype`: float32, or bfloat16 for decoding
    under CPU autocast (whose result it equals exactly, without casting W at every call).
    `weight` and `bias` stay for everything else: gradients, other dtypes and devices."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight, self.bias, self.dtype = weight, bias, dtype  # the model owns the first two
        self.out_features, self.in_features = weight.shape
        with torch.no_grad():
            w = weight.detach().to(dtype).contiguous()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w)
            self.packed_bias = None if bias is None else bias.detach().to(dtype).contiguous()

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """xW^T + b, and then ReLU where `relu` says (in the kernel where it runs one)."""
        if torch.is_grad_enabled() or x.device.type != "cpu":
            return _then_relu(F.linear(x, self.weight, self.bias), relu)
        autocast = torch.is_autocast_enabled("cpu")
        if autocast and torch.get_autocast_dtype("cpu") == self.dtype != torch.float32:
            x = x.to(self.dtype)  # as autocast would
        elif autocast or x.dtype != self.dtype or x.numel() * self.out_features < SMALL_MACS:
            return _then_relu(F.linear(x, self.weight, self.bias), relu)
        return self.packed_linear(x, relu)

    def packed_linear(self, x: Tensor, relu: bool = False) -> Tensor:
        """oneDNN's kernel on the packed weight, x already in `dtype`."""
        post = "relu" if relu else "none"
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, post, [], "")


def _then_relu(y: Tensor, relu: bool) -> Tensor:
    return F.relu(y) if relu else y


def linear_activation(linear: nn.Module, activation: Callable[[Tensor], Tensor], x: Tensor):
    """activation(linear(x)). A packed layer runs ReLU in its kernel, as oneDNN's post-op on
    the float32 sums: the same numbers without another pass over the (N, d_ff) activations."""
    if activation is F.relu and isinstance(linear, PackedLinear):
        return linear(x, relu=True)
    return activation(linear(x))


def pack_linears(model: nn.Module, dtype: torch.dtype = torch.float32) -> bool:
    """Give every linear layer of a float32 model on the CPU, and every attention's input
    projections (`MultiheadAttention.packed`), a copy of its weight packed in `dtype` (float32,
    or bfloat16 to decode under autocast). Returns whether it did (not on other devices, nor
    where oneDNN's kernels are missing or fail, nor in bf16 where the CPU lacks it: the model
    is then left as it was)."""
    params = list(model.parameters())
    if not can_pack(dtype) or any(
        p.device.type != "cpu" or p.dtype != torch.float32 for p in params
    ):
        return False
    from model.attention import MultiheadAttention  # which imports this module

    try:
        with torch.no_grad():
            probe = PackedLinear(torch.ones(2, 3), torch.zeros(2), dtype).packed_linear(
                torch.ones(1, 3, dtype=dtype)
            )
        if probe.tolist() != [[3.0, 3.0]]:
            raise RuntimeError(f"1x3 ones by 3x2 ones gave {probe.tolist()}")
    except RuntimeError as err:
        log.debug("oneDNN's packed linear layers are not usable here: %s", err)
        return False
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child.weight, child.bias, dtype))
        if isinstance(module, MultiheadAttention):
            module.pack(dtype)
    return True


def is_packed(model) -> bool:
    """Whether `pack_linears` packed the model (or each model of an ensemble)."""
    models = getattr(model, "models", [model])
    return all(isinstance(m.generator, PackedLinear) for m in models)
