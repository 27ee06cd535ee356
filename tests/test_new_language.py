"""A language a pretrained model lacks, added by fine-tuning (`data.new_languages`, issue 58):
the NLLB-200 stand-in (`benchmarks.fairseq_standin`, as tests/test_many_end_to_end.py builds
it) with ast_Latn (Asturian) left out of its tokenizer stands in for a model that lacks it;
tuned on spa_Latn -> ast_Latn (the fixture's English side relabelled) it gets ast_Latn at the
next id, every old id and row unchanged, and its exports carry it (a code transformers'
`NllbTokenizer` lists among its own, at another id); a tf multilingual run gets a
new `<2xx>` token; a one-way model (a tf run, an OPUS-MT import) tokens for its old target and
the new one, in its form (issue 67, item 11); LoRA trains the new rows alone; bad settings are
one line, nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_import import quiet_transformers

from benchmarks.fairseq_standin import (
    make_model_standin,
    mbart50_tokenizer,
    nllb_tokenizer,
    train_spm,
)
from benchmarks.marian_standin import bundled_lines
from cli.runs.checkpoint import load_checkpoint
from cli.runs.model_dirs import resolve_checkpoint
from cli.runs.models import load_for_inference
from data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
SPA, XYZ, FRA = "spa_Latn", "ast_Latn", "fra_Latn"
FP32 = ("--set", "decode.precision=fp32")
SEED = 1  # the stand-in's weights: seed 0 translates ast_Latn to mostly empty lines
EMBEDDINGS = ("src_embed.token.weight", "tgt_embed.token.weight", "generator.weight")


@pytest.fixture(scope="module")
def nllb_run(tmp_path_factory) -> Path:
    """The NLLB-200 stand-in without ast_Latn, imported."""
    quiet_transformers()
    root = tmp_path_factory.mktemp("nllb")
    src, tgt = bundled_lines(1000)
    spm = train_spm(src + tgt, root / "spm", 400, "bpe")
    tokenizer = nllb_tokenizer(root / "tokenizer", spm, without=(XYZ,))
    result = tf(
        "import",
        make_model_standin(root / "standin", "nllb", tokenizer, seed=SEED),
        "-o",
        root / "run",
    )
    assert result.exit_code == 0, result.output
    return root / "run"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, tiny_prefix: str) -> Path:
    """The fixture's pairs as spa_Latn -> ast_Latn: train and dev."""
    root = tmp_path_factory.mktemp("xyz")
    for split, source in (("train", tiny_prefix), ("dev", f"{tiny_prefix}-dev")):
        shutil.copyfile(f"{source}.es", root / f"{split}.{SPA}")
        shutil.copyfile(f"{source}.en", root / f"{split}.{XYZ}")
    return root


def settings(
    corpora: Path,
    new: str = f"[{{lang: {XYZ}, init: {FRA}}}]",
    steps: int = 0,
    langs: tuple[str, str] = (SPA, XYZ),
) -> list:
    one = f'corpus: "{corpora}/{{}}", src_lang: {langs[0]}, tgt_lang: {langs[1]}'
    rules = [
        f"data.train=[{{{one.format('train')}}}]",
        f"data.dev=[{{{one.format('dev')}}}]",
        f"data.new_languages={new}",
        f"train.max_steps={steps}",
        "train.max_tokens=512",
        "train.eval_bleu_sentences=4",
        "train.precision=fp32",
        "train.deterministic=true",
        "decode.max_len_a=0",
        "decode.max_len_b=8",
    ]
    return [x for rule in rules for x in ("--set", rule)]


