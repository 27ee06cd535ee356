"""Exports of the models whose decoder writes the target language's token first (issue 57, item
5): NLLB-200, M2M100 and mBART-50 layouts, `data.lang_token_side: target`.

Stand-ins: a tiny `M2M100ForConditionalGeneration` (NLLB's layout and tokenizer, M2M100's) or
`MBartForConditionalGeneration` (mBART-50's), random weights, saved with `save_pretrained`
beside a stand-in tokenizer (`benchmarks.fairseq_standin`), and the `tf` run holding the same
weights (`model.m2m100`/`model.mbart`'s `tf_weights`), saved as `tf import` saves one. Proved:

- `tf translate CT2DIR --from --to` (tf's CTranslate2 engine, the target language's token its
  `target_prefix`) is `tf translate RUN`: greedy token for token, beam search with the length
  penalty off, and the scores (the forced token certain, a request's prefix counted);
- CTranslate2's own converter of the stand-in and `tf export --to ctranslate2` of the run
  translate alike;
- `tf export --to huggingface` is the stand-in again (class, tensors, tokenizer ids), and its
  `generate(forced_bos_token_id=...)` is `tf translate --from --to --greedy`.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_ensemble import split

from benchmarks.fairseq_standin import (
    m2m100_tokenizer,
    mbart50_tokenizer,
    nllb_tokenizer,
    train_spm,
)
from benchmarks.marian_standin import bundled_lines
from cli.config import Config, DecodeConfig, check_config, save_config
from cli.inference.engines import length_limit, load_engine
from cli.inference.requests import Request
from cli.runs.checkpoint import FORMAT, save_atomic
from data.config import DataConfig
from data.errors import InputError
from data.fairseq import HF_CONFIG, FairseqTokenizer
from model import m2m100, mbart
from model.transformer import ModelConfig, Transformer

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")

CPU = torch.device("cpu")
D_MODEL, MAX_POSITIONS = 32, 128
# stand-in: (transformers family, activation, (source, target, other target), EOS threshold:
# where some outputs end before the limit, others not, tried)
KINDS = {
    "nllb": ("m2m_100", "relu", ("spa_Latn", "fra_Latn", "eng_Latn"), 0.5),
    "m2m100": ("m2m_100", "relu", ("es", "fr", "en"), -0.9),
    "mbart50": ("mbart", "gelu", ("es_XX", "fr_XX", "en_XX"), -2.0),
}
FP32 = ("--set", "decode.precision=fp32")
# tf's per-sentence length limit (a * len + b), for CTranslate2's engine, which searches a batch
# under its longest and searches again the sentences that went past their own.
PER_SENTENCE = ("--set", "decode.max_len_a=1.0", "--set", "decode.max_len_b=10")
# transformers' length rule, one limit for every sentence: the export's max_length of a model
# whose tf limit is per sentence, the most its positions take (max_positions - 1 tokens).
ONE_LIMIT = ("--set", "decode.max_len_a=0", "--set", f"decode.max_len_b={MAX_POSITIONS - 1}")


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """30 Spanish lines of the bundled corpus, of 20 to 60 pieces."""
    src, _ = bundled_lines(60)
    return [line for line in src if len(line) < 120][:30]


@pytest.fixture(scope="module")
def hundred() -> list[str]:
    """100 Spanish lines of the bundled corpus."""
    src, _ = bundled_lines(200)
    return [line for line in src if len(line) < 160][:100]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    """The stand-in tokenizers, over SentencePiece models of 300 pieces (BPE, unigram)."""
    root = tmp_path_factory.mktemp("tokenizers")
    src, tgt = bundled_lines(1000)
    bpe = train_spm(src + tgt, root / "bpe", 300, "bpe")
    unigram = train_spm(src + tgt, root / "unigram", 300, "unigram")
    made = {
        "nllb": nllb_tokenizer(root / "nllb", bpe),
        "m2m100": m2m100_tokenizer(root / "m2m100", bpe, src + tgt),
        "mbart50": mbart50_tokenizer(root / "mbart50", unigram),
    }
    # The published M2M100 models have 8 rows past their tokenizer's ids ("madeupword0"...,
    # CTranslate2's converter adds them to the vocabulary): the stand-in none, as the run.
    # mBART-50's files name its BOS, which CTranslate2's converter reads (transformers 5 saves
    # none where the class has a default).
    patch(made["m2m100"] / HF_CONFIG, num_madeup_words=0)
    patch(made["mbart50"] / HF_CONFIG, bos_token="<s>")
    return made


def patch(path: Path, **settings) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))


def hf_standin(kind: str, vocab_size: int):
    """A tiny transformers model of `kind`'s layout: random weights made to depend on the
    source, and an EOS that ends some outputs before the length limit (`sharpen`)."""
    family, activation, _, threshold = KINDS[kind]
    transformers.utils.logging.set_verbosity_error()
    settings = dict(
        vocab_size=vocab_size,
        d_model=D_MODEL,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        activation_function=activation,
        scale_embedding=True,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    torch.manual_seed(0)
    if family == "mbart":  # as mBART-50's config.json: its tokenizer, fairseq's layout names
        layout = dict(normalize_before=True, normalize_embedding=True)
        config = transformers.MBartConfig(**settings, **layout, tokenizer_class="MBart50Tokenizer")
        hf = transformers.MBartForConditionalGeneration(config)
    else:
        hf = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**settings))
    return sharpen(hf, threshold).eval()


def sharpen(hf, threshold: float):
    """Random weights (N(0, 0.3), biases and norms too) whose outputs depend on the source
    (small token embeddings, a sharp last norm: `tests/test_model_switches.py`'s `distinct`),
    and an EOS whose logit follows a slow cosine of the decoder's position (fairseq's sinusoid
    of frequency 10000 ** (-2/15), dimension 18; mBART's learned table set to them): some
    outputs end after about ten tokens, others run to the length limit."""
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding as Sinusoids,
    )

    m, dim = hf.model, D_MODEL // 2 + 2
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        m.shared.weight.mul_(0.2)  # tied: both embeddings and the output layer
        m.decoder.layer_norm.weight.mul_(10.0)
        if hasattr(m.decoder, "layernorm_embedding"):  # mBART
            m.decoder.embed_positions.weight.copy_(
                Sinusoids.get_embedding(MAX_POSITIONS + 2, D_MODEL, 1)
            )
        w = m.decoder.layer_norm.weight
        m.decoder.layer_norm.bias[dim] = threshold * w[dim]
        m.shared.weight[2] = 0.0
        m.shared.weight[2, dim] = -3.0 / w[dim]
    return hf


def tf_model_config(hf) -> ModelConfig:
    c = hf.config
    layout = mbart.LAYOUT if c.model_type == "mbart" else m2m100.LAYOUT
    return ModelConfig(
        d_model=c.d_model,
        n_heads=c.encoder_attention_heads,
        d_ff=c.encoder_ffn_dim,
        n_encoder_layers=c.encoder_layers,
        n_decoder_layers=c.decoder_layers,
        activation=c.activation_function,
        max_positions=c.max_position_embeddings,
        scale_embedding=c.scale_embedding,
        **layout,
    )


def save_run(model: Transformer, tokenizer_dir: Path, run: Path, keep_config: bool = True) -> Path:
    """`model` as an imported run: config.yaml (languages on both sides, every code of the
    tokenizer's, no corpus), tokenizer/ (the files, tf_tokenizer.json; tokenizer_config.json
    unless not `keep_config`), checkpoints/last.pt at step 0."""
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tokenizer_dir, run / "tokenizer")
    FairseqTokenizer(tokenizer_dir).settings.save(run / "tokenizer")
    if not keep_config:
        (run / "tokenizer" / HF_CONFIG).unlink()
    tok = FairseqTokenizer(run / "tokenizer")
    data = DataConfig(
        train=[],
        dev="",
        test="",
        src_lang=tok.src_lang,
        tgt_lang=next(iter(tok.languages)),
        lang_token=tok.family.lang_token,
        lang_token_side="target",
        languages=list(tok.languages),
        max_len=model.config.max_positions - 1,
    )
    decode = DecodeConfig(max_len_a=0.0, max_len_b=40)  # one limit: transformers' max_length
    config = check_config(Config(data=data, model=model.config, decode=decode), str(run))
    save_config(config, run / "config.yaml")
    checkpoint = {
        "format": FORMAT,
        "model": model.state_dict(),
        "step": 0,
        "config": config.to_dict(),
        "tokenizer_digest": tok.digest(),
        "imported": {"source": "stand-in"},
    }
    save_atomic(checkpoint, run / "checkpoints" / "last.pt")
    return run


def make_standin(kind: str, tokenizer_dir: Path, root: Path, keep_config: bool = True):
    """(the stand-in's directory, as the hub's: weights and tokenizer; the tf run of it:
    `tf import`'s, or, without `keep_config`, the same weights saved as a run whose tokenizer
    keeps no tokenizer_config.json)."""
    from safetensors.torch import load_file

    tok = FairseqTokenizer(tokenizer_dir)
    hf = hf_standin(kind, tok.src_vocab_size)
    hf.save_pretrained(root / "hf")
    for path in tokenizer_dir.iterdir():
        shutil.copyfile(path, root / "hf" / path.name)
    if keep_config:
        imported = tf("import", root / "hf", "-o", root / "run")
        assert imported.exit_code == 0, imported.output
        return root / "hf", root / "run"
    config = tf_model_config(hf)
    model = Transformer(config, tok.src_vocab_size, tok.tgt_vocab_size, tok.pad_id)
    family = mbart if config.positions == "learned" else m2m100
    saved = load_file(root / "hf" / "model.safetensors")
    model.load_state_dict(family.tf_weights(saved, config), strict=True)
    return root / "hf", save_run(model, tokenizer_dir, root / "run", keep_config)


@pytest.fixture(scope="module")
def standin(tokenizers, tmp_path_factory):
    """kind -> (stand-in directory, tf run), each made once."""
    made = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in made:
            made[kind] = make_standin(kind, tokenizers[kind], tmp_path_factory.mktemp(kind))
        return made[kind]

    return get


def export(run: Path, to: str, out: Path) -> Path:
    result = tf("export", run, "--to", to, "-o", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def nllb_ct2(standin, tmp_path_factory) -> tuple[Path, Path]:
    _, run = standin("nllb")
    return run, export(run, "ctranslate2", tmp_path_factory.mktemp("nllb_ct2") / "ct2")


def translate(model: Path, lines: list[str], *args: str) -> list[str]:
    result = tf("translate", model, *args, input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


# -- tf's CTranslate2 engine, the target language's token forced


@pytest.mark.parametrize("to", ["fra_Latn", "eng_Latn"])
def test_ctranslate2_translates_as_tf_greedy_with_the_forced_token(nllb_ct2, lines, to):
    """`tf translate CT2DIR --from --to` is `tf translate RUN`'s greedy search: the texts, and
    the scores (the language token certain in both: its log-probability counts 0)."""
    run, ct2 = nllb_ct2
    args = ("--from", "spa_Latn", "--to", to, "--greedy", "--scores", *PER_SENTENCE)
    ours, theirs = translate(run, lines, *args, *FP32), translate(ct2, lines, *args)
    ours_texts, ours_scores = split(ours)
    theirs_texts, theirs_scores = split(theirs)
    assert theirs_texts == ours_texts
    assert theirs_scores == pytest.approx(ours_scores, abs=1e-3)
    assert len(set(ours_texts)) > 5  # outputs that depend on their sources
    other = translate(ct2, lines, "--from", "spa_Latn", "--to", "eng_Latn", "--greedy")
    assert other != theirs_texts or to == "eng_Latn"  # the forced token decides the output


def hypotheses(model: Path, settings: list[str], requests: list[Request]):
    """Each request's hypotheses by their tokens, and the source ids."""
    engine = load_engine(str(model), CPU, settings, to="fra_Latn", frm="spa_Latn")
    found = list(engine.stream(requests, "test"))
    return [{tuple(h.tokens): h for h in hyps} for _, hyps in found], [s for s, _ in found]


def requests(lines: list[str]) -> list[Request]:
    """The lines, every other one with a prefix of its own (the first word of its greedy
    output, or any word: a prefix's log-probability counts in tf's score)."""
    return [Request(line, prefix="Y" if n % 2 else "") for n, line in enumerate(lines)]


@pytest.mark.parametrize("lenpen, form", [(0.0, "gnmt"), (1.0, "gnmt"), (1.0, "power")])
def test_ctranslate2_scores_count_the_forced_token_certain_and_the_prefix(
    nllb_ct2, lines, lenpen, form
):
    """CTranslate2 scores a target prefix's tokens 0; tf counts the language token it forces as
    certain (0) and a request's prefix by its log-probability: the engine adds those back, and
    both engines' scores mean the same for the same output, greedy and beam, outputs that end
    and outputs cut at the limit (re-scored without the certain token)."""
    run, ct2 = nllb_ct2
    common = [f"decode.length_penalty={lenpen}", f"decode.length_penalty_form={form}"]
    common += ["decode.precision=fp32", "decode.min_len=2", "decode.max_len_a=1.0"]
    common += ["decode.max_len_b=10"]
    asked = requests(lines)
    config = load_engine(str(run), CPU, common).config
    ended = cut = 0
    for search in (["decode.beam_size=1"], ["decode.beam_size=3", "decode.nbest=3"]):
        (ours, src_ids), (theirs, _) = (
            hypotheses(run, search + common, asked),
            hypotheses(ct2, search + common, asked),
        )
        same = [(a[t], b[t], ids) for a, b, ids in zip(ours, theirs, src_ids) for t in a if t in b]
        assert len(same) >= len(lines)
        for a, b, ids in same:
            assert math.isclose(a.log_prob, b.log_prob, abs_tol=1e-3), (search, a, b)
            assert math.isclose(a.score, b.score, abs_tol=1e-3), (search, a, b)
            limit = length_limit(len(ids), config)
            cut += len(a.tokens) == limit
            ended += len(a.tokens) < limit
    assert ended > 5 and cut > 5  # both kinds compared


@pytest.mark.parametrize("beam", [3, 5])
def test_ctranslate2_beam_search_is_tfs_with_the_forced_token(nllb_ct2, lines, beam):
    """With the length penalty off, CTranslate2's beam search finds tf's best output, the
    language token forced first, at least one word after it (`decode.min_len` 2: both count
    the forced token; CTranslate2 bars EOS from all but its best candidate at the first step
    after a target prefix, which a `min_len` of 2 makes tf's rule too)."""
    run, ct2 = nllb_ct2
    settings = [f"decode.beam_size={beam}", "decode.length_penalty=0", "decode.min_len=2"]
    settings += ["decode.precision=fp32", "decode.max_len_a=1.0", "decode.max_len_b=10"]
    asked = [Request(line) for line in lines]
    (ours, _), (theirs, _) = hypotheses(run, settings, asked), hypotheses(ct2, settings, asked)
    best = [max(found.values(), key=lambda h: h.score).tokens for found in ours]
    other = [max(found.values(), key=lambda h: h.score).tokens for found in theirs]
    assert other == best
    code = FairseqTokenizer(run / "tokenizer").tags["fra_Latn"]
    assert all(tokens[0] == code for tokens in best)


def test_ctranslate2_keeps_a_requests_prefix_after_the_forced_token(nllb_ct2, lines):
    run, ct2 = nllb_ct2
    jsonl = "\n".join(
        json.dumps({"text": line, "prefix": "Y", "from": "spa_Latn", "to": to})
        for line, to in zip(lines[:6], ["fra_Latn", "eng_Latn"] * 3)
    )
    args = ("--input-format", "jsonl", "--greedy", *PER_SENTENCE)
    theirs = tf("translate", ct2, *args, input=jsonl + "\n")
    ours = tf("translate", run, *args, *FP32, input=jsonl + "\n")
    assert theirs.exit_code == 0, theirs.output
    assert theirs.stdout == ours.stdout
    assert all(line.startswith("Y") for line in theirs.stdout.splitlines())


# -- CTranslate2 against CTranslate2


def ct2_translate(directory: Path, sources: list[list[str]], code: str, beam: int):
    translator = ctranslate2.Translator(str(directory))
    found = translator.translate_batch(
        sources,
        target_prefix=[[code]] * len(sources),
        beam_size=beam,
        max_decoding_length=40,
        max_input_length=0,
        return_scores=True,
    )
    return [r.hypotheses[0] for r in found], [r.scores[0] for r in found]


@pytest.mark.parametrize("kind", KINDS)
def test_ctranslate2s_converter_and_tf_export_translate_alike(standin, hundred, kind, tmp_path):
    """The stand-in converted by CTranslate2's own converter (`TransformersConverter`: its
    M2M100 and mBART loaders), `tf export --to ctranslate2` of the run, and CTranslate2's
    converter of `tf export --to huggingface`: the same 100 sources (the stand-in's ids), the
    target code as the target prefix, the same outputs, greedy and beam 4."""
    from ctranslate2.converters import TransformersConverter

    hf_dir, run = standin(kind)
    theirs = tmp_path / "theirs"
    TransformersConverter(str(hf_dir)).convert(str(theirs))
    ours = export(run, "ctranslate2", tmp_path / "ours")
    again = tmp_path / "again"
    TransformersConverter(str(export(run, "huggingface", tmp_path / "hf"))).convert(str(again))
    src, to = KINDS[kind][2][:2]
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir, src_lang=src)
    sources = [hf_tok.convert_ids_to_tokens(hf_tok(line).input_ids) for line in hundred]
    code = FairseqTokenizer(run / "tokenizer").languages[to]
    for beam in (1, 4):
        expected, scores = ct2_translate(theirs, sources, code, beam)
        for other in (ours, again):
            found, found_scores = ct2_translate(other, sources, code, beam)
            assert found == expected, (kind, beam, other.name)
            assert found_scores == pytest.approx(scores, abs=1e-4)
        assert len({len(h) for h in expected}) > 1 and all(h[0] == code for h in expected)


