"""One model, several directions (issue 38): corpora with their languages and `reverse`, one
target-language token per target language, validation per direction, and `--to` on every
entry point (translate, JSONL, eval, serve, backtranslate, distill, ensembles, constraints, both
export engines); a multilingual model asked for no language refuses, naming its languages."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_cli import assert_user_error, tf

from cli.config import ConfigError, load_config
from cli.inference.engines import load_engine
from cli.inference.languages import with_language, with_languages
from cli.runs.models import load_for_inference
from data.config import CorpusConfig, DataConfig, SetConfig
from data.errors import InputError
from data.pipeline import load_set

ROOT = Path(__file__).resolve().parent.parent

LINES = ["Y dijo Dios: Sea la luz.", "En el principio", "hola"]
ENGLISH = ["And God said, Let there be light.", "In the beginning", "hello"]


def both_ways(prefix: str) -> list[str]:
    """--set arguments of a tiny es<->en run: the corpus twice, once reversed; dev likewise."""
    sets = [
        f"data.train=[{{corpus: {prefix}}}, {{corpus: {prefix}, reverse: true}}]",
        f"data.dev=[{{corpus: {prefix}-dev}}, {{corpus: {prefix}-dev, reverse: true}}]",
        f"data.test={prefix}-dev",
        "data.max_len=120",
        "train.max_steps=4",
        "train.eval_every=2",
        "train.save_every=2",
    ]
    return [a for s in sets for a in ("--set", s)]


@pytest.fixture(scope="module")
def bidirectional(tiny_prefix, tmp_path_factory) -> Path:
    """A tiny es<->en run trained through `tf train`, its weights then made sharp (random, the
    output embedding scaled up) so that every engine's search meets no near-ties."""
    from cli.runs.checkpoint import load_checkpoint, save_atomic
    from cli.runs.models import build_model

    run = tmp_path_factory.mktemp("bidirectional") / "run"
    result = tf("train", "tiny", "--out", run, *both_ways(tiny_prefix))
    assert result.exit_code == 0, result.output
    _, tok, config = load_for_inference(run, torch.device("cpu"))
    torch.manual_seed(2)  # a seed whose outputs differ by line and by direction
    model = build_model(config, tok)
    with torch.no_grad():
        model.generator.weight.mul_(4.0)
    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        ckpt = load_checkpoint(path)
        # One length limit for every line, as `transformers`' generate has (test_huggingface).
        ckpt["config"]["decode"].update(max_len_a=0.0, max_len_b=12)
        save_atomic({**ckpt, "model": model.state_dict()}, path)
    return run


def greedy(*args, input: str) -> list[str]:
    result = tf("translate", *args, "--greedy", "--set", "decode.precision=fp32", input=input)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


# ----------------------------------------------------------------------------- the config


def test_directions_tokens_and_reverse_in_the_data_section():
    d = DataConfig(
        train=[
            CorpusConfig("a"),
            CorpusConfig("a", reverse=True, tag="<bt>"),
            CorpusConfig("b", src_lang="en", tgt_lang="fr"),
        ]
    )
    assert [d.direction(c) for c in d.corpora()] == [("es", "en"), ("en", "es"), ("en", "fr")]
    assert d.target_langs() == ["en", "es", "fr"]
    assert d.lang_tokens() == {"en": "<2en>", "es": "<2es>", "fr": "<2fr>"}
    assert d.source_prefix(d.corpora()[1]) == ["<2es>", "<bt>"]
    assert d.tags() == ["<2en>", "<2es>", "<2fr>", "<bt>"]
    marian = replace(d, lang_token=">>{lang}<<")
    assert marian.lang_tokens()["fr"] == ">>fr<<"
    # One target language, however many corpora: no tokens (a one-way run stays as it was).
    one_way = DataConfig(train=[CorpusConfig("a"), CorpusConfig("b", src_lang="fr")])
    assert one_way.lang_tokens() == {} and one_way.tags() == []
    assert DataConfig(dev="x").dev_sets() == [SetConfig("x")]


