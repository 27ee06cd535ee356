"""The `model.*` switches of NLLB-200, M2M100 and mBART-50, exact against `transformers` itself.

Tiny `M2M100ForConditionalGeneration` models at NLLB's layout and at M2M100's (and one unscaled,
GELU variant), and an `MBartForConditionalGeneration` at mBART-50's, are built with
`transformers`' own config classes, given random weights (norms and biases too) and copied into
`tf`'s Transformer through the name tables of `model/m2m100.py` and `model/mbart.py`: the
logits, cached decoding, LayerDrop and a CTranslate2 export of each are compared. No network.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from cli.config import ConfigError, load_config
from model import m2m100, mbart
from model.search import SearchSettings, greedy_search
from model.transformer import (
    ModelConfig,
    Transformer,
    count_parameters,
    fairseq_sinusoids,
    sinusoidal_positions,
)

BOS, PAD, EOS, UNK = 0, 1, 2, 3  # fairseq's dictionary, as NLLB, M2M100 and mBART number it
VOCAB = 64
LANGS = (VOCAB - 2, VOCAB - 1)  # two language codes, last as in the published vocabularies
TINY = dict(
    vocab_size=VOCAB,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=40,
    bos_token_id=BOS,
    pad_token_id=PAD,
    eos_token_id=EOS,
    decoder_start_token_id=EOS,
)
# Where the published configs differ (nllb-200-distilled-600M, m2m100_418M,
# mbart-large-50-many-to-many-mmt): the activation, the embeddings' scale, LayerDrop, dropouts.
LAYOUTS = {
    "nllb": ("m2m_100", dict(activation_function="relu", scale_embedding=True, layerdrop=0.0)),
    "m2m100": ("m2m_100", dict(activation_function="relu", scale_embedding=True, layerdrop=0.05)),
    "m2m100-unscaled-gelu": (
        "m2m_100",
        dict(activation_function="gelu", scale_embedding=False, layerdrop=0.0),
    ),
    "mbart50": ("mbart", dict(activation_function="gelu", scale_embedding=True, layerdrop=0.0)),
}


def tiny_config(**overrides) -> ModelConfig:
    sizes = dict(d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2, n_decoder_layers=2)
    return ModelConfig(**{**sizes, "max_positions": 40, **overrides})


def quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()


def hf_model(layout: str, seed: int = 0, **overrides):
    """A tiny transformers model of `layout`, every weight random (norms, biases and mBART's
    `final_logits_bias` too, so that a misplaced one shows), in eval mode."""
    from transformers import (
        M2M100Config,
        M2M100ForConditionalGeneration,
        MBartConfig,
        MBartForConditionalGeneration,
    )

    quiet_transformers()
    family, options = LAYOUTS[layout]
    options = dict(options)
    layerdrop = options.pop("layerdrop")
    settings = dict(
        TINY,
        **options,
        encoder_layerdrop=layerdrop,
        decoder_layerdrop=layerdrop,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.0,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    if family == "m2m_100":
        model = M2M100ForConditionalGeneration(M2M100Config(**settings))
    else:
        model = MBartForConditionalGeneration(MBartConfig(**settings))
        model.final_logits_bias.normal_(0, 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def tf_config(hf) -> ModelConfig:
    """The `ModelConfig` of a transformers model: its family's switches, its config's values."""
    c = hf.config
    layout = m2m100.LAYOUT if c.model_type == "m2m_100" else mbart.LAYOUT
    return ModelConfig(
        d_model=c.d_model,
        n_heads=c.encoder_attention_heads,
        d_ff=c.encoder_ffn_dim,
        n_encoder_layers=c.encoder_layers,
        n_decoder_layers=c.decoder_layers,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        activation=c.activation_function,
        max_positions=c.max_position_embeddings,
        scale_embedding=c.scale_embedding,
        encoder_layerdrop=c.encoder_layerdrop,
        decoder_layerdrop=c.decoder_layerdrop,
        **layout,
    )


def family_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """`model`'s weights under the names of its family's transformers model."""
    if model.config.positions == "learned":
        return mbart.mbart_weights(model)
    return m2m100.m2m100_weights(model)


def tf_weights(theirs: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The inverse, through the family's module."""
    family = mbart if config.positions == "learned" else m2m100
    return family.tf_weights(theirs, config)