@pytest.fixture(scope="module")
def tuned(nllb_run, corpora, tmp_path_factory) -> Path:
    """The stand-in with ast_Latn added (its row fra_Latn's), fine-tuned for one update."""
    out = tmp_path_factory.mktemp("tuned") / "run"
    result = tf("train", "finetune", "--init", nllb_run, "--out", out, *settings(corpora, steps=1))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def adapted(nllb_run, corpora, tmp_path_factory) -> Path:
    """The same with LoRA, its embeddings frozen: RUN/base.pt holds the weights it started
    from, as loaded (step 0)."""
    out = tmp_path_factory.mktemp("adapted") / "run"
    lora = ("--set", "train.lora.rank=2", "--set", "train.weight_decay=0")
    result = tf("train", "finetune", "--init", nllb_run, "--out", out,
                *settings(corpora, steps=1), *lora)  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_the_new_code_takes_the_next_id_and_every_old_id_stays(nllb_run, tuned):
    before, after = Tokenizer.load(nllb_run / "tokenizer"), Tokenizer.load(tuned / "tokenizer")
    assert XYZ not in before.languages  # the init's files untouched
    assert after.language_id(XYZ) == before.src_vocab_size == after.src_vocab_size - 1
    assert after.src_vocabulary()[: before.src_vocab_size] == before.src_vocabulary()
    lines, _ = bundled_lines(1000)
    assert after.encode_src([f"{SPA} {line}" for line in lines]) == before.encode_src(
        [f"{SPA} {line}" for line in lines]
    )
    assert after.encode_src([f"{XYZ} Hola"])[0][0] == before.src_vocab_size


def test_old_rows_are_the_inits_and_the_new_row_is_the_named_ones(nllb_run, tuned, adapted):
    init = load_checkpoint(nllb_run / "checkpoints" / "last.pt")["model"]
    start = load_checkpoint(adapted / "base.pt")["model"]  # the weights as loaded, step 0
    fra = Tokenizer.load(nllb_run / "tokenizer").language_id(FRA)
    for name in EMBEDDINGS:
        old, new = init[name], start[name]
        assert new.shape[0] == old.shape[0] + 1
        assert torch.equal(new[: old.shape[0]], old), name
        assert torch.equal(new[-1], old[fra]), name
    run = load_checkpoint(tuned / "checkpoints" / "last.pt")
    assert (
        run["step"] == 1
        and run["model"]["generator.weight"].shape == start["generator.weight"].shape
    )
    languages = run["config"]["data"]["languages"]
    assert XYZ in languages and len(languages) == 202  # NLLB-200's 202, one of them new


def exports_translate_alike(
    run: Path, src: str, tgt: str, tmp_path: Path, hf_source: bool = True
) -> tuple[int, Path]:
    """`tf translate --from SRC --to TGT --greedy` of 8 lines equals the Hugging Face export's
    generate(forced_bos_token_id=TGT's code) and the CTranslate2 export's translation, and
    depends on its sources; the export's tokenizer gives TGT the run's id and the model's
    vocabulary its size, and (`hf_source`) takes TGT as its `src_lang` too. Returns the
    code's id and the CTranslate2 export."""
    lines = [line for line in bundled_lines(40)[0] if len(line) < 100][:8]
    text = "\n".join(lines) + "\n"
    # (the run's length rule is one limit, decode.max_len_a 0: the export's max_length)
    ours = tf("translate", run, "--from", src, "--to", tgt, "--greedy", *FP32, input=text)
    assert ours.exit_code == 0, ours.output
    assert len(set(ours.stdout.splitlines())) > 2  # outputs that depend on their sources
    hf = tmp_path / "hf"
    assert tf("export", run, "--to", "huggingface", "-o", hf).exit_code == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf, src_lang=src)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
    code = tokenizer.convert_tokens_to_ids(tgt)
    assert code == Tokenizer.load(run / "tokenizer").language_id(tgt)
    assert model.config.vocab_size == len(tokenizer) == code + 1
    if hf_source:
        reads = transformers.AutoTokenizer.from_pretrained(hf, src_lang=tgt)  # a source in it
        assert reads("Hola").input_ids[0] == code
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, forced_bos_token_id=code, num_beams=1, do_sample=False)
    assert tokenizer.batch_decode(out, skip_special_tokens=True) == ours.stdout.splitlines()
    ct2 = tmp_path / "ct2"
    assert tf("export", run, "--to", "ctranslate2", "-o", ct2).exit_code == 0
    engine = tf("translate", ct2, "--from", src, "--to", tgt, "--greedy", input=text)
    assert engine.exit_code == 0, engine.output
    assert engine.stdout == ours.stdout  # CTranslate2, the code as its target prefix
    return code, ct2


