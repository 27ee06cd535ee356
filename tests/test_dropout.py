"""model/dropout.py: the mask of a CPU dropout drawn four 16-bit uniforms to a 64-bit draw."""

from __future__ import annotations

import pytest
import torch

from model.dropout import LEVELS, Dropout, dropout

N = 1 << 20  # binomial standard deviation of a kept share: at most 0.0005 over N draws


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_quarter_of_a_draw_keeps_one_minus_p(p, dtype):
    """Each of the four 16-bit slices of a 64-bit draw keeps 1 - p of its elements (a draw
    short of its top bit, as `random_()` gives int64, would keep every fourth element at
    p < 1/2), and the kept ones are scaled so that the mean holds."""
    torch.manual_seed(0)
    y = dropout(torch.ones(N, dtype=dtype), p)
    assert y.dtype == dtype
    kept = y != 0
    keep = 1 - round(p * LEVELS) / LEVELS  # p rounded to 1/65,536
    for slice_ in range(4):
        share = kept[slice_::4].double().mean().item()
        assert abs(share - keep) < 6 * (keep * (1 - keep) / (N / 4)) ** 0.5, (slice_, share)
    value = torch.tensor(1 / keep).to(dtype)  # 1 / keep rounded once to the dtype (bf16: 0.2%)
    assert torch.all(y[kept] == value)
    mean = keep * value.item()  # 1 in float32; what the rounding leaves in bf16
    assert abs(y.double().mean().item() - mean) < 6 * (keep * (1 - keep) / N) ** 0.5 * value.item()


def test_the_gradient_passes_where_the_forward_kept():
    torch.manual_seed(1)
    x = torch.randn(4, 33, 17, requires_grad=True)  # an element count not a multiple of 4
    y = dropout(x, 0.25)
    y.backward(torch.ones_like(y))
    scale = 1 / (1 - 0.25)
    assert torch.equal(x.grad, (y != 0).float() * scale)
    assert torch.allclose(y, x.detach() * x.grad)


def test_the_draws_follow_torch_s_seed():
    """The CPU generator seeds, saves and restores it (a resumed run drops the same)."""
    x = torch.ones(1000)
    torch.manual_seed(5)
    first = dropout(x, 0.5)
    state = torch.get_rng_state()
    second = dropout(x, 0.5)
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.5), second)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.5), first) and not torch.equal(first, second)


def test_strided_inputs_and_autocast():
    """A transposed input is dropped element by element as a contiguous one; under CPU autocast
    the dropout of a bf16 activation stays bf16."""
    torch.manual_seed(2)
    x = torch.randn(64, 48)
    torch.manual_seed(3)
    y = dropout(x.t(), 0.5)
    torch.manual_seed(3)
    assert torch.equal(y, dropout(x.t().contiguous(), 0.5))
    linear = torch.nn.Linear(48, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert dropout(linear(x), 0.2).dtype == torch.bfloat16


def test_probabilities_out_of_range_or_below_the_resolution():
    x = torch.ones(1000)
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(x, -0.1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(x, 1.5)
    torch.manual_seed(6)
    # p = 5e-6 rounds to 0 of 65,536: torch's own dropout, which still drops (about 5 of 1M).
    dropped = (dropout(torch.ones(N), 5e-6) == 0).sum().item()
    assert 0 < dropped < 20


def test_graphs_torch_compile_builds_take_torch_s_dropout(monkeypatch):
    """Inside a graph being compiled, torch's own dropout (which the compiler fuses), not the
    int16 view of a 64-bit draw."""
    import torch.nn.functional as F

    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p: calls.append(p) or x)
    dropout(torch.ones(8), 0.5)
    assert not calls
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    dropout(torch.ones(8), 0.5)
    assert calls == [0.5]


def test_the_module_drops_only_in_training():
    module = Dropout(0.5)
    x = torch.ones(1000)
    assert not torch.equal(module(x), x)
    assert torch.equal(module.eval()(x), x)
    assert torch.equal(Dropout(0.0)(x), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros(1000))  # torch's own, p = 1