def copied(hf, tmp_path: Path) -> Transformer:
    """`hf` saved as `save_pretrained` saves it (tied matrices once, as `model.shared`), read
    back and copied into a `tf` Transformer through the family's table."""
    from safetensors.torch import load_file

    hf.save_pretrained(tmp_path / "hf")
    saved = load_file(tmp_path / "hf" / "model.safetensors")
    config = tf_config(hf)
    model = Transformer(config, VOCAB, VOCAB, PAD)
    model.load_state_dict(tf_weights(saved, config), strict=True)
    return model.eval()


def padded(rows: list[list[int]]) -> torch.Tensor:
    """Rows right-padded with PAD, as `tf` batches them."""
    out = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def sources(seed: int = 1, lengths: tuple[int, ...] = (7, 3, 5, 9)) -> torch.Tensor:
    """NLLB's sources, `[src_lang] X </s>`, of different lengths, padded."""
    g = torch.Generator().manual_seed(seed)
    words = [torch.randint(4, LANGS[0], (n,), generator=g).tolist() for n in lengths]
    return padded([[LANGS[0], *w, EOS] for w in words])


def targets_in(seed: int = 2, lengths: tuple[int, ...] = (4, 6, 2, 5)) -> torch.Tensor:
    """Decoder inputs as these models are fed: EOS, the target language, the words; padded."""
    g = torch.Generator().manual_seed(seed)
    words = [torch.randint(4, LANGS[0], (n,), generator=g).tolist() for n in lengths]
    return padded([[EOS, LANGS[1], *w] for w in words])


def hf_logits(hf, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    return hf(
        input_ids=src,
        attention_mask=(src != PAD).long(),
        decoder_input_ids=tgt_in,
        decoder_attention_mask=(tgt_in != PAD).long(),
    ).logits


def our_logits(model: Transformer, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    return model(src, tgt_in, src == PAD, tgt_in == PAD)


# -- exactness against transformers


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_equal_transformers_on_a_padded_batch(layout, tmp_path):
    """fp32 logits within 1e-4 at every real target position of sources and targets of
    different lengths (right-padded: positions counted over the real tokens, as fairseq's)."""
    hf = hf_model(layout)
    model = copied(hf, tmp_path)
    src, tgt_in = sources(), targets_in()
    with torch.no_grad():
        theirs, ours = hf_logits(hf, src, tgt_in), our_logits(model, src, tgt_in)
    real = tgt_in != PAD
    assert_close(ours[real], theirs[real], rtol=0, atol=1e-4)
    assert theirs[real].std() > 0.1  # logits far from flat: a wrong weight would show


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_decoding_equals_the_full_forward(layout, tmp_path):
    """`decode_step`, one token at a time from the cache, gives the full forward's logits
    (and so transformers'): the positions of a step are those of the whole sequence."""
    hf = hf_model(layout)
    model = copied(hf, tmp_path)
    src, tgt_in = sources(), targets_in()
    with torch.no_grad():
        full = our_logits(model, src, tgt_in)
        theirs = hf_logits(hf, src, tgt_in)
        cache = model.init_cache(model.encode(src, src == PAD), src == PAD)
        steps = torch.stack(
            [model.decode_step(tgt_in[:, t], cache) for t in range(tgt_in.size(1))], 1
        )
    real = tgt_in != PAD
    assert_close(steps[real], full[real], rtol=0, atol=1e-5)
    assert_close(steps[real], theirs[real], rtol=0, atol=1e-4)


def test_fairseq_sinusoids_are_m2m100s_bit_for_bit():
    """`positions: fairseq`: transformers' table (fairseq's sines then cosines, frequencies
    divided by D/2 - 1), row for row from the offset on; the paper's differ."""
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding as Theirs,
    )

    theirs = Theirs.get_embedding(50, 16, padding_idx=PAD)
    ours = fairseq_sinusoids(50, 16)
    assert torch.equal(ours[2:], theirs[2:])  # rows 0, 1 are never read (offset 2)
    assert torch.equal(sinusoidal_positions(50, 16, "fairseq"), ours)
    assert not torch.allclose(ours, sinusoidal_positions(50, 16, "halves"), atol=1e-3)


def test_a_pad_token_has_no_position_under_fairseq_positions():
    """fairseq numbers the real tokens only: a pad's position is a zero row, so its embedding
    is its (zero) token row alone."""
    config = tiny_config(**m2m100.LAYOUT)
    torch.manual_seed(0)
    model = Transformer(config, VOCAB, VOCAB, PAD).eval()
    ids = torch.tensor([[5, 6, PAD, PAD]])
    with torch.no_grad():
        x = model.src_embed(ids)
    assert not x[0, 2:].any()
    assert x[0, :2].abs().sum() > 0


def test_pre_ln_layout_is_m2m100s():
    """The norms sit where M2M100's and mBART's do: before each sub-layer, and one ending
    each stack (transformers' `model.{encoder,decoder}.layer_norm`), the norm after the
    embeddings where `layernorm_embedding`, and nothing else (a strict load of the whole
    state dict each way)."""
    for layout in ("nllb", "mbart50"):
        hf = hf_model(layout)
        config = tf_config(hf)
        model = Transformer(config, VOCAB, VOCAB, PAD)
        model.load_state_dict(tf_weights(hf.state_dict(), config), strict=True)
        hf.load_state_dict(family_weights(model), strict=True)
        names = set(family_weights(model))
        assert {"model.encoder.layer_norm.weight", "model.decoder.layer_norm.weight"} <= names
        has_embedding_norm = "model.encoder.layernorm_embedding.weight" in names
        assert has_embedding_norm == (layout == "mbart50")


# -- names, both ways


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_through_transformers_names_is_bit_for_bit(layout, tmp_path):
    """tf -> transformers' names -> tf gives every tensor back, bit for bit, for a model of
    the layout trained by tf (its own random init: learned positions, norms), and the names
    are transformers' whole state dict (a strict load into its model)."""
    config = tf_config(hf_model(layout))
    torch.manual_seed(5)
    model = Transformer(config, VOCAB, VOCAB, PAD)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)  # norms and biases off their initial 1 and 0
    theirs = family_weights(model)
    back = tf_weights(theirs, config)
    ours = model.state_dict()
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)
    hf_model(layout).load_state_dict(theirs, strict=True)
    if config.positions == "learned":  # each stack its own table, saved, with its 2 spare rows
        assert ours["src_embed.positions"].shape == (40 + 2, 16)
        assert not torch.equal(ours["src_embed.positions"], ours["tgt_embed.positions"])


