"""`tf import` of a Hugging Face Marian model (OPUS-MT), exact against `transformers` itself.

The stand-in for Helsinki-NLP/opus-mt-es-en (`benchmarks.marian_standin`): a MarianMTModel with
its published configuration and random weights, SentencePiece models and a vocab.json trained
on the bundled corpus, saved with `save_pretrained`. No network anywhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from torch.testing import assert_close

from benchmarks.marian_standin import OPUS_MT_ES_EN, TINY, make_standin
from cli.inference.engines import load_engine
from cli.runs.checkpoint import load_checkpoint
from cli.runs.models import load_for_inference
from data.corpus import load_corpus
from data.text import read_file_lines

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "corpora" / "bible-es-en"
# Searches compared with `generate`: a shorter limit than the model's own (512), the same for
# every sentence as transformers has, in fp32; every other rule is the model's, imported.
SAME_RULES = [
    "decode.max_len_a=0",
    "decode.max_len_b=10",  # + EOS: generate's max_new_tokens=11
    "decode.precision=fp32",
]


def quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()


@pytest.fixture(scope="session")
def bundled_pairs() -> tuple[list[str], list[str]]:
    ds = load_corpus("bundled:bible-es-en/train", "es", "en").select(range(8000))
    return list(ds["src"]), list(ds["tgt"])


@pytest.fixture(scope="session")
def opus(tmp_path_factory, bundled_pairs) -> Path:
    """The stand-in for opus-mt-es-en, at its published size."""
    quiet_transformers()
    src, tgt = bundled_pairs
    return make_standin(
        tmp_path_factory.mktemp("opus") / "opus-mt-es-en", src, tgt, OPUS_MT_ES_EN, 2000
    )


@pytest.fixture(scope="session")
def opus_run(opus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "run"
    result = tf("import", opus, "-o", out)
    assert result.exit_code == 0, result.output
    return out


def small_standin(tmp_path: Path, tiny_prefix: str, **options) -> Path:
    """A tiny stand-in trained on the 200-pair fixture: the variants' model. Its translations
    stop at 62 tokens (max_length 64, imported): a random model seldom ends before its limit,
    and OPUS-MT's 512 made every command's test spend its time on 510-token outputs."""
    quiet_transformers()
    src = read_file_lines(Path(f"{tiny_prefix}.es"))
    tgt = read_file_lines(Path(f"{tiny_prefix}.en"))
    options = {"generation": dict(max_length=64), **options}
    return make_standin(tmp_path / "standin", src, tgt, TINY, vocab_size=300, **options)


def imported(directory: Path, tmp_path: Path) -> Path:
    out = tmp_path / "imported"
    result = tf("import", directory, "-o", out)
    assert result.exit_code == 0, result.output
    return out


def hf_logits(directory: Path, src: list[str], tgt: list[str]):
    """transformers' logits of teacher-forced targets, the batch, and the real target
    positions."""
    from transformers import MarianMTModel, MarianTokenizer
    from transformers.models.marian.modeling_marian import shift_tokens_right

    model = MarianMTModel.from_pretrained(directory).eval()
    tokenizer = MarianTokenizer.from_pretrained(directory)
    batch = tokenizer(src, text_target=tgt, return_tensors="pt", padding=True)
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    tgt_in = shift_tokens_right(labels, tokenizer.pad_token_id, model.config.decoder_start_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels
        ).logits
    return logits, batch, tgt_in, labels != -100


def assert_same_logits(directory: Path, run: Path, src: list[str], tgt: list[str]) -> None:
    theirs, batch, tgt_in, real = hf_logits(directory, src, tgt)
    model, _, _ = load_for_inference(run, torch.device("cpu"))
    with torch.no_grad():
        ours = model(batch["input_ids"], tgt_in, batch["attention_mask"] == 0, None)
    assert_close(ours[real], theirs[real], rtol=0, atol=1e-4)


def generated(directory: Path, lines: list[str], beam: int) -> list[str]:
    """What a transformers user gets with the model's own generation config (pad banned, EOS
    forced at the limit, |Y| ** 1.0 length penalty, `early_stopping` false) at SAME_RULES'
    limit: tf's search with the settings `tf import` took from it."""
    from transformers import MarianMTModel, MarianTokenizer

    limit = int(next(r for r in SAME_RULES if "max_len_b" in r).split("=")[1])
    model = MarianMTModel.from_pretrained(directory).eval()
    tokenizer = MarianTokenizer.from_pretrained(directory)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=beam, max_new_tokens=limit + 1)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def translated(run: Path, lines: list[str], beam: int, rules: list[str] = SAME_RULES) -> list[str]:
    args = ["translate", run, "--beam", str(beam)] + [x for s in rules for x in ("--set", s)]
    result = tf(*args, input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


# --------------------------------------------------------------------- exact against transformers


def test_logits_equal_transformers_on_50_sentences(opus, opus_run):
    src = read_file_lines(BUNDLED / "dev.es")[:50]
    tgt = read_file_lines(BUNDLED / "dev.en")[:50]
    assert_same_logits(opus, opus_run, src, tgt)


def test_ids_equal_marian_tokenizer_on_1000_lines(opus, opus_run):
    from transformers import MarianTokenizer

    theirs = MarianTokenizer.from_pretrained(opus)
    _, ours, _ = load_for_inference(opus_run, torch.device("cpu"))
    src = read_file_lines(BUNDLED / "test.es")
    tgt = read_file_lines(BUNDLED / "test.en")
    assert len(src) == len(tgt) == 1000
    assert ours.encode_src(src) == theirs(src)["input_ids"]
    # Targets: tf's batching appends the EOS that MarianTokenizer puts in the ids.
    expected = theirs(text_target=tgt)["input_ids"]
    assert [ids + [ours.eos_id] for ids in ours.encode_tgt(tgt)] == expected
    assert ours.decode_tgt(expected) == theirs.batch_decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("beam", [1, 4])
def test_translate_equals_generate_on_100_lines(opus, opus_run, beam):
    lines = read_file_lines(BUNDLED / "dev.es")[100:200]
    assert translated(opus_run, lines, beam) == generated(opus, lines, beam)


@pytest.mark.parametrize(
    "options",
    [
        dict(separate=True),  # two vocabularies, untied encoder and decoder embeddings
        dict(relu=True),
        dict(language_tokens=(">>fra<<", ">>spa<<", ">>eng<<")),  # a multilingual model
    ],
    ids=["separate-vocabularies", "relu", "multilingual"],
)
def test_variants_are_exact(tmp_path, tiny_prefix, options):
    relu = options.pop("relu", False)
    shape = dict(TINY, activation_function="relu") if relu else TINY
    quiet_transformers()
    src = read_file_lines(Path(f"{tiny_prefix}.es"))
    tgt = read_file_lines(Path(f"{tiny_prefix}.en"))
    directory = make_standin(tmp_path / "standin", src, tgt, shape, vocab_size=300, **options)
    run = imported(directory, tmp_path)
    lines = src[:40]
    if options.get("language_tokens"):
        lines = [f">>{lang}<< {line}" for lang, line in zip(["fra", "spa", "eng"] * 14, lines)]
        report = tf("import", directory, "-o", tmp_path / "again")
        assert ">>fra<< >>spa<< >>eng<<" in report.stdout
    assert_same_logits(directory, run, lines, tgt[:40])
    assert translated(run, lines, 1) == generated(directory, lines, 1)
    config = load_checkpoint(run / "checkpoints" / "last.pt")["config"]["model"]
    assert config["activation"] == ("relu" if relu else "swish")
    assert config["tie_embeddings"] == ("decoder" if options.get("separate") else "all")


# ---------------------------------------------------------------------------------- round trips


def safetensors_of(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def test_an_imported_model_exported_again_is_the_same_tensors(opus, opus_run, tmp_path):
    out = tmp_path / "hf"
    result = tf("export", opus_run, "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    original, again = safetensors_of(opus), safetensors_of(out)
    assert set(original) == set(again)
    for name, tensor in original.items():
        assert torch.equal(tensor, again[name]), name
    lines = read_file_lines(BUNDLED / "dev.es")[:20]
    assert generated(out, lines, 1) == generated(opus, lines, 1)  # its tokenizer included


def test_a_tf_run_exported_and_imported_back_is_the_same_run(trained, tmp_path):
    """A `tf` model (interleaved positions, BOS start, its own SentencePiece) through Marian."""
    hf = tmp_path / "hf"
    assert tf("export", trained, "--to", "huggingface", "-o", hf).exit_code == 0
    back = imported(hf, tmp_path)
    before = load_checkpoint(trained / "checkpoints" / "best.pt")
    after = load_checkpoint(back / "checkpoints" / "last.pt")
    assert before["model"].keys() == after["model"].keys()
    for name, tensor in before["model"].items():
        assert torch.equal(tensor, after["model"][name]), name  # bit for bit
    assert after["config"]["model"] == before["config"]["model"]
    lines = read_file_lines(Path(__file__).parent / "fixtures" / "tiny-dev.es")
    text = "\n".join(lines) + "\n"
    first = tf("translate", trained, "--beam", "3", input=text)
    second = tf("translate", back, "--beam", "3", input=text)
    assert first.exit_code == second.exit_code == 0
    assert first.stdout == second.stdout  # byte for byte


def test_ctranslate2_export_of_an_imported_run_translates_as_tf(tmp_path, tiny_prefix):
    """Swish, the output bias, the pad start and Marian's positions in CTranslate2's spec."""
    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    out = tmp_path / "ct2"
    result = tf("export", run, "--to", "ctranslate2", "-o", out)
    assert result.exit_code == 0, result.output
    lines = read_file_lines(BUNDLED / "dev.es")[200:300]
    assert translated(out, lines, 1) == translated(run, lines, 1)
    # The import's transformers stopping rule is tf's own: the directory searches as
    # CTranslate2 does, said at export, and its beam search runs as it comes.
    assert "note: decoding as CTranslate2 searches: decode.beam_stop" in result.stdout
    assert tf("translate", out, "--beam", "3", input="hola\n").exit_code == 0


# ------------------------------------------------------------------------------------ bad input


def test_hub_names_load_through_the_hub_cache_offline(tmp_path, tiny_prefix, monkeypatch):
    """A hub name is fetched as transformers fetches it: here from a cache that holds it, with
    HF_HUB_OFFLINE set (conftest); a name the cache lacks is one line saying what to do."""
    import huggingface_hub.constants as hub

    directory = small_standin(tmp_path, tiny_prefix)
    cache = tmp_path / "hub"
    snapshot = cache / "models--Helsinki-NLP--opus-mt-es-en" / "snapshots" / ("a" * 40)
    shutil.copytree(directory, snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    out = tmp_path / "run"
    result = tf("import", "Helsinki-NLP/opus-mt-es-en", "-o", out)
    assert result.exit_code == 0, result.output
    assert (
        json.loads((out / "import.json").read_text())["source"] == "hf:Helsinki-NLP/opus-mt-es-en"
    )
    missing = tf("import", "Helsinki-NLP/opus-mt-xx-yy", "-o", tmp_path / "none")
    assert missing.exit_code == 2
    assert "cannot be reached" in missing.stderr and "hf download" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()


def broken(tmp_path: Path, tiny_prefix: str, change) -> Path:
    directory = small_standin(tmp_path, tiny_prefix)
    change(directory)
    return directory


def edit_config(**values):
    def change(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        config.update(values)
        (directory / "config.json").write_text(json.dumps(config))

    return change


def remove(name: str):
    return lambda directory: (directory / name).unlink()


def evil_pickle(directory: Path) -> None:
    """A pytorch_model.bin whose unpickling would write a file: weights_only refuses it."""
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {directory / 'pwned'}",))

    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Evil()}))


def sharded_with_a_list(directory: Path) -> None:
    """An index file whose weight_map is no mapping (valid JSON all the same)."""
    (directory / "model.safetensors.index.json").write_text('{"weight_map": ["a", "b"]}')


def tokenizer_languages(**languages):
    def change(directory: Path) -> None:
        where = directory / "tokenizer_config.json"
        settings = json.loads(where.read_text()) if where.is_file() else {}
        where.write_text(json.dumps({**settings, **languages}))

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (edit_config(model_type="t5", architectures=["T5ForConditionalGeneration"]), "a t5 model"),
        (edit_config(model_type="bart"), "tf import takes Marian"),
        (edit_config(normalize_before=True), "normalize_before: true is a Marian variant"),
        (edit_config(static_position_embeddings=False), "static_position_embeddings"),
        (edit_config(activation_function="tanh"), "activation_function 'tanh'"),
        (remove("source.spm"), "source.spm: missing"),
        (remove("vocab.json"), "vocab.json: missing"),
        (lambda d: (d / "target.spm").write_text("not a model"), "not a SentencePiece model"),
        (lambda d: (d / "vocab.json").write_text("{"), "vocab.json: not readable JSON"),
        (edit_config(vocab_size=999), "config.json's vocab_size is 999"),
        (remove("model.safetensors"), "no model.safetensors or pytorch_model.bin"),
        (evil_pickle, "pytorch_model.bin: not loadable as plain weights"),
        (edit_config(dropout=None), "dropout must be a number in [0, 1), got None"),
        (edit_config(activation_function=["relu"]), "activation_function must be a name"),
        (edit_config(pad_token_id="0"), "pad_token_id must be a token id"),
        (edit_config(tie_word_embeddings="yes"), "tie_word_embeddings must be true or false"),
        (sharded_with_a_list, "weight_map must map tensor names to shard file names"),
        (tokenizer_languages(source_lang=5), "tokenizer_config.json: source_lang must be"),
        (tokenizer_languages(target_lang="e s"), "tokenizer_config.json: target_lang must be"),
    ],
    ids=[
        "t5",
        "bart",
        "pre-ln",
        "learned-positions",
        "activation",
        "no-source-spm",
        "no-vocab",
        "bad-spm",
        "bad-vocab",
        "vocab-size",
        "no-weights",
        "malicious-pickle",
        "null-dropout",
        "activation-list",
        "id-string",
        "flag-string",
        "weight-map-list",
        "language-number",
        "language-spaced",
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, tiny_prefix, change, message):
    directory = broken(tmp_path, tiny_prefix, change)
    out = tmp_path / "run"
    result = tf("import", directory, "-o", out)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists() and not (directory / "pwned").exists()


def test_an_existing_output_needs_force(tmp_path, tiny_prefix):
    directory = small_standin(tmp_path, tiny_prefix)
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = tf("import", directory, "-o", out)
    assert result.exit_code == 2 and "use --force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert tf("import", directory, "-o", out, "--force").exit_code == 0
    assert not (out / "keep.txt").exists() and (out / "checkpoints" / "last.pt").is_file()


def test_an_output_under_a_file_or_holding_the_source_is_refused(tmp_path, tiny_prefix):
    directory = small_standin(tmp_path, tiny_prefix)
    (tmp_path / "afile").write_text("mine")
    under = tf("import", directory, "-o", tmp_path / "afile" / "run")
    assert_user_error(under, "afile is a file, not a directory")
    before = sorted(p.name for p in directory.iterdir())
    for out in (directory, tmp_path):  # the source itself, a folder above it
        refused = tf("import", directory, "-o", out, "--force")
        assert_user_error(refused, "which replacing it would delete")
    assert sorted(p.name for p in directory.iterdir()) == before
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_many_to_many_model_imports_with_its_language_tokens(tmp_path, tiny_prefix):
    """opus-mt-gem-gem and the like: one group's code on both sides, the languages in tokens."""
    standin = small_standin(tmp_path, tiny_prefix, language_tokens=(">>deu<<", ">>nld<<"))
    directory = standin.rename(tmp_path / "opus-mt-gem-gem")
    tokenizer_languages(source_lang="gem", target_lang="gem")(directory)  # as the hub's says
    result = tf("import", directory, "-o", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "gem->gem" in result.output and ">>deu<< >>nld<<" in result.output
    run = tmp_path / "run"
    assert_user_error(tf("translate", run, input="hola\n"), "--to", "deu, nld")
    out = tf("translate", run, "--to", "nld", "--greedy", input="hola\n")
    assert out.exit_code == 0, out.output
    mono = tmp_path / "mono.txt"
    mono.write_text("hola\n")
    fast = ("--greedy", "--set", "decode.max_len_b=4")
    made = tf("backtranslate", run, mono, "--out", tmp_path / "bt", "--to", "deu", *fast)
    assert made.exit_code == 0, made.output
    assert sorted(p.name for p in (tmp_path / "bt").glob("train.*")) == ["train.deu", "train.gem"]
    hf = tmp_path / "hf"
    assert tf("export", run, "--to", "huggingface", "-o", hf).exit_code == 0
    card = (hf / "README.md").read_text()
    assert "# multilingual translation (gem, deu, nld)" in card and "`>>nld<<` (nld)" in card


def test_backtranslating_into_the_source_language_is_refused(tmp_path, tiny_prefix):
    """Its pairs' two files would be one: train.es holding the translations."""
    directory = small_standin(tmp_path, tiny_prefix, language_tokens=(">>es<<", ">>en<<"))
    run = imported(directory, tmp_path)  # es->en by its tokenizer_config.json
    mono = tmp_path / "mono.es"
    mono.write_text("hola\n")
    out = tmp_path / "bt"
    refused = tf("backtranslate", run, mono, "--out", out, "--to", "es", "--greedy")
    assert_user_error(refused, "source and target language are both 'es'", "train.es")
    assert not out.exists()


def test_an_imported_run_is_no_training_run_to_resume(tmp_path, tiny_prefix):
    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    result = tf("train", "--resume", run)
    assert result.exit_code == 2
    assert "an imported model, not a training run" in result.stderr
    assert "--init" in result.stderr


def test_fine_tuning_keeps_the_tokenizer_and_refuses_what_needs_another(tmp_path, tiny_prefix):
    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    common = ["train", "finetune", "--init", run, "--out", tmp_path / "ft"]
    for setting, message in [
        ("data.vocab_size=16000", "data.vocab_size 16000: train.init"),
        ("data.tokenizer_type=unigram", "data.tokenizer_type 'unigram'"),
        (f'data.train=[{{corpus: "{tiny_prefix}", tag: "<bt>"}}]', "the tag(s) <bt>"),
    ]:
        result = tf(*common, "--set", setting)
        assert result.exit_code == 2, result.output
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "ft").exists()


def test_engine_reads_a_target_language_token_as_one_piece(tmp_path, tiny_prefix):
    directory = small_standin(tmp_path, tiny_prefix, language_tokens=(">>fra<<", ">>deu<<"))
    run = imported(directory, tmp_path)
    engine = load_engine(str(run), torch.device("cpu"), ["decode.beam_size=1"])
    fra, deu = engine.tokenizer.tags[">>fra<<"], engine.tokenizer.tags[">>deu<<"]
    (src_fra, _), (src_deu, _) = engine.stream([">>fra<< Y dijo Dios", ">>deu<< Y dijo Dios"], "x")
    assert src_fra[0] == fra and src_deu[0] == deu and src_fra[1:] == src_deu[1:]


# ---------------------------------------------------------------------------------- end to end


def test_import_fine_tune_resume_constrain_distill_export(tmp_path, tiny_prefix):
    """The whole path of a pretrained model: import, fine-tune on a corpus list with cleaning
    (validated at step 0), resume exactly after a stop, translate with a constraint, distill a
    student with its own tokenizer, export to both formats."""
    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    corpus = f'{{corpus: "{tiny_prefix}"'
    corpora = f"data.train=[{corpus}, weight: 1}}, {corpus}, weight: 0.5}}]"
    common = [
        "--set", corpora,
        "--set", f"data.dev={tiny_prefix}-dev",
        "--set", "train.max_tokens=512",
        "--set", "train.eval_every=2",
        "--set", "train.save_every=2",
        "--set", "train.eval_bleu_sentences=8",
        "--set", "train.deterministic=true",
        "--set", "train.precision=fp32",
        "--set", "train.lr=1e-3",
    ]  # fmt: skip

    def fine_tune(out: Path, steps: int) -> None:
        result = tf("train", "finetune", "--init", run, "--out", out, *common, "--set", steps)
        assert result.exit_code == 0, result.output

    fine_tune(tmp_path / "straight", "train.max_steps=4")
    stopped = tmp_path / "stopped"
    fine_tune(stopped, "train.max_steps=2")
    again = tf("train", "--resume", stopped, "--set", "train.max_steps=4", "--allow-config-change")
    assert again.exit_code == 0, again.output
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(stopped / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 4
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    records = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "dev_bleu" in r] == [0, 2, 4]  # step 0: before any update
    report = json.loads((stopped / "data.json").read_text())["corpora"]
    assert [c["weight"] for c in report] == [1, 0.5] and "duplicate" in report[0]["removed"]
    assert (stopped / "tokenizer" / "vocab.json").is_file()  # the model's own, kept

    request = json.dumps({"text": "Y dijo Dios: Sea la luz.", "constraints": ["God"]}) + "\n"
    constrained = tf("translate", stopped, "--input-format", "jsonl", "--beam", "4", input=request)
    assert constrained.exit_code == 0, constrained.output
    assert "God" in constrained.stdout

    distilled = tmp_path / "distilled"
    short = ["--set", "decode.max_len_a=0", "--set", "decode.max_len_b=12"]
    assert tf("distill", stopped, "--out", distilled, "--beam", "2", *short).exit_code == 0
    student = tmp_path / "student"
    trained_student = tf(
        "train", "tiny", "--out", student,
        "--set", f"data.train={distilled}/train",
        "--set", f"data.dev={tiny_prefix}-dev",
        "--set", "data.clean=false",  # a teacher of 4 updates repeats itself
        # ... in outputs of any length: no pair may fall to the length filters either.
        "--set", "data.max_len=255",
        "--set", "data.max_len_ratio=1000",
        "--set", "train.max_steps=2",
    )  # fmt: skip
    assert trained_student.exit_code == 0, trained_student.output
    assert (student / "tokenizer" / "joint.model").is_file()  # a small tokenizer of its own

    for engine in ("huggingface", "ctranslate2"):
        result = tf("export", stopped, "--to", engine, "-o", tmp_path / engine)
        assert result.exit_code == 0, result.output
    lines = read_file_lines(Path(f"{tiny_prefix}-dev.es"))[:10]
    greedy = ["decode.precision=fp32"]
    assert translated(tmp_path / "ctranslate2", lines, 1, greedy) == translated(
        stopped, lines, 1, greedy
    )


def test_every_command_takes_an_imported_run(tmp_path, tiny_prefix):
    """translate (--int8, an ensemble, a prefix), eval, serve, prune, average, and the
    target-language token of a multilingual model on each way in."""
    from test_serve import call, serving

    from cli.serving.app import build_app

    directory = small_standin(tmp_path, tiny_prefix, language_tokens=(">>fra<<",))
    run = imported(directory, tmp_path)
    text = ">>fra<< Y dijo Dios: Sea la luz.\nEn el principio\n"
    plain = tf("translate", run, "--greedy", input=text)
    assert plain.exit_code == 0, plain.output
    assert len(plain.stdout.splitlines()) == 2
    for extra in (["--int8"], [str(run)]):  # int8; an ensemble of the run with itself
        result = tf("translate", run, *extra, "--greedy", input=text)
        assert result.exit_code == 0, result.output
    assert tf("translate", run, str(run), "--greedy", input=text).stdout == plain.stdout
    request = json.dumps({"text": "Y dijo Dios", "prefix": "And"}) + "\n"
    prefixed = tf("translate", run, "--input-format", "jsonl", input=request)
    assert prefixed.exit_code == 0 and prefixed.stdout.startswith("And")
    src, ref = Path(f"{tiny_prefix}-dev.es"), Path(f"{tiny_prefix}-dev.en")
    assert tf("eval", run, "--src", src, "--ref", ref, "--greedy").exit_code == 0
    engine = load_engine(str(run), torch.device("cpu"), ["decode.beam_size=1"])
    with serving(build_app(engine, "run", "pytorch")) as url:
        status, body, _ = call(f"{url}/translate", {"text": text.splitlines()})
    assert status == 200 and body["translations"] == plain.stdout.splitlines()
    pruned = run / "checkpoints" / "pruned.pt"
    result = tf("prune", run, "-o", pruned, "--heads", "1", "--ffn", "0.5")
    assert result.exit_code == 0, result.output
    assert tf("translate", pruned, "--greedy", input=text).exit_code == 0
    averaged = run / "checkpoints" / "avg.pt"
    last = run / "checkpoints" / "last.pt"
    assert tf("average", last, last, "-o", averaged).exit_code == 0
    assert tf("translate", averaged, "--greedy", input=text).stdout == plain.stdout


def test_blank_lines_stay_blank_and_long_sources_keep_their_eos(tmp_path, tiny_prefix):
    """Marian's tokenizer ends every source in EOS, an empty one too: a blank line is still
    no source (no invented translation; a prefix on it is refused), and a source cut to the
    model's limit is translated in parts (issue 69), each ending in EOS as Marian's sources do."""
    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    result = tf("translate", run, "--greedy", input="Y dijo Dios\n\n   \nEn el principio\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert lines[1] == lines[2] == "" and lines[0] and lines[3]
    request = json.dumps({"text": "", "prefix": "And"}) + "\n"
    refused = tf("translate", run, "--input-format", "jsonl", input=request)
    assert refused.exit_code == 2 and "no text" in refused.stderr
    engine = load_engine(str(run), torch.device("cpu"), [])
    long = " ".join(["y dijo Dios"] * 200)
    rows = engine.encode([long], ["es"], "x", 1)
    limit, eos = engine.config.model.max_positions, engine.tokenizer.eos_id
    assert len(rows) > 1 and all(len(row) <= limit and row[-1] == eos for row in rows)
    assert " ".join(engine.tokenizer.decode_src(rows)) == long


def test_learned_positions_in_the_weights_are_refused(tmp_path, tiny_prefix):
    """A file that keeps its position table (older exports do) must hold Marian's sinusoids:
    learned positions would change every logit without a word."""
    from safetensors.torch import load_file, save_file

    directory = small_standin(tmp_path, tiny_prefix)
    weights = load_file(directory / "model.safetensors")
    table = torch.randn(TINY["max_position_embeddings"], TINY["d_model"])
    weights["model.encoder.embed_positions.weight"] = table
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    result = tf("import", directory, "-o", tmp_path / "run")
    assert result.exit_code == 2 and "are not Marian's sinusoids" in result.stderr
    assert not (tmp_path / "run").exists()


def test_an_imported_teacher_distills_the_corpus_it_is_given(tmp_path, tiny_prefix):
    """An imported model was trained on no corpus of tf's: `tf distill` asks for one
    (`--corpus`), where a trained teacher translates its own training sources."""
    run = imported(small_standin(tmp_path, tiny_prefix), tmp_path)
    config = load_checkpoint(run / "checkpoints" / "last.pt")["config"]["data"]
    assert config["train"] == [] and (config["src_lang"], config["tgt_lang"]) == ("es", "en")
    out = tmp_path / "distilled"
    refused = tf("distill", run, "--out", out)
    assert refused.exit_code == 2 and "--corpus" in refused.stderr and not out.exists()
    short = ["--set", "decode.max_len_a=0", "--set", "decode.max_len_b=6"]
    done = tf("distill", run, "--out", out, "--corpus", f"{tiny_prefix}-dev", "--beam", "1", *short)
    assert done.exit_code == 0, done.output
    sources = (out / "train.es").read_text().splitlines()
    assert sources == read_file_lines(Path(f"{tiny_prefix}-dev.es"))
    assert len((out / "train.en").read_text().splitlines()) == len(sources)


def test_fine_tuning_keeps_the_models_direction(tmp_path, tiny_prefix):
    """train.init's languages are the run's (a config that names none takes them); a target
    language the model does not write is refused in one line (another source language is
    transfer: tests/test_directions.py)."""
    directory = small_standin(tmp_path, tiny_prefix)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings.update(source_lang="en", target_lang="de")  # as if opus-mt-en-de
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    run = imported(directory, tmp_path)
    out = tmp_path / "ft"
    result = tf("train", "finetune", "--init", run, "--out", out, "--set", "data.tgt_lang=fr")
    assert result.exit_code == 2 and "translates en->fr" in result.stderr
    assert "translates into de" in result.stderr
    # Without languages of its own, the run is en->de: it reads the corpus's .de side.
    result = tf(
        "train", "finetune", "--init", run, "--out", out, "--set", f"data.train={tiny_prefix}"
    )
    assert result.exit_code == 2 and "tiny.de: no such file" in result.stderr
