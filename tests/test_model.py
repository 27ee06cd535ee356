"""The Transformer against torch's reference layers, its masks, its cache, tying and size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from benchmarks.uncached import uncached_start
from model.search import SearchSettings, greedy_search
from model.transformer import (
    ModelConfig,
    Transformer,
    causal_mask,
    count_parameters,
    sinusoidal_positions,
)

PAD, BOS, EOS = 0, 2, 3
VOCAB = 40


def tiny_config(**overrides) -> ModelConfig:
    sizes = dict(d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2, n_decoder_layers=2)
    no_dropout = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    return ModelConfig(**{**sizes, **no_dropout, **overrides})


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides), VOCAB, VOCAB, PAD).eval()


def padded_batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, max(lengths)) right-padded with PAD, and the padding mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (len(lengths), max(lengths)), generator=g)
    pad_mask = torch.arange(max(lengths))[None, :] >= torch.tensor(lengths)[:, None]  # (B, L)
    return ids.masked_fill(pad_mask, PAD), pad_mask


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """src, src_pad_mask, tgt_in, tgt_pad_mask with padding in both (tgt_in starts with BOS)."""
    src, src_pad = padded_batch([7, 4, 6], seed)
    tgt_in, tgt_pad = padded_batch([5, 6, 3], seed + 1)
    tgt_in[:, 0] = BOS
    return src, src_pad, tgt_in, tgt_pad


def torch_reference(model: Transformer) -> tuple[nn.TransformerEncoder, nn.TransformerDecoder]:
    """torch's encoder and decoder stacks with our weights: the state dicts share every name."""
    c = model.config

    def layer(cls: type[nn.Module]) -> nn.Module:
        return cls(
            c.d_model,
            c.n_heads,
            c.d_ff,
            dropout=0.0,
            activation={"relu": F.relu, "gelu": F.gelu, "swish": F.silu}[c.activation],
            layer_norm_eps=c.norm_eps,
            batch_first=True,
            norm_first=c.norm_first,
        )

    def final_norm() -> nn.LayerNorm | None:
        return nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm_first else None

    encoder = nn.TransformerEncoder(
        layer(nn.TransformerEncoderLayer),
        c.n_encoder_layers,
        norm=final_norm(),
        enable_nested_tensor=False,
    )
    decoder = nn.TransformerDecoder(
        layer(nn.TransformerDecoderLayer), c.n_decoder_layers, norm=final_norm()
    )
    encoder.load_state_dict(model.encoder.state_dict())  # strict: every name must match
    decoder.load_state_dict(model.decoder.state_dict())
    dtype = next(model.parameters()).dtype
    return encoder.to(dtype).eval(), decoder.to(dtype).eval()


