"""Linear layers in int8 for decoding on a CPU, every row of activations quantized on its own.

As CTranslate2's int8: a weight is stored in int8 with one scale per output channel (its row's
largest |w| / 127), and each row of activations (a token of a source, a hypothesis of a
search) is quantized on the fly by its own largest |x| / 127; the int8 x int8 products are
summed in int32, and the row's and the channel's scales turn each sum back into a float.

Dynamic quantisation as `torch.ao.quantization.quantize_dynamic` does it (what `--int8` ran
before) takes one scale for the whole tensor of activations, the largest |x| of all its rows:
a sentence's numbers then depended on the sentences beside it in its batch, padding included
(`tf translate --int8` wrote 39 of 50 lines otherwise at beam 4 when each came in a batch of
its own). Here a row's output is a function of that row alone: its scale comes from its own
values, its int32 sums are exact whatever order a kernel adds them in (and so whatever rows
it is given with), and what follows is elementwise. That holds for the whole model only if
every row a layer quantizes is itself the same whatever its batch, to the last bit: one bit
more or less may round a value to the next step. So the attention between the layers runs in
float64, rounded to float32 (`model.attention.float64_attention`): in float32 its sums over a
batch's padded keys ran in another order, and 7 of 100 test sentences came out otherwise
alone than in a batch (`demo`, beam 5); with it none did, their scores the same bit for bit.
Everything else between the layers (norms, residuals, embeddings, the softmax over the
vocabulary) works row by row.

`torch._int_mm` runs the int8 products (oneDNN's s8s8s32 GEMM on x86). A CPU without VNNI may
saturate the 16-bit pair sums of such kernels (oneDNN's "Nuances of int8 computations"), so
the kernel is checked against exact sums once per layer shape, on the products that would
saturate (`int_mm_is_exact`). Where it is not exact, or missing, the same int8 values are
multiplied in float32 instead, in slices of `EXACT_FLOAT_TERMS` inputs, where every partial
sum is an integer below 2^24 and so exact in any order: the same numbers, at float32's speed.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from model.attention import MultiheadAttention

INT8_MAX = 127  # symmetric: -128 is never used, so that -x quantizes to -q
# Inputs of one float32 slice: 1024 x 127 x 127 < 2^24, so every partial sum of a slice's
# int8 products is an integer that float32 holds exactly, in whatever order it is summed.
EXACT_FLOAT_TERMS = 1024
TINY = torch.finfo(torch.float32).tiny  # the scale of a row of zeros (never 0: x / 0 is NaN)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of x quantized symmetrically by its own scale, max |x| / 127.

    Shape: x (..., K) float32 -> (int8 (..., K), float32 scales (..., 1)). An all-zero row
    quantizes to zeros.
    """
    scale = x.abs().amax(dim=-1, keepdim=True).div_(INT8_MAX).clamp_(min=TINY)
    # |x| <= 127 scale, so no clamp: the rounded values are within [-127, 127] already.
    return torch.div(x, scale).round_().to(torch.int8), scale


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (a scale per output channel) and each row of x quantized
    to int8 on the fly (see the module docstring). For decoding on a CPU: no gradients, and
    its tensors are plain attributes, not buffers (read at no cost at each of a search's
    thousands of calls; a quantized model is never saved nor moved).

    Shape: x (..., in_features) -> (..., out_features) float32.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.qweight, scale = quantize_rows(weight.detach().float())  # (out, in) int8
        # Its transpose as a view: oneDNN reads it as a column-major (in, out) matrix, which
        # for one row took a third of the time of a row-major copy (2 cores, AMD EPYC).
        self.columns = self.qweight.t()
        self.weight_scale = scale[:, 0]  # (out,)
        self.bias = None if bias is None else bias.detach().float().clone()
        # The int8 values as float32, where `torch._int_mm` is not exact here (else None).
        exact = int_mm_is_exact(self.in_features, self.out_features)
        self.float_weight = None if exact else self.qweight.float()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"

    def forward(self, x: Tensor) -> Tensor:
        q, scale = quantize_rows(x.reshape(-1, self.in_features).float())  # (M, K), (M, 1)
        sums = self.int_sums(q)  # (M, N) int32, exact
        # Elementwise from here, one rounding per op (never a fused multiply-add, which a
        # kernel may run in its vector loop and not in its tail): a row's outputs are its own
        # whatever rows come with it.
        y = sums.float().mul_(scale).mul_(self.weight_scale)  # (M, N)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def int_sums(self, q: Tensor) -> Tensor:
        """q (M, K) int8 times the int8 weight transposed: (M, N) int32, exact."""
        if self.float_weight is None:
            return torch._int_mm(q, self.columns)
        sums = torch.zeros(q.size(0), self.out_features, dtype=torch.int32, device=q.device)
        for start in range(0, self.in_features, EXACT_FLOAT_TERMS):
            part = slice(start, start + EXACT_FLOAT_TERMS)
            sums += (q[:, part].float() @ self.float_weight[:, part].t()).to(torch.int32)
        return sums


@functools.cache
def int_mm_is_exact(in_features: int, out_features: int) -> bool:
    """Whether `torch._int_mm` gives exact int32 sums on this CPU for a layer of this shape:
    for one row and for several, with rows of +127s and -127s on both sides (the products
    that would saturate a 16-bit pair) and random ones. Checked on all the layer's inputs
    and on 64 outputs plus those past its last multiple of 64 (a kernel's tail), in a few
    milliseconds."""
    if not hasattr(torch, "_int_mm"):
        return False
    generator = torch.Generator().manual_seed(0)

    def draw(rows: int) -> Tensor:
        """(rows, in_features) int8: a row of +127s, one of -127s, then random ones."""
        x = torch.randint(-INT8_MAX, INT8_MAX + 1, (rows, in_features), generator=generator)
        x[0], x[1:2] = INT8_MAX, -INT8_MAX
        return x.to(torch.int8)

    weight = draw(min(out_features, 64 + out_features % 64))
    exact = weight.double().t()  # float64 holds every sum here exactly (below 2^53)
    for rows in (1, 2, 5, 17):
        x = draw(rows)
        try:
            sums = torch._int_mm(x, weight.t())
        except RuntimeError:
            return False
        if not torch.equal(sums.double(), x.double() @ exact):
            return False
    return True


def quantize_linears(model: nn.Module) -> nn.Module:
    """Every linear layer of a float model in int8 (`Int8Linear`), in place: each nn.Linear
    and each attention's input projections (`MultiheadAttention.set_in_proj`); and its
    attention in float64 (`model.attention.float64_attention`), so that every quantized row
    gets the same float32 numbers whatever its batch. Returns the model. Merge LoRA adapters
    first (`model.lora.merge_lora`): their layers are left as they are."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child.weight, child.bias))
        if isinstance(module, MultiheadAttention):
            module.set_in_proj(Int8Linear)
            module.attend_in_float64 = True
    return model
