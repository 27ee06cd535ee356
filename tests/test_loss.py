"""Label-smoothed cross-entropy against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model import loss as loss_module
from model.loss import label_smoothed_cross_entropy, projected_label_smoothed_cross_entropy

PAD = 0


def test_matches_a_hand_computation_and_ignores_padding():
    # Row 0: p = (0.25, 0.5, 0.25), target 1: nll = ln 2, sum_v -log p_v = ln 2 + 2 ln 4 = 5 ln 2,
    #   loss = 0.9 ln 2 + (0.1 / 3) 5 ln 2 = (0.9 + 1/6) ln 2 = 0.739357
    # Row 1: p = (0.25, 0.25, 0.5), target 2: nll = ln 2, loss the same.
    # Row 2: the target is PAD: ignored, whatever its logits.
    logits = torch.tensor([[0.25, 0.5, 0.25], [0.25, 0.25, 0.5], [9.0, 3.0, 1.0]]).log()
    target = torch.tensor([1, 2, PAD])
    loss, nll = label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=PAD)
    assert loss.item() == pytest.approx(2 * 0.7393570, abs=1e-6)
    assert nll.item() == pytest.approx(2 * math.log(2), abs=1e-6)


def test_equals_torch_label_smoothing():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 7, generator=g)
    target = torch.randint(0, 7, (10,), generator=g)
    loss, nll = label_smoothed_cross_entropy(logits, target, 0.1, ignore_index=PAD)
    expected = F.cross_entropy(
        logits, target, label_smoothing=0.1, ignore_index=PAD, reduction="sum"
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    expected_nll = F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum")
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-6)


def test_no_smoothing_is_the_nll_and_no_ignore_index_counts_every_row():
    logits = torch.tensor([[0.5, 0.25, 0.25], [0.25, 0.25, 0.5]]).log()
    loss, nll = label_smoothed_cross_entropy(logits, torch.tensor([0, 0]), epsilon=0.0)
    assert loss.item() == pytest.approx(math.log(2) + math.log(4), abs=1e-6)
    assert nll.item() == pytest.approx(loss.item())


def test_float32_under_bfloat16_autocast():
    logits = torch.randn(4, 11, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = label_smoothed_cross_entropy(logits, torch.tensor([1, 2, 3, 4]), 0.1)
    assert loss.dtype == nll.dtype == torch.float32


def reference_loss(logits, target, epsilon, ignore_index):
    """The textbook autograd formulation over float32 log-probabilities of all rows at once."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    counted = (target != ignore_index).float()
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)
    loss = (1 - epsilon) * nll - (epsilon / logits.size(1)) * log_probs.sum(-1)
    return (loss * counted).sum(), (nll * counted).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 3 * 7])  # one chunk; chunks of 3 rows
def test_gradient_and_values_equal_the_autograd_reference(dtype, chunk_elements, monkeypatch):
    import model.loss

    monkeypatch.setitem(model.loss.CHUNK_ELEMENTS, "cpu", chunk_elements)
    g = torch.Generator().manual_seed(1)
    base = (3 * torch.randn(10, 7, generator=g)).to(dtype)
    target = torch.randint(0, 7, (10,), generator=g)
    target[4] = PAD
    ours_logits = base.clone().requires_grad_()
    ref_logits = base.clone().requires_grad_()
    loss, nll = label_smoothed_cross_entropy(ours_logits, target, 0.1, ignore_index=PAD)
    ref_loss, ref_nll = reference_loss(ref_logits, target, 0.1, PAD)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    (2.5 * loss).backward()
    (2.5 * ref_loss).backward()
    assert ours_logits.grad.dtype == dtype
    torch.testing.assert_close(ours_logits.grad, ref_logits.grad)
    assert ours_logits.grad[4].abs().max() == 0  # an ignored row gets no gradient
    torch.testing.assert_close(base, ours_logits.detach())  # the logits were not changed