# -- Hugging Face


@pytest.mark.parametrize("kind", KINDS)
def test_the_huggingface_export_is_the_standin_again(standin, lines, kind, tmp_path):
    """`tf export --to huggingface` of the run: the stand-in's class, config and tensors, its
    tokenizer files (the same ids, `src_lang` set), and a generation config with no forced
    language."""
    hf_dir, run = standin(kind)
    out = export(run, "huggingface", tmp_path / "hf")
    original = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir)
    exported = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    assert type(exported) is type(original)
    theirs, ours = original.state_dict(), exported.state_dict()
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    keys = ["vocab_size", "d_model", "encoder_layers", "decoder_ffn_dim", "activation_function"]
    keys += ["scale_embedding", "max_position_embeddings", "pad_token_id", "eos_token_id"]
    keys += ["decoder_start_token_id", "bos_token_id", "decoder_attention_heads"]
    assert {k: getattr(exported.config, k) for k in keys} == {
        k: getattr(original.config, k) for k in keys
    }
    generation = exported.generation_config
    assert generation.forced_bos_token_id is None and generation.num_beams == 1
    # tf's limit per sentence (the import's: the stand-in names no max_length) is one number
    # here: the most the positions take, max_positions - 1, the start token and the EOS
    assert generation.max_length == MAX_POSITIONS + 1
    src = KINDS[kind][2][0]
    ids = [
        transformers.AutoTokenizer.from_pretrained(d, src_lang=src)(lines).input_ids
        for d in (hf_dir, out)
    ]
    tok = FairseqTokenizer(run / "tokenizer")
    assert ids[1] == ids[0] == tok.encode_src([f"{tok.languages[src]} {line}" for line in lines])


