"""LoRA adapters (`model/lora.py`) against weights merged by hand: outputs, merging, freezing,
gradients, dropout and the settings' errors, on tiny models in Post-LN and in NLLB's Pre-LN."""

from __future__ import annotations

import copy
import itertools
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from test_model import VOCAB, batch, tiny_config
from test_search import model_search, tokens_and_scores
from test_search import tiny_model as search_model
from torch import nn
from torch.testing import assert_close

from model import m2m100, mbart
from model.dropout import dropout
from model.lora import (
    LORA_TARGETS,
    TRAINABLE_GROUPS,
    LoraAdapter,
    LoraConfig,
    LoraLinear,
    add_lora,
    check_lora,
    freeze_for_lora,
    lora_parameters,
    merge_lora,
    rows_trained_alone,
)
from model.packed import can_pack, pack_linears
from model.transformer import ModelConfig, Transformer

LAYOUTS = {"post-ln": {}, "pre-ln": m2m100.LAYOUT}
RANK, ALPHA = 2, 8.0  # scale 4: a wrong or missing scale shows


def tiny_model(layout: str = "post-ln", seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**{**LAYOUTS[layout], **overrides}), VOCAB, VOCAB, 0).eval()


def randomise_b(model: nn.Module, seed: int = 1) -> None:
    """Every adapter's B random (it starts at zero, where any A would pass unseen)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".B"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def adapted(layout: str = "post-ln", targets=LORA_TARGETS, **overrides):
    """A tiny model and a copy of it with adapters (B random) on `targets`."""
    plain = tiny_model(layout, **overrides)
    model = copy.deepcopy(plain)
    lora = LoraConfig(rank=RANK, alpha=ALPHA, targets=list(targets))
    add_lora(model, lora, torch.Generator().manual_seed(0))
    randomise_b(model)
    return plain, model


def merged_by_hand(plain: Transformer, model: Transformer) -> Transformer:
    """`plain` with each adapted weight W replaced by W + alpha / rank B A, computed here from
    the adapters' names (in float64), independently of `merge_lora`."""
    weights = {k: v.double() for k, v in plain.state_dict().items()}
    params = dict(model.named_parameters())
    inner = model.config.d_model
    rows = dict(
        lora_q=slice(0, inner), lora_k=slice(inner, 2 * inner), lora_v=slice(2 * inner, None)
    )
    for name in params:
        if not name.endswith(".A"):
            continue
        path = name[: -len(".A")]
        update = ALPHA / RANK * params[path + ".B"].double() @ params[name].double()
        owner, leaf = path.rsplit(".", 1)
        if leaf == "lora":  # a LoraLinear: out_proj, linear1, linear2
            weights[owner + ".weight"] += update
        else:  # W_q, W_k or W_v: rows of in_proj
            weights[owner + ".in_proj_weight"][rows[leaf]] += update
    hand = copy.deepcopy(plain)
    hand.load_state_dict({k: v.float() for k, v in weights.items()})
    return hand


def inputs() -> tuple[torch.Tensor, ...]:
    """`Transformer.forward`'s src, tgt_in, src_pad_mask, tgt_pad_mask, with padding."""
    src, src_pad, tgt_in, tgt_pad = batch()
    return src, tgt_in, src_pad, tgt_pad


def logits(model: Transformer) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_adapted_model_starts_as_its_base_exactly(layout):
    plain = tiny_model(layout)
    model = copy.deepcopy(plain)
    names = add_lora(model, LoraConfig(rank=RANK, alpha=ALPHA, targets=list(LORA_TARGETS)))
    # 2 + 2 layers: self-attention q, k, v, o and the FFN's two in each, cross-attention's 4
    assert len(names) == 2 * (2 * 6 + 2 * 10)
    b = [p for n, p in model.named_parameters() if n.endswith(".B")]
    assert len(b) == len(names) // 2 and not any(p.any() for p in b)
    assert torch.equal(logits(model), logits(plain))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("targets", [[t] for t in LORA_TARGETS] + [list(LORA_TARGETS)])
def test_the_adapted_forward_equals_weights_merged_by_hand(layout, targets):
    plain, model = adapted(layout, targets)
    per_layer = {"q": 1, "k": 1, "v": 1, "o": 1, "ffn": 2}  # adapters of one attention / FFN
    attentions = 2 + 2 * 2  # 2 encoder layers' self-attention, 2 decoder layers' two
    expected = sum(per_layer[t] * (attentions if t != "ffn" else 4) for t in targets)
    assert len(lora_parameters(model)) == 2 * expected
    hand = merged_by_hand(plain, model)
    assert not torch.allclose(logits(hand), logits(plain), atol=1e-3)  # the update shows
    assert_close(logits(model), logits(hand), atol=1e-5, rtol=0)