def test_m2m100_has_no_logits_bias():
    config = tiny_config(**{**m2m100.LAYOUT, "output_bias": True})
    with pytest.raises(ValueError, match="no bias on its logits"):
        m2m100.m2m100_weights(Transformer(config, VOCAB, VOCAB, PAD))


def test_tied_stacks_share_the_token_embedding_only():
    """`tie_embeddings: all`: one token matrix (and the generator's), under the names existing
    checkpoints use; positions and norms each stack's own. Today's model has the same state
    dict names as before the switches."""
    model = Transformer(tiny_config(**mbart.LAYOUT), VOCAB, VOCAB, PAD)
    assert model.src_embed.token is model.tgt_embed.token
    assert model.generator.weight is model.src_embed.token.weight
    assert model.src_embed.positions is not model.tgt_embed.positions
    assert model.src_embed.norm is not model.tgt_embed.norm
    assert count_parameters(model.config, VOCAB, VOCAB) == model.num_parameters()
    plain = Transformer(tiny_config(), VOCAB, VOCAB, PAD).state_dict()
    embeddings = {k for k in plain if "embed" in k or "generator" in k}
    assert embeddings == {"src_embed.token.weight", "tgt_embed.token.weight", "generator.weight"}


# -- LayerDrop


def layerdrop_pair(seed: int = 0):
    """An NLLB-layout pair with LayerDrop 0.5 in every stack of 4 layers and no dropout, so
    that the only randomness of a training forward is which layers run."""
    hf = hf_model(
        "nllb",
        encoder_layers=4,
        decoder_layers=4,
        encoder_layerdrop=0.5,
        decoder_layerdrop=0.5,
        dropout=0.0,
        attention_dropout=0.0,
    )
    config = tf_config(hf)
    model = Transformer(config, VOCAB, VOCAB, PAD)
    model.load_state_dict(tf_weights(hf.state_dict(), config), strict=True)
    return hf, model


def test_layerdrop_skips_layers_as_transformers_does_in_training_only():
    """In train mode each seed skips the layers transformers' own draws skip (the same
    `torch.rand([]) < p`), so outputs vary between draws and equal transformers' at each; in
    eval mode nothing is skipped and nothing varies."""
    hf, model = layerdrop_pair()
    src, tgt_in = sources(), targets_in()
    real = tgt_in != PAD
    hf.train(), model.train()
    outputs = []
    with torch.no_grad():
        for seed in range(6):
            torch.manual_seed(seed)
            theirs = hf_logits(hf, src, tgt_in)
            torch.manual_seed(seed)
            ours = our_logits(model, src, tgt_in)
            assert_close(ours[real], theirs[real], rtol=0, atol=1e-4)
            outputs.append(ours)
        assert any(not torch.allclose(outputs[0], o) for o in outputs[1:])
        hf.eval(), model.eval()
        evaluated = [our_logits(model, src, tgt_in) for _ in range(2)]
        assert torch.equal(evaluated[0], evaluated[1])
        assert_close(evaluated[0][real], hf_logits(hf, src, tgt_in)[real], rtol=0, atol=1e-4)