@pytest.mark.parametrize("requires_grad", [False, True])
def test_torch_ignore_index_convention_minus_100(requires_grad):
    """torch marks ignored targets with -100, an id outside every vocabulary: those rows must
    count for nothing, in the value and in the gradient, without ever being used as an index."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(9, 7, generator=g)
    target = torch.randint(0, 7, (9,), generator=g)
    target[[1, 5]] = -100
    ours = logits.clone().requires_grad_(requires_grad)
    ref = logits.clone().requires_grad_(requires_grad)
    loss, nll = label_smoothed_cross_entropy(ours, target, 0.1, ignore_index=-100)
    expected = F.cross_entropy(ref, target, label_smoothing=0.1, reduction="sum")
    expected_nll = F.cross_entropy(logits, target, reduction="sum")  # ignore_index=-100
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected_nll)
    if requires_grad:
        loss.backward()
        expected.backward()
        torch.testing.assert_close(ours.grad, ref.grad)
        assert ours.grad[[1, 5]].abs().max() == 0


@pytest.mark.parametrize("bias", [False, True])
def test_the_output_layer_and_loss_as_one_step_equal_them_apart(bias, monkeypatch):
    """`projected_label_smoothed_cross_entropy` (what training runs) against nn.Linear then
    the loss: the same sums and the same gradients of hidden, weight and bias, with chunks
    smaller than the rows (several of them) and a scaled incoming gradient."""
    monkeypatch.setitem(loss_module.CHUNK_ELEMENTS, "cpu", 40)  # 3 rows of 13 a chunk
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(13, 6, generator=g, dtype=torch.float64)
    b = torch.randn(13, generator=g, dtype=torch.float64) if bias else None
    target = torch.randint(0, 13, (10,), generator=g)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, *([b] if bias else []))]
    loss, nll = projected_label_smoothed_cross_entropy(
        leaves[0], leaves[1], leaves[2] if bias else None, target, 0.1
    )
    (loss * 0.25).backward()
    apart = [t.clone().requires_grad_() for t in (hidden, weight, *([b] if bias else []))]
    logits = F.linear(apart[0], apart[1], apart[2] if bias else None)
    expected, expected_nll = label_smoothed_cross_entropy(logits, target, 0.1)
    (expected * 0.25).backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-12)
    for ours, theirs in zip(leaves, apart):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # validation's path: the same sums, no gradient kept
        again = projected_label_smoothed_cross_entropy(hidden, weight, b, target, 0.1)
    assert again[0].item() == pytest.approx(expected.item(), rel=1e-12)


def test_ignored_rows_of_the_one_step_count_for_nothing(monkeypatch):
    """Rows whose target is the ignore index (training's padding of its rows to a round
    number, whatever they hold) change neither the sums nor any gradient."""
    monkeypatch.setitem(loss_module.CHUNK_ELEMENTS, "cpu", 40)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(7, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(13, 6, generator=g, requires_grad=True, dtype=torch.float64)
    target = torch.randint(0, 13, (7,), generator=g)
    extra = torch.randn(5, 6, generator=g, dtype=torch.float64)
    padded = torch.cat([hidden, extra]).requires_grad_()
    ignored = torch.cat([target, torch.full((5,), -100)])
    loss, nll = projected_label_smoothed_cross_entropy(padded, weight, None, ignored, 0.1, -100)
    loss.backward()
    grads = padded.grad.clone(), weight.grad.clone()
    weight.grad = None
    plain = hidden.clone().requires_grad_()
    expected, expected_nll = projected_label_smoothed_cross_entropy(
        plain, weight, None, target, 0.1
    )
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-12)
    torch.testing.assert_close(grads[0][:7], plain.grad)
    assert grads[0][7:].abs().max() == 0
    torch.testing.assert_close(grads[1], weight.grad)
    with torch.no_grad():
        again = projected_label_smoothed_cross_entropy(padded, weight, None, ignored, 0.1, -100)
    assert again[0].item() == pytest.approx(expected.item(), rel=1e-12)


def test_the_one_step_computes_in_autocasts_dtype():
    """Under bf16 autocast the output layer multiplies in bf16 as the nn.Linear it replaces,
    the softmax in float32; the gradients come back in the parameters' dtype."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(8, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    target = torch.randint(0, 40, (8,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = projected_label_smoothed_cross_entropy(hidden, weight, None, target, 0.1)
        logits = F.linear(hidden, weight)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    expected, _ = label_smoothed_cross_entropy(logits, target, 0.1)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.float32