def test_cross_attention_adapts_queries_from_the_decoder_and_keys_values_from_memory():
    """Cross-attention projects W_q from the decoder states and W_k, W_v from the encoder
    output, separately: each adapter must land in its own part's columns."""
    for targets in (["q"], ["k"], ["v"]):
        plain, model = adapted("post-ln", targets)
        for layer in model.encoder.layers:  # only the cross-attention keeps adapters
            for part in "qkv":
                setattr(layer.self_attn, f"lora_{part}", None)
        for layer in model.decoder.layers:
            for part in "qkv":
                setattr(layer.self_attn, f"lora_{part}", None)
        assert_close(logits(model), logits(merged_by_hand(plain, model)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_merging_gives_an_ordinary_model_with_the_same_outputs(layout):
    plain, model = adapted(layout)
    before = logits(model)
    in_proj = model.decoder.layers[0].multihead_attn.in_proj_weight
    linear1 = model.encoder.layers[1].linear1.weight
    merge_lora(model)
    assert_close(logits(model), before, atol=1e-5, rtol=0)
    assert lora_parameters(model) == []
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert shapes == {k: v.shape for k, v in plain.state_dict().items()}
    assert not any(isinstance(m, LoraLinear) for m in model.modules())
    # the same Parameters, updated in place
    assert model.decoder.layers[0].multihead_attn.in_proj_weight is in_proj
    assert model.encoder.layers[1].linear1.weight is linear1
    assert type(model.encoder.layers[1].linear1) is nn.Linear
    for ours, theirs in zip(model.modules(), plain.modules(), strict=True):
        assert type(ours) is type(theirs) and ours._modules.keys() == theirs._modules.keys()


def test_a_base_state_dict_loads_into_an_adapted_model_missing_only_the_adapters():
    plain, model = adapted()
    before = logits(model)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(".A")}
    adapters |= {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(".B")}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    result = model.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(result.missing_keys) == sorted(lora_parameters(model)) == sorted(adapters)
    assert result.unexpected_keys == []
    assert model.load_state_dict(adapters, strict=False).unexpected_keys == []
    assert torch.equal(logits(model), before)


def searched(model: Transformer) -> tuple[list, list]:
    """Greedy and beam search (3) of test_search's batch: tokens, and scores."""
    greedy = [[h] for h in model_search(model, True, None)]
    return tokens_and_scores(greedy + model_search(model, True, 3))


def test_merged_and_adapted_models_decode_alike():
    plain = search_model()  # float64, random, whose outputs end at different lengths
    model = copy.deepcopy(plain)
    add_lora(model, LoraConfig(rank=RANK, alpha=ALPHA, targets=list(LORA_TARGETS)))
    randomise_b(model)
    with torch.no_grad():
        tokens, scores = searched(model)
        assert tokens != searched(plain)[0]  # the adapters change the output
        merge_lora(model)
        merged_tokens, merged_scores = searched(model)
    assert merged_tokens == tokens
    assert merged_scores == pytest.approx(scores, abs=1e-9)


@pytest.mark.skipif(not can_pack(), reason="no oneDNN packed linear kernels")
def test_a_packed_adapted_model_still_adds_its_updates(monkeypatch):
    """`pack_linears` packs in_proj's parts (the adapters go on top) and leaves the adapted
    out_proj and FFN layers unpacked; merging a packed model is refused."""
    monkeypatch.setattr("model.packed.SMALL_MACS", 0)  # pack even these tiny products
    plain, model = adapted()
    expected = logits(merged_by_hand(plain, model))
    assert pack_linears(model)
    assert model.decoder.layers[0].self_attn.packed
    assert_close(logits(model), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="merging LoRA in a packed model"):
        merge_lora(model)
    plain_packed = tiny_model()
    assert pack_linears(plain_packed)
    merge_lora(plain_packed)  # nothing to merge: left as it is


def test_gradients_reach_the_adapters_only_and_match_the_merged_weights():
    """dL/dB = scale dL/dW A^T and dL/dA = scale B^T dL/dW, W's gradient taken on a model
    merged by hand: the low-rank path's backward is the chain rule's."""
    plain, model = adapted(targets=["q", "o", "ffn"])
    trainable = freeze_for_lora(model, [])
    assert trainable == lora_parameters(model)
    hand = merged_by_hand(plain, model)
    for m in (model, hand):
        m(*inputs()).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad == name.endswith((".A", ".B")), name
    hand_grads = {n: p.grad for n, p in hand.named_parameters()}
    attention = model.decoder.layers[1].self_attn
    w_grad = hand_grads["decoder.layers.1.self_attn.in_proj_weight"][: attention.inner]
    A, B = attention.lora_q.A, attention.lora_q.B
    assert_close(B.grad, ALPHA / RANK * w_grad @ A.detach().T, atol=1e-5, rtol=1e-4)
    assert_close(A.grad, ALPHA / RANK * B.detach().T @ w_grad, atol=1e-5, rtol=1e-4)
    linear2 = model.encoder.layers[0].linear2
    w_grad = hand_grads["encoder.layers.0.linear2.weight"]
    lora = linear2.lora
    assert_close(lora.B.grad, ALPHA / RANK * w_grad @ lora.A.detach().T, atol=1e-5, rtol=1e-4)


def kind(name: str) -> str:
    """Which group of `freeze_for_lora` a parameter's name belongs to."""
    if name.endswith((".A", ".B")):
        return "adapter"
    for group in ("norm", "token", "positions", "generator.bias"):
        if group in name:
            return group
    return "other"


def test_freezing_leaves_the_named_groups_trainable():
    config = dict(**mbart.LAYOUT, max_positions=20)  # learned positions, an output bias
    _, model = adapted(targets=["v"], **config)
    trainable = freeze_for_lora(model, ["norms", "output_bias", "embeddings", "positions"])
    assert Counter(map(kind, trainable)) == {
        "adapter": 2 * 6,  # A and B of W_v in 6 attentions
        "norm": 2 * (2 * 2 + 2 * 3 + 2 + 2),  # the layers', the embeddings', the stacks' last
        "token": 1,  # one token embedding, tied to the generator
        "positions": 2,  # one table per stack
        "generator.bias": 1,
    }
    assert Counter(map(kind, freeze_for_lora(model, ["positions"]))) == {
        "adapter": 12,
        "positions": 2,
    }
    trainable = freeze_for_lora(model, ["norms", "output_bias", "embeddings", "positions"])
    model.train()
    model(*inputs()).sum().backward()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(model.get_parameter(n).grad is None for n in frozen)
    assert "encoder.layers.0.self_attn.in_proj_weight" in frozen
    assert "decoder.layers.1.linear1.weight" in frozen
    assert all(model.get_parameter(n).grad is not None for n in trainable)


NEW = VOCAB - 2  # the first of two new languages' rows
GROWN = ("src_embed.token.weight", "tgt_embed.token.weight", "generator.weight", "generator.bias")


def moved_by(groups: tuple[str, ...], tie: str) -> dict[str, torch.Tensor]:
    """Which elements of each weight one Adam step (no weight decay) moves, `groups` trainable
    beside adapters on W_v: a model of every group (learned positions, an output bias), its
    last two ids new languages' (as `cli.training.new_languages.first_new_rows` names them),
    on a batch that holds those ids. Asserts that the parameters whose new rows alone train
    (`rows_trained_alone`: what a checkpoint keeps of them) moved nowhere else."""
    layout = {**mbart.LAYOUT, "max_positions": 20, "tie_embeddings": tie}
    _, model = adapted(targets=["v"], **layout)
    model.train()
    new_rows = {name: NEW for name in GROWN}
    names = freeze_for_lora(model, list(groups), new_rows)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam([model.get_parameter(n) for n in names], lr=0.1)
    src = torch.tensor([[5, NEW, 7, VOCAB - 1, 9], [NEW + 1, 4, NEW, 6, 8]])
    tgt = torch.tensor([[2, NEW, 11, VOCAB - 1, 3], [2, 12, NEW, 13, 3]])
    logits = model(src, tgt[:, :-1], src == 0, tgt[:, :-1] == 0)
    F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()).backward()
    optimizer.step()
    moved = {k: v != before[k] for k, v in model.state_dict().items()}
    for name, first in rows_trained_alone(model, list(groups), new_rows).items():
        assert moved[name][first:].any() and not moved[name][:first].any(), (groups, name)
    return moved


