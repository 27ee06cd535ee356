"""What a run translates comes from its corpora (issue 56, items 1, 2, 5, 24): a one-way run
trained with `reverse: true` (or per-corpus languages) is taken in its corpora's direction by
every command, `data.src_lang`/`tgt_lang` being only the defaults of corpora that name none;
a corpus tag is never one of the run's language tokens; a line of tokens alone is an empty
line; a prefix or a constraint never holds a reserved piece."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_cli import assert_user_error, tf

from cli.config import ConfigError, check_config, load_config
from cli.inference.engines import load_engine
from cli.serving.app import Limits, health_fields
from data.config import CorpusConfig, DataConfig, SetConfig
from data.text import read_file_lines


def sets(*pairs: str) -> list[str]:
    return [a for s in pairs for a in ("--set", s)]


@pytest.fixture(scope="module")
def en_es(tiny_prefix, tmp_path_factory, trained) -> Path:
    """A tiny en->es run: the fixture's es/en files read backwards (`reverse: true`), dev and
    test likewise, `data.src_lang`/`tgt_lang` left at es/en. It shares `trained`'s (es->en)
    tokenizer, so that the two could ensemble but for their directions."""
    run = tmp_path_factory.mktemp("en_es") / "run"
    args = sets(
        f"data.train=[{{corpus: {tiny_prefix}, reverse: true}}]",
        f"data.dev=[{{corpus: {tiny_prefix}-dev, reverse: true}}]",
        f"data.test=[{{corpus: {tiny_prefix}-dev, reverse: true}}]",
        f"data.tokenizer={trained}/tokenizer",
        "train.max_steps=2",
        "train.eval_every=0",
    )
    result = tf("train", "tiny", "--out", run, *args)
    assert result.exit_code == 0, result.output
    return run


def test_a_reversed_run_translates_into_its_corpora_target(en_es, tmp_path):
    assert tf("translate", en_es, "--to", "es", "--greedy", input="hello\n").exit_code == 0
    assert_user_error(tf("translate", en_es, "--to", "en", input="hello\n"), "into es only")
    src, ref = tmp_path / "src", tmp_path / "ref"
    src.write_text("In the beginning\n")
    ref.write_text("En el principio\n")
    result = tf("compare", en_es, "--src", src, "--ref", ref, "--to", "es")
    assert result.exit_code == 0, result.output
    assert_user_error(tf("compare", en_es, "--src", src, "--ref", ref, "--to", "en"), "es only")


def test_serve_health_names_a_reversed_runs_direction(en_es):
    engine = load_engine(str(en_es), torch.device("cpu"), [])
    health = health_fields(engine, str(en_es), "pytorch", Limits())
    assert (health["src_lang"], health["tgt_lang"]) == ("en", "es")
    assert health["directions"] == ["en->es"]


def test_backtranslate_names_a_reversed_runs_files_by_its_direction(en_es, tmp_path):
    """The reverse model of an es->en system is an en->es run: its input is English."""
    mono = tmp_path / "mono.en"
    mono.write_text("In the beginning\nAnd God said\n")
    out = tmp_path / "bt"
    result = tf("backtranslate", en_es, mono, "--out", out, "--greedy")
    assert result.exit_code == 0, result.output
    assert read_file_lines(out / "train.en") == ["In the beginning", "And God said"]
    assert len(read_file_lines(out / "train.es")) == 2


def test_distill_feeds_a_reversed_teacher_its_own_source_side(en_es, tiny_prefix, tmp_path):
    out = tmp_path / "distilled"
    result = tf("distill", en_es, "--corpus", f"{tiny_prefix}-dev", "--out", out, "--beam", "1")
    assert result.exit_code == 0, result.output
    english = read_file_lines(Path(f"{tiny_prefix}-dev.en"))
    assert read_file_lines(out / "train.en") == [" ".join(line.split()) for line in english]
    assert json.loads((out / "distill.json").read_text())["corpus"][0].endswith("(en-es)")


def test_an_ensemble_of_opposite_directions_is_refused(en_es, trained):
    assert_user_error(tf("translate", trained, en_es, input="hola\n"), "en->es", "es->en")


def test_fine_tuning_into_another_target_language_is_refused(en_es, trained, tiny_prefix, tmp_path):
    """An es->en model's decoder writes English: an en->es corpus would train it to write
    Spanish from scratch, refused; another source language (transfer) is not."""
    backwards = [
        f"data.{name}=[{{corpus: {tiny_prefix}{suffix}, reverse: true}}]"
        for name, suffix in (("train", ""), ("dev", "-dev"), ("test", "-dev"))
    ]
    result = tf("train", "tiny", "--init", trained, "--out", tmp_path / "a", *sets(*backwards))
    assert_user_error(result, "translates en->es", "into en", "data.train[0]")
    assert not (tmp_path / "a").exists()
    result = tf(
        "train",
        "tiny",
        "--init",
        en_es,
        "--out",
        tmp_path / "b",
        *sets(f"data.train=[{{corpus: {tiny_prefix}, src_lang: es, tgt_lang: en}}]"),
    )
    assert_user_error(result, "translates es->en", "into es")


def test_fine_tuning_from_another_source_language_is_transfer(trained, tmp_path):
    """An es->en model tuned on pt->en pairs (Zoph et al. 2016): the run translates both."""
    config = load_config("tiny", ["data.train=x", "data.src_lang=pt", f"train.init={trained}"])
    from cli.training.init import with_init

    merged = with_init(config).data
    assert merged.translates() == [("es", "en"), ("pt", "en")] and merged.lang_tokens() == {}
    assert merged.directions == ["es->en"]


@pytest.mark.parametrize(
    "corpora, says",
    [
        # the bidirectional habit of Johnson et al.: the token as the reversed corpus's tag
        ("[{corpus: x}, {corpus: x, reverse: true, tag: '<2es>'}]", "data.train[1].tag '<2es>'"),
        ("[{corpus: x, tag: '<2en>'}, {corpus: x, reverse: true}]", "token for en"),
    ],
)
def test_a_tag_that_is_a_language_token_is_refused(corpora, says):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", [f"data.train={corpora}"])
    assert says in str(e.value) and "tgt_lang" in str(e.value) and "\n" not in str(e.value)


def test_a_dev_sets_tag_must_tag_a_training_corpus():
    train = "data.train=[{corpus: x, tag: '<bt>'}, {corpus: y}]"
    assert load_config("tiny", [train, "data.dev=[{corpus: d, tag: '<bt>'}]"])
    with pytest.raises(ConfigError, match=r"data.dev\[0\].tag '<ft>' tags no training corpus"):
        load_config("tiny", [train, "data.dev=[{corpus: d, tag: '<ft>'}]"])


@pytest.fixture(scope="module")
def es_en_es(tiny_prefix, tmp_path_factory) -> Path:
    """A tiny es<->en run (`test_multilingual.both_ways`)."""
    from test_multilingual import both_ways

    run = tmp_path_factory.mktemp("bidirectional") / "run"
    result = tf("train", "tiny", "--out", run, *both_ways(tiny_prefix))
    assert result.exit_code == 0, result.output
    return run


def test_a_line_of_only_a_language_token_is_an_empty_line(es_en_es):
    """Its translation is empty, as a blank line's is, not a hallucination."""
    result = tf("translate", es_en_es, "--greedy", input="<2en>\n  <2es>  \n\n<2en> hola\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert lines[:3] == ["", "", ""] and lines[3].strip()


@pytest.mark.parametrize(
    "request_line, says",
    [
        ({"text": "hola", "prefix": "<2es>"}, "the prefix '<2es>' holds <2es>"),
        ({"text": "hola", "constraints": ["light <2en>"]}, "the constraint 'light <2en>'"),
    ],
)
def test_a_reserved_piece_in_a_prefix_or_constraint_is_refused(es_en_es, request_line, says):
    line = json.dumps({**request_line, "to": "en"})
    result = tf("translate", es_en_es, "--input-format", "jsonl", input=line + "\n")
    assert_user_error(result, says, "<stdin>:1", "reserved piece")


@pytest.fixture(scope="module")
def multilingual_import(tiny_prefix, tmp_path_factory) -> Path:
    """An imported OPUS-MT-style model into fra and spa (`>>fra<<`, `>>spa<<`), from es."""
    from test_import import small_standin

    tmp = tmp_path_factory.mktemp("multilingual_import")
    standin = small_standin(tmp, tiny_prefix, language_tokens=(">>fra<<", ">>spa<<"))
    result = tf("import", standin, "-o", tmp / "run")
    assert result.exit_code == 0, result.output
    return tmp / "run"


def fra_corpus(tiny_prefix: str, folder: Path) -> str:
    """The fixture's pairs as es -> "fra" files (the tokenizer does not mind)."""
    for name in ("", "-dev"):
        shutil.copy(f"{tiny_prefix}{name}.es", folder / f"pairs{name}.es")
        shutil.copy(f"{tiny_prefix}{name}.en", folder / f"pairs{name}.fra")
    return str(folder / "pairs")


def test_fine_tuning_a_multilingual_import_keeps_its_languages(
    multilingual_import, tiny_prefix, tmp_path
):
    """Tuned into fra alone, it still translates into fra and spa: its tokens go before the
    sources of training and validation alike, and --to works as before."""
    from cli.training import distributed
    from cli.training.data import training_data
    from cli.training.init import with_init
    from cli.training.run import start_run

    pairs = fra_corpus(tiny_prefix, tmp_path)
    overrides = [
        f"data.train=[{{corpus: {pairs}, tgt_lang: fra}}]",
        f"data.dev=[{{corpus: {pairs}-dev, tgt_lang: fra}}]",
        "train.max_steps=1",
        "train.eval_every=0",
        "train.eval_on_start=false",
        "train.max_tokens=512",
        f"train.init={multilingual_import}",
    ]
    imported = load_config(multilingual_import / "config.yaml").data  # what it translates
    assert imported.directions == ["es->fra", "es->spa"] and imported.lang_token == ">>{lang}<<"
    config = with_init(load_config("finetune", overrides))
    assert config.data.lang_tokens() == {"fra": ">>fra<<", "spa": ">>spa<<"}
    data = training_data(
        config, start_run(config, tmp_path / "ft", False).tokenizer, distributed.Dist(), False
    )
    fra = data.tokenizer.tags[">>fra<<"]
    assert all(ids[0] == fra for ids in data.dev_sets[0].src_ids)  # validated with the token
    assert all(batch.src[0, 0].item() == fra for batch in data.dev_batches)
    result = tf("train", "finetune", "--out", tmp_path / "run", *sets(*overrides))
    assert result.exit_code == 0, result.output
    for to in ("fra", "spa"):
        assert tf("translate", tmp_path / "run", "--to", to, input="hola\n").exit_code == 0
    assert_user_error(tf("translate", tmp_path / "run", input="hola\n"), "multilingual")


def test_a_multilingual_imports_token_as_a_corpus_tag_is_refused(
    multilingual_import, tiny_prefix, tmp_path
):
    pairs = fra_corpus(tiny_prefix, tmp_path)
    tagged = f"data.train=[{{corpus: {pairs}, tgt_lang: fra, tag: '>>fra<<'}}]"
    dev = f"data.dev=[{{corpus: {pairs}-dev, tgt_lang: fra}}]"
    result = tf(
        "train",
        "finetune",
        "--init",
        multilingual_import,
        "--out",
        tmp_path / "ft",
        *sets(tagged, dev),
    )
    assert_user_error(result, "'>>fra<<' is the run's token for fra", "tgt_lang: fra")


def test_the_prompt_shows_the_language_the_chosen_direction_reads(es_en_es, monkeypatch):
    from cli.commands import translate

    shown = []
    monkeypatch.setattr(translate, "start_prompt", lambda raw, langs: shown.append(langs) or "")
    for to in ("es", "en", None):
        tf("translate", es_en_es, *(["--to", to] if to else []), "--greedy", input="<2en> x\n")
    assert shown == ["en", "es", "es/en"]


# ------------------------------------------------------------------ the property over corpus lists

LANGS = ("en", "es", "fr")
TAGS = ("", "<bt>", ">>ft<<")


@pytest.fixture(scope="module")
def tagged_tokenizer(tiny_prefix, tmp_path_factory):
    """A tokenizer reserving every token and tag the property below may draw."""
    from data.config import lang_token
    from data.tokenizer import train_tokenizer

    tokens = [lang_token(form, x) for form in ("<2{lang}>", ">>{lang}<<") for x in LANGS]
    src = Path(f"{tiny_prefix}.es").read_text().splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text().splitlines()
    folder = tmp_path_factory.mktemp("tagged")
    return train_tokenizer(src, tgt, folder, vocab_size=150, seed=0, tags=[*tokens, *TAGS[1:]])


corpus_lists = st.lists(
    st.builds(
        lambda src, tgt, reverse, tag: CorpusConfig(
            "c", src_lang=src, tgt_lang=tgt, reverse=reverse, tag=tag
        ),
        st.sampled_from(("", *LANGS)),
        st.sampled_from(("", *LANGS)),
        st.booleans(),
        st.sampled_from(TAGS),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(corpora=corpus_lists, form=st.sampled_from(("<2{lang}>", ">>{lang}<<")), space=st.booleans())
def test_every_command_reads_a_corpus_list_as_its_corpora_train(
    tagged_tokenizer, tiny_prefix, corpora, form, space
):
    """For any list of one-way or two-way corpora (reversed, with their own languages, tagged):
    the direction each command infers is the one the corpora train, and a line fed to
    `tf translate --to` (and `tf serve`, which reads it the same way) is the ids training fed
    for it, the corpus's tag typed before it with a space or without."""
    from cli.config import Config
    from cli.inference.decoding import source_ids
    from cli.inference.engines import Engine

    first = corpora[0]  # a dev set in one of the directions trained
    dev = [SetConfig("d", first.src_lang, first.tgt_lang, first.reverse)]
    d = DataConfig(train=corpora, lang_token=form, dev=dev, test="")
    ways = [d.direction(c) for c in corpora]
    assume(all(src != tgt for src, tgt in ways))
    config = Config(data=d)
    check_config(config, "property")
    text = Path(f"{tiny_prefix}.es").read_text().splitlines()[len(corpora)]
    tok = tagged_tokenizer
    for c, (src, tgt) in zip(corpora, ways):
        engine = Engine(tok, config, search=None)
        engine.choose(tgt)
        sources = {s for s, t in ways if t == tgt}
        assert engine.direction("cmd") == (src if len(sources) == 1 else "src", tgt)
        trained = [tok.tags[t] for t in d.source_prefix(c)] + tok.encode_src([text])[0]
        typed = f"{c.tag}{' ' if space else ''}{text}" if c.tag else text
        assert source_ids(tok, [engine.source_text(typed, "x:1")]) == [trained]


def test_a_reversed_runs_model_card_names_its_corpora_direction(en_es, tmp_path):
    out = tmp_path / "hf"
    result = tf("export", en_es, "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    card = (out / "README.md").read_text()
    assert "# en→es translation (en, es)" in card
    assert "Y dijo Dios" not in card  # no Spanish example fed to an en->es model
    assert "(en-es, weight 1)" in card and "es→en" not in card


def test_fine_tuning_a_reversed_run_on_corpora_naming_no_languages_keeps_its_direction(en_es):
    """The init's direction (its corpora's, en->es) is the default of corpora that name none,
    not its data.src_lang/tgt_lang (es, en)."""
    from cli.training.init import with_init

    merged = with_init(load_config("finetune", ["data.train=x", f"train.init={en_es}"])).data
    assert (merged.src_lang, merged.tgt_lang) == ("en", "es")
    assert merged.translates() == [("en", "es")]


def test_directions_are_the_records_of_init_and_import_not_a_setting_from_scratch():
    with pytest.raises(ConfigError, match="data.directions records what a model translates"):
        load_config("tiny", ["data.directions=[es->fr]"])
    assert load_config("tiny", ["data.directions=[es->en]", "train.init=x"])  # as --init writes
    imported = ["data.train=[]", "data.directions=[es->fr, es->de]", "data.dev=''", "data.test=''"]
    assert load_config("tiny", imported).data.lang_tokens() == {"fr": "<2fr>", "de": "<2de>"}