def test_the_new_language_translates_and_exports(tuned, tmp_path):
    """tf translate --to ast_Latn; the Hugging Face export's tokenizer and generate(forced_bos)
    give the same; CTranslate2's vocabulary is the embeddings' size, and it translates alike."""
    code, ct2 = exports_translate_alike(tuned, SPA, XYZ, tmp_path)
    vocabulary = json.loads((ct2 / "shared_vocabulary.json").read_text())
    assert len(vocabulary) == code + 1 and vocabulary[code] == XYZ


def test_lora_trains_the_new_rows_alone_and_keeps_them_alone(nllb_run, corpora, tmp_path):
    """`embeddings_of_new_languages`: the merged model's old rows are the init's bit for bit,
    its new row trained; the checkpoints keep that row alone, and its moments (not matrices of
    256,206 rows), and a resume from them continues exactly."""
    lora = ("--set", "train.lora.rank=2", "--set", "train.weight_decay=0",
            "--set", "train.trainable=[embeddings_of_new_languages]")  # fmt: skip
    args = ("finetune", "--init", nllb_run, *settings(corpora, f"[{{lang: {XYZ}}}]"), *lora)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert tf("train", *args, "--out", straight, "--set", "train.max_steps=3").exit_code == 0
    assert tf("train", *args, "--out", stopped, "--set", "train.max_steps=2").exit_code == 0
    saved = load_checkpoint(stopped / "checkpoints" / "last.pt")
    width = saved["model"]["src_embed.token.weight"].shape[1]
    vocab = Tokenizer.load(stopped / "tokenizer").src_vocab_size
    assert saved["rows"]["src_embed.token.weight"] == vocab - 1
    assert saved["model"]["src_embed.token.weight"].shape == (1, width)  # (tied: saved once)
    moments = [m for s in saved["optimizer"]["state"].values() for m in s.values() if m.dim()]
    assert max(m.shape[0] for m in moments) < vocab  # no moment of a whole embedding matrix
    more = ("--set", "train.max_steps=3", "--allow-config-change")
    assert tf("train", "--resume", stopped, *more).exit_code == 0

    init = load_checkpoint(nllb_run / "checkpoints" / "last.pt")["model"]
    tok = Tokenizer.load(nllb_run / "tokenizer")
    codes = torch.tensor(sorted(tok.tags.values()))
    weights = {}
    for run in (straight, stopped):
        model, _, _ = load_for_inference(run / "checkpoints" / "last.pt", torch.device("cpu"))
        weights[run] = model.state_dict()
    for name in EMBEDDINGS:
        assert torch.equal(weights[straight][name][:-1], init[name]), name  # frozen, bit for bit
    mean = init["src_embed.token.weight"][codes].mean(0)
    assert not torch.equal(weights[straight]["src_embed.token.weight"][-1], mean)  # it trained
    for name, value in weights[straight].items():  # fp32, deterministic: exactly
        assert torch.equal(weights[stopped][name], value), name


@pytest.mark.parametrize(
    "new, fragments",
    [
        (f"[{{lang: {XYZ}, init: xyz_Cyrl}}]", ["data.new_languages[0].init", "xyz_Cyrl"]),
        (
            f"[{{lang: {XYZ}}}, {{lang: zzz_Latn}}]",
            ["data.new_languages[1]", "no training corpus", "zzz_Latn"],
        ),
    ],
)
def test_bad_new_languages_are_one_line_and_write_nothing(
    nllb_run, corpora, tmp_path, new, fragments
):
    out = tmp_path / "out"
    assert_user_error(
        tf("train", "finetune", "--init", nllb_run, "--out", out, *settings(corpora, new)),
        *fragments,
    )
    assert not out.exists()


def test_a_code_that_is_a_piece_already_is_refused(nllb_run, corpora, tmp_path):
    """A language the model has (spa_Latn) or any other piece of its tokenizer."""
    out = tmp_path / "out"
    new = f"[{{lang: {XYZ}}}, {{lang: {SPA}}}]"
    assert_user_error(
        tf("train", "finetune", "--init", nllb_run, "--out", out, *settings(corpora, new)),
        SPA,
        "a piece of the tokenizer already",
    )
    assert not out.exists()


