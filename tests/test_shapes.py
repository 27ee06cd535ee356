"""Decoding shapes from a few sizes under CPU autocast (`cli.inference.shapes`): the rows added
change no translation, and the matmuls only ever see the sizes of `bucket`."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_search import BOS, EOS, PAD, tiny_model
from torch.profiler import ProfilerActivity, profile

import cli.inference.decoding as decoding
from cli.config import DecodeConfig
from cli.inference.decoding import search_batch
from cli.inference.requests import Guide
from cli.inference.shapes import WIDTH_MULTIPLE, bucket
from data.batching import collate
from model.ensemble import Ensemble

ROOT = Path(__file__).resolve().parents[1]


def test_buckets_are_few_and_close_above_every_count():
    sizes = [bucket(n) for n in range(1, 513)]
    for n, size in enumerate(sizes, start=1):
        assert n <= size <= n + n // 8 and bucket(size) == size
    assert sizes == sorted(sizes)
    assert len(set(sizes)) == 15 + 8 * 5 + 1  # exact below 16, then 8 sizes per doubling


def sentences(n: int = 37) -> list[list[int]]:
    """n sources of 1 to 9 pieces: their outputs end at many lengths, so sentences leave the
    search one by one while the padded counts often stay put (37 and 38 round to 38)."""
    g = torch.Generator().manual_seed(3)
    return [torch.randint(4, 40, (1 + i % 9,), generator=g).tolist() for i in range(n)]


def searched(model, decode: DecodeConfig, padded: bool, guides=None, monkeypatch=None):
    monkeypatch.setattr(decoding, "shapes_matter", lambda model, device: padded)
    src = sentences()
    batch = collate(src, None, PAD, BOS, EOS, range(len(src)))
    return search_batch(model, batch, decode, BOS, EOS, guides=guides)


SETTINGS = {
    "greedy": dict(beam_size=1),
    "beam": dict(beam_size=4, nbest=2, length_penalty=0.6),
    "sampling": dict(beam_size=3, nbest=2, sampling_topk=5),
    "rules": dict(beam_size=3, min_len=2, no_repeat_ngram_size=2),
}


@torch.no_grad()
@pytest.mark.parametrize("name", [*SETTINGS, "prefix", "constraints", "ensemble"])
def test_padded_rows_change_no_translation(name, monkeypatch):
    """Padding is switched on by hand in float64, where it must change nothing: the same
    tokens and scores, whatever the search (a padded row never mixes with a real one)."""
    model = Ensemble([tiny_model(), tiny_model()]) if name == "ensemble" else tiny_model()
    decode = replace(DecodeConfig(max_len_a=0.0, max_len_b=8), **SETTINGS.get(name, {}))
    guides = None
    if name == "prefix":
        guides = [Guide(prefix=(5, 6)) if i % 3 == 0 else None for i in range(37)]
    if name == "constraints":
        guides = [Guide(constraints=((7, 8),)) if i % 4 == 0 else None for i in range(37)]
    plain = searched(model, decode, False, guides, monkeypatch)
    padded = searched(model, decode, True, guides, monkeypatch)
    assert [[h.tokens for h in n] for n in padded] == [[h.tokens for h in n] for n in plain]
    assert [h.score for n in padded for h in n] == pytest.approx(
        [h.score for n in plain for h in n]
    )
    assert len({len(n[0].tokens) for n in plain}) > 3  # sentences did leave at many steps


@torch.no_grad()
@pytest.mark.parametrize("autocast", [False, True])
def test_under_cpu_autocast_every_matmul_sees_a_bucketed_size(autocast):
    model = tiny_model().float()
    rows, sources = [], []
    model.generator.register_forward_pre_hook(lambda m, args: rows.append(args[0].size(0)))
    model.encoder.register_forward_pre_hook(lambda m, args: sources.append(tuple(args[0].shape)))
    src = sentences()
    batch = collate(src, None, PAD, BOS, EOS, range(len(src)))
    decode = DecodeConfig(beam_size=4, max_len_a=0.0, max_len_b=8)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        hyps = search_batch(model, batch, decode, BOS, EOS)
    assert len(hyps) == 37 and len(set(rows)) > 3
    (shape,) = sources
    if autocast:
        assert shape[0] == bucket(37) and shape[1] % WIDTH_MULTIPLE == 0
        assert all(r == bucket(r) or r % 4 == 0 and r // 4 == bucket(r // 4) for r in rows)
    else:  # fp32: the exact counts, one of them off every bucket
        assert shape[0] == 37 and any(r % 4 == 0 and r // 4 != bucket(r // 4) for r in rows)


@torch.no_grad()
def test_under_autocast_a_search_casts_each_weight_once_not_at_every_step():
    """Autocast keeps its half-precision copy of a weight for the batch only outside
    inference_mode: inside it the output layer's weight was cast again at every step."""
    model = tiny_model().float()
    src = sentences(4)
    batch = collate(src, None, PAD, BOS, EOS, range(len(src)))
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=6)
    weight = list(model.generator.weight.shape)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            search_batch(model, batch, decode, BOS, EOS)
    casts = [
        e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes[:1] == [weight]
    ]
    steps = [e for e in prof.events() if e.name == "aten::log_softmax"]
    assert len(steps) > 3 and len(casts) == 1


KERNELS = """
import os, torch, cli.device as device
device.DECODING_KERNELS = 1
if {bound}:
    device.bound_decoding_kernels()
print("----", flush=True)
w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(16, 16))
for n in (3, 5, 3, 5):
    torch.ops.mkldnn._linear_pointwise(torch.randn(n, 16), w, None, "none", [], "")
print("left:", os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), flush=True)
"""


def test_decoding_bounds_the_kernels_onednn_keeps_and_leaks_no_variable():
    """oneDNN keeps a kernel per shape: bounded (here to 1), two shapes taking turns are built
    again every time, where unbounded the second round finds both kept; either way the
    variable is gone again, so no process started later inherits it."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    env["ONEDNN_VERBOSE"] = "profile_create"  # a line per kernel made: cache_hit or cache_miss
    hits = {}
    for bound in (False, True):
        out = subprocess.run(
            [sys.executable, "-c", KERNELS.format(bound=bound)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("----")[1]
        hits[bound] = out.count("cache_hit")
        assert out.count("cache_miss") and out.strip().endswith("left: None")
    assert hits[False] >= 2 and hits[True] == 0


def test_a_loaded_engine_bounds_its_kernels_in_bf16_and_int8_unless_the_user_set_it(
    trained, monkeypatch
):
    """Bounded before the engine's first kernel (its weights packed or quantized), where they
    are half precision or int8; float32's are small and many, and kept."""
    import cli.inference.engines as engines
    from cli.device import bound_decoding_kernels

    events = []
    monkeypatch.setattr(engines, "bound_decoding_kernels", lambda: events.append("bound"))
    monkeypatch.setattr(engines, "pack_linears", lambda m, dtype: events.append(dtype))
    monkeypatch.setattr(engines, "quantize_int8", lambda m, device: events.append("int8") or m)
    cpu = torch.device("cpu")
    engines.load_engine(str(trained), cpu, ["decode.precision=bf16"])
    assert events == ["bound", torch.bfloat16]
    events.clear()
    engines.load_engine(str(trained), cpu, [], int8=True)
    assert events == ["bound", "int8"]
    events.clear()
    engines.load_engine(str(trained), cpu, ["decode.precision=fp32"])
    assert events == [torch.float32]
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    bound_decoding_kernels()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"