def test_no_layerdrop_is_todays_model():
    """p = 0 draws nothing: a training forward leaves the generator where it was (today's
    model draws only its dropout), and with no dropout it is the evaluation forward."""
    torch.manual_seed(0)
    no_dropout = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = Transformer(tiny_config(**no_dropout), VOCAB, VOCAB, PAD)
    assert model.config.encoder_layerdrop == model.config.decoder_layerdrop == 0.0
    src, tgt_in = sources(), targets_in()
    with torch.no_grad():
        before = torch.get_rng_state()
        trained = our_logits(model.train(), src, tgt_in)
        assert torch.equal(torch.get_rng_state(), before)
        assert torch.equal(trained, our_logits(model.eval(), src, tgt_in))


def test_layerdrop_resumes_exactly_from_the_saved_generator():
    """Its draws come from the CPU generator alone, which every checkpoint keeps
    (`cli.training.run.rng_state`): restored, a training forward is the same again."""
    from cli.training.run import rng_state, set_rng_state

    _, model = layerdrop_pair()
    model.train()
    src, tgt_in = sources(), targets_in()
    state = rng_state(torch.device("cpu"))
    with torch.no_grad():
        first = [our_logits(model, src, tgt_in) for _ in range(3)]
        set_rng_state(state, torch.device("cpu"))
        again = [our_logits(model, src, tgt_in) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_layerdrop_under_distributed_data_parallel():
    """Under DDP a skipped layer still runs (its output discarded, its gradient zero), so that
    every parameter gets a gradient as DDP's reducer requires: several updates run, and the
    outputs are those of the plain model under the same draws."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    _, model = layerdrop_pair()
    model.train()
    plain = Transformer(model.config, VOCAB, VOCAB, PAD).train()
    plain.load_state_dict(model.state_dict())
    src, tgt_in = sources(), targets_in()
    expected = []
    for seed in range(4):
        torch.manual_seed(seed)
        expected.append(our_logits(plain, src, tgt_in).detach())
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        net = DistributedDataParallel(model)
        for seed in range(4):
            torch.manual_seed(seed)
            out = net(src, tgt_in, src == PAD, tgt_in == PAD)
            out.sum().backward()  # the second one fails if a parameter had no gradient
            assert torch.equal(out.detach(), expected[seed])
            assert all(p.grad is not None for p in model.parameters())
            model.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()


# -- CTranslate2


class Vocabulary:
    """What `transformer_spec` reads of a tokenizer: fairseq's special ids and the pieces."""

    bos_id, pad_id, eos_id, unk_id = BOS, PAD, EOS, UNK
    pieces = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB - 2)]
    pieces += ["eng_Latn", "fra_Latn"]

    def decoder_start_id(self, start: str) -> int:
        return {"bos": BOS, "pad": PAD, "eos": EOS}[start]

    def src_vocabulary(self) -> list[str]:
        return self.pieces

    tgt_vocabulary = src_vocabulary


def ct2_translator(model: Transformer, out: Path):
    import ctranslate2

    from cli.exporters.ctranslate2 import transformer_spec

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return transformer_spec(model, Vocabulary())

    Converter().convert(str(out))
    return ctranslate2.Translator(str(out))


def tf_greedy(model: Transformer, src: torch.Tensor, prefix: int, max_len: int) -> list[list[int]]:
    src_pad = src == PAD
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, src_pad), src_pad)
        hyps = greedy_search(
            lambda tokens, c: (F.log_softmax(model.decode_step(tokens, c), -1), c),
            cache,
            lambda c, index, group: c.reorder(index, group),
            SearchSettings(bos_id=EOS, eos_id=EOS),  # these models' decoders start from EOS
            torch.full((src.size(0),), max_len),
            torch.full((src.size(0), 1), prefix),
        )
    return [h.tokens for h in hyps]