def test_a_tf_multilingual_run_gets_a_new_source_token(tiny_prefix, tmp_path):
    """An es<->en run of `<2en>`/`<2es>` tokens tuned on es->xyz: `<2xyz>` at the next id of
    its SentencePiece model, its row `<2en>`'s, and `--to xyz` translates."""
    one = f'corpus: "{tiny_prefix}"'
    both = f"[{{{one}}}, {{{one}, reverse: true}}]"
    base = tmp_path / "base"
    trained = tf("train", "tiny", "--out", base, "--set", f"data.train={both}",
                 "--set", f"data.dev={tiny_prefix}-dev", "--set", "train.max_steps=1")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    for split, source in (("train", tiny_prefix), ("dev", f"{tiny_prefix}-dev")):
        shutil.copyfile(f"{source}.es", tmp_path / f"{split}.es")
        shutil.copyfile(f"{source}.en", tmp_path / f"{split}.xyz")
    out = tmp_path / "xyz"
    rules = [
        f'data.train=[{{corpus: "{tmp_path}/train", src_lang: es, tgt_lang: xyz}}]',
        f'data.dev=[{{corpus: "{tmp_path}/dev", src_lang: es, tgt_lang: xyz}}]',
        "data.new_languages=[{lang: xyz, init: en}]",
        "train.max_steps=1",
        "train.lora.rank=2",
        "train.weight_decay=0",
    ]
    tuned = tf(
        "train", "tiny", "--init", base, "--out", out, *[x for r in rules for x in ("--set", r)]
    )
    assert tuned.exit_code == 0, tuned.output
    before, after = Tokenizer.load(base / "tokenizer"), Tokenizer.load(out / "tokenizer")
    assert after.tags["<2xyz>"] == before.src_vocab_size == after.src_vocab_size - 1
    assert after.src_vocabulary()[:-1] == before.src_vocabulary()
    lines = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    assert after.encode_src(lines) == before.encode_src(lines)
    init = load_checkpoint(base / "checkpoints" / "last.pt")["model"]
    start = load_checkpoint(out / "base.pt")["model"]
    for name in ("src_embed.token.weight", "generator.weight"):
        assert torch.equal(start[name][:-1], init[name])
        assert torch.equal(start[name][-1], init[name][before.tags["<2en>"]])
    result = tf("translate", out, "--to", "xyz", "--greedy", input="Y dijo Dios.\n")
    assert result.exit_code == 0, result.output
    again = tf("train", "--resume", out, "--set", "train.max_steps=2", "--allow-config-change")
    assert again.exit_code == 0, again.output  # its own tokenizer, grown once
    assert Tokenizer.load(out / "tokenizer").src_vocab_size == after.src_vocab_size


def test_an_opus_mt_import_gets_a_new_target_token(tiny_prefix, tmp_path):
    """An OPUS-MT-style import into fra and spa (`>>fra<<`, `>>spa<<`) tuned on es->xyz:
    `>>xyz<<` at the next id of its vocab.json, its row `>>fra<<`'s; `--to xyz` translates."""
    from test_import import small_standin

    standin = small_standin(tmp_path, tiny_prefix, language_tokens=(">>fra<<", ">>spa<<"))
    assert tf("import", standin, "-o", tmp_path / "run").exit_code == 0
    rules = one_way_settings(tmp_path, tiny_prefix, "data.new_languages=[{lang: xyz, init: fra}]")
    out = tmp_path / "xyz"
    tuned = tf("train", "finetune", "--init", tmp_path / "run", "--out", out, *rules)
    assert tuned.exit_code == 0, tuned.output
    before, after = (
        Tokenizer.load(tmp_path / "run" / "tokenizer"),
        Tokenizer.load(out / "tokenizer"),
    )
    assert after.tags[">>xyz<<"] == before.src_vocab_size == after.src_vocab_size - 1
    assert after.src_vocabulary()[:-1] == before.src_vocabulary()
    init = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"]
    start = load_checkpoint(out / "base.pt")["model"]
    fra = before.tags[">>fra<<"]
    for name in ("src_embed.token.weight", "generator.weight", "generator.bias"):
        assert torch.equal(start[name][:-1], init[name]), name
        assert torch.equal(start[name][-1], init[name][fra]), name
    result = tf("translate", out, "--to", "xyz", "--greedy", input="Y dijo Dios.\n")
    assert result.exit_code == 0, result.output


