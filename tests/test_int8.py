"""`--int8`: every linear layer in int8, each row of activations quantized by its own scale
(`model.int8`), so that a sentence's translation never depends on the sentences batched with
it: each layer computes a row from that row alone (exactly, whatever rows, padding or order
come with it), and a sentence translates alike alone, in any batch, through `tf translate`
and through `tf serve`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from test_cli import tf
from test_serve import call_at_once, serving

import model.int8
from cli.config import load_config
from cli.inference import engines
from cli.inference.engines import load_engine
from cli.serving.app import Limits, build_app
from model.attention import MultiheadAttention
from model.int8 import Int8Linear, int_mm_is_exact, quantize_rows
from model.transformer import Transformer

CPU = torch.device("cpu")
SHORT = ["decode.max_len_a=0", "decode.max_len_b=10"]  # outputs of 10 tokens at most: quick


@pytest.fixture
def fresh_kernel_checks():
    """`int_mm_is_exact` remembers its answer per shape: a test that fakes the kernel starts
    and ends with none remembered."""
    int_mm_is_exact.cache_clear()
    yield
    int_mm_is_exact.cache_clear()


def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(load_config("tiny").model, 64, 64, pad_id=0).eval()


def computing_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every layer of a quantized model that computes a linear map: its modules with
    `in_features` but plain nn.Linear, and the attentions' input projections."""
    layers = [
        m for m in model.modules() if hasattr(m, "in_features") and type(m) is not torch.nn.Linear
    ]
    for m in model.modules():
        if isinstance(m, MultiheadAttention):
            layers += list(m.packed.values())
    return layers


def rows_of_every_size(in_features: int) -> torch.Tensor:
    """(9, in_features): rows of magnitudes from 1e-3 to 1e3, a row of zeros, and a row as
    large as padding's activations can be."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(9, in_features, generator=generator)
    x[:7] *= torch.logspace(-3, 3, 7)[:, None]
    x[7] = 0.0
    x[8] *= 1e4
    return x


@pytest.mark.parametrize("kernel", ["int_mm", "float32"])
def test_each_int8_layer_computes_a_row_from_that_row_alone(kernel, monkeypatch):
    """Every linear layer `--int8` runs: a row's outputs are bit for bit the same alone, among
    other rows in any order, and beside a row of huge values (what padding may hold) or of
    zeros; through oneDNN's int8 kernel and through the exact float32 route alike. Dynamic
    quantisation gave all rows one scale, the largest |x| of the batch: not so."""
    if kernel == "float32":
        monkeypatch.setattr(model.int8, "int_mm_is_exact", lambda *shape: False)
    quantized = engines.quantize_int8(tiny_model(), CPU)
    layers = computing_layers(quantized)
    # 2 + 2 layers: 3 linear layers in each encoder layer, 4 in each decoder layer, the
    # generator, and 3 parts of each attention's input projection (6 attentions)
    assert len(layers) == 2 * 3 + 2 * 4 + 1 + 6 * 3
    with torch.no_grad():
        for layer in layers:
            x = rows_of_every_size(layer.in_features)
            alone = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
            orders = [torch.arange(len(x)), torch.arange(len(x)).flip(0), torch.randperm(len(x))]
            orders += [torch.tensor([3, 8]), torch.tensor([0, 7, 1]), torch.tensor([5, 5, 2])]
            for order in orders:
                assert torch.equal(layer(x[order]), alone[order]), (layer, order)
            batched = layer(x[None, [0, 8, 2]])  # (B, T, K) as attention gives it
            assert torch.equal(batched[0], alone[[0, 8, 2]])


def test_int8_sums_are_exact_through_both_routes():
    """The int32 sums of int8 products, through `torch._int_mm` (where this CPU runs it
    exactly) and through float32 slices (where not): both equal int64 arithmetic, on the
    largest products and across slices (1100 inputs: two float32 slices)."""
    torch.manual_seed(0)
    layer = Int8Linear(torch.randn(40, 1100), torch.zeros(40))
    q = torch.randint(-127, 128, (6, 1100), dtype=torch.int8)
    q[0], q[1] = 127, -127
    layer.qweight[0] = 127
    exact = (q.long() @ layer.qweight.long().t()).int()
    assert torch.equal(layer.int_sums(q), exact)
    layer.float_weight = layer.qweight.float()
    assert torch.equal(layer.int_sums(q), exact)


def test_an_int8_kernel_that_saturates_is_not_used(monkeypatch, fresh_kernel_checks):
    """A kernel whose sums saturate (16-bit pair sums of CPUs without VNNI) is found out at
    the layer's construction, and the layer computes the exact sums in float32 instead."""

    def saturating(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.long() @ b.long()).clamp(-(1 << 15), (1 << 15) - 1).int()

    monkeypatch.setattr(torch, "_int_mm", saturating)
    assert not int_mm_is_exact(16, 64)
    torch.manual_seed(0)
    weight = torch.randn(64, 16)
    layer = Int8Linear(weight, None)
    assert layer.float_weight is not None
    x = torch.full((2, 16), 3.0)
    q, scale = quantize_rows(x)
    exact = (q.long() @ layer.qweight.long().t()).float() * scale * layer.weight_scale
    assert torch.equal(layer(x), exact)