def distinct(model: Transformer) -> Transformer:
    """`model` with outputs that depend on the source: random Pre-LN layers with tied
    embeddings mostly repeat their input token (its embedding rides the residual stream to the
    output layer, which is the same matrix), so the tokens are made small against the layers'
    outputs and the last norm sharper."""
    with torch.no_grad():
        model.src_embed.token.weight.mul_(0.2)  # tied: every embedding and the output layer
        model.decoder.norm.weight.mul_(10.0)
        if model.tgt_embed.norm is not None:
            model.tgt_embed.norm.weight.mul_(0.2)
    return model


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ctranslate2_export_searches_and_scores_as_tf(layout, tmp_path):
    """The CTranslate2 spec of such a model (`tf export --to ctranslate2`'s) decodes greedily
    the tokens tf's own greedy search gives, from EOS and the target language's code, and
    scores given targets as tf does (every token's log-probability within 1e-4): the
    positions from the offset, the scale, the embeddings' norm and the final norms carried."""
    model = distinct(copied(hf_model(layout), tmp_path))
    translator = ct2_translator(model, tmp_path / "ct2")
    pieces = Vocabulary.pieces
    src = sources(seed=7, lengths=(7, 3, 5, 9, 4, 6))
    batch = [[pieces[i] for i in row if i != PAD] for row in src.tolist()]
    ours = tf_greedy(model, src, LANGS[1], max_len=12)
    found = translator.translate_batch(
        batch,
        target_prefix=[[pieces[LANGS[1]]]] * len(batch),
        beam_size=1,
        max_decoding_length=12,
        max_input_length=0,
    )
    assert [[pieces.index(p) for p in r.hypotheses[0]] for r in found] == ours
    assert len({tuple(t) for t in ours}) > 1  # the outputs depend on their sources

    tgt_in = targets_in(seed=8, lengths=(3, 6, 1, 4, 2, 5))  # EOS, language, words; padded
    labels = torch.cat([tgt_in[:, 1:], torch.full((len(batch), 1), PAD)], 1)
    labels[torch.arange(len(batch)), (tgt_in != PAD).sum(1) - 1] = EOS  # each ends in EOS
    with torch.no_grad():
        log_probs = F.log_softmax(our_logits(model, src, tgt_in), -1)
    targets = [[pieces[i] for i in row[1:] if i != PAD] for row in tgt_in.tolist()]
    scored = translator.score_batch(batch, targets, max_input_length=0)
    for row, result in enumerate(scored):
        n = len(result.log_probs)  # the targets' tokens and the EOS
        expected = log_probs[row, torch.arange(n), labels[row, :n]]
        assert_close(torch.tensor(result.log_probs), expected, rtol=0, atol=1e-4)


# -- settings


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.encoder_layerdrop=1.0", "model.encoder_layerdrop must be in [0, 1)"),
        ("model.decoder_layerdrop=-0.1", "model.decoder_layerdrop must be in [0, 1)"),
        ("model.position_offset=-2", "model.position_offset must be 0 or more"),
        ("model.positions=sinusoids", "model.positions must be one of"),
        ("model.decoder_start=lang", "model.decoder_start must be one of"),
        ("model.scale_embedding=1", "model.scale_embedding must be bool"),
    ],
)
def test_bad_switches_are_one_line_errors(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [setting])


def test_fairseq_positions_need_four_dimensions():
    sets = ["model.positions=fairseq", "model.d_model=2", "model.n_heads=1"]
    with pytest.raises(ConfigError, match="'fairseq' needs model.d_model 4 or more"):
        load_config(None, sets)


def test_the_switches_load_and_default_to_todays_model():
    config = load_config(
        None,
        [
            "model.norm_first=true",
            "model.positions=learned",
            "model.position_offset=2",
            "model.layernorm_embedding=true",
            "model.scale_embedding=false",
            "model.decoder_start=eos",
            "model.encoder_layerdrop=0.05",
            "model.decoder_layerdrop=0.05",
        ],
    ).model
    assert (config.positions, config.position_offset, config.decoder_start) == ("learned", 2, "eos")
    default = ModelConfig()
    assert (default.positions, default.position_offset, default.decoder_start) == (
        "interleaved",
        0,
        "bos",
    )
    assert default.scale_embedding and not default.layernorm_embedding
    assert default.encoder_layerdrop == default.decoder_layerdrop == 0.0


@pytest.mark.parametrize(
    "switch",
    [
        dict(positions="fairseq"),
        dict(position_offset=2),
        dict(scale_embedding=False),
        dict(layernorm_embedding=True),
        dict(positions="learned"),
    ],
)
def test_marian_export_refuses_what_marian_cannot_hold(switch):
    """A Post-LN model with another embedding would be exported as Marian's without a word,
    and compute something else there: refused in one line."""
    from cli.families.marian import check_exportable
    from data.errors import InputError

    with pytest.raises(InputError, match="cannot be exported"):
        check_exportable(tiny_config(**switch))
    check_exportable(tiny_config(positions="halves"))  # Marian's own
