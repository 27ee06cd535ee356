"""A run is what its files say (issue 56, items 3, 8, 10, 25; issue 67, items 9, 10): a resume
finds the pairs its checkpoint was cut from or refuses in one line; a fine-tuned run resumes
from anywhere, whatever became of its init, and so does a run of relative paths (recorded
absolute); one killed before its first checkpoint restarts from its own tokenizer and base.pt,
or names the init it needs; a failed start leaves nothing behind; the fine-tuning recipe asks
for no test set of its own; dev BLEU decodes `train.eval_bleu_sentences` per direction."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.config import load_config
from cli.runs.checkpoint import load_checkpoint
from data.config import DataConfig


def sets(*pairs: str) -> list[str]:
    return [a for s in pairs for a in ("--set", s)]


def tsv(path: Path, prefix: str, swapped: bool = False) -> Path:
    """The fixture's pairs as a TSV with an es/en header; `swapped`: the columns' contents
    exchanged under the same header (as a careless rewrite would leave them)."""
    es = Path(f"{prefix}.es").read_text().splitlines()
    en = Path(f"{prefix}.en").read_text().splitlines()
    rows = zip(en, es) if swapped else zip(es, en)
    path.write_text("es\ten\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
    return path


def test_resume_refuses_a_corpus_whose_pairs_changed(tmp_path, tiny_prefix, caplog):
    corpus = tsv(tmp_path / "pairs.tsv", tiny_prefix)
    run = tmp_path / "run"
    args = sets(
        f"data.train=[{{corpus: {corpus}}}, {{corpus: {corpus}, reverse: true}}]",
        f"data.dev={tiny_prefix}-dev",
        "data.max_len=120",
        "train.max_steps=2",
        "train.eval_every=0",
    )
    assert tf("train", "tiny", "--out", run, *args).exit_code == 0
    os.utime(corpus)  # touched, the same pairs: the run goes on
    result = tf("train", "--resume", run, *sets("train.max_steps=3"), "--allow-config-change")
    assert result.exit_code == 0, result.output
    warned = [r for r in caplog.records if "resuming with a changed config" in r.getMessage()]
    assert len(warned) == 1
    last = (run / "checkpoints" / "last.pt").read_bytes()
    config = (run / "config.yaml").read_text()
    tsv(corpus, tiny_prefix, swapped=True)
    result = tf("train", "--resume", run, *sets("train.max_steps=4"), "--allow-config-change")
    assert_user_error(result, "data.train[0]", "pairs.tsv", "not those")
    # Nothing the refused resume touched: its checkpoint and its config.
    assert (run / "checkpoints" / "last.pt").read_bytes() == last
    assert (run / "config.yaml").read_text() == config


def test_a_fine_tuned_run_resumes_from_anywhere_whatever_became_of_its_init(
    tmp_path, tiny_prefix, trained, monkeypatch
):
    init = tmp_path / "init"
    shutil.copytree(trained, init)
    monkeypatch.chdir(tmp_path)
    args = sets(
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.max_steps=2",
        "train.eval_every=0",
    )
    assert tf("train", "tiny", "--init", "init", "--out", "ft", *args).exit_code == 0
    shutil.rmtree(init)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = tf("train", "--resume", "../ft", *sets("train.max_steps=3"), "--allow-config-change")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(elsewhere / "../ft/checkpoints/last.pt")["step"] == 3


def test_a_failed_start_leaves_nothing_behind(tmp_path, tiny_prefix):
    run = tmp_path / "run"
    missing = f"data.dev={tmp_path}/nowhere"
    result = tf("train", "tiny", "--out", run, *sets(f"data.train={tiny_prefix}", missing))
    assert_user_error(result, "nowhere")
    assert not run.exists()
    # In a directory that was there: what the start added goes, what was there stays.
    run.mkdir()
    (run / "notes.txt").write_text("mine\n")
    result = tf("train", "tiny", "--out", run, *sets(f"data.train={tiny_prefix}", missing))
    assert_user_error(result, "nowhere")
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_the_fine_tuning_recipe_has_no_test_set_unless_given():
    """Another language pair's model is tuned on the user's pairs; a bundled es-en test set
    would stop it with "no 'de' side"."""
    config = load_config("finetune")
    assert config.data.test == "" and config.data.test_sets() == []
    assert DataConfig(test="").test_sets() == []


def test_a_fine_tuned_recipe_of_another_language_pair_starts(tmp_path, tiny_prefix, trained):
    """An es->en model read as de->en (its tokenizer does not care): the user's train and dev
    in de/en files, the recipe's own settings otherwise."""
    for name in ("", "-dev"):
        shutil.copy(f"{tiny_prefix}{name}.es", tmp_path / f"pairs{name}.de")
        shutil.copy(f"{tiny_prefix}{name}.en", tmp_path / f"pairs{name}.en")
    out = tmp_path / "ft"
    args = sets(
        f"data.train={tmp_path}/pairs",
        f"data.dev={tmp_path}/pairs-dev",
        "data.src_lang=de",
        "train.max_steps=1",
        "train.eval_on_start=false",
        "train.eval_every=0",
        "train.max_tokens=512",
        "model.max_positions=256",
        "data.max_len=64",
    )
    result = tf("train", "finetune", "--init", trained, "--out", out, *args)
    assert result.exit_code == 0, result.output