def drop_in(directory: Path, lines: list[str], src: str, code: str) -> list[str]:
    """What a transformers user runs: the source's language on the tokenizer, the target's
    token forced first, everything else the directory's own generation config."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, src_lang=src)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    out = model.generate(**batch, forced_bos_token_id=tokenizer.convert_tokens_to_ids(code))
    return tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_with_the_forced_token_is_tf_greedy(standin, lines, kind, tmp_path):
    """`generate(forced_bos_token_id=...)` on the export is `tf translate --from --to --greedy`
    of the run, for two target languages."""
    _, run = standin(kind)
    out = export(run, "huggingface", tmp_path / "hf")
    tok = FairseqTokenizer(run / "tokenizer")
    src, *targets = KINDS[kind][2]
    for to in targets:
        ours = translate(run, lines, "--from", src, "--to", to, "--greedy", *FP32, *ONE_LIMIT)
        assert drop_in(out, lines, src, tok.languages[to]) == ours
        assert len(set(ours)) > 5  # outputs that depend on their sources


@pytest.mark.parametrize("kind", ["nllb", "m2m100"])
def test_a_run_without_tokenizer_config_exports_one_transformers_reads(
    tokenizers, lines, kind, tmp_path
):
    """A run that keeps no tokenizer_config.json of the original's: the export writes one
    (the class, the settings tf read), and AutoTokenizer reads the files as the original's."""
    hf_dir, run = make_standin(kind, tokenizers[kind], tmp_path, keep_config=False)
    out = export(run, "huggingface", tmp_path / "export")
    src = KINDS[kind][2][0]
    ours = transformers.AutoTokenizer.from_pretrained(out, src_lang=src)
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir, src_lang=src)
    assert type(ours) is type(theirs)
    assert ours(lines).input_ids == theirs(lines).input_ids
    code = FairseqTokenizer(run / "tokenizer").languages[KINDS[kind][2][1]]
    assert ours.convert_tokens_to_ids(code) == theirs.convert_tokens_to_ids(code)
    assert ours.decode(theirs(lines[0]).input_ids, skip_special_tokens=True) == theirs.decode(
        theirs(lines[0]).input_ids, skip_special_tokens=True
    )


