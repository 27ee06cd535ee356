"""Every export of every `model.*` switch (issue 67, item 1): small models over the switches of
`ModelConfig` and every prune of heads (`tf prune`), exported to CTranslate2 and to Hugging
Face, score forced targets as `tf` does (every token's log-probability, the EOS's too, within
1e-4 in float32), or their export is refused in one line. A walk takes every value of every
switch at least once (and a test checks that it still does when a switch is added); random
combinations of them all come on top.

A pruned model's heads keep their width (`model.d_head`) with fewer of them: CTranslate2 had
scaled its queries by 1 / sqrt(d_model / heads) where the model needs 1 / sqrt(d_head), and its
translations changed without a word (8 of 12 greedy lines; one head left failed outright).
"""

from __future__ import annotations

import dataclasses
import tempfile
import typing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from test_cli import tf
from torch.testing import assert_close

from cli.commands.export import export_huggingface
from cli.commands.prune import prune
from cli.config import TF_CONFIG, DecodeConfig, load_config
from cli.exporters.ctranslate2 import ct2_decode, export_ctranslate2
from cli.runs.models import build_model, load_for_inference
from data.errors import InputError
from data.tokenizer import Tokenizer, train_tokenizer
from model.transformer import ModelConfig, Transformer

ctranslate2 = pytest.importorskip("ctranslate2")
transformers = pytest.importorskip("transformers")

SIZES = dict(d_model=16, n_heads=4, d_ff=32, max_positions=128)
BASE = ModelConfig(**SIZES, n_encoder_layers=2, n_decoder_layers=2)  # where a case says nothing
# What no export computes with (dropouts, LayerDrop: training only) or what every model here
# shares (`SIZES`); `d_head` is what `tf prune --heads` sets, every prune walked.
NOT_WALKED = {*SIZES, "d_head", "dropout", "attention_dropout", "activation_dropout"}
NOT_WALKED |= {"encoder_layerdrop", "decoder_layerdrop"}
ATOL = 1e-4  # float32 against float32: another order of the same sums
# Sources and targets of several lengths (a padded batch), ids past the special ones.
SRC_LENGTHS, TGT_LENGTHS = (6, 2, 9), (3, 1, 5)


def switch_values() -> dict[str, tuple]:
    """Each switch of `ModelConfig` and the values walked: every value of a bool or a Literal
    (read from the schema, so that a new one is walked), a few of the numbers."""
    numbers = dict(
        position_offset=(0, 1, 2),
        norm_eps=(1e-5, 1e-6),
        n_encoder_layers=(1, 2),
        n_decoder_layers=(1, 2),
    )
    hints = typing.get_type_hints(ModelConfig)
    values = {}
    for f in dataclasses.fields(ModelConfig):
        if f.name in NOT_WALKED:
            continue
        kind = hints[f.name]
        if kind is bool:
            values[f.name] = (False, True)
        elif typing.get_origin(kind) is typing.Literal:
            values[f.name] = typing.get_args(kind)
        else:
            values[f.name] = numbers[f.name]  # a KeyError: a new number to walk
    return values


SWITCHES = switch_values()


@dataclass(frozen=True)
class Case:
    """A model to export: its `model.*` switches (the others are `BASE`'s), the
    heads `tf prune` removes from every attention and the share of feed-forward units it
    removes, whether its tokenizer is joint."""

    switches: tuple[tuple[str, object], ...]
    heads: int = 0
    ffn: float = 0.0
    joint: bool = True

    def __str__(self) -> str:
        set_ = ",".join(f"{k}={v}" for k, v in self.switches) or "defaults"
        return f"{set_};heads={self.heads};ffn={self.ffn};joint={self.joint}"


def case(heads: int = 0, ffn: float = 0.0, joint: bool = True, **switches) -> Case:
    """The `Case` of these switches and prune."""
    return Case(tuple(sorted(switches.items())), heads, ffn, joint)