def test_eval_bleu_sentences_count_per_direction(tmp_path, tiny_prefix):
    """Two dev sets of one direction share its sentences; each direction has its own."""
    from cli.training import distributed
    from cli.training.data import training_data
    from cli.training.run import start_run

    dev = f"{tiny_prefix}-dev"
    config = load_config(
        "tiny",
        [
            f"data.train=[{{corpus: {tiny_prefix}}}, {{corpus: {tiny_prefix}, reverse: true}}]",
            f"data.dev=[{{corpus: {dev}}}, {{corpus: {dev}}}, {{corpus: {dev}, reverse: true}}]",
            "data.max_len=120",
            "train.eval_bleu_sentences=7",
        ],
    )
    run = start_run(config, tmp_path / "run", False)
    data = training_data(config, run.tokenizer, distributed.Dist(), False)
    assert {d.name: len(d.refs) for d in data.dev_sets} == {"es-en": 7, "en-es": 7}


def test_a_resume_refused_by_its_checkpoint_keeps_the_config(tmp_path, tiny_prefix):
    """A resume with an allowed change, then refused (another number of processes, here a
    corrupt checkpoint), leaves config.yaml as the run had it."""
    run = tmp_path / "run"
    args = sets(
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.max_steps=2",
        "train.eval_every=0",
    )
    assert tf("train", "tiny", "--out", run, *args).exit_code == 0
    before = (run / "config.yaml").read_text()
    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    result = tf("train", "--resume", run, *sets("train.lr=0.001"), "--allow-config-change")
    assert_user_error(result, "last.pt")
    assert (run / "config.yaml").read_text() == before


def test_a_run_that_starts_from_pad_keeps_that_row_zero(tmp_path, tiny_prefix):
    """Its decoder starts from a zero vector, as Marian's does and CTranslate2's converter
    assumes: the tied output layer's gradients never reach that row, nor does the average."""
    run = tmp_path / "run"
    args = sets(
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "model.decoder_start=pad",
        "train.ema_decay=0.9",
        "train.max_steps=4",
        "train.eval_every=0",
    )
    assert tf("train", "tiny", "--out", run, *args).exit_code == 0
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    for weights in (ckpt["model"], ckpt["train_model"]):
        embeddings = weights["tgt_embed.token.weight"]
        assert not embeddings[0].any() and embeddings[1:].abs().sum() > 0  # pad is id 0


def test_fine_tuning_keeps_the_models_decode_settings_but_those_set(trained):
    """An import's generation settings (here a run's recipe: beam 2, max_len_b 10 in tiny.yaml)
    are how the fine-tuned run decodes, but for a setting the config gives."""
    from cli.training.init import with_init

    plain = with_init(load_config("finetune", ["data.train=x", f"train.init={trained}"]))
    assert (plain.decode.beam_size, plain.decode.max_len_b) == (2, 10)
    chosen = ["data.train=x", f"train.init={trained}", "decode.beam_size=3"]
    assert with_init(load_config("finetune", chosen)).decode.beam_size == 3


def test_bleu_sentences_a_short_dev_set_cannot_use_go_to_the_others():
    from data.pipeline import bleu_shares

    es_en, en_es = ("es", "en"), ("en", "es")
    assert bleu_shares([es_en, es_en], [100, 1000], 500) == [100, 400]
    assert bleu_shares([es_en, es_en, en_es], [200, 200, 200], 5) == [3, 2, 5]
    assert bleu_shares([es_en, en_es], [30, 40], 0) == [30, 40]  # 0: all


