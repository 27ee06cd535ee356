"""Linear layers packed for oneDNN (`model.packed`): the same model, state and translations,
faster on a CPU; gradients, autocast and other dtypes fall back to the plain layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_search import BOS, EOS, PAD, tiny_model
from test_shapes import sentences
from torch.profiler import ProfilerActivity, profile
from torch.testing import assert_close

import model.packed as packed_module
from cli.config import DecodeConfig
from cli.device import engine_precision
from cli.inference.decoding import search_batch
from cli.inference.engines import load_engine
from cli.inference.shapes import shapes_matter
from data.batching import collate
from model.packed import PackedLinear, can_pack, is_packed, linear_activation, pack_linears

pytestmark = pytest.mark.skipif(not can_pack(), reason="this PyTorch has no oneDNN")


@pytest.fixture
def every_product_packed(monkeypatch):
    """Packed layers run oneDNN's kernel at the tiny models' sizes too (`SMALL_MACS`)."""
    monkeypatch.setattr(packed_module, "SMALL_MACS", 0)


def packed_pair(dtype=torch.float32):
    plain = tiny_model().float()
    packed = tiny_model().float()
    assert pack_linears(packed, dtype) and is_packed(packed) and not is_packed(plain)
    cpu = torch.device("cpu")  # oneDNN keeps a kernel per shape: decoding pads them
    assert shapes_matter(packed, cpu) and not shapes_matter(plain, cpu)
    return plain, packed


def test_packing_keeps_the_state_and_gradients():
    plain, packed = packed_pair()
    assert isinstance(packed.generator, PackedLinear)
    assert isinstance(packed.decoder.layers[0].self_attn.packed["qkv"], PackedLinear)
    assert packed.state_dict().keys() == plain.state_dict().keys()
    for (name, a), b in zip(plain.state_dict().items(), packed.state_dict().values()):
        assert torch.equal(a, b), name
    src = torch.randint(4, 40, (3, 5))
    tgt = torch.randint(4, 40, (3, 4))
    pad = torch.zeros(3, 5, dtype=torch.bool)
    loss = packed(src, tgt, pad, None).logsumexp(-1).sum()  # with gradients: the plain layers
    loss.backward()
    assert packed.decoder.layers[0].linear1.weight.grad is not None
    assert packed.decoder.layers[0].self_attn.in_proj_weight.grad is not None
    assert not pack_linears(tiny_model())  # float64: nothing to pack


def searched(model, autocast: bool = False) -> list:
    src = sentences()
    batch = collate(src, None, PAD, BOS, EOS, range(len(src)))
    decode = DecodeConfig(beam_size=3, nbest=2, max_len_a=0.0, max_len_b=8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return search_batch(model, batch, decode, BOS, EOS)


@torch.no_grad()
def test_a_packed_model_translates_as_the_plain_one(every_product_packed):
    plain, packed = packed_pair()
    src = torch.randint(4, 40, (6, 5))
    pad = torch.arange(5)[None] >= torch.tensor([5, 3, 4, 2, 5, 1])[:, None]
    tgt = torch.randint(4, 40, (6, 4))
    assert packed(src, tgt, pad, None) == pytest.approx(plain(src, tgt, pad, None), abs=1e-5)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours = searched(packed)
    assert any(e.name == "mkldnn::_linear_pointwise" for e in prof.events())  # really packed
    theirs = searched(plain)
    assert [[h.tokens for h in n] for n in ours] == [[h.tokens for h in n] for n in theirs]
    scores = [h.score for n in theirs for h in n]
    assert [h.score for n in ours for h in n] == pytest.approx(scores, abs=1e-4)


@torch.no_grad()
def test_packed_in_bf16_equals_autocast_exactly():
    if not can_pack(torch.bfloat16):  # no native bf16: autocast runs its own kernels, unpacked
        model = tiny_model().float()
        assert not pack_linears(model, torch.bfloat16) and not is_packed(model)
        return
    plain, packed = packed_pair(torch.bfloat16)
    x = torch.randn(7, 16)
    layer = packed.decoder.layers[0].linear1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))  # no autocast: plain
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours = searched(packed, True)
    assert any(e.name == "mkldnn::_linear_pointwise" for e in prof.events())
    theirs = searched(plain, True)
    assert [[(h.tokens, h.score) for h in n] for n in ours] == [
        [(h.tokens, h.score) for h in n] for n in theirs
    ]


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_feed_forward_runs_relu_in_its_kernel(dtype, every_product_packed):
    """ReLU after a packed FFN layer is oneDNN's post-op: relu(linear)'s numbers, in float32
    and in bf16 under autocast, without a ReLU op of its own; other activations and the plain
    layers' way (gradients) apply it after."""
    if not can_pack(dtype):  # no native bf16: autocast runs its own kernels, unpacked
        assert not pack_linears(tiny_model().float(), dtype)
        return
    _, packed = packed_pair(dtype)
    layer = packed.decoder.layers[0].linear1
    x = torch.randn(7, 1, 16)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        # The same packed kernel without its post-op: bit for bit at any thread count (the
        # plain F.linear is another kernel, whose sums match oneDNN's on one thread only).
        expected = F.relu(layer(x))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fused = linear_activation(layer, F.relu, x)
        assert torch.equal(linear_activation(layer, F.gelu, x), F.gelu(layer(x)))
    names = {e.name for e in prof.events()}
    assert "mkldnn::_linear_pointwise" in names and not names & {"aten::relu", "aten::clamp_min"}
    assert fused.dtype == expected.dtype and torch.equal(fused, expected)
    with torch.enable_grad():
        assert torch.equal(layer(x, relu=True), F.relu(F.linear(x, layer.weight, layer.bias)))


@torch.no_grad()
def test_small_float32_products_run_mkl_on_the_plain_weight():
    """Below SMALL_MACS multiply-adds a float32 call goes to MKL (oneDNN's costs ~35 us more),
    from it on to oneDNN's kernel; both compute the plain layer's numbers, ReLU included."""
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 32), torch.randn(64)
    layer = PackedLinear(weight, bias)
    rows = -(-packed_module.SMALL_MACS // (64 * 32))  # the fewest that reach it
    for n, kernel in ((rows - 1, "aten::addmm"), (rows, "mkldnn::_linear_pointwise")):
        x = torch.randn(n, 32)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            y = layer(x, relu=True)
        names = {e.name for e in prof.events()}
        other = ({"aten::addmm", "mkldnn::_linear_pointwise"} - {kernel}).pop()
        assert kernel in names and other not in names, n
        assert_close(y, F.relu(F.linear(x, weight, bias)), atol=1e-4, rtol=1e-4)


def test_engines_decode_auto_in_packed_fp32_on_cpus_without_amx(monkeypatch, trained):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for amx, expected in ((False, "fp32"), (True, "auto")):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        assert engine_precision("auto", cpu) == expected
        assert engine_precision("bf16", cpu) == "bf16" and engine_precision("auto", cuda) == "auto"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    engine = load_engine(str(trained), cpu, [])
    assert engine.config.decode.precision == "fp32" and is_packed(engine.model)
    assert not is_packed(load_engine(str(trained), cpu, [], int8=True).model)
