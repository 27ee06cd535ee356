"""Label-smoothed cross-entropy (paper section 5.4; Szegedy et al., 2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Logits taken to float32 at once, by device type, whatever N and V. A chunk makes several passes
# (the float32 copy, logsumexp, softmax, the gradient's cast back): on a CPU they run twice as
# fast while it stays in the last-level cache (on a 2-core EPYC with 32 MB of L3, `small`'s loss
# at 3,500 targets took 146 ms in 64-MB chunks, 72 ms in 4-MB ones, the same from 16 MB down to
# 1 MB); on a GPU larger chunks mean fewer kernel launches.
CHUNK_ELEMENTS = {"cpu": 1 << 20}
OTHER_CHUNK_ELEMENTS = 1 << 24
# The target of a row that counts for nothing (torch's convention): training pads its rows of
# real targets to a round number with such rows (`data.batching.TARGET_ROWS_MULTIPLE`).
IGNORE_INDEX = -100


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int | None = None
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and summed negative log-likelihood.

    The smoothed target keeps 1 - epsilon on the reference and spreads epsilon uniformly over
    all V classes (the reference and the pad id included): q = (1 - eps) onehot + eps / V, so

        loss = (1 - eps) * nll + (eps / V) * sum_v -log p_v

    which is what F.cross_entropy(label_smoothing=eps) computes. (fairseq's criterion spreads
    eps over the V - 1 other classes instead: (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum.)

    The softmax runs in float32, also under bf16/fp16 autocast, but a chunk of rows at a time:
    no float32 copy of all (N, V) logits is made, and the gradient, softmax - q, is computed
    in the forward pass and kept in the logits' dtype. For `base` at 25k tokens that is 1.8 GB
    of bf16 instead of several GB of float32 log-probabilities.

    Args:
        logits: (N, V) unnormalised scores, usually only the real (non-pad) target positions.
        target: (N,) long reference ids.
        epsilon: the smoothing mass, 0 for plain cross-entropy.
        ignore_index: rows whose target is this id count for nothing in either sum; any int,
            in the vocabulary (the pad id) or not (torch's -100).

    Returns:
        (loss_sum, nll_sum): float32 scalars summed over the counted rows; divide by their
        number. Only loss_sum carries a gradient.
    """
    counted = None if ignore_index is None else target != ignore_index  # (N,)
    if counted is not None:
        # An ignored row's target may lie outside the vocabulary (torch's convention is -100):
        # it is gathered and scattered like any row, so it gets an id that exists; its weight
        # of 0 keeps it out of both sums and the gradient.
        target = target.masked_fill(~counted, 0)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _SmoothedCrossEntropy.apply(logits, target, counted, epsilon)
    loss, nll, _ = _chunked(logits, target, counted, epsilon, want_grad=False)
    return loss, nll


def projected_label_smoothed_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    epsilon: float,
    ignore_index: int | None = None,
) -> tuple[Tensor, Tensor]:
    """`label_smoothed_cross_entropy` of the logits `hidden @ weight.T + bias`, the output
    layer and the loss as one step (what training computes).

    The (N, V) logits are the largest tensor of a step (V is 8,000 to 65,000 pieces): here
    they are made once, in the compute dtype (bf16 under autocast), and their gradient
    overwrites them chunk by chunk during the forward pass; the backward pass is then the two
    matmuls of the output layer, scaled. Separately, autograd would also allocate the
    gradient, the gradient times the incoming scale, and pass over all three: on a CPU, pages
    touched for the first time and memory traffic, the fifth of an fp32 update of `small`.

    Shape: hidden (N, D), weight (V, D), bias (V,) or None, target (N,) long -> two scalars,
    as `label_smoothed_cross_entropy` (only loss_sum carries a gradient; rows whose target is
    `ignore_index` count for nothing, as there).
    """
    counted = None if ignore_index is None else target != ignore_index  # (N,)
    if counted is not None:
        target = target.masked_fill(~counted, 0)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ProjectedSmoothedCrossEntropy.apply(hidden, weight, bias, target, counted, epsilon)
    logits = _project(hidden, weight, bias)[0]
    loss, nll, _ = _chunked(logits, target, counted, epsilon, want_grad=False)
    return loss, nll


