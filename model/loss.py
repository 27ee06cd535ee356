"""Label-smoothed cross-entropy (paper section 5.4; Szegedy et al., 2016)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int | None = None
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and summed negative log-likelihood.

    The smoothed target keeps 1 - epsilon on the reference and spreads epsilon uniformly over
    all V classes (the reference and the pad id included): q = (1 - eps) onehot + eps / V, so

        loss = (1 - eps) * nll + (eps / V) * sum_v -log p_v

    which is what F.cross_entropy(label_smoothing=eps) computes. (fairseq's criterion spreads
    eps over the V - 1 other classes instead: (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum.)
    log_softmax runs in float32, also under bf16/fp16 autocast.

    Args:
        logits: (N, V) unnormalised scores, usually only the real (non-pad) target positions.
        target: (N,) long reference ids.
        epsilon: the smoothing mass, 0 for plain cross-entropy.
        ignore_index: rows whose target is this id count for nothing in either sum.

    Returns:
        (loss_sum, nll_sum): float32 scalars summed over the counted rows; divide by their number.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    ignored = None if ignore_index is None else target == ignore_index  # (N,)
    if ignored is not None:
        target = target.masked_fill(ignored, 0)  # any valid id: these rows are zeroed below
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)  # (N,)
    smooth = -log_probs.sum(dim=-1)  # (N,)
    loss = (1.0 - epsilon) * nll + (epsilon / log_probs.size(-1)) * smooth  # (N,)
    if ignored is not None:
        loss = loss.masked_fill(ignored, 0.0)
        nll = nll.masked_fill(ignored, 0.0)
    return loss.sum(), nll.sum()
