"""`tf import` of NLLB-200, M2M100 and mBART-50 (issue 57), exact against `transformers` itself.

The stand-ins (`benchmarks.fairseq_standin`): the tokenizers of NLLB-200, M2M100 and mBART-50
saved by transformers' own classes over a SentencePiece model trained here, and tiny models of
transformers' own classes, `M2M100ForConditionalGeneration` at NLLB-200's layout and at
M2M100's, `MBartForConditionalGeneration` at mBART-50's, random weights drawn to tell their
sources apart, config.json's vocabulary the tokenizer's ids and the spare rows the published
models have (NLLB-200: 2, M2M100: 8), generation_config.json as published, saved with
`save_pretrained`. No network anywhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_import import BUNDLED, quiet_transformers
from torch.testing import assert_close

from benchmarks.fairseq_standin import (
    SPARE_ROWS,
    m2m100_tokenizer,
    make_model_standin,
    mbart50_tokenizer,
    nllb_tokenizer,
    train_spm,
)
from benchmarks.marian_standin import bundled_lines
from cli.inference.engines import load_engine
from cli.runs.checkpoint import load_checkpoint
from cli.runs.models import load_for_inference
from data.text import read_file_lines
from data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

# Each kind: its transformers tokenizer and model classes, a source language and two target
# languages as transformers names them (NLLB's codes; M2M100's languages, their codes __xx__).
KINDS = {
    "nllb": ("NllbTokenizer", "M2M100ForConditionalGeneration", "spa_Latn", "eng_Latn", "fra_Latn"),
    "m2m100": ("M2M100Tokenizer", "M2M100ForConditionalGeneration", "es", "en", "fr"),
    "mbart50": ("MBart50Tokenizer", "MBartForConditionalGeneration", "es_XX", "en_XX", "fr_XX"),
}
EOS = 2  # fairseq's </s>, these models' decoder start too
# Searches compared with `generate`: one length limit for every sentence, as transformers has
# it, its last place EOS forced as certain (`forced_eos_token_id`), in fp32.
SAME_RULES = [
    "decode.max_len_a=0",
    "decode.max_len_b=10",  # + EOS: generate's max_new_tokens=11, the language's code counted
    "decode.score_forced_eos=false",
    "decode.precision=fp32",
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    """The three tokenizers, of two SentencePiece models (BPE, unigram) trained once."""
    root = tmp_path_factory.mktemp("fairseq-tokenizers")
    src, tgt = bundled_lines(3000)
    bpe = train_spm(src + tgt, root / "bpe", 1000, "bpe")
    unigram = train_spm(src + tgt, root / "unigram", 1000, "unigram")
    return {
        "nllb": nllb_tokenizer(root / "nllb", bpe),
        "m2m100": m2m100_tokenizer(root / "m2m100", bpe, src[:1000] + tgt[:1000]),
        "mbart50": mbart50_tokenizer(root / "mbart50", unigram),
    }


@pytest.fixture(scope="module")
def standins(tokenizers, tmp_path_factory) -> dict[str, Path]:
    quiet_transformers()
    root = tmp_path_factory.mktemp("fairseq-models")
    return {kind: make_model_standin(root / kind, kind, path) for kind, path in tokenizers.items()}


@pytest.fixture(scope="module")
def runs(standins, tmp_path_factory) -> dict[str, Path]:
    """Each stand-in imported, and `tf import`'s report of it."""
    root = tmp_path_factory.mktemp("fairseq-runs")
    for kind, directory in standins.items():
        result = tf("import", directory, "-o", root / kind)
        assert result.exit_code == 0, result.output
        (root / f"{kind}.report").write_text(result.output)
    return {kind: root / kind for kind in standins}


def hf_tokenizer(kind: str, directory: Path, src_lang: str):
    return getattr(transformers, KINDS[kind][0]).from_pretrained(directory, src_lang=src_lang)


def hf_model(kind: str, directory: Path):
    return getattr(transformers, KINDS[kind][1]).from_pretrained(directory).eval()


def code_id(kind: str, directory: Path, lang: str) -> int:
    """The id of `lang`'s code as transformers' tokenizer has it (`forced_bos_token_id`)."""
    code = Tokenizer.load(directory).languages[lang]
    return hf_tokenizer(kind, directory, KINDS[kind][2]).convert_tokens_to_ids(code)