def _project(hidden: Tensor, weight: Tensor, bias: Tensor | None):
    """(logits (N, V), hidden and weight as multiplied): in autocast's dtype where it is on,
    as the nn.Linear it replaces would compute them."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    h = hidden if dtype is None else hidden.to(dtype)
    w = weight if dtype is None else weight.to(dtype)
    b = bias if bias is None or dtype is None else bias.to(dtype)
    return F.linear(h, w, b), h, w


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output layer and the loss, the loss's gradient written over the logits."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, counted, epsilon):
        logits, h, w = _project(hidden, weight, bias)
        loss, nll, _ = _chunked(logits, target, counted, epsilon, want_grad=True, out=logits)
        ctx.save_for_backward(logits, h, w)  # the logits' buffer holds their gradient now
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        grad, h, w = ctx.saved_tensors  # (N, V), (N, D), (V, D)
        scale = grad_loss.float()
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        d_hidden = d_weight = d_bias = None
        if ctx.needs_input_grad[0]:
            d_hidden = (grad @ w).to(hidden_dtype).mul_(scale)  # (N, D)
        if ctx.needs_input_grad[1]:
            d_weight = (grad.t() @ h).to(weight_dtype).mul_(scale)  # (V, D)
        if bias_dtype is not None and ctx.needs_input_grad[2]:
            summed = grad.sum(dim=0, dtype=torch.promote_types(grad.dtype, torch.float32))
            d_bias = summed.to(bias_dtype).mul_(scale)
        return d_hidden, d_weight, d_bias, None, None, None


class _SmoothedCrossEntropy(torch.autograd.Function):
    """The loss with its gradient computed chunk by chunk in the forward pass."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, counted: Tensor | None, epsilon: float):
        loss, nll, grad = _chunked(logits, target, counted, epsilon, want_grad=True)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None


def _chunked(
    logits: Tensor,
    target: Tensor,
    counted: Tensor | None,
    epsilon: float,
    want_grad: bool,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(loss_sum, nll_sum, d loss_sum / d logits or None), a chunk of rows at a time; the
    gradient goes to `out` (which may be `logits` itself: each chunk is read before it is
    written), else to a new tensor.

    Per row, with lse = logsumexp(x): nll = lse - x[target], sum_v -log p_v = V lse - sum_v x_v,
    and the gradient of the row's smoothed loss is softmax(x) - q.
    """
    N, V = logits.shape
    rows = max(1, CHUNK_ELEMENTS.get(logits.device.type, OTHER_CHUNK_ELEMENTS) // max(V, 1))
    loss = torch.zeros((), dtype=torch.float32, device=logits.device)
    nll = torch.zeros((), dtype=torch.float32, device=logits.device)
    grad = (out if out is not None else torch.empty_like(logits)) if want_grad else None
    for start in range(0, N, rows):
        x = logits[start : start + rows].to(torch.float32, copy=True)  # (n, V), ours to change
        t = target[start : start + rows, None]  # (n, 1)
        weight = None if counted is None else counted[start : start + rows].float()  # (n,)
        lse = torch.logsumexp(x, dim=-1)  # (n,)
        row_nll = lse - x.gather(1, t).squeeze(1)  # (n,)
        row_loss = (1.0 - epsilon) * row_nll + (epsilon / V) * (V * lse - x.sum(dim=-1))
        if weight is not None:
            row_nll, row_loss = row_nll * weight, row_loss * weight
        loss += row_loss.sum()
        nll += row_nll.sum()
        if grad is not None:
            g = x.sub_(lse[:, None]).exp_().sub_(epsilon / V)  # softmax - eps / V
            g.scatter_add_(1, t, g.new_full(t.shape, -(1.0 - epsilon)))  # - (1 - eps) onehot
            if weight is not None:
                g.mul_(weight[:, None])
            grad[start : start + rows] = g
    return loss, nll, grad
