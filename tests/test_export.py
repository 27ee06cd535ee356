"""`tf export` to CTranslate2 and Hugging Face Marian: the same outputs as `tf` itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.inference.decoding import encode_sources, translate_ids
from cli.runs.models import load_for_inference

SENTENCES = [
    "Y dijo Dios: Sea la luz.",
    "En el principio crió Dios los cielos y la tierra.",
    "Y vió Dios que la luz era buena.",
    "hola",
]


@pytest.fixture(scope="module")
def sharp(trained, tmp_path_factory) -> Path:
    """The trained tiny run with fresh random weights whose outputs are far from ties (6 updates
    leave near-equal logits, where engines may break a tie either way)."""
    from cli.runs.checkpoint import load_checkpoint, save_atomic
    from cli.runs.models import build_model
    from data.tokenizer import Tokenizer

    run = tmp_path_factory.mktemp("sharp") / "run"
    shutil.copytree(trained, run)
    path = run / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    _, _, config = load_for_inference(trained, torch.device("cpu"))
    torch.manual_seed(3)
    model = build_model(config, Tokenizer.load(run / "tokenizer"))
    with torch.no_grad():
        model.generator.weight.mul_(4.0)  # tied: sharper embeddings and output distribution
    save_atomic({**ckpt, "model": model.state_dict()}, path)
    return run


@pytest.fixture(scope="module")
def ending(sharp, tmp_path_factory) -> Path:
    """`sharp` with an EOS that wins at some steps (the last norm's bias along EOS's row): some
    outputs end, others run to the length limit, so both kinds are compared."""
    from cli.runs.checkpoint import config_from_checkpoint, load_checkpoint, save_atomic
    from cli.runs.models import build_model
    from data.tokenizer import Tokenizer

    run = tmp_path_factory.mktemp("ending") / "run"
    shutil.copytree(sharp, run)
    path = run / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    tok = Tokenizer.load(run / "tokenizer")
    torch.manual_seed(3)  # as `sharp`, whose weights these are; then the direction below
    model = build_model(config_from_checkpoint(ckpt, path), tok)
    model.load_state_dict(ckpt["model"])
    with torch.no_grad():
        norm = model.decoder.layers[-1].norm3
        toward = torch.randn(norm.bias.shape)
        norm.bias.copy_(toward / toward.norm())
        model.generator.weight[tok.eos_id] = norm.bias * 20
    save_atomic({**ckpt, "model": model.state_dict()}, path)
    return run


def exported(run: Path, to: str, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / to
    result = tf("export", run, "--to", to, "-o", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def ct2_dir(sharp, tmp_path_factory) -> Path:
    return exported(sharp, "ctranslate2", tmp_path_factory)


@pytest.fixture(scope="module")
def hf_dir(sharp, tmp_path_factory) -> Path:
    return exported(sharp, "huggingface", tmp_path_factory)


def ours(trained, **decode) -> list[list[int]]:
    model, tok, config = load_for_inference(trained, torch.device("cpu"))
    ids = encode_sources(tok, SENTENCES, model.config.max_positions, "test", 1)
    settings = replace(config.decode, **{"precision": "fp32", **decode})  # as the exports
    return [h[0].tokens for h in translate_ids(model, tok, ids, settings, torch.device("cpu"))]


@pytest.mark.parametrize("beam", [1, 3])
def test_ctranslate2_searches_as_tf(sharp, ct2_dir, beam):
    """Greedy, and beam search with the length penalty off (CTranslate2 divides by len ** alpha,
    we by GNMT's lp) and at least one token (its beam never returns an empty output)."""
    import ctranslate2

    from cli.inference.engines import translate_ids_ct2
    from data.tokenizer import Tokenizer

    decode = dict(beam_size=beam, length_penalty=0.0, min_len=1)
    _, tok, config = load_for_inference(sharp, torch.device("cpu"))
    config = replace(config, decode=replace(config.decode, **decode))
    translator = ctranslate2.Translator(str(ct2_dir))
    ids = encode_sources(Tokenizer.load(ct2_dir), SENTENCES, 256, "test", 1)
    theirs = [h[0].tokens for h in translate_ids_ct2(translator, tok, ids, config)]
    assert theirs == ours(sharp, **decode)
    assert len({len(t) for t in theirs}) > 1  # outputs of several lengths were compared


def test_tf_translate_runs_an_exported_directory(sharp, ct2_dir):
    text = "\n".join(SENTENCES) + "\n"
    fp32 = ["--set", "decode.precision=fp32"]  # CTranslate2 computes in float32
    direct = tf("translate", sharp, "--greedy", *fp32, input=text)
    exported = tf("translate", ct2_dir, "--greedy", input=text)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout == direct.stdout
    assert_user_error(tf("translate", ct2_dir, "--int8", input=text), "--quantization")
    exhaustive = tf("translate", ct2_dir, "--set", "decode.patience=0", input=text)
    assert_user_error(exhaustive, "CTranslate2 needs a patience above 0")


def test_ctranslate2_searches_with_the_runs_patience():
    from types import SimpleNamespace

    from cli.config import Config
    from cli.inference.engines import translate_ids_ct2

    calls = []

    class Translator:
        def translate_batch(self, sources, **options):
            calls.append(options)
            return [SimpleNamespace(hypotheses=[["a"]], scores=[-1.0]) for _ in sources]

    tok = SimpleNamespace(src_id_pieces=lambda ids: ids, tgt_piece_ids=lambda pieces: [5])
    config = Config()
    config = replace(config, decode=replace(config.decode, patience=1.5, beam_size=4))
    translate_ids_ct2(Translator(), tok, [[7, 8], [9]], config)
    assert calls and all(c["patience"] == 1.5 and c["beam_size"] == 4 for c in calls)


def test_tf_eval_scores_an_exported_directory(sharp, ct2_dir, tiny_prefix):
    common = ["--src", f"{tiny_prefix}.es", "--ref", f"{tiny_prefix}.en", "--greedy", "--json"]
    common += ["--limit", "20"]
    fp32 = ["--set", "decode.precision=fp32"]  # CTranslate2 computes in float32
    direct, exported = tf("eval", sharp, *common, *fp32), tf("eval", ct2_dir, *common)
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["bleu"] == json.loads(direct.stdout)["bleu"]


def test_an_exported_directory_loads_without_tf(ct2_dir, hf_dir):
    """A fresh process with only the engines imported: no `tf` module is needed."""
    code = f"""
import sys, ctranslate2, transformers
t = ctranslate2.Translator({str(ct2_dir)!r})
print(t.translate_batch([["▁hola"]])[0].hypotheses[0])
m = transformers.AutoModelForSeq2SeqLM.from_pretrained({str(hf_dir)!r})
tok = transformers.AutoTokenizer.from_pretrained({str(hf_dir)!r})
out = m.generate(**tok(["hola", "Y dijo Dios"], return_tensors="pt", padding=True))
print(tok.batch_decode(out, skip_special_tokens=True))
assert not {{"cli", "model", "data"}} & set(sys.modules), sorted(sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd="/",
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_marian_logits_equal_tf_on_a_padded_batch(sharp, hf_dir):
    from transformers import MarianMTModel

    from data.batching import collate

    model, tok, _ = load_for_inference(sharp, torch.device("cpu"))
    marian = MarianMTModel.from_pretrained(hf_dir).eval()
    src = encode_sources(tok, SENTENCES, 256, "test", 1)
    tgt = encode_sources(tok, ["God said.", "In the beginning", "light", "hi"], 256, "test", 1)
    batch = collate(src, tgt, tok.pad_id, tok.bos_id, tok.eos_id, list(range(len(src))))
    moved = torch.tensor(exported_ids(hf_dir, tok))  # (V,) tf's id -> the export's
    with torch.no_grad():
        expected = model(batch.src, batch.tgt_in, batch.src_pad_mask, batch.tgt_pad_mask)
        got = marian(
            input_ids=moved[batch.src],
            attention_mask=(~batch.src_pad_mask).long(),
            decoder_input_ids=moved[batch.tgt_in],
        ).logits
    real = ~batch.tgt_pad_mask
    order = torch.argsort(moved)  # the export's id -> tf's
    torch.testing.assert_close(got[real], expected[real][:, order], atol=1e-4, rtol=1e-4)


def exported_ids(hf: Path, tok) -> list[int]:
    """tf's id i is id `exported_ids[i]` of the export (OPUS-MT's layout: `<pad>` last)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf).convert_tokens_to_ids(tok.src_vocabulary())