def test_int8_layers_are_close_to_float32():
    """Per-channel weights and per-row activations stay near the float32 layer: within 2% of
    its outputs' size for random rows (quantisation's own error, a few parts in a thousand)."""
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 32), torch.randn(64)
    x = torch.randn(50, 32)
    want = torch.nn.functional.linear(x, weight, bias)
    got = Int8Linear(weight, bias)(x)
    assert (got - want).abs().max() < 0.02 * want.abs().max()


@pytest.fixture(scope="module")
def sources(tiny_prefix) -> list[str]:
    lines = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line][:14]


def batchings(count: int, seed: int) -> list[list[list[int]]]:
    """Ways to split sentences 0..count-1 into batches: all at once, reversed, one per batch
    but in pairs with the last one, and random groups in random orders."""
    rng = random.Random(seed)
    ways = [[list(range(count))], [list(range(count))[::-1]]]
    ways.append([[k, count - 1] for k in range(count - 1)])
    for _ in range(3):
        order = rng.sample(range(count), count)
        cuts = sorted(rng.sample(range(1, count), 3))
        ways.append([order[a:b] for a, b in zip([0, *cuts], [*cuts, count])])
    return ways


def test_an_int8_model_computes_a_sentence_alone_as_in_a_padded_batch(trained, sources):
    """The encoder's output and three decoding steps' logits of each sentence, alone and in
    a batch padded to its longest: the same bit for bit. Each linear layer's rows are its own
    (above), and attention, whose float32 sums over the padded keys ran in another order
    (a bit more or less, which int8 rounding of the next layer made a whole step), runs in
    float64."""
    engine = load_engine(str(trained), CPU, [], int8=True)
    net, ids = engine.model, engine.tokenizer.encode_src(sources[:6])
    width = max(len(i) for i in ids)
    src = torch.full((len(ids), width), net.src_pad_id)
    for row, source in enumerate(ids):
        src[row, : len(source)] = torch.tensor(source)
    steps = torch.tensor([[5, 9, 11]]).expand(len(ids), -1)  # the tokens fed, (B, 3)

    def run(src: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        mask = src == net.src_pad_id
        with torch.no_grad():
            memory = net.encode(src, mask)
            cache = net.init_cache(memory, mask)
            logits = [net.decode_step(steps[: len(src), t], cache) for t in range(3)]
        return memory, logits

    memory, logits = run(src)
    for row, source in enumerate(ids):
        alone_memory, alone_logits = run(src[row : row + 1, : len(source)])
        assert torch.equal(memory[row, : len(source)], alone_memory[0]), row
        for step, alone_step in zip(logits, alone_logits):
            assert torch.equal(step[row], alone_step[0]), row


@pytest.mark.parametrize("beam, nbest", [(1, 1), (3, 2)])
def test_an_int8_translation_is_the_same_alone_and_in_any_batch(trained, sources, beam, nbest):
    """Each sentence searched alone, then in batches of several compositions and orders
    (longer and shorter neighbours: its padding changes with them): the same hypotheses,
    greedy and beam, with the same scores bit for bit. With one scale for a whole batch's
    activations they were not."""
    sets = [*SHORT, f"decode.beam_size={beam}", f"decode.nbest={nbest}"]
    engine = load_engine(str(trained), CPU, sets, int8=True)
    ids = engine.tokenizer.encode_src(sources)
    decode = engine.config.decode

    def found(hyps) -> list[tuple[list[int], float, float]]:
        return [(h.tokens, h.score, h.log_prob) for h in hyps]

    alone = [found(engine.search([i], decode)[0]) for i in ids]
    for way in batchings(len(ids), seed=beam):
        for batch in way:
            searched = engine.search([ids[k] for k in batch], decode)
            assert [found(hyps) for hyps in searched] == [alone[k] for k in batch], batch


def test_tf_translate_int8_writes_the_same_whatever_the_batch_size(trained, sources):
    """The issue's own case: `--int8 --beam 4`, in batches of the default token budget and
    one sentence a batch (`decode.max_tokens=1`), writes the same lines."""
    text = "\n".join(sources) + "\n"
    sets = [a for s in SHORT for a in ("--set", s)]
    batched = tf("translate", trained, "--int8", "--beam", "4", *sets, input=text)
    one_by_one = tf(
        "translate", trained, "--int8", "--beam", "4", *sets, "--set", "decode.max_tokens=1",
        input=text,
    )  # fmt: skip
    assert batched.exit_code == 0 and one_by_one.exit_code == 0, batched.output
    assert batched.stdout.splitlines() == one_by_one.stdout.splitlines()
    assert len(batched.stdout.splitlines()) == len(sources)


def test_tf_serve_int8_answers_as_tf_translate_int8(trained, sources):
    """Requests of one to three lines sent at once, so that the server batches them together
    (whole groups), get `tf translate --int8`'s lines."""
    lines = sources[:8]
    sets = [a for s in SHORT for a in ("--set", s)]
    direct = tf("translate", trained, "--int8", "--beam", "2", *sets, input="\n".join(lines) + "\n")
    assert direct.exit_code == 0, direct.output
    engine = load_engine(str(trained), CPU, [*SHORT, "decode.beam_size=2"], int8=True)
    app = build_app(engine, str(trained), "pytorch-int8", Limits(max_wait=0.2))
    requests = [lines[0:1], lines[1:3], lines[3:4], lines[4:7], lines[7:8]]
    with serving(app) as url:
        bodies = [{"text": r} for r in requests]
        answers = call_at_once(f"{url}/translate", bodies, timeout=120)
    got = []
    for status, body, _ in answers:
        assert status == 200, body
        got += body["translations"]
    assert got == direct.stdout.splitlines()