def test_trainable_groups_add_up_with_the_new_languages_rows(tiny_prefix, tmp_path):
    """`train.trainable: [output_bias, embeddings, embeddings_of_new_languages]` on an OPUS-MT
    import (an output bias, one vocabulary): the whole embedding matrix and the whole bias
    train, old rows too (the new rows' group used to freeze them: old rows moved 0.0), the
    checkpoints keep them whole, and the merged model is what a resume continues from."""
    from test_import import small_standin

    standin = small_standin(tmp_path, tiny_prefix, language_tokens=(">>fra<<", ">>spa<<"))
    assert tf("import", standin, "-o", tmp_path / "run").exit_code == 0
    rules = one_way_settings(
        tmp_path,
        tiny_prefix,
        "data.new_languages=[{lang: xyz, init: fra}]",
        "train.max_steps=2",
        "train.lr=0.01",
        "train.trainable=[output_bias, embeddings, embeddings_of_new_languages]",
        "train.precision=fp32",
        "train.eval_bleu_sentences=2",
    )
    out = tmp_path / "xyz"
    tuned = tf("train", "finetune", "--init", tmp_path / "run", "--out", out, *rules)
    assert tuned.exit_code == 0, tuned.output
    saved = load_checkpoint(out / "checkpoints" / "last.pt")
    assert not saved.get("rows")  # nothing trains its new rows alone: kept whole
    start = load_checkpoint(out / "base.pt")["model"]
    merged = load_for_inference(out / "checkpoints" / "last.pt", torch.device("cpu"))[0]
    merged = merged.state_dict()
    for name in ("src_embed.token.weight", "generator.bias"):
        assert merged[name].shape == start[name].shape == saved["model"][name].shape, name
        moved = (merged[name] != start[name]).reshape(len(start[name]), -1).any(1)  # (V,)
        assert moved[:-1].sum() > 1 and moved[-1], name  # old rows and the new one trained


def test_tokenizers_that_cannot_grow_are_refused_in_one_line(nllb_run, tmp_path):
    """M2M100's codes come from transformers' fixed list; an NLLB-200 tokenizer without
    tokenizer.json numbers <mask> after its codes: a new code would move it."""
    from benchmarks.fairseq_standin import m2m100_tokenizer
    from data.added_tokens import check_addable
    from data.errors import InputError

    spm_path = nllb_run.parent / "spm" / "sentencepiece.bpe.model"
    lines, _ = bundled_lines(200)
    m2m100 = Tokenizer.load(m2m100_tokenizer(tmp_path / "m2m100", spm_path, lines))
    with pytest.raises(InputError, match="M2M100's tokenizer takes its codes") as e:
        check_addable(m2m100, ["__xyz__"])
    assert "\n" not in str(e.value)
    bare = tmp_path / "bare"
    shutil.copytree(nllb_run / "tokenizer", bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="tokenizer.json: missing"):
        check_addable(Tokenizer.load(bare), [XYZ])