# What each Hugging Face class holds (`cli.families.marian`, `cli.families.fairseq`), a tf
# tokenizer's pad at 0: else nearly every model would be refused there.
MARIAN = dict(norm_first=False, positions="halves", position_offset=0, layernorm_embedding=False)
M2M100 = dict(norm_first=True, positions="fairseq", position_offset=1, tie_embeddings="all")
M2M100 |= dict(layernorm_embedding=False, output_bias=False)
MBART = dict(norm_first=True, positions="learned", position_offset=2, tie_embeddings="all")
MBART |= dict(layernorm_embedding=True)
LAYOUTS = (MARIAN, M2M100, MBART)
UNTIED = dict(tie_embeddings="none")  # a tokenizer per side

WALK = [
    case(heads=2),  # the issue's: `tf prune --heads 2` of the paper's model
    case(heads=3, ffn=0.5, norm_first=True),  # one head left
    case(heads=1, **MARIAN),  # refused by transformers, exact in CTranslate2
    case(**MARIAN, activation="swish", output_bias=True, decoder_start="pad"),
    case(**MARIAN | dict(positions="interleaved"), tie_embeddings="decoder", activation="gelu"),
    case(**MARIAN, tie_embeddings="none", decoder_start="eos", n_encoder_layers=1, ffn=0.5),
    case(**M2M100, scale_embedding=False, decoder_start="eos", n_decoder_layers=1),
    case(**M2M100, decoder_start="pad"),  # fairseq's positions skip pad: its start's too
    case(**MBART, activation="gelu", output_bias=True, decoder_start="eos"),
    case(**MBART, scale_embedding=False, decoder_start="pad"),
    case(positions="fairseq", position_offset=2, layernorm_embedding=True, joint=False, **UNTIED),
    case(positions="learned", tie_embeddings="decoder", decoder_start="pad", joint=False),
    case(norm_eps=1e-6),  # refused by both
]


@st.composite
def cases(draw) -> Case:
    """Every switch drawn, then (most often) those of a Hugging Face class's layout fixed;
    any prune."""
    switches = {name: draw(st.sampled_from(values)) for name, values in SWITCHES.items()}
    layout = draw(st.sampled_from([{}, *LAYOUTS]))
    switches |= layout
    if layout is MARIAN:
        switches["positions"] = draw(st.sampled_from(["interleaved", "halves"]))
    joint = switches["tie_embeddings"] == "all" or draw(st.booleans())
    heads = draw(st.sampled_from([0, 0, 1, SIZES["n_heads"] - 1]))  # unpruned as often
    return case(heads, draw(st.sampled_from([0.0, 0.5])), joint, **switches)


@pytest.fixture(scope="module")
def tokenizers(tiny_prefix, tmp_path_factory) -> dict[bool, Tokenizer]:
    """A joint tokenizer and one per side, 64 pieces each."""
    src = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text(encoding="utf-8").splitlines()
    root = tmp_path_factory.mktemp("tokenizers")
    common = dict(vocab_size=64, seed=0, character_coverage=0.98)
    return {
        joint: train_tokenizer(src, tgt, root / str(joint), joint=joint, **common)
        for joint in (True, False)
    }


def random_model(c: Case, tokenizer: Tokenizer, seed: int = 0):
    """The model of case `c`, every weight random (norms, biases, learned positions too, so
    that a misplaced one shows), pruned as `tf prune` prunes; and its config."""
    config = load_config("tiny", [])
    config = replace(config, model=replace(BASE, **dict(c.switches)))
    torch.manual_seed(seed)
    model = build_model(config, tokenizer)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    if c.heads or c.ffn:
        model, config = prune(model.eval(), tokenizer, config, c.heads, c.ffn)
    return model.eval(), config