def test_the_model_card_says_how_to_choose_the_languages(standin, tmp_path):
    _, run = standin("nllb")
    card = (export(run, "huggingface", tmp_path / "hf") / "README.md").read_text()
    assert card.startswith("---\nlanguage:\n- ace_Arab\n")  # every language of the model's
    assert "- m2m_100\n" in card and "M2M100ForConditionalGeneration" in card
    assert 'AutoTokenizer.from_pretrained("THIS_DIRECTORY", src_lang="eng_Latn")' in card
    assert 'convert_tokens_to_ids("' in card and "forced_bos_token_id=to" in card
    assert "Pre-LN Transformer" in card and "NLLB-200's" in card
    assert "Do not convert" not in card and "target_prefix" in card


# -- what no Hugging Face class runs


@pytest.mark.parametrize(
    "switches, fragment",
    [
        (dict(norm_first=False), "no Hugging Face class runs a Post-LN model with model.positions"),
        (dict(positions="halves"), "no Hugging Face class runs a Pre-LN model"),
        (dict(output_bias=True), "M2M100ForConditionalGeneration takes"),
        (dict(position_offset=0), "model.position_offset 0"),
        (dict(layernorm_embedding=True), "model.layernorm_embedding True"),
        (dict(tie_embeddings="none"), "model.tie_embeddings 'none'"),
    ],
)
def test_what_no_huggingface_class_runs_is_one_line(tokenizers, tmp_path, switches, fragment):
    """A model of switches that no class of transformers computes with: refused in one line,
    nothing written."""
    tok = FairseqTokenizer(tokenizers["nllb"])
    config = ModelConfig(
        d_model=D_MODEL, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
        max_positions=MAX_POSITIONS, **{**m2m100.LAYOUT, **switches},
    )  # fmt: skip
    model = Transformer(config, tok.src_vocab_size, tok.tgt_vocab_size, tok.pad_id)
    run = save_run(model, tokenizers["nllb"], tmp_path / "run")
    result = tf("export", run, "--to", "huggingface", "-o", tmp_path / "hf")
    assert_user_error(result, fragment)
    assert not (tmp_path / "hf").exists() and list(tmp_path.iterdir()) == [tmp_path / "run"]


def test_mbart_takes_learned_positions_with_their_norm():
    from cli.families.fairseq import check_exportable
    from cli.families.marian import MARIAN
    from cli.families.mbart import MBART
    from cli.families.registry import exporting_family

    c = ModelConfig(**{**mbart.LAYOUT, "layernorm_embedding": False})
    family = exporting_family(c)
    assert family is MBART
    tok = type("Tok", (), {"pad_id": 1})()
    with pytest.raises(InputError, match="MBartForConditionalGeneration takes .*"):
        check_exportable(family, c, tok)
    check_exportable(family, replace(c, layernorm_embedding=True), tok)
    assert exporting_family(ModelConfig()) is MARIAN  # tf's own: Marian's