def test_mbart50_gets_a_new_language_end_to_end(corpora, tmp_path):
    """mBART-50's codes (`xx_XX`): ast_XX added to the stand-in, `tf translate --to ast_XX`
    equal to the Hugging Face export's generate(forced_bos) and to its CTranslate2 export."""
    quiet_transformers()
    src, tgt = bundled_lines(1000)
    spm = train_spm(src + tgt, tmp_path / "spm", 400, "unigram")
    standin = make_model_standin(
        tmp_path / "standin", "mbart50", mbart50_tokenizer(tmp_path / "tokenizer", spm)
    )
    base, run = tmp_path / "base", tmp_path / "run"
    assert tf("import", standin, "-o", base).exit_code == 0
    for split in ("train", "dev"):
        shutil.copyfile(corpora / f"{split}.{SPA}", corpora / f"{split}.es_XX")
        shutil.copyfile(corpora / f"{split}.{XYZ}", corpora / f"{split}.ast_XX")
    new = "[{lang: ast_XX, init: fr_XX}]"
    sets = settings(corpora, new, steps=1, langs=("es_XX", "ast_XX"))
    sets += ["--set", "data.max_len=200"]  # the tiny stand-in learned 256 positions
    tuned = tf("train", "finetune", "--init", base, "--out", run, *sets)
    assert tuned.exit_code == 0, tuned.output
    before, after = Tokenizer.load(base / "tokenizer"), Tokenizer.load(run / "tokenizer")
    assert after.src_vocabulary()[: before.src_vocab_size] == before.src_vocabulary()
    code, _ = exports_translate_alike(run, "es_XX", "ast_XX", tmp_path, hf_source=False)
    assert code == before.src_vocab_size
    # transformers' MBart50Tokenizer takes `src_lang` from its fixed list of codes: the export
    # writes the new code as a target (forced_bos, above), not as a source
    # (docs/lora-and-new-languages.md says so).
    with pytest.raises(KeyError, match="ast_XX"):
        transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", src_lang="ast_XX")


def one_way_settings(tmp_path: Path, tiny_prefix: str, *extra: str) -> list:
    """The fixture's pairs as es -> xyz, a language a one-way es->en model lacks, and a LoRA
    update's settings, as --set options; `extra` settings come last (a later --set wins)."""
    for split, source in (("train", tiny_prefix), ("dev", f"{tiny_prefix}-dev")):
        shutil.copyfile(f"{source}.es", tmp_path / f"{split}.es")
        shutil.copyfile(f"{source}.en", tmp_path / f"{split}.xyz")
    rules = [
        f'data.train=[{{corpus: "{tmp_path}/train", src_lang: es, tgt_lang: xyz}}]',
        f'data.dev=[{{corpus: "{tmp_path}/dev", src_lang: es, tgt_lang: xyz}}]',
        "data.new_languages=[{lang: xyz}]",
        "train.max_steps=1",
        "train.max_tokens=512",
        "train.lora.rank=2",
        "train.weight_decay=0",
        *extra,
    ]
    return [x for r in rules for x in ("--set", r)]


def assert_gains_both_targets(init: Path, out: Path, old: str, new: str) -> None:
    """`out`'s tokenizer is `init`'s with the tokens of its old target and of the new one at
    the next ids, their rows (base.pt: the weights it started from) the mean of every row;
    each target translates."""
    before, after = Tokenizer.load(init / "tokenizer"), Tokenizer.load(out / "tokenizer")
    size = before.src_vocab_size
    assert (
        (after.tags[old], after.tags[new]) == (size, size + 1) == (size, after.src_vocab_size - 1)
    )
    assert after.src_vocabulary()[:size] == before.src_vocabulary()
    weights = load_checkpoint(resolve_checkpoint(init)[0])["model"]
    start = load_checkpoint(out / "base.pt")["model"]
    for name in ("src_embed.token.weight", "generator.weight"):
        assert torch.equal(start[name][:size], weights[name]), name
        mean = weights[name].float().mean(0).to(weights[name].dtype)
        assert torch.equal(start[name][size], mean) and torch.equal(start[name][size + 1], mean)
    for lang in ("en", "xyz"):
        result = tf("translate", out, "--to", lang, "--greedy", input="Y dijo Dios.\n")
        assert result.exit_code == 0, result.output


def test_a_one_way_run_gains_tokens_for_its_old_and_new_target(trained, tiny_prefix, tmp_path):
    """An es->en run (no language tokens: one target) tuned on es->xyz writes two languages:
    `<2en>` and `<2xyz>` join its tokenizer, `data.new_languages` naming xyz alone."""
    out = tmp_path / "xyz"
    tuned = tf("train", "tiny", "--init", trained, "--out", out,
               *one_way_settings(tmp_path, tiny_prefix))  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    assert_gains_both_targets(trained, out, "<2en>", "<2xyz>")