@pytest.mark.parametrize(
    "switches",
    [
        dict(norm_first=False),
        dict(norm_first=True),
        # what an OPUS-MT import sets (positions are the embeddings', outside the stacks)
        dict(activation="swish", norm_eps=1e-6),
        dict(activation="gelu"),
    ],
)
def test_matches_torch_transformer_at_real_positions(switches):
    model = tiny_model(**switches).double()
    encoder, decoder = torch_reference(model)
    src, src_pad, tgt_in, tgt_pad = batch()
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        hidden = model.decode(tgt_in, memory, src_pad, tgt_pad)
        ref_memory = encoder(model.src_embed(src), src_key_padding_mask=src_pad)
        ref_hidden = decoder(
            model.tgt_embed(tgt_in),
            ref_memory,
            tgt_mask=causal_mask(tgt_in.size(1)),
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
    assert_close(memory[~src_pad], ref_memory[~src_pad])
    assert_close(hidden[~tgt_pad], ref_hidden[~tgt_pad])


def test_pad_ids_change_nothing_at_real_positions():
    model = tiny_model()
    src, src_pad, tgt_in, tgt_pad = batch()
    other_src = src.masked_fill(src_pad, 17)
    other_tgt = tgt_in.masked_fill(tgt_pad, 23)
    with torch.no_grad():
        logits = model(src, tgt_in, src_pad, tgt_pad)
        assert_close(model(other_src, tgt_in, src_pad, tgt_pad)[~tgt_pad], logits[~tgt_pad])
        assert_close(model(src, other_tgt, src_pad, tgt_pad)[~tgt_pad], logits[~tgt_pad])


def test_future_target_tokens_change_no_earlier_logit():
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()
    with torch.no_grad():
        logits = model(src, tgt_in, src_pad, None)  # (B, T, V)
        for j in range(1, tgt_in.size(1)):
            changed = tgt_in.clone()
            changed[:, j] = (changed[:, j] + 1) % VOCAB
            assert_close(model(src, changed, src_pad, None)[:, :j], logits[:, :j])


def test_all_padding_source_gives_no_nan():
    model = tiny_model()
    src, src_pad, tgt_in, tgt_pad = batch()
    src_pad[1] = True
    with torch.no_grad():
        assert torch.isfinite(model(src, tgt_in, src_pad, tgt_pad)).all()


def step_by_step(model: Transformer, memory, src_pad, tokens: torch.Tensor) -> torch.Tensor:
    """decode_step over tokens (B, T), stacked logits (B, T, V)."""
    cache = model.init_cache(memory, src_pad)
    return torch.stack([model.decode_step(tokens[:, t], cache) for t in range(tokens.size(1))], 1)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_decoding(norm_first):
    model = tiny_model(norm_first=norm_first)
    src, src_pad, tgt_in, _ = batch()
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        full = model.project(model.decode(tgt_in, memory, src_pad, None))  # (B, T, V)
        cached = step_by_step(model, memory, src_pad, tgt_in)
    assert_close(cached, full, atol=1e-5, rtol=1e-5)


def test_cached_decoding_after_reorder():
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()
    index = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        cache = model.init_cache(memory, src_pad)
        for t in range(2):
            model.decode_step(tgt_in[:, t], cache)
        cache = cache.reorder(index)
        reordered = tgt_in[index]
        after = [model.decode_step(reordered[:, t], cache) for t in range(2, tgt_in.size(1))]
        full = model.project(model.decode(reordered, memory[index], src_pad[index], None))
    assert_close(torch.stack(after, 1), full[:, 2:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [0, 2, 6])
def test_self_attention_cache_is_written_in_place(steps):
    """Every layer's self-attention keys and values go into tables made once (room for `steps`
    tokens, grown past it); a reorder that moves most rows copies into a second set, the two
    taking turns, one that moves few copies those rows in place; the logits equal full
    decoding of the reordered rows at every step."""
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()  # 3 sentences, 6 target positions
    orders = {
        1: torch.tensor([1, 0, 2]),  # two of three move: into new tables
        2: torch.tensor([2, 0, 0, 1]),  # widen: tables of 4 rows
        3: torch.tensor([3, 1, 2]),  # narrow, one row moves: in place
        4: torch.tensor([2, 0, 1]),  # all move: into the spares, the first tables, 3 rows
    }
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        cache = model.init_cache(memory, src_pad, steps)
        rows, index, buffers = tgt_in, torch.arange(3), []
        for t in range(tgt_in.size(1)):
            if t in orders:
                # Sentences change places: their cross-attention keys move too (in place
                # where few do), which the searches' reorders never ask but as sentences leave.
                cache = cache.reorder(orders[t], same_sentences=False)
                rows, index = rows[orders[t]], index[orders[t]]
            logits = model.decode_step(rows[:, t], cache)
            full = model.project(
                model.decode(rows[:, : t + 1], memory[index], src_pad[index], None)
            )
            assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)
            buffers.append(cache.self_attn.tables[0])
    pointers = [b.data_ptr() for b in buffers]
    if steps == 6:  # room for every step: no buffer made but for more rows
        assert pointers[0] != pointers[1] != pointers[2] == pointers[3] != pointers[4]
        assert pointers[4] == pointers[1] == pointers[5]
        assert {tuple(b.shape[1:]) for b in buffers} == {(model.config.n_heads, 6, 4)}
    else:  # grown as needed, never below what was fed
        assert all(b.size(2) >= t + 1 for t, b in enumerate(buffers))
    assert len(cache.self_attn.tables) == 2 * model.config.n_decoder_layers  # keys, values


def test_a_reordered_cache_is_spent():
    """A reorder hands the cache's buffers on: using the old cache again is an error, never
    keys read from buffers its successor now writes."""
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, src_pad), src_pad)
        model.decode_step(tgt_in[:, 0], cache)
        cache.reorder(torch.tensor([1, 0, 2]))
        with pytest.raises(RuntimeError, match="used after its reorder"):
            model.decode_step(tgt_in[:, 1], cache)
        with pytest.raises(RuntimeError, match="used after its reorder"):
            cache.reorder(torch.tensor([0, 1, 2]))