def test_exporting_leaves_the_model_unchanged(sharp, tmp_path):
    """CTranslate2 quantizes the arrays it is given in place: they must be copies."""
    from cli.exporters.ctranslate2 import export_ctranslate2

    model, tok, config = load_for_inference(sharp, torch.device("cpu"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_ctranslate2(model, tok, config, tmp_path / "q", "int8")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_export_never_replaces_the_run_it_exports(trained, tmp_path):
    run = tmp_path / "runs" / "run"
    shutil.copytree(trained, run)
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    for out in (run, run.parent):  # the run itself, a folder that holds it
        for to in ("ctranslate2", "huggingface"):
            refused = tf("export", run, "--to", to, "-o", out, "--force")
            assert_user_error(refused, "which replacing it would delete")
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before


def test_export_never_writes_inside_the_run_or_its_inputs(trained, tmp_path):
    """Item 9: `-o RUN/checkpoints --force` had deleted every checkpoint, `-o RUN/tokenizer
    --force` replaced the tokenizer: an output inside the run (or inside any input, the
    checkpoint given, the tokenizer) is refused, with --force or without, whatever exists."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    given = [run, run / "checkpoints" / "last.pt"]  # a run, or one of its checkpoints
    outputs = [run / "checkpoints", run / "tokenizer", run / "export", run / "checkpoints" / "x"]
    for source in given:
        for out in outputs:
            for to in ("ctranslate2", "huggingface"):
                refused = tf("export", source, "--to", to, "-o", out, "--force")
                assert_user_error(refused, f"{out}: ", "give another -o")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # A checkpoint kept beside a tokenizer/ folder: its folder is no run, only its files are.
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copyfile(run / "checkpoints" / "best.pt", loose / "model.pt")
    shutil.copytree(run / "tokenizer", loose / "tokenizer")
    for out in (loose / "tokenizer", loose / "tokenizer" / "hf", loose / "model.pt"):
        refused = tf("export", loose / "model.pt", "--to", "huggingface", "-o", out, "--force")
        assert_user_error(refused, f"{out}: ", "give another -o")
    beside = tf("export", loose / "model.pt", "--to", "huggingface", "-o", loose / "hf")
    assert beside.exit_code == 0, beside.output


def test_import_never_writes_inside_its_source(hf_dir, tmp_path):
    """Item 9, `tf import`: a run written inside the directory it reads is refused."""
    source = tmp_path / "hf"
    shutil.copytree(hf_dir, source)
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    for force in ([], ["--force"]):
        refused = tf("import", source, "-o", source / "run", *force)
        assert_user_error(refused, f"{source / 'run'}: is inside {source}")
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before


def test_export_refuses_clearly(trained, tmp_path, monkeypatch):
    assert_user_error(tf("export", trained, "--to", "onnx", "-o", tmp_path / "x"), "--to onnx")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("keep")
    assert_user_error(tf("export", trained, "--to", "ctranslate2", "-o", full), "--force")
    assert (full / "keep").read_text() == "keep"
    q = tf("export", trained, "--to", "huggingface", "-o", tmp_path / "q", "--quantization", "int8")
    assert_user_error(q, "--quantization int8: only --to ctranslate2 quantizes")
    (tmp_path / "afile").write_text("keep")
    for to in ("ctranslate2", "huggingface"):
        under = tf("export", trained, "--to", to, "-o", tmp_path / "afile" / "sub")
        assert_user_error(under, "afile is a file, not a directory")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "ctranslate2" else real(name)
    )
    missing = tf("export", trained, "--to", "ctranslate2", "-o", tmp_path / "m")
    assert_user_error(missing, "pip install 'tf[export]'")


def test_pre_ln_cannot_become_marian(tmp_path, tiny_prefix):
    from cli.config import load_config
    from cli.families.marian import export_marian
    from cli.runs.models import build_model
    from data.errors import InputError
    from data.tokenizer import Tokenizer, train_tokenizer

    config = load_config("tiny", ["model.norm_first=true"])
    src = Path(f"{tiny_prefix}.es").read_text().splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text().splitlines()
    train_tokenizer(src, tgt, tmp_path / "tok", vocab_size=100, seed=0)
    tok = Tokenizer.load(tmp_path / "tok")
    with pytest.raises(InputError, match="Post-LN only"):
        export_marian(build_model(config, tok), tok, config, tmp_path / "out")


@pytest.mark.parametrize("precision", ["auto", "bf16"])
def test_int8_translates_every_line(trained, precision):
    """int8 layers take fp32 activations: a bf16 precision (asked, or `auto` on a CPU with
    bf16) does not apply to them."""
    text = "\n".join(SENTENCES) + "\n"
    sets = ["--set", f"decode.precision={precision}"]
    result = tf("translate", trained, "--greedy", "--int8", *sets, input=text)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == len(SENTENCES)