@pytest.mark.parametrize(
    "setting, says",
    [
        ("data.lang_token=<2xx>", "must hold {lang}"),
        ("data.lang_token=to_{lang}", "must hold {lang}"),
        ("data.train=[{corpus: x, src_lang: en}]", "source and target language are both 'en'"),
        ("data.train=[{corpus: x, tgt_lang: 'e n'}]", "language 'e n' must be a code"),
        ("data.dev=[]", "data.dev is an empty list"),
        ("data.dev=[{corpus: x, reverse: true}]", "into 'es', which the model does not"),
        ("data.test=[{corpus: x, tgt_lang: fr}]", "data.test[0] translates into 'fr'"),
    ],
)
def test_bad_direction_settings_are_refused_in_one_line(setting, says):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", [setting])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_reverse_reads_a_corpus_the_other_way_round(tiny_prefix):
    d = DataConfig()
    forward = load_set(d, SetConfig(tiny_prefix))
    backward = load_set(d, SetConfig(tiny_prefix, reverse=True))
    assert backward["src"] == forward["tgt"] and backward["tgt"] == forward["src"]
    assert backward["src"][0] == Path(f"{tiny_prefix}.en").read_text().splitlines()[0]
    # Languages named per corpus: the same pairs, read through the files' own suffixes.
    named = load_set(d, SetConfig(tiny_prefix, src_lang="en", tgt_lang="es"))
    assert named["src"] == backward["src"]


# ----------------------------------------------------------------------------- training


def test_the_directions_mean_is_what_early_stopping_and_best_pt_follow():
    from cli.training.state import Progress
    from cli.training.stopping import record_validation
    from cli.training.validation import direction_scores

    scores = {"es-en": {"bleu": 10.0, "chrf": 30.0}, "en-es": {"bleu": 20.0, "chrf": 50.0}}
    metrics = direction_scores(scores)
    assert metrics == {
        "dev_bleu": 15.0,
        "dev_bleu/es-en": 10.0,
        "dev_bleu/en-es": 20.0,
        "dev_chrf": 40.0,
        "dev_chrf/es-en": 30.0,
        "dev_chrf/en-es": 50.0,
    }
    assert direction_scores({"es-en": scores["es-en"]}) == {"dev_bleu": 10.0, "dev_chrf": 30.0}
    trainer = SimpleNamespace(config=load_config("tiny"), progress=Progress())  # bleu: the default
    assert record_validation(trainer.config.train, trainer.progress, {**metrics, "dev_loss": 1.0})
    assert trainer.progress.best == 15.0
    worse = direction_scores({"es-en": {"bleu": 29.0, "chrf": 0}, "en-es": {"bleu": 0, "chrf": 0}})
    worse = {**worse, "dev_loss": 1.0}
    assert not record_validation(trainer.config.train, trainer.progress, worse)  # one way's 29: no