def test_a_cache_reordered_mid_step_is_refused():
    """A reorder copies every layer's first t positions: between steps, when the layers hold
    the same number. Between two layers' writes it refuses rather than drop the positions of
    the layers already written."""
    model = tiny_model()
    src, src_pad, _, _ = batch()
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, src_pad), src_pad)
        keys = torch.zeros(3, model.config.n_heads, 1, 4)
        cache.self_attn.layer(0).append(keys, keys)
        with pytest.raises(RuntimeError, match="reordered mid-step"):
            cache.reorder(torch.tensor([1, 0, 2]))


def test_beams_share_their_sentence_keys_and_values():
    """Each sentence's rows (beams) attend to its one copy of the source keys and values: a
    reorder within sentences copies none, one that drops a sentence drops its copy, and the
    logits equal decoding each row on its own."""
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()  # 3 sentences
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        cache = model.init_cache(memory, src_pad)
        model.decode_step(tgt_in[:, 0], cache)
        beams = torch.tensor([0, 0, 1, 1, 2, 2])  # two beams each
        expanded = cache.reorder(beams, group=2)
        assert expanded.cross_attn[0].keys is cache.cross_attn[0].keys  # nothing copied
        rows = tgt_in[beams]
        steps = [model.decode_step(rows[:, 1], expanded)]
        dropped = torch.tensor([3, 2, 5, 4])  # sentence 0 leaves; beams swap places
        fewer = expanded.reorder(dropped, group=2)
        assert fewer.cross_attn[0].keys.size(0) == 2
        rows = rows[dropped]
        steps.append(model.decode_step(rows[:, 2], fewer))
        full = model.project(
            model.decode(rows, memory[beams][dropped], src_pad[beams][dropped], None)
        )
    assert_close(steps[1], full[:, 2], atol=1e-5, rtol=1e-5)
    full_first = model.project(model.decode(tgt_in[beams], memory[beams], src_pad[beams], None))
    assert_close(steps[0], full_first[:, 1], atol=1e-5, rtol=1e-5)


def test_decode_step_under_bfloat16_autocast():
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()
    with torch.no_grad():
        full = model.project(model.decode(tgt_in, model.encode(src, src_pad), src_pad, None))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            memory = model.encode(src, src_pad)
            cache = model.init_cache(memory, src_pad)
            cached = [model.decode_step(tgt_in[:, t], cache) for t in range(tgt_in.size(1))]
    # The cache holds what autocast made, in the float32 its attention runs in: cast once.
    for kv in (cache.self_attn.layer(0), cache.cross_attn[0]):
        assert kv.keys.dtype == torch.float32
        assert torch.equal(kv.keys.bfloat16().float(), kv.keys)
    assert_close(torch.stack(cached, 1).float(), full, atol=0.1, rtol=0.05)


def test_dropout_only_in_training():
    model = tiny_model(dropout=0.1, attention_dropout=0.3, activation_dropout=0.1)
    src, src_pad, tgt_in, tgt_pad = batch()
    with torch.no_grad():
        assert_close(model(src, tgt_in, src_pad, tgt_pad), model(src, tgt_in, src_pad, tgt_pad))
        model.train()
        first, second = (model(src, tgt_in, src_pad, tgt_pad) for _ in range(2))
    assert not torch.allclose(first, second)


def test_uncached_step_equals_cached_step():
    model = tiny_model()
    src, src_pad, tgt_in, _ = batch()
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        state, step = uncached_start(model, memory, src_pad)
        uncached = [step(tgt_in[:, t], state) for t in range(tgt_in.size(1))]
        cached = step_by_step(model, memory, src_pad, tgt_in)
    assert_close(torch.stack(uncached, 1), cached, atol=1e-5, rtol=1e-5)