def sentences(tokenizer: Tokenizer, seed: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """Random sources and targets of `SRC_LENGTHS` and `TGT_LENGTHS` ids, no special one."""
    g = torch.Generator().manual_seed(seed)
    first = 1 + max(tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id)

    def draw(n: int, vocab: int) -> list[int]:
        return torch.randint(first, vocab, (n,), generator=g).tolist()

    src = [draw(n, tokenizer.src_vocab_size) for n in SRC_LENGTHS]
    return src, [draw(n, tokenizer.tgt_vocab_size) for n in TGT_LENGTHS]


def padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    """(B, max len) right-padded."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


def tf_scores(
    model: Transformer, tokenizer: Tokenizer, src, tgt, exported: Path
) -> list[torch.Tensor]:
    """Each target's log-probabilities under `model`, teacher-forced from the decoder's start
    token (every target token's, then the EOS's), as tf's search scores them with the decode
    settings the export `exported` records: a decoder that starts from pad has pad banned
    (`search_batch`), and with `decode.renormalize` its probability shared out."""
    start = tokenizer.decoder_start_id(model.config.decoder_start)
    src_ids = padded(src, tokenizer.src_pad_id)
    tgt_in = padded([[start, *t] for t in tgt], tokenizer.pad_id)
    with torch.no_grad():
        logits = model(src_ids, tgt_in, src_ids == tokenizer.src_pad_id, None)  # (B, T, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)
    if start == tokenizer.pad_id != tokenizer.eos_id:
        log_probs[..., tokenizer.pad_id] = float("-inf")
        if load_config(exported / TF_CONFIG).decode.renormalize:
            log_probs = log_probs.log_softmax(dim=-1)
    labels = [[*t, tokenizer.eos_id] for t in tgt]
    return [log_probs[b, torch.arange(len(y)), y] for b, y in enumerate(labels)]


def ct2_scores(out: Path, tokenizer: Tokenizer, src, tgt) -> list[torch.Tensor]:
    """The same, by CTranslate2's forced decoding of the exported directory `out`."""
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    scored = translator.score_batch(
        [tokenizer.src_id_pieces(s) for s in src],
        [tokenizer.tgt_pieces(t) for t in tgt],
        max_input_length=0,
    )
    return [torch.tensor(r.log_probs) for r in scored]


def hf_scores(out: Path, tokenizer: Tokenizer, src, tgt, start: int) -> list[torch.Tensor]:
    """The same, by the exported `transformers` model's forward over the padded batch, its ids
    read from its own tokenizer (Marian's layout moves `<pad>` last)."""
    transformers.utils.logging.set_verbosity_error()
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    moved = torch.tensor(theirs.convert_tokens_to_ids(tokenizer.src_vocabulary()))  # tf -> theirs
    src_ids = padded(src, tokenizer.src_pad_id)
    tgt_in = padded([[start, *t] for t in tgt], tokenizer.pad_id)
    with torch.no_grad():
        logits = hf(
            input_ids=moved[src_ids],
            attention_mask=(src_ids != tokenizer.src_pad_id).long(),
            decoder_input_ids=moved[tgt_in],
        ).logits
    log_probs = F.log_softmax(logits.float(), dim=-1)
    labels = [moved[[*t, tokenizer.eos_id]] for t in tgt]
    return [log_probs[b, torch.arange(len(y)), y] for b, y in enumerate(labels)]


def exported_or_refused(export, out: Path, engine: str) -> bool:
    """Whether `export(out)` wrote a directory; a refusal must be one line (`InputError`)."""
    try:
        export(out)
    except InputError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
        said(f"{engine}: refused")
        return False
    said(f"{engine}: exported")
    return True


def said(what: str) -> None:
    """What became of a drawn case, counted by `pytest --hypothesis-show-statistics`."""
    if currently_in_test_context():
        event(what)


def assert_same_scores(got: list[torch.Tensor], expected: list[torch.Tensor], engine: str):
    for row, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_close(g, e, rtol=0, atol=ATOL, msg=lambda m, r=row: f"{engine}, row {r}: {m}")


def check_exports(c: Case, tokenizers: dict[bool, Tokenizer]) -> None:
    """Case `c` exported to CTranslate2 and to Hugging Face scores as tf, or is refused."""
    tokenizer = tokenizers[c.joint]
    model, config = random_model(c, tokenizer)
    src, tgt = sentences(tokenizer)
    start = tokenizer.decoder_start_id(config.model.decoder_start)
    with tempfile.TemporaryDirectory() as tmp:
        ct2, hf = Path(tmp) / "ct2", Path(tmp) / "hf"
        to_ct2 = partial(export_ctranslate2, model, tokenizer, config, quantization=None)
        if exported_or_refused(to_ct2, ct2, "CTranslate2"):
            expected = tf_scores(model, tokenizer, src, tgt, ct2)
            assert_same_scores(ct2_scores(ct2, tokenizer, src, tgt), expected, "CTranslate2")
        hf.mkdir()
        if exported_or_refused(partial(export_huggingface, model, tokenizer, config), hf, "HF"):
            expected = tf_scores(model, tokenizer, src, tgt, hf)
            got = hf_scores(hf, tokenizer, src, tgt, start)
            assert_same_scores(got, expected, "Hugging Face")


@pytest.mark.parametrize("walked", WALK, ids=str)
def test_every_export_of_each_switch_scores_as_tf_or_is_refused(tokenizers, walked):
    check_exports(walked, tokenizers)


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,  # the same models every run: a failure is never a matter of luck
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(drawn=cases())
def test_every_export_of_switches_drawn_together_scores_as_tf_or_is_refused(tokenizers, drawn):
    check_exports(drawn, tokenizers)


def test_the_walk_takes_every_value_of_every_switch():
    """A switch added to ModelConfig is walked (or named in NOT_WALKED, with its reason), and
    every prune of heads is."""
    walked = {f.name for f in dataclasses.fields(ModelConfig)} - NOT_WALKED
    assert set(SWITCHES) == walked
    for name, values in SWITCHES.items():
        taken = {dict(c.switches).get(name, getattr(BASE, name)) for c in WALK}
        assert taken >= set(values), name
    assert {c.heads for c in WALK} == set(range(SIZES["n_heads"]))


def test_ctranslate2_export_of_a_pruned_run_and_its_lora_fine_tune_scores_as_tf(
    trained, tiny_prefix, tmp_path
):
    """The issue's commands: `tf prune --heads 2`, `tf export --to ctranslate2`, and the same
    of a LoRA fine-tune of the pruned model (merged at export)."""
    pruned = tmp_path / "pruned" / "model.pt"
    assert tf("prune", trained, "-o", pruned, "--heads", "2").exit_code == 0
    lora = tmp_path / "lora"
    sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.max_steps=2"]
    sets += ["train.lora.rank=2", "train.lr=0.05", "train.eval_every=0"]
    args = ["train", "tiny", "--init", pruned, "--out", lora]
    tuned = tf(*args, *[a for s in sets for a in ("--set", s)])
    assert tuned.exit_code == 0, tuned.output
    for run in (pruned, lora):
        out = tmp_path / f"{run.stem}-ct2"
        result = tf("export", run, "--to", "ctranslate2", "-o", out)
        assert result.exit_code == 0, result.output
        model, tokenizer, _ = load_for_inference(run, torch.device("cpu"))
        assert model.config.n_heads == 2 and model.config.d_head == 8
        src, tgt = sentences(tokenizer)
        expected = tf_scores(model, tokenizer, src, tgt, out)
        assert_same_scores(ct2_scores(out, tokenizer, src, tgt), expected, str(run))


def test_ctranslate2_directory_records_that_its_softmax_leaves_out_what_it_forbids():
    """CTranslate2 takes the pad a decoder starts from, EOS before `decode.min_len` and repeated
    n-grams out before its softmax: the directory's settings say `decode.renormalize: true`,
    and the export says so; where it forbids nothing, the run's settings stay."""
    plain = DecodeConfig()
    assert ct2_decode(plain, pad_banned=False) == (plain, [])
    for decode, pad_banned in [
        (plain, True),
        (replace(plain, min_len=1), False),
        (replace(plain, no_repeat_ngram_size=3), False),
    ]:
        recorded, said = ct2_decode(decode, pad_banned)
        assert recorded == replace(decode, renormalize=True)
        assert said == ["decode.renormalize: False -> True"]
    already = replace(plain, renormalize=True)
    assert ct2_decode(already, pad_banned=True) == (already, [])