def generated(kind: str, directory: Path, lines: list[str], tgt: str, **settings) -> list[str]:
    """What a transformers user gets: the model's generation settings, the target language's
    code forced first, `settings` over them."""
    src = KINDS[kind][2]
    tokenizer, model = hf_tokenizer(kind, directory, src), hf_model(kind, directory)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, forced_bos_token_id=code_id(kind, directory, tgt), **settings)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def translated(run: Path, lines: list[str], src: str, tgt: str, *args: str) -> list[str]:
    result = tf("translate", run, "--from", src, "--to", tgt, *args, input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def sets(rules: list[str]) -> list[str]:
    return [x for rule in rules for x in ("--set", rule)]


# --------------------------------------------------------------------- exact against transformers


@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_transformers_on_50_sentences(standins, runs, kind):
    """fp32 logits within 1e-4 at every real target position, the same source and target ids
    fed to both (transformers' tokenizer's, its decoder's inputs `</s> [code] X`); the rows
    config.json has past the tokenizer's ids are left out, never a model's choice. tf's own
    source ids for those lines (`--from`) are transformers' ids."""
    _, _, src, tgt, _ = KINDS[kind]
    directory = standins[kind]
    tokenizer, model = hf_tokenizer(kind, directory, src), hf_model(kind, directory)
    tokenizer.tgt_lang = tgt
    sources = read_file_lines(BUNDLED / "dev.es")[:50]
    batch = tokenizer(
        sources,
        text_target=read_file_lines(BUNDLED / "dev.en")[:50],
        return_tensors="pt",
        padding=True,
    )
    from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right

    labels = batch["labels"]  # `[code] X </s>`, padded
    tgt_in = shift_tokens_right(labels, tokenizer.pad_token_id, EOS)  # `</s> [code] X`
    real = labels != tokenizer.pad_token_id
    with torch.no_grad():
        theirs = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=tgt_in,
        ).logits
    ours_model, ours, _ = load_for_inference(runs[kind], torch.device("cpu"))
    with torch.no_grad():
        logits = ours_model(
            batch["input_ids"], tgt_in, batch["attention_mask"] == 0, tgt_in == ours.pad_id
        )
    V = logits.size(-1)
    assert V + SPARE_ROWS[kind] == theirs.size(-1) == model.config.vocab_size
    assert_close(logits[real], theirs[real][:, :V], rtol=0, atol=1e-4)
    assert theirs[real].std() > 1.0  # far from flat: a weight out of place would show
    if SPARE_ROWS[kind]:
        assert theirs[real][:, V:].max() < theirs[real][:, :V].min() - 50
    engine = load_engine(str(runs[kind]), torch.device("cpu"), [], to=tgt, frm=src)
    texts = [engine.source_text(line, "x") for line in sources]
    expected = [row[row != tokenizer.pad_token_id].tolist() for row in batch["input_ids"]]
    assert ours.encode_src(texts) == expected


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_translate_equals_generate_on_100_lines(standins, runs, kind, beam):
    """`tf translate RUN --from X --to Y` equals `generate(forced_bos_token_id=Y's code)`,
    greedy and beam 4, into two languages, under one length rule (`SAME_RULES`), with the rest
    of the search the model's own, imported (M2M100's and mBART-50's early_stopping, the
    power length penalty)."""
    _, _, src, *targets = KINDS[kind]
    lines = read_file_lines(BUNDLED / "dev.es")[100:200]
    search = ["--greedy"] if beam == 1 else ["--beam", str(beam)]
    into = {}
    for tgt in targets:
        into[tgt] = translated(runs[kind], lines, src, tgt, *search, *sets(SAME_RULES))
        theirs = generated(
            kind, standins[kind], lines, tgt, num_beams=beam, max_new_tokens=11,
            forced_eos_token_id=EOS,
        )  # fmt: skip
        assert into[tgt] == theirs
        assert len(set(into[tgt])) > 30  # the translations depend on their sources, not one line
    assert into[targets[0]] != into[targets[1]]  # and on the language asked for


@pytest.mark.parametrize("kind", ["nllb", "mbart50"])
def test_the_models_own_generation_settings_are_transformers(standins, runs, kind):
    """No rule given: NLLB-200's greedy search to max_length 200 and mBART-50's beam of 5,
    early stopping and forced EOS at 200, as `generate` runs them from the model's files."""
    _, _, src, tgt, _ = KINDS[kind]
    lines = read_file_lines(BUNDLED / "dev.es")[:20]
    ours = translated(runs[kind], lines, src, tgt, "--set", "decode.precision=fp32")
    assert ours == generated(kind, standins[kind], lines, tgt)
    config = load_checkpoint(runs[kind] / "checkpoints" / "last.pt")["config"]["decode"]
    assert config["beam_size"] == (1 if kind == "nllb" else 5)
    assert config["max_len_b"] == (199 if kind == "nllb" else 198)  # a forced EOS takes one


# ------------------------------------------------------------------------- the run's languages