def test_cross_attention_matches_torch_weights():
    model = tiny_model().double()
    _, decoder = torch_reference(model)
    src, src_pad, tgt_in, tgt_pad = batch()
    causal = causal_mask(tgt_in.size(1))
    with torch.no_grad():
        probabilities = model.cross_attention(src, tgt_in, src_pad, tgt_pad)  # (L, B, H, T, S)
        memory = model.encode(src, src_pad)
        x = model.tgt_embed(tgt_in)
        for layer, ours in zip(decoder.layers, probabilities, strict=True):
            # torch's Post-LN layer: the cross-attention reads norm1(x + self-attention(x)).
            query = layer.norm1(x + layer._sa_block(x, causal, tgt_pad))
            _, ref = layer.multihead_attn(
                query, memory, memory, key_padding_mask=src_pad, average_attn_weights=False
            )
            assert_close(ours.transpose(1, 2)[~tgt_pad], ref.transpose(1, 2)[~tgt_pad])
            x = layer(
                x,
                memory,
                tgt_mask=causal,
                tgt_key_padding_mask=tgt_pad,
                memory_key_padding_mask=src_pad,
            )
    assert probabilities.shape == (2, 3, 4, tgt_in.size(1), src.size(1))
    assert_close(probabilities.sum(-1), torch.ones_like(probabilities.sum(-1)))
    on_padding = src_pad[None, :, None, None, :].expand_as(probabilities)  # (L, B, H, T, S)
    assert (probabilities[on_padding] == 0).all()


def reference_greedy(model, encoder, decoder, src, src_pad, max_len: int) -> list[list[int]]:
    """Greedy decoding with torch's stacks, the whole prefix decoded again at every step."""
    memory = encoder(model.src_embed(src), src_key_padding_mask=src_pad)
    tokens = torch.full((src.size(0), 1), BOS)
    for _ in range(max_len):
        hidden = decoder(
            model.tgt_embed(tokens),
            memory,
            tgt_mask=causal_mask(tokens.size(1)),
            memory_key_padding_mask=src_pad,
        )
        next_tokens = model.project(hidden[:, -1]).argmax(-1)  # (B,)
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
    outputs = [row[1:] for row in tokens.tolist()]
    return [row[: row.index(EOS)] if EOS in row else row for row in outputs]


def test_greedy_decode_matches_torch_reference_token_for_token():
    model = tiny_model(seed=3, tie_embeddings="none")
    with torch.no_grad():
        model.generator.weight[EOS] *= 6  # so that outputs end at different lengths
    encoder, decoder = torch_reference(model)
    src, src_pad = padded_batch([7, 4, 6, 5, 3], seed=5)
    max_len = 10
    with torch.no_grad():
        expected = reference_greedy(model, encoder, decoder, src, src_pad, max_len)
        cache = model.init_cache(model.encode(src, src_pad), src_pad)
        hyps = greedy_search(
            lambda tokens, c: (F.log_softmax(model.decode_step(tokens, c), -1), c),
            cache,
            lambda c, index, group: c.reorder(index, group),
            SearchSettings(bos_id=BOS, eos_id=EOS),
            torch.full((5,), max_len),
        )
    assert [h.tokens for h in hyps] == expected
    assert len({len(tokens) for tokens in expected}) > 1


def test_tying_shares_parameters():
    none = tiny_model(tie_embeddings="none")
    decoder = tiny_model(tie_embeddings="decoder")
    every = tiny_model(tie_embeddings="all")
    assert none.generator.weight is not none.tgt_embed.token.weight
    assert none.src_embed.token.weight is not none.tgt_embed.token.weight
    assert decoder.generator.weight is decoder.tgt_embed.token.weight
    assert decoder.src_embed.token.weight is not decoder.tgt_embed.token.weight
    assert every.generator.weight is every.tgt_embed.token.weight is every.src_embed.token.weight
    shared = VOCAB * 16
    assert none.num_parameters() - decoder.num_parameters() == shared
    assert decoder.num_parameters() - every.num_parameters() == shared


def test_tying_all_needs_one_vocabulary():
    with pytest.raises(ValueError, match="joint vocabulary"):
        Transformer(tiny_config(tie_embeddings="all"), VOCAB, VOCAB + 1, PAD)
    with pytest.raises(ValueError, match="tie_embeddings"):
        Transformer(tiny_config(tie_embeddings="encoder"), VOCAB, VOCAB, PAD)


def test_initialisation_zeroes_the_pad_embedding():
    model = tiny_model(tie_embeddings="none")
    for embedding in (model.src_embed.token, model.tgt_embed.token):
        assert (embedding.weight[PAD] == 0).all()
        assert embedding.weight[PAD + 1 :].std().item() == pytest.approx(16**-0.5, rel=0.2)


def test_positions_beyond_max_positions_are_an_error():
    model = tiny_model(max_positions=8)
    src, src_pad = padded_batch([9], seed=0)
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(src, src_pad)