def test_every_path_a_config_names_is_recorded_absolute(tmp_path, monkeypatch):
    """Corpora (a spec, a list's `corpus:`, a local `hf:` folder), the tokenizer and the init,
    read from the working directory; hub names, bundled corpora and "" as they are; a saved
    value naming the same place is kept as it is written."""
    from cli.runs.run_dir import anchored

    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    config = anchored(
        load_config(
            "tiny",
            [
                "data.train=[{corpus: c}, {corpus: pairs.tsv}, {corpus: 'hf:local@train'}]",
                "data.dev=[{corpus: d/dev.jsonl}, {corpus: 'hf:org/name:cfg@dev'}]",
                "data.test=''",
                "data.tokenizer=tok",
                "train.init=runs/base",
            ],
        )
    )
    d = config.data
    assert [c.corpus for c in d.train] == [
        f"{tmp_path}/c",
        f"{tmp_path}/pairs.tsv",
        f"hf:{tmp_path}/local@train",
    ]
    assert [s.corpus for s in d.dev] == [f"{tmp_path}/d/dev.jsonl", "hf:org/name:cfg@dev"]
    assert (d.test, d.tokenizer, config.train.init) == (
        "",
        f"{tmp_path}/tok",
        f"{tmp_path}/runs/base",
    )
    assert anchored(load_config("tiny")).data.train == "bundled:bible-es-en/train"
    saved = load_config("tiny", ["data.train=c", "data.dev=/elsewhere/d"])
    wanted = anchored(saved, like=saved)
    assert (wanted.data.train, wanted.data.dev) == ("c", "/elsewhere/d")


def path_settings(cls: type, prefix: str = "") -> list[str]:
    """The dotted names of the schema's settings marked as naming files or folders
    (`metadata["path"]`), at any depth; a list's entries as NAME[].FIELD."""
    import dataclasses
    import typing

    names = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        if f.metadata.get("path"):
            names.append(dotted)
        for hint in (hints[f.name], *typing.get_args(hints[f.name])):
            listed = typing.get_origin(hint) is list
            inner = typing.get_args(hint)[0] if listed else hint
            if dataclasses.is_dataclass(inner):
                names += path_settings(inner, f"{dotted}[]." if listed else f"{dotted}.")
    return list(dict.fromkeys(names))


def test_every_path_setting_the_schema_marks_is_recorded_absolute(tmp_path, monkeypatch):
    """The settings that name files say so in the schema (`metadata={"path": True}`), and
    `anchored` makes each one absolute by walking it, a list's entries too: a path setting
    added later is anchored without a list to update by hand (there was one)."""
    from cli.config import Config
    from cli.runs.run_dir import anchored

    monkeypatch.chdir(tmp_path)
    names = path_settings(Config)
    assert {
        "data.train", "data.train[].corpus", "data.dev", "data.dev[].corpus",
        "data.test", "data.test[].corpus", "data.tokenizer", "train.init",
    } <= set(names)  # fmt: skip
    for i, dotted in enumerate(names):
        relative = f"here/{i}"
        listed, _, key = dotted.partition("[].")
        override = f"{listed}=[{{{key}: {relative}}}]" if key else f"{dotted}={relative}"
        node = anchored(load_config("tiny", [override]))
        for part in dotted.split("."):
            node = getattr(node[0] if isinstance(node, list) else node, part.removesuffix("[]"))
        assert node == str(tmp_path / relative), dotted