@pytest.mark.parametrize(
    "kind, count, src, tgt, token",
    [
        ("nllb", 202, "eng_Latn", "fra_Latn", "{lang}"),
        ("m2m100", 100, "en", "ro", "__{lang}__"),
        ("mbart50", 52, "en_XX", "ro_RO", "{lang}"),
    ],
)
def test_the_run_reads_and_writes_every_language(runs, tokenizers, kind, count, src, tgt, token):
    """The run's data section: every language of the tokenizer, any into any, each its own
    code, the target's forced first (`lang_token_side: target`), the default source and
    target transformers' tokenizers have; the tokenizer's files and tf_tokenizer.json in
    RUN/tokenizer; the report lists the languages and says how to choose them."""
    run = runs[kind]
    data = load_checkpoint(run / "checkpoints" / "last.pt")["config"]["data"]
    own = Tokenizer.load(tokenizers[kind])
    assert data["languages"] == list(own.languages) and len(data["languages"]) == count
    assert (data["lang_token"], data["lang_token_side"]) == (token, "target")
    assert (data["src_lang"], data["tgt_lang"]) == (src, tgt)
    assert data["train"] == [] and data["dev"] == "" and data["test"] == ""
    imported = Tokenizer.load(run / "tokenizer")
    assert (run / "tokenizer" / "tf_tokenizer.json").is_file()
    assert imported.tags == own.tags and imported.settings == own.settings
    report = (run.parent / f"{kind}.report").read_text()
    first = list(own.languages)[:3]
    assert f"languages ({count}), any into any: {', '.join(first)}" in report
    assert f"--from {src} --to {tgt}" in report
    record = json.loads((run / "import.json").read_text())
    assert record["rows_left_out"] == SPARE_ROWS[kind] and len(record["languages"]) == count
    assert ("row(s) of the embeddings past" in report) == bool(SPARE_ROWS[kind])


def test_languages_unknown_to_the_model_name_the_nearest(runs):
    """--from and --to are the model's languages, as its tokenizer names them: another
    family's spelling is refused naming the nearest of its own, and nothing is translated."""
    refused = tf("translate", runs["nllb"], "--from", "spa", "--to", "fra_Latn", input="Hola\n")
    assert_user_error(refused, "--from", "202 languages, not 'spa'", "spa_Latn")
    refused = tf("translate", runs["m2m100"], "--from", "es", "--to", "fra", input="Hola\n")
    assert_user_error(refused, "--to", "100 languages, not 'fra'", "fr")
    refused = tf("translate", runs["mbart50"], "--from", "es", "--to", "fr_XX", input="Hola\n")
    assert_user_error(refused, "--from", "52 languages, not 'es'", "es_XX")
    assert refused.stdout == ""


# ------------------------------------------------------------------------ the files, the hub


def test_pickled_and_sharded_weights_import_as_the_safetensors(standins, runs, tmp_path):
    """pytorch_model.bin (read with weights_only=True, its pages handed back as read) and
    sharded safetensors (save_pretrained's own) give the single file's weights, bit for bit."""
    from safetensors.torch import load_file

    single = load_checkpoint(runs["nllb"] / "checkpoints" / "last.pt")["model"]
    pickled = shutil.copytree(standins["nllb"], tmp_path / "pickled")
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    sharded = tmp_path / "sharded"
    hf_model("nllb", standins["nllb"]).save_pretrained(sharded, max_shard_size="20KB")
    for path in standins["nllb"].iterdir():
        if not (sharded / path.name).exists() and path.suffix != ".safetensors":
            shutil.copyfile(path, sharded / path.name)
    assert (sharded / "model.safetensors.index.json").is_file()
    for directory in (pickled, sharded):
        result = tf("import", directory, "-o", tmp_path / f"{directory.name}-run")
        assert result.exit_code == 0, result.output
        again = load_checkpoint(tmp_path / f"{directory.name}-run" / "checkpoints" / "last.pt")
        assert all(torch.equal(t, again["model"][name]) for name, t in single.items())