@pytest.mark.parametrize("tie", ["none", "decoder", "all"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("output_bias", [False, True])
def test_parameter_count_formula(tie, norm_first, output_bias):
    config = tiny_config(tie_embeddings=tie, norm_first=norm_first, output_bias=output_bias)
    src_vocab = VOCAB if tie == "all" else VOCAB + 7
    model = Transformer(config, src_vocab, VOCAB, PAD)
    assert count_parameters(config, src_vocab, VOCAB) == model.num_parameters()


@pytest.mark.parametrize(
    "sizes, low, high",
    [
        (dict(), 63e6, 66e6),  # base: the paper's Table 3 says 65M
        (dict(d_model=1024, n_heads=16, d_ff=4096), 205e6, 215e6),  # big: 213M
    ],
)
def test_paper_model_sizes(sizes, low, high):
    config = ModelConfig(**sizes, tie_embeddings="all")
    with torch.device("meta"):  # no memory, no initialisation cost
        model = Transformer(config, 37000, 37000, PAD)
    assert count_parameters(config, 37000, 37000) == model.num_parameters()
    assert low <= model.num_parameters() <= high


def test_causal_mask_blocks_the_future():
    assert causal_mask(3).tolist() == [
        [False, True, True],
        [False, False, True],
        [False, False, False],
    ]


def test_the_attention_pass_runs_each_decoder_layer_once():
    """The heatmap pass keeps each layer's cross-attention while running the layer, instead of
    running the self-attention again to find the layer's input."""
    model = tiny_model().eval()
    src, src_pad, tgt_in, tgt_pad = batch()
    calls = []
    for layer in model.decoder.layers:
        layer.self_attn.register_forward_hook(lambda module, args, out: calls.append(module))
    with torch.no_grad():
        model.cross_attention(src, tgt_in, src_pad, tgt_pad)
    assert len(calls) == len(model.decoder.layers)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("as_bias", [False, True])
def test_cpu_half_precision_attention_equals_sdpa(causal, as_bias):
    """The written-out attention used under CPU autocast (torch's fused CPU kernel is 5x slower
    there) computes what scaled_dot_product_attention does: values and gradients, with a
    key-padding mask (boolean, or additive as `keep_bias` makes it), the causal flag, and
    all-masked rows handled as `keep_mask` makes them."""
    from model.attention import keep_bias, keep_mask, written_out_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, :] = causal is False  # an all-padding row (keep_mask lets it see every key)
    keep = keep_mask(pad)
    mask = keep_bias(keep, torch.bfloat16) if as_bias else keep
    ours = written_out_attention(q, k, v, mask, causal, 0.0)
    ours.float().square().sum().backward()
    mine = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    theirs = F.scaled_dot_product_attention(*ref, attn_mask=keep, is_causal=causal)
    theirs.square().sum().backward()
    assert_close(ours.float(), theirs, atol=2e-2, rtol=2e-2)
    for got, want in zip(mine, ref):
        assert_close(got.float(), want.grad, atol=5e-2, rtol=5e-2)


def test_training_under_cpu_autocast_takes_the_written_out_attention(monkeypatch):
    import model.attention as attention

    calls = []
    real = attention.written_out_attention
    monkeypatch.setattr(attention, "written_out_attention", lambda *a: calls.append(1) or real(*a))
    model = tiny_model().train()
    src, pad = padded_batch([5, 3], seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(src, src, pad, pad)
    c = model.config
    assert len(calls) == c.n_encoder_layers + 2 * c.n_decoder_layers  # self, self and cross
    calls.clear()
    model(src, src, pad, pad)  # fp32: SDPA's fused kernel
    assert not calls


def test_decoding_steps_of_many_rows_take_the_written_out_attention(monkeypatch):
    """At one query a row, SDPA's fused CPU kernel costs about a microsecond per (row, head):
    a step with WRITTEN_OUT_QUERIES of them or more attends written out, self- and
    cross-attention alike, and computes what full decoding does (padded sources); a step with
    fewer, the fused kernel."""
    import model.attention as attention

    calls = []
    real = attention.written_out_attention
    monkeypatch.setattr(attention, "written_out_attention", lambda *a: calls.append(1) or real(*a))
    model = tiny_model()
    rows = -(-attention.WRITTEN_OUT_QUERIES // model.config.n_heads)  # the fewest that do
    src, pad = padded_batch([1 + i % 7 for i in range(rows)], seed=0)
    tgt, _ = padded_batch([4] * rows, seed=1)
    with torch.no_grad():
        memory = model.encode(src, pad)
        full = model.project(model.decode(tgt, memory, pad, None))  # (rows, 4, V)
        assert not calls  # a whole sequence at once: the fused kernel
        cached = step_by_step(model, memory, pad, tgt)
        assert len(calls) == 4 * 2 * model.config.n_decoder_layers
        calls.clear()
        fewer = step_by_step(model, memory[1:], pad[1:], tgt[1:])
    assert not calls
    assert_close(cached, full, atol=1e-5, rtol=1e-5)
    assert_close(fewer, full[1:], atol=1e-5, rtol=1e-5)


def test_keep_bias_is_the_additive_mask_in_the_dtype_asked():
    from model.attention import keep_bias, keep_mask

    pad = torch.tensor([[False, False, True], [True, True, True]])
    bias = keep_bias(keep_mask(pad), torch.float64)
    assert bias.dtype == torch.float64 and bias.shape == (2, 1, 1, 3)
    inf = float("-inf")
    assert bias.flatten(1).tolist() == [[0.0, 0.0, inf], [0.0, 0.0, 0.0]]  # all-padding: all
    assert keep_bias(None, torch.float32) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decoding_steps_take_the_cache_s_additive_mask(dtype, monkeypatch):
    """A decoding cache keeps the source's mask additive, in the keys' dtype (SDPA's CPU kernel
    read a float32 mask of float64 queries as float64, and turns a boolean one into an
    additive one at every call): every attention of a step with a mask gets that tensor."""
    model = tiny_model().to(dtype)
    src, pad = padded_batch([5, 3], seed=0)
    masks = []
    real = F.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, pad), pad)
        masks.clear()
        model.decode_step(torch.tensor([BOS, BOS]), cache)
    given = [m for m in masks if m is not None]
    assert len(given) == model.config.n_decoder_layers  # cross-attention's
    assert all(m is cache.src_keep for m in given) and cache.src_keep.dtype == dtype


def test_decoding_calls_no_dropout_module():
    """Dropout that does nothing (evaluation, or p = 0) is not called: a decoding step made
    16 module calls for nothing. Training calls those with p > 0 (here the residual ones, the
    FFN's activation dropout being 0)."""
    model = tiny_model(dropout=0.1)
    calls = []
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.register_forward_hook(lambda module, args, out: calls.append(module))
    src, src_pad, tgt_in, tgt_pad = batch()
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, src_pad), src_pad)
        model.decode_step(tgt_in[:, 0], cache)
        model(src, tgt_in, src_pad, tgt_pad)
    assert not calls
    model.train()
    model(src, tgt_in, src_pad, tgt_pad)
    assert calls and {module.p for module in calls} == {0.1}