@pytest.mark.parametrize("tie", ["all", "none"])
def test_every_combination_of_trainable_groups_trains_what_its_groups_train_alone(tie):
    """The groups add up: `[embeddings, embeddings_of_new_languages]` trains every row (the new
    rows' group used to freeze the old ones of the same matrix), `[output_bias,
    embeddings_of_new_languages]` the whole bias; every subset of the groups moves the union
    of what each of its groups moves alone, tied or untied."""
    alone = {group: moved_by((group,), tie) for group in TRAINABLE_GROUPS}
    adapters_only = moved_by((), tie)
    for size in range(2, len(TRAINABLE_GROUPS) + 1):
        for groups in itertools.combinations(TRAINABLE_GROUPS, size):
            moved = moved_by(groups, tie)
            for name, mask in moved.items():
                union = adapters_only[name].clone()
                for group in groups:
                    union |= alone[group][name]
                assert torch.equal(mask, union), (groups, name)
    assert alone["embeddings"]["src_embed.token.weight"][:NEW].any()  # the old rows train
    assert alone["output_bias"]["generator.bias"][:NEW].any()


def test_an_unknown_group_names_the_valid_ones():
    _, model = adapted()
    with pytest.raises(ValueError, match="'norms'.*norms, output_bias, embeddings, positions"):
        freeze_for_lora(model, ["norm"])