def test_a_run_of_relative_paths_resumes_from_any_directory(
    tmp_path, tiny_prefix, tiny_tokenizer, monkeypatch
):
    """Corpora, dev and test sets and the tokenizer named relative to where the run started:
    `tf train --resume` from elsewhere finds them; one gone is named whole."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("", "-dev"):
        shutil.copy(f"{tiny_prefix}{name}.es", work / f"c{name}.es")
        shutil.copy(f"{tiny_prefix}{name}.en", work / f"c{name}.en")
    tsv(work / "pairs.tsv", tiny_prefix)
    shutil.copytree(tiny_tokenizer.directory, work / "tok")
    monkeypatch.chdir(work)
    args = sets(
        "data.train=[{corpus: c}, {corpus: pairs.tsv}]",
        "data.dev=[{corpus: c-dev}]",
        "data.test=c-dev",
        "data.tokenizer=tok",
        "train.max_steps=1",
        "train.eval_every=0",
    )
    assert tf("train", "tiny", "--out", "run", *args).exit_code == 0
    saved = load_config(work / "run" / "config.yaml")
    assert [c.corpus for c in saved.data.train] == [f"{work}/c", f"{work}/pairs.tsv"]
    assert (saved.data.dev[0].corpus, saved.data.test) == (f"{work}/c-dev", f"{work}/c-dev")
    assert saved.data.tokenizer == f"{work}/tok"
    monkeypatch.chdir(tmp_path)
    more = ("--allow-config-change", *sets("train.max_steps=2"))
    result = tf("train", "--resume", "work/run", *more)
    assert result.exit_code == 0, result.output
    assert load_checkpoint(work / "run" / "checkpoints" / "last.pt")["step"] == 2
    (work / "c.es").unlink()
    assert_user_error(tf("train", "--resume", "work/run", *more), f"{work}/c.es: no such file")


def killed_before_its_first_checkpoint(run: Path) -> None:
    """What a run killed during its first updates leaves: no checkpoint, a metrics file."""
    shutil.rmtree(run / "checkpoints")
    (run / "metrics.jsonl").write_text("")


def test_a_lora_run_killed_before_its_first_checkpoint_restarts_without_its_init(
    tmp_path, tiny_prefix, trained, monkeypatch
):
    """Its base.pt and its tokenizer hold what its init gave it: it starts again from them,
    wherever it is resumed from, and trains the very updates it would have."""
    shutil.copytree(trained, tmp_path / "init")
    monkeypatch.chdir(tmp_path)
    args = sets(
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.lora.rank=2",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.deterministic=true",
        "train.precision=fp32",
    )
    assert tf("train", "tiny", "--init", "init", "--out", "ft", *args).exit_code == 0
    first = load_checkpoint(tmp_path / "ft" / "checkpoints" / "last.pt")
    killed_before_its_first_checkpoint(tmp_path / "ft")
    shutil.rmtree(tmp_path / "init")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = tf("train", "--resume", "../ft")
    assert result.exit_code == 0, result.output
    again = load_checkpoint(tmp_path / "ft" / "checkpoints" / "last.pt")
    assert again["step"] == 2 and again["base"]["sha256"] == first["base"]["sha256"]
    assert again["model"].keys() == first["model"].keys()
    for name, weights in first["model"].items():
        assert torch.equal(again["model"][name], weights), name


def test_a_full_fine_tune_killed_before_its_first_checkpoint_says_its_init_is_gone(
    tmp_path, tiny_prefix, trained
):
    """Its first weights are its init's: the refusal names the init, not its tokenizer
    folder, and touches nothing."""
    init, run = tmp_path / "init", tmp_path / "ft"
    shutil.copytree(trained, init)
    args = sets(
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.max_steps=1",
        "train.eval_every=0",
    )
    assert tf("train", "tiny", "--init", init, "--out", run, *args).exit_code == 0
    killed_before_its_first_checkpoint(run)
    shutil.rmtree(init)
    before = sorted(p.name for p in run.iterdir())
    result = tf("train", "--resume", run)
    assert_user_error(result, f"train.init {init}: gone", "--force")
    assert "tokenizer" not in result.stderr
    assert sorted(p.name for p in run.iterdir()) == before
    assert (run / "metrics.jsonl").exists()


def test_a_tokenizer_copy_is_whole_or_absent(tmp_path, tiny_tokenizer, monkeypatch):
    """A run's copy of an adopted tokenizer (a restart takes it as its init's) is made aside
    and renamed into place: a copy that fails half-way leaves no folder."""
    import data.pipeline
    from data.errors import InputError
    from data.pipeline import adopt_tokenizer

    def fail(directory, tokens):
        raise InputError("killed")

    monkeypatch.setattr(data.pipeline, "add_tokens", fail)
    out = tmp_path / "run" / "tokenizer"
    with pytest.raises(InputError, match="killed"):
        adopt_tokenizer(tiny_tokenizer.directory, out, resume=False, added=["<2xyz>"])
    assert not out.exists()