def test_a_hub_name_fetches_its_familys_files_through_the_cache(standins, tmp_path, monkeypatch):
    """facebook/nllb-200-distilled-600M from a cache that holds it (HF_HUB_OFFLINE, conftest):
    config.json read first, then the family's files."""
    import huggingface_hub.constants as hub

    cache = tmp_path / "hub"
    snapshot = cache / "models--facebook--nllb-200-distilled-600M" / "snapshots" / ("b" * 40)
    shutil.copytree(standins["nllb"], snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("b" * 40)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    out = tmp_path / "run"
    result = tf("import", "facebook/nllb-200-distilled-600M", "-o", out)
    assert result.exit_code == 0, result.output
    record = json.loads((out / "import.json").read_text())
    assert record["source"] == "hf:facebook/nllb-200-distilled-600M"
    assert record["weights"] == "model.safetensors"


# ------------------------------------------------------------------------------------ bad input


def edit_json(path: Path, **values) -> None:
    """`path`'s JSON object with `values` (a None value: the key removed)."""
    settings = json.loads(path.read_text()) if path.is_file() else {}
    settings.update(values)
    path.write_text(json.dumps({k: v for k, v in settings.items() if k not in values or v}))


def edit(name: str, **values):
    return lambda directory, tokenizers: edit_json(directory / name, **values)


def remove(*names: str):
    return lambda directory, tokenizers: [(directory / name).unlink() for name in names]


def mbart25(named: bool):
    """The mBART-50 stand-in with mBART-25's tokenizer (`MBartTokenizer`, 25 codes), as
    facebook/mbart-large-cc25's files hold it; `named`: its tokenizer_config.json names the
    class, else nothing names one (tokenizer.json's codes say what it is)."""

    def change(directory: Path, tokenizers: dict[str, Path]) -> None:
        source = directory.parent / "cc25-spm"
        source.mkdir()
        spm = "sentencepiece.bpe.model"
        shutil.copyfile(tokenizers["mbart50"] / spm, source / spm)
        transformers.MBartTokenizer.from_pretrained(source).save_pretrained(directory)
        if not named:
            edit_json(directory / "tokenizer_config.json", tokenizer_class=None)
            edit_json(directory / "config.json", tokenizer_class=None)

    return change


def logits_bias(directory: Path, tokenizers: dict[str, Path]) -> None:
    """A final_logits_bias in an M2M100 file, whose model has none."""
    from safetensors.torch import load_file, save_file

    rows = json.loads((directory / "config.json").read_text())["vocab_size"]
    weights = load_file(directory / "model.safetensors") | {
        "final_logits_bias": torch.zeros(1, rows)
    }
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


CASES = [  # kind, what is done to its files, what the one line says
    ("nllb", edit("config.json", model_type="nllb-moe"), "config.json: NLLB-MoE", "not dense"),
    (
        "mbart50",
        mbart25(named=True),
        "tokenizer_config.json: an mBART-25 model (tokenizer_class MBartTokenizer",
        "facebook/mbart-large-50-many-to-many-mmt",
    ),
    ("mbart50", mbart25(named=False), "tokenizer.json: an mBART-25 model (25 language codes"),
    (
        "nllb",
        remove("sentencepiece.bpe.model", "tokenizer.json"),  # (either one reads the text)
        "sentencepiece.bpe.model: missing (an NLLB-200 tokenizer needs sentencepiece.bpe.model "
        "or tokenizer.json)",
    ),
    ("m2m100", remove("vocab.json"), "vocab.json: missing (an M2M100 tokenizer needs"),
    (
        "nllb",
        edit("config.json", vocab_size=1000),
        "config.json: vocab_size 1000 is less than the tokenizer's",
        "the embeddings have no row for ids 1000 to",
    ),
    (
        "mbart50",
        edit("config.json", decoder_start_token_id=7),
        "config.json: decoder_start_token_id 7 is not the tokenizer's 2 (</s>",
    ),
    (
        "mbart50",
        edit("tokenizer_config.json", tokenizer_class="NllbTokenizer"),
        "tokenizer_config.json: an NLLB-200 tokenizer beside a mbart model",
        "MBart50Tokenizer",
    ),
    ("m2m100", logits_bias, "1 tensor(s) that config.json's model does not use: final_logits_bias"),
    (
        "m2m100",
        edit("config.json", encoder_layerdrop="0.05"),
        "config.json: encoder_layerdrop must be a number in [0, 1), got '0.05'",
    ),
]
IDS = [
    "nllb-moe",
    "mbart-cc25",
    "mbart-cc25-unnamed",
    "no-sentencepiece-nor-tokenizer-json",
    "no-vocab-json",
    "vocabulary-past-the-embeddings",
    "decoder-start",
    "another-familys-tokenizer",
    "a-bias-m2m100-has-not",
    "layerdrop-string",
]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bad_input_is_one_line_naming_the_file_and_writes_nothing(
    standins, tokenizers, tmp_path, case
):
    kind, change, *message = case
    directory = shutil.copytree(standins[kind], tmp_path / "model")
    change(directory, tokenizers)
    out = tmp_path / "run"
    result = tf("import", directory, "-o", out)
    assert_user_error(result, *message)
    assert str(directory) in result.stderr
    assert not out.exists() and not (tmp_path / ".run.importing").exists()


# ----------------------------------------------------------------------------- the memory bench


def test_the_memory_benchmark_measures_an_import(standins, tmp_path):
    """`benchmarks/import_memory_bench.py` (run at full size by hand: 1.24x the weights'
    bytes): its measure of one import runs, against the file it read."""
    from benchmarks.import_memory_bench import measure

    result = measure(standins["m2m100"], "model.safetensors", tmp_path)
    assert result["peak_rss_gb"] > 0.1 and result["weights"] == "model.safetensors"
    assert result["parameters_gb"] > 0 and not (tmp_path / "run-model").exists()