def test_a_one_way_opus_mt_import_gains_its_tokens_in_its_form(tiny_prefix, tmp_path):
    """An OPUS-MT es->en import: `>>en<<` and `>>xyz<<`, the pieces its vocabulary reads as
    tags, whatever `data.lang_token` the recipe leaves."""
    from test_import import small_standin

    standin = small_standin(tmp_path, tiny_prefix)
    assert tf("import", standin, "-o", tmp_path / "run").exit_code == 0
    out = tmp_path / "xyz"
    tuned = tf("train", "finetune", "--init", tmp_path / "run", "--out", out,
               *one_way_settings(tmp_path, tiny_prefix))  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    assert_gains_both_targets(tmp_path / "run", out, ">>en<<", ">>xyz<<")


@pytest.mark.parametrize(
    "new, fragments",
    [
        ("[{lang: pt}]", ("data.new_languages[0]: pt is only read", "drop it")),
        (
            "[{lang: xyz, init: es}]",
            ("data.new_languages[0].init 'es'", "no language tokens", "leave init out"),
        ),
    ],
)
def test_a_one_way_models_new_language_needs_no_token_or_row_it_lacks(
    trained, tiny_prefix, tmp_path, new, fragments
):
    """A source language of a model whose sources carry no token is transfer: no token to
    add; a one-way model has no language row to copy. Each one line, nothing written."""
    shutil.copyfile(f"{tiny_prefix}.es", tmp_path / "train.pt")
    shutil.copyfile(f"{tiny_prefix}.en", tmp_path / "train.en")
    rules = one_way_settings(tmp_path, tiny_prefix, f"data.new_languages={new}")
    if "pt" in new:
        rules += ["--set", f'data.train=[{{corpus: "{tmp_path}/train", src_lang: pt}}]']
    out = tmp_path / "out"
    assert_user_error(tf("train", "tiny", "--init", trained, "--out", out, *rules), *fragments)
    assert not out.exists()


def test_the_old_targets_token_is_checked_as_the_new_ones_when_the_config_is_read(
    trained, tiny_prefix, tmp_path, monkeypatch
):
    """A one-way model given a second target gains a token for its old target too (`<2en>`),
    added after the languages the user names were checked: it is checked as theirs are, when
    the config is read (`with_init`), not only once the data is being prepared. Here `<2en>`
    is a word piece of the tokenizer (SentencePiece may learn one), which no new token may be."""
    from cli.config import ConfigError, load_config
    from cli.training.init import with_init

    vocabulary = Tokenizer.src_vocabulary
    monkeypatch.setattr(Tokenizer, "src_vocabulary", lambda self: [*vocabulary(self), "<2en>"])
    sets = one_way_settings(tmp_path, tiny_prefix, f"train.init={trained}")[1::2]
    with pytest.raises(ConfigError, match="'<2en>' is a piece of the tokenizer already"):
        with_init(load_config("tiny", sets))


@pytest.mark.parametrize(
    "trainable, refused",
    [("[embeddings, embeddings_of_new_languages]", False), ("[embeddings_of_new_languages]", True)],
)
def test_weight_decay_is_refused_only_where_a_matrix_trains_its_new_rows_alone(
    trained, tiny_prefix, tmp_path, trainable, refused
):
    """A tied model (the tiny run's `tie_embeddings: all`: one matrix): listed with
    `embeddings`, the new rows' group adds nothing, the matrix trains whole, and weight decay
    may move its old rows (it was refused all the same); listed alone, decay would move the
    rows it keeps: refused in one line naming the matrix, nothing written."""
    out = tmp_path / "out"
    decay = ("train.weight_decay=0.01", f"train.trainable={trainable}")
    result = tf("train", "tiny", "--init", trained, "--out", out,
                *one_way_settings(tmp_path, tiny_prefix, *decay))  # fmt: skip
    if not refused:
        assert result.exit_code == 0, result.output
        return
    assert_user_error(result, "train.weight_decay would move the old rows of src_embed.token")
    assert not out.exists()