def test_each_direction_is_validated_and_best_follows_their_mean(bidirectional):
    records = [json.loads(x) for x in (bidirectional / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "dev_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        for name in ("bleu", "chrf"):
            ways = [r[f"dev_{name}/es-en"], r[f"dev_{name}/en-es"]]
            assert r[f"dev_{name}"] == pytest.approx(sum(ways) / 2)
    report = json.loads((bidirectional / "data.json").read_text())["corpora"]
    assert [c["direction"] for c in report] == ["es-en", "en-es"]


def test_every_source_starts_with_its_target_languages_token(tiny_prefix, tmp_path):
    """In the training batches and the dev sets, with a target of that language."""
    from data.pipeline import Batching, prepare_training_data

    config = load_config("tiny", both_ways(tiny_prefix)[1::2])
    batching = Batching(4096, 64, 0, 256, 5, "bos")
    data = prepare_training_data(config.data, batching, tmp_path / "tok", resume=False)
    tok = data.tokenizer
    en, es = tok.tags["<2en>"], tok.tags["<2es>"]
    english = set(Path(f"{tiny_prefix}.en").read_text().splitlines())
    spanish = set(Path(f"{tiny_prefix}.es").read_text().splitlines())
    seen = {en: 0, es: 0}
    for batch in data.train:
        special = (tok.pad_id, tok.eos_id)
        rows = batch.tgt_out.tolist()
        targets = tok.decode_tgt([[i for i in r if i not in special] for r in rows])
        for src, target in zip(batch.src.tolist(), targets):
            assert src[0] in (en, es) and src[1] not in (en, es)
            assert target in (english if src[0] == en else spanish)
            seen[src[0]] += 1
    assert seen[en] > 100 and seen[es] > 100  # an epoch: both directions, ~190 pairs each
    assert [d.name for d in data.dev_sets] == ["es-en", "en-es"]
    assert all(ids[0] == en for ids in data.dev_sets[0].src_ids)
    assert all(ids[0] == es for ids in data.dev_sets[1].src_ids)
    assert data.dev_sets[1].refs[0] == Path(f"{tiny_prefix}-dev.es").read_text().splitlines()[0]


def test_dev_sets_of_one_direction_are_scored_as_one(tiny_prefix, tmp_path):
    """A one-way run with two dev sets: one direction, its BLEU over both sets' sentences, its
    `eval_bleu_sentences` (5) shared between them (3 + 2)."""
    from data.pipeline import Batching, prepare_training_data

    sets = [
        f"data.train={tiny_prefix}",
        f"data.dev=[{{corpus: {tiny_prefix}-dev}}, {{corpus: {tiny_prefix}}}]",
        "data.max_len=120",
        "data.clean=false",  # (the second dev set is the training corpus)
    ]
    config = load_config("tiny", sets)
    data = prepare_training_data(
        config.data, Batching(4096, 64, 0, 256, 5, "bos"), tmp_path / "tok", resume=False
    )
    (dev,) = data.dev_sets
    heads = [
        Path(f"{p}.en").read_text().splitlines()[:5] for p in (f"{tiny_prefix}-dev", tiny_prefix)
    ]
    assert dev.name == "es-en" and dev.refs == heads[0][:3] + heads[1][:2] and len(dev.src_ids) == 5
    assert data.tokenizer.tags == {}  # one target language: no token, no reserved piece


def test_overlap_is_held_against_the_sets_either_way_round(tiny_prefix, tmp_path, caplog):
    """The es->en dev set's pairs leave the es->en corpus, and read the other way the en->es
    one (the model would learn the test's sentences from them). The en->es direction, which no
    dev set validates, is named in a warning."""
    from data.pipeline import Batching, prepare_training_data

    head = tmp_path / "head"
    for lang in ("es", "en"):
        lines = Path(f"{tiny_prefix}.{lang}").read_text().splitlines()[:40]
        Path(f"{head}.{lang}").write_text("\n".join(lines) + "\n")
    sets = [
        f"data.train=[{{corpus: {tiny_prefix}}}, {{corpus: {tiny_prefix}, reverse: true}}]",
        f"data.dev={head}",  # es->en only
        f"data.test={head}",
        "data.max_len=120",
    ]
    config = load_config("tiny", sets)
    data = prepare_training_data(
        config.data, Batching(4096, 64, 0, 256, 5, "bos"), tmp_path / "tok", resume=False
    )
    forward, backward = data.report["corpora"]
    assert forward["removed"]["overlap"] >= 40 and backward["removed"]["overlap"] >= 40
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("en->es" in m and "not validated" in m for m in warned), warned
    assert not any("es->en" in m for m in warned)


# ----------------------------------------------------------------------------- --to


def test_translate_needs_to_and_takes_it_or_a_token_in_the_line(bidirectional):
    text = "\n".join(LINES) + "\n"
    refused = tf("translate", bidirectional, input=text)
    assert_user_error(refused, "multilingual", "--to", "en, es", "<2en>")
    assert_user_error(tf("translate", bidirectional, "--to", "fr", input=text), "en, es", "fr")
    into_en = greedy(bidirectional, "--to", "en", input=text)
    into_es = greedy(bidirectional, "--to", "es", input=text)
    assert into_en != into_es  # the token steers the model
    tokened = "".join(f"<2es> {line}\n" for line in LINES)
    assert greedy(bidirectional, input=tokened) == into_es  # a line's own token needs no --to
    assert greedy(bidirectional, "--to", "en", input=tokened) == into_es  # and keeps its own


def test_jsonl_lines_choose_their_language(bidirectional):
    lines = [json.dumps({"text": t, "to": to}) for t, to in zip(LINES, ["en", "es", "en"])]
    mixed = greedy(bidirectional, "--input-format", "jsonl", input="\n".join(lines) + "\n")
    into_en = greedy(bidirectional, "--to", "en", input="\n".join(LINES) + "\n")
    into_es = greedy(bidirectional, "--to", "es", input="\n".join(LINES) + "\n")
    assert mixed == [into_en[0], into_es[1], into_en[2]]
    bad = json.dumps({"text": "hola", "to": "fr"}) + "\n"
    assert_user_error(tf("translate", bidirectional, "--input-format", "jsonl", input=bad), "fr")
    # Constraints and a language together: the phrase is in the output, as with the token typed.
    asked = [
        {"text": LINES[0], "to": "es", "constraints": ["luz"]},
        {"text": f"<2es> {LINES[0]}", "constraints": ["luz"]},
        {"text": LINES[0], "to": "en", "constraints": ["luz"]},
    ]
    text = "".join(json.dumps(a) + "\n" for a in asked)
    result = tf(
        "translate", bidirectional, "--input-format", "jsonl", "--beam", "2", "--scores",
        "--set", "decode.precision=fp32", input=text,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    es, typed, en = result.stdout.splitlines()
    assert "luz" in es and es == typed and "luz" in en
    assert en != es  # the same words may come out, but not from the same source: other scores


def test_eval_takes_to(bidirectional, tiny_prefix, tmp_path):
    src, ref = tmp_path / "src", tmp_path / "ref"
    src.write_text("\n".join(LINES) + "\n")
    ref.write_text("\n".join(ENGLISH) + "\n")
    args = ["eval", bidirectional, "--src", src, "--ref", ref, "--greedy", "--json"]
    assert_user_error(tf(*args), "multilingual", "en, es")
    into_en = json.loads(tf(*args, "--to", "en").stdout)
    hyps = tmp_path / "hyps"
    hyps.write_text("\n".join(greedy(bidirectional, "--to", "en", input=src.read_text())) + "\n")
    scored = json.loads(tf("eval", "--hyp", hyps, "--ref", ref, "--json").stdout)
    assert into_en["bleu"] == scored["bleu"] and into_en["chrf"] == scored["chrf"]


class SpelledAsSources:
    """A tokenizer whose targets decode as its sources do."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self.tokenizer.decode_src(ids)


def test_serve_takes_to_per_request_and_per_sentence(bidirectional):
    pytest.importorskip("uvicorn")
    from test_serve import call, echo_engine, serving

    from cli.serving.app import build_app

    engine = echo_engine(load_engine(str(bidirectional), torch.device("cpu"), []))
    # The echo's answers are its sources: spelled as sources are, their tokens as text (a
    # translation's reserved pieces decode to nothing).
    engine = replace(engine, tokenizer=SpelledAsSources(engine.tokenizer))
    with serving(build_app(engine, str(bidirectional), "pytorch")) as url:
        status, health, _ = call(f"{url}/health")
        assert health["languages"] == ["en", "es"]
        status, body, _ = call(f"{url}/translate", {"text": ["hola"]})
        assert status == 400 and "en, es" in body["error"] and "text[0]" in body["error"]
        status, body, _ = call(f"{url}/translate", {"text": ["hola", "hi"], "to": "fr"})
        assert status == 400 and body["error"].startswith('"to": ') and "'fr'" in body["error"]
        items = ["hola", {"text": "hello", "to": "es"}, "<2es> adios"]
        status, body, _ = call(f"{url}/translate", {"text": items, "to": "en"})
        assert status == 200, body
        # The echo engine answers each source with its own pieces: the token the model read.
        assert [t.split()[0] for t in body["translations"]] == ["<2en>", "<2es>", "<2es>"]
        clash = {"text": [{"text": "<2es> adios", "to": "en"}]}  # its own "to" and its token
        status, body, _ = call(f"{url}/translate", clash)
        assert status == 400 and "text[0]" in body["error"] and "<2es>" in body["error"]
    page = (Path(__file__).parents[1] / "cli" / "serving" / "page.html").read_text()
    assert 'id="to"' in page and "h.languages" in page


def test_a_servers_to_is_the_default_of_its_requests(bidirectional):
    from test_serve import echo_engine

    engine = load_engine(str(bidirectional), torch.device("cpu"), [], to="es")
    assert engine.to == "es"
    echo = echo_engine(engine)
    ((ids, _),) = list(echo.stream(["hola"], "x"))
    assert ids[0] == engine.tokenizer.tags["<2es>"]


def test_backtranslate_and_distill_take_to_and_name_their_files_by_it(
    bidirectional, tiny_prefix, tmp_path
):
    mono = tmp_path / "mono.en"
    mono.write_text("\n".join(ENGLISH) + "\n")
    fast = ["--greedy", "--set", "decode.precision=fp32"]
    assert_user_error(tf("backtranslate", bidirectional, mono, "--out", tmp_path / "x", *fast))
    assert not (tmp_path / "x").exists()  # refused before anything was written
    out = tmp_path / "bt"
    result = tf("backtranslate", bidirectional, mono, "--out", out, "--to", "es", *fast)
    assert result.exit_code == 0, result.output
    assert (out / "train.en").read_text() == mono.read_text()
    into_es = greedy(bidirectional, "--to", "es", input=mono.read_text())
    assert (out / "train.es").read_text().splitlines() == into_es

    assert_user_error(tf("distill", bidirectional, "--out", tmp_path / "y", "--beam", "1"), "--to")
    out = tmp_path / "kd"
    result = tf("distill", bidirectional, "--out", out, "--to", "en", "--beam", "1")
    assert result.exit_code == 0, result.output
    sources = (out / "train.es").read_text().splitlines()
    # The teacher's es->en corpus alone, its raw Spanish (the token is the engine's to add).
    assert sources[0] == Path(f"{tiny_prefix}.es").read_text().splitlines()[0]
    assert len(sources) == len((out / "train.en").read_text().splitlines()) == 200
    record = json.loads((out / "distill.json").read_text())
    assert record["corpus"] == [f"{tiny_prefix} (es-en)"]  # what was translated, and which way
    # A named corpus is read in the direction asked for: into es, its English side translated.
    out = tmp_path / "kd-es"
    args = ["--out", out, "--to", "es", "--corpus", f"{tiny_prefix}-dev", "--beam", "1"]
    result = tf("distill", bidirectional, *args)
    assert result.exit_code == 0, result.output
    english = Path(f"{tiny_prefix}-dev.en").read_text()
    assert (out / "train.en").read_text() == english


def test_an_ensemble_takes_to_and_its_members_share_their_languages(bidirectional, tmp_path):
    from cli.runs.checkpoint import load_checkpoint, save_atomic

    text = "\n".join(LINES) + "\n"
    alone = greedy(bidirectional, "--to", "es", input=text)
    twice = greedy(bidirectional, bidirectional, "--to", "es", input=text)
    assert twice == alone  # two equal members: the same log-probabilities
    # A member with the same tokenizer, trained one way only: its sources carry no token.
    one_way = tmp_path / "one_way"
    shutil.copytree(bidirectional, one_way)
    path = one_way / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    ckpt["config"]["data"]["train"] = ckpt["config"]["data"]["train"][:1]
    save_atomic(ckpt, path)
    mixed = tf("translate", bidirectional, one_way, "--to", "es", input=text)
    assert_user_error(mixed, "translate the same directions")


@pytest.mark.parametrize("engine", ["ctranslate2", "huggingface"])
def test_exports_translate_with_the_token_in_the_source(bidirectional, tmp_path, engine):
    pytest.importorskip("ctranslate2" if engine == "ctranslate2" else "transformers")
    out = tmp_path / engine
    assert tf("export", bidirectional, "--to", engine, "-o", out).exit_code == 0
    text = "\n".join(LINES) + "\n"
    into_es = greedy(bidirectional, "--to", "es", input=text)
    if engine == "ctranslate2":
        assert greedy(out, "--to", "es", input=text) == into_es
        assert_user_error(tf("translate", out, input=text), "en, es")
        return
    from test_huggingface import drop_in

    from data.tokenizer import Tokenizer

    tokened = [f"<2es> {line}" for line in LINES]
    from transformers import AutoTokenizer

    fast, tok = AutoTokenizer.from_pretrained(out), Tokenizer.load(bidirectional / "tokenizer")
    moved = fast.convert_tokens_to_ids(tok.src_vocabulary())  # tf's ids -> the export's
    expected = [[moved[i] for i in row] for row in tok.encode_src(tokened)]
    assert fast(tokened)["input_ids"] == expected
    assert drop_in(out, tokened) == into_es
    card = (out / "README.md").read_text()
    assert "multilingual" in card and "`<2es>` (es)" in card


def test_a_one_way_model_takes_its_own_language_and_refuses_others(trained):
    text = "hola\n"
    assert tf("translate", trained, "--to", "en", "--greedy", input=text).exit_code == 0
    assert_user_error(tf("translate", trained, "--to", "fr", input=text), "en only", "fr")


def test_a_multilingual_recipe_ships():
    config = load_config("bidirectional")
    d = config.data
    assert [d.direction(c) for c in d.corpora()] == [("es", "en"), ("en", "es")]
    assert [d.direction(s) for s in d.dev_sets()] == [("es", "en"), ("en", "es")]
    assert d.lang_tokens() == {"en": "<2en>", "es": "<2es>"}


def test_plot_draws_each_direction_and_their_mean(bidirectional, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from cli.commands import plot

    drawn = []
    real = plot.draw_series

    def spy(axes, ylabel, series):
        drawn.extend(label for records, key, label, _ in series if records and key in records[0])
        real(axes, ylabel, series)

    monkeypatch.setattr(plot, "draw_series", spy)
    assert plot.plot_curves(bidirectional, tmp_path / "curves.png").stat().st_size > 0
    for label in ("BLEU (mean of the directions)", "BLEU es-en", "BLEU en-es", "chrF en-es"):
        assert label in drawn


def test_compare_takes_to_for_multilingual_and_one_way_models_alike(
    bidirectional, trained, tmp_path
):
    src, ref = tmp_path / "src", tmp_path / "ref"
    src.write_text("\n".join(LINES) + "\n")
    ref.write_text("\n".join(ENGLISH) + "\n")
    result = tf("compare", bidirectional, trained, "--src", src, "--ref", ref, "--to", "en")
    assert result.exit_code == 0, result.output
    assert str(bidirectional) in result.stdout and str(trained) in result.stdout
    assert_user_error(tf("compare", bidirectional, "--src", src, "--ref", ref), "en, es")


def test_only_a_model_without_corpora_reads_its_languages_off_marian_tokens():
    """An imported OPUS-MT model's `>>xx<<` pieces are its target languages; a run trained on
    corpora says its own, and its `>>bt<<`-style tags are no languages."""
    tokenizer = SimpleNamespace(tags={">>fr<<": 5, ">>es<<": 6})
    imported = load_config("tiny", ["data.train=[]"])
    assert with_languages(imported, tokenizer).data.lang_tokens() == {
        "fr": ">>fr<<",
        "es": ">>es<<",
    }
    tagged = load_config("tiny", ["data.train=[{corpus: a, tag: '>>bt<<'}, {corpus: b}]"])
    other_tags = SimpleNamespace(tags={">>bt<<": 5, ">>ft<<": 6})
    assert with_languages(tagged, other_tags).data.lang_tokens() == {}


def test_a_lines_own_to_must_agree_with_the_token_it_starts_with():
    languages = {"en": "<2en>", "es": "<2es>"}
    assert with_language("<2es> Hola", "en", languages, "x:1") == "<2es> Hola"  # --to: a default
    assert with_language("Hola", "en", languages, "x:1", "en") == "<2en> Hola"
    assert with_language("<2en> Hola", "en", languages, "x:1", "en") == "<2en> Hola"
    with pytest.raises(InputError, match=r'x:1: "to" asks for en, but the text starts with <2es>'):
        with_language("<2es> Hola", "en", languages, "x:1", "en")


def test_a_token_without_a_space_after_it_is_the_lines_token():
    """The tokenizer reads "<2es>Hola" as <2es> then Hola: no second token goes before it."""
    languages = {"en": "<2en>", "es": "<2es>", "es_mx": "<2es_mx>"}
    assert with_language("<2es>Hola", "en", languages, "x:1") == "<2es>Hola"
    assert with_language("  <2es_mx>Hola", "en", languages, "x:1") == "  <2es_mx>Hola"
    with pytest.raises(InputError, match=r'"to" asks for en, but the text starts with <2es>'):
        with_language("<2es>Hola", "en", languages, "x:1", "en")


def test_make_translate_and_eval_pass_to_for_a_multilingual_run():
    for target in ("translate", "eval"):
        make = ["make", "-n", target, "RUN=runs/bi"]
        chosen = subprocess.run([*make, "TO=es"], cwd=ROOT, capture_output=True, text=True)
        plain = subprocess.run(make, cwd=ROOT, capture_output=True, text=True)
        assert chosen.returncode == plain.returncode == 0, chosen.stderr
        assert "tf translate runs/bi" in chosen.stdout or "tf eval runs/bi" in chosen.stdout
        assert " --to es" in chosen.stdout and "--to" not in plain.stdout


def test_eval_records_the_direction_it_scored(bidirectional, trained, tiny_prefix, tmp_path):
    """Item 26: `tf eval --to` scored one direction of a multilingual run and recorded none
    (--json, and so `make eval`'s eval.json): two directions' scores read alike."""
    src, ref = tmp_path / "src", tmp_path / "ref"
    src.write_text("\n".join(LINES) + "\n")
    ref.write_text("\n".join(ENGLISH) + "\n")
    args = ["eval", bidirectional, "--src", src, "--ref", ref, "--greedy", "--json"]
    for to, direction in (("en", "es-en"), ("es", "en-es")):
        result = tf(*args, "--to", to)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["direction"] == direction
    one_way = ["eval", trained, "--src", f"{tiny_prefix}.es", "--ref", f"{tiny_prefix}.en"]
    result = tf(*one_way, "--limit", "4", "--greedy", "--json")
    assert json.loads(result.stdout)["direction"] == "es-en"  # a one-way run's own