def test_dropout_changes_training_outputs_only():
    plain = tiny_model()
    model = copy.deepcopy(plain)
    add_lora(model, LoraConfig(rank=RANK, alpha=ALPHA, dropout=0.5, targets=list(LORA_TARGETS)))
    model.train()  # the model's own dropouts are 0: only the adapters' can act
    with torch.no_grad():
        assert torch.equal(model(*inputs()), plain(*inputs()))  # B = 0: the base is never dropped
    randomise_b(model)
    hand = merged_by_hand(plain, model)
    torch.manual_seed(3)
    trained = model(*inputs()).detach()
    assert not torch.allclose(trained, logits(hand), atol=1e-3)
    model.eval()
    assert_close(logits(model), logits(hand), atol=1e-5, rtol=0)


def test_an_adapter_drops_its_input_as_peft_does():
    """peft's lora_dropout: scale B A dropout(x), the mask over x's features (16 here), not
    over the update's (32)."""
    linear = nn.Linear(16, 32)
    adapter = LoraLinear(linear, LoraAdapter(linear.weight, LoraConfig(rank=RANK, dropout=0.5)))
    randomise_b(adapter)
    x = torch.randn(3, 5, 16)
    torch.manual_seed(4)
    y = adapter(x)
    torch.manual_seed(4)
    dropped = dropout(x, 0.5)  # the model's dropout (model/dropout.py), from the same seed
    lora = adapter.lora
    expected = linear(x) + 16.0 / RANK * dropped @ lora.A.T @ lora.B.T
    assert_close(y, expected, atol=1e-5, rtol=0)


def test_rank_zero_adds_nothing_and_a_seed_draws_the_same_adapters():
    model = tiny_model()
    keys = list(model.state_dict())
    assert add_lora(model, LoraConfig()) == []
    assert list(model.state_dict()) == keys
    two = [tiny_model() for _ in range(2)]
    for m in two:
        add_lora(m, LoraConfig(rank=RANK), torch.Generator().manual_seed(5))
    a = [dict(m.named_parameters())["encoder.layers.0.self_attn.lora_q.A"] for m in two]
    assert torch.equal(a[0], a[1]) and a[0].abs().max() <= 16**-0.5  # +-1/sqrt(in)
    with pytest.raises(ValueError, match="already"):
        add_lora(two[0], LoraConfig(rank=RANK))


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(rank=-1), "rank must be 0 or more, got -1"),
        (dict(rank=17), "rank 17 is above the width of target 'q': 16"),
        (dict(rank=20, targets=["ffn"]), "rank 20 is above the width of target 'ffn': 16"),
        (dict(rank=4, targets=["qq"]), r"unknown target 'qq' \(did you mean 'q'\?\)"),
        (dict(rank=0, targets=["fnn"]), r"unknown target 'fnn' \(did you mean 'ffn'\?\)"),
        (dict(rank=4, targets=[]), "no target"),
        (dict(rank=4, alpha=0.0), "alpha must be positive, got 0.0"),
        (dict(rank=4, alpha=math.inf), "alpha must be a finite number, got inf"),
        (dict(rank=4, dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
    ],
)
def test_settings_that_make_no_sense_are_one_line_errors(settings, message):
    with pytest.raises(ValueError, match=message) as error:
        check_lora(LoraConfig(**settings), tiny_config())
    assert "\n" not in str(error.value)


def test_valid_settings_pass():
    check_lora(LoraConfig(), tiny_config())  # rank 0: off
    check_lora(LoraConfig(rank=0, targets=[]), tiny_config())
    check_lora(LoraConfig(rank=16, targets=list(LORA_TARGETS)), tiny_config())
    pruned = ModelConfig(d_model=16, n_heads=2, d_head=4, d_ff=32)  # W_q (8, 16)
    check_lora(LoraConfig(rank=8, targets=["ffn"]), pruned)
    with pytest.raises(ValueError, match="width of target 'q': 8"):
        check_lora(LoraConfig(rank=9, targets=["q"]), pruned)


def test_adapters_follow_the_weights_dtype_and_train_under_autocast():
    _, model = adapted(targets=["q", "ffn"])
    model.double()
    assert all(p.dtype == torch.float64 for p in model.parameters())
    model.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(*inputs())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    F.cross_entropy(out.float().flatten(0, 1), batch()[2].flatten()).backward()
    assert model.encoder.layers[0].self_attn.lora_q.B.grad is not None