def test_decoding_under_cpu_autocast_attends_in_float32(monkeypatch):
    """Without gradients (decoding) attention under CPU autocast runs in float32 (no per-shape
    half-precision kernels): SDPA computes in float32 (autocast would cast float32 inputs to
    bf16 and return bf16), and the output is what it computes."""
    model = tiny_model()
    src, pad = padded_batch([5, 3], seed=0)
    seen = []
    real = F.scaled_dot_product_attention

    def recorded(q, *args, **kwargs):
        out = real(q, *args, **kwargs)
        seen.append((q.dtype, out.dtype))
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, src, pad, pad)
    c = model.config
    assert seen == [(torch.float32,) * 2] * (c.n_encoder_layers + 2 * c.n_decoder_layers)
    with torch.inference_mode():
        fp32 = model(src, src, pad, pad)
    assert_close(logits.float(), fp32, atol=0.1, rtol=0.05)


def test_halves_positions_are_the_interleaved_ones_reordered():
    """model.positions "halves" (Marian's): the same sines and cosines, sines first."""
    interleaved = sinusoidal_positions(50, 16)
    halves = sinusoidal_positions(50, 16, "halves")
    assert torch.equal(halves, torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1))
    model = tiny_model(positions="halves")
    assert torch.equal(model.src_embed.positions, sinusoidal_positions(1024, 16, "halves"))


def test_output_bias_is_added_to_every_logit_and_starts_at_zero():
    model = tiny_model(output_bias=True)
    assert torch.equal(model.generator.bias, torch.zeros(VOCAB))
    src, src_pad, tgt_in, tgt_pad = batch()
    with torch.no_grad():
        before = model(src, tgt_in, src_pad, tgt_pad)
        model.generator.bias.copy_(torch.arange(VOCAB, dtype=torch.float))
        after = model(src, tgt_in, src_pad, tgt_pad)
    assert_close(after - before, torch.arange(VOCAB, dtype=torch.float).expand_as(before))
