"""Forgetting made visible (issue 58, item 4): a fine-tuning run lists dev sets of directions it
does not train, each validated and logged per direction (`dev_bleu/en-es`) and their mean apart
(`watched_bleu`), while `dev_bleu`, `dev_loss`, early stopping and best.pt follow the trained
directions alone; cleaning holds nothing against a set of another direction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_directions import fra_corpus, multilingual_import  # noqa: F401 - fixtures
from test_many_end_to_end import nllb_run  # noqa: F401 - fixtures

from cli.config import load_config
from cli.runs.checkpoint import load_checkpoint
from cli.training.init import with_init
from cli.training.validation import direction_scores
from data.config import CorpusConfig, DataConfig, SetConfig
from data.pipeline import Batching, prepare_training_data

TARGET_SIDE = "data.lang_token_side=target"


def sets(*settings: str) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


def base_run(prefix: str, out: Path, *extra: str) -> Path:
    """A tiny es<->en run (the corpus twice, once reversed), trained two updates."""
    result = tf(
        "train", "tiny", "--out", out,
        *sets(
            f"data.train=[{{corpus: {prefix}}}, {{corpus: {prefix}, reverse: true}}]",
            f"data.dev={prefix}-dev",
            "data.test=''",
            "data.max_len=120",
            "train.max_steps=2",
            "train.eval_every=2",
            *extra,
        ),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def es_en_es(tiny_prefix, tmp_path_factory) -> Path:
    return base_run(tiny_prefix, tmp_path_factory.mktemp("forgetting") / "base")


def es_en_only(prefix: str, base: Path, dev: str, *extra: str) -> list[str]:
    """--set arguments that fine-tune `base` on es->en alone, validating on `dev`."""
    return sets(
        f"train.init={base}",
        f"data.train={prefix}",
        f"data.dev={dev}",
        f"data.test={prefix}-dev",
        "data.max_len=120",
        "train.max_steps=4",
        "train.eval_every=2",
        "train.eval_on_start=true",
        "train.early_stop_metric=loss",  # a tiny model's BLEU is 0 in both directions
        "train.lr=3e-3",  # steps that change its scores
        "train.eval_bleu_sentences=6",
        "train.deterministic=true",
        "train.precision=fp32",
        *extra,
    )


def both_dev_sets(prefix: str) -> str:
    return f"[{{corpus: {prefix}-dev}}, {{corpus: {prefix}-dev, reverse: true}}]"


def validations(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for line in lines if "dev_loss" in (r := json.loads(line))]


# ----------------------------------------------------------------------------- the rule


def test_dev_sets_of_untrained_directions_are_watched():
    es_en = CorpusConfig("a")
    dev, back = SetConfig("d"), SetConfig("d", reverse=True)
    fr = SetConfig("f", src_lang="en", tgt_lang="fr")
    d = DataConfig(train=[es_en], dev=[dev, back, fr, back])
    assert d.watched_directions() == [("en", "es"), ("en", "fr")]
    both = DataConfig(train=[es_en, CorpusConfig("a", reverse=True)], dev=[dev, back])
    assert both.watched_directions() == []
    # No dev set of a trained direction: those listed are all a run can follow, as before.
    assert DataConfig(train=[es_en], dev=[back]).watched_directions() == []


def test_the_followed_mean_leaves_the_watched_directions_out():
    scores = {"es-en": {"bleu": 10.0, "chrf": 30.0}, "en-es": {"bleu": 2.0, "chrf": 12.0}}
    assert direction_scores(scores, ["en-es"]) == {
        "dev_bleu": 10.0,
        "watched_bleu": 2.0,
        "dev_bleu/es-en": 10.0,
        "dev_bleu/en-es": 2.0,
        "dev_chrf": 30.0,
        "watched_chrf": 12.0,
        "dev_chrf/es-en": 30.0,
        "dev_chrf/en-es": 12.0,
    }
    assert direction_scores(scores)["dev_bleu"] == 6.0  # as before: the mean of both
    assert "watched_bleu" not in direction_scores(scores)


# ----------------------------------------------------------------------------- a fine-tuning run


@pytest.fixture(scope="module")
def watched_and_not(es_en_es, tiny_prefix, tmp_path_factory) -> tuple[Path, Path]:
    """es<->en fine-tuned on es->en alone, twice: validated on es->en and en->es, and on
    es->en alone."""
    root = tmp_path_factory.mktemp("fine_tuned")
    runs = []
    for name, dev in (("watched", both_dev_sets(tiny_prefix)), ("alone", f"{tiny_prefix}-dev")):
        args = es_en_only(tiny_prefix, es_en_es, dev)
        result = tf("train", "finetune", "--out", root / name, *args)
        assert result.exit_code == 0, result.output
        runs.append(root / name)
    return runs[0], runs[1]


def test_a_direction_fine_tuning_does_not_train_is_validated_and_logged(watched_and_not):
    from test_tensorboard import assert_same

    run, _ = watched_and_not
    records = validations(run)
    assert [r["step"] for r in records] == [0, 2, 4]
    best = None
    for r in records:
        assert r["dev_chrf"] == r["dev_chrf/es-en"] and r["dev_bleu"] == r["dev_bleu/es-en"]
        assert r["watched_chrf"] == r["dev_chrf/en-es"]
        assert r["watched_bleu"] == r["dev_bleu/en-es"]
        assert {"watched_loss", "watched_nll", "watched_ppl"} <= set(r)
        best = r["dev_loss"] if best is None else min(best, r["dev_loss"])
        assert r["best"] == best  # early stopping's and best.pt's: the trained direction's
        assert r["dev_loss"] != r["watched_loss"]
    assert any(r["dev_chrf/es-en"] != r["dev_chrf/en-es"] for r in records)  # two numbers
    assert_same(run)  # TensorBoard holds every one of them
    result = tf("plot", run, "-o", run / "curves.png")
    assert result.exit_code == 0, result.output
    assert (run / "curves.png").stat().st_size > 0


def test_watching_changes_nothing_the_run_follows(watched_and_not):
    """The same dev loss, dev BLEU/chrF and best, the same pairs trained on and the same
    weights, with the watched set listed or not."""
    watched, alone = watched_and_not
    followed = ("step", "dev_loss", "dev_nll", "dev_ppl", "dev_bleu", "dev_chrf", "best")
    ours = [{k: r[k] for k in followed} for r in validations(watched)]
    assert ours == [{k: r[k] for k in followed} for r in validations(alone)]
    assert "watched_bleu" not in validations(alone)[0]
    report = [json.loads((run / "data.json").read_text())["corpora"] for run in (watched, alone)]
    assert report[0] == report[1]
    for name in ("last.pt", "best.pt"):
        a, b = (load_checkpoint(run / "checkpoints" / name) for run in (watched, alone))
        assert a["step"] == b["step"]
        assert all(torch.equal(t, b["model"][k]) for k, t in a["model"].items())


def test_a_dev_set_the_model_cannot_translate_is_one_line(es_en_es, tiny_prefix, tmp_path):
    """Into a language the model never wrote: refused before anything is written."""
    fr = f"[{{corpus: {tiny_prefix}-dev}}, {{corpus: {tiny_prefix}-dev, tgt_lang: fr}}]"
    out = tmp_path / "ft"
    result = tf("train", "finetune", "--out", out, *es_en_only(tiny_prefix, es_en_es, fr))
    assert_user_error(result, "data.dev[1] translates into 'fr', which the model does not")
    assert not out.exists()


# ----------------------------------------------------------------------------- target side


@pytest.fixture(scope="module")
def target_side(tiny_prefix, tmp_path_factory) -> Path:
    """The es<->en run with NLLB's layout: sources say their language, the target's forced."""
    return base_run(tiny_prefix, tmp_path_factory.mktemp("target_side") / "base", TARGET_SIDE)


def test_a_target_side_models_watched_direction_is_forced_as_it_translates(
    target_side, tiny_prefix, tmp_path
):
    from cli.training import distributed
    from cli.training.data import training_data
    from cli.training.run import start_run

    args = es_en_only(tiny_prefix, target_side, both_dev_sets(tiny_prefix))
    config = with_init(load_config("finetune", args[1::2]))
    assert config.data.lang_token_side == "target"
    run = start_run(config, tmp_path / "ft", False)
    data = training_data(config, run.tokenizer, distributed.Dist(), False)
    tok = data.tokenizer
    es, en = tok.tags["<2es>"], tok.tags["<2en>"]
    by_name = {dev.name: dev for dev in data.dev_sets}
    assert [(n, dev.watched) for n, dev in by_name.items()] == [("es-en", False), ("en-es", True)]
    assert by_name["en-es"].forced == tok.tgt_piece_ids(["<2es>"])  # as --to es forces it
    assert all(ids[0] == en for ids in by_name["en-es"].src_ids)  # the source says English
    assert all(batch.src[0, 0].item() == es for batch in data.dev_batches)
    assert all(batch.src[0, 0].item() == en for batch in data.watched_batches)


def test_a_target_side_dev_set_in_a_language_the_model_does_not_read_is_one_line(
    target_side, tiny_prefix, tmp_path
):
    fr = f"[{{corpus: {tiny_prefix}-dev}}, {{corpus: {tiny_prefix}-dev, src_lang: fr}}]"
    out = tmp_path / "ft"
    result = tf("train", "finetune", "--out", out, *es_en_only(tiny_prefix, target_side, fr))
    assert_user_error(result, "data.dev[1] reads 'fr', which the model does not", "es, en")
    assert not out.exists()


# ----------------------------------------------------------------------------- cleaning


@pytest.mark.parametrize(
    "languages, overlap",
    [
        (("en", "fr"), 0),  # another direction: holds nothing, however alike its text
        (("en", "es"), 100),  # the trained one read backwards: held, as any dev set is
    ],
)
def test_cleaning_holds_a_watched_set_only_against_its_own_direction(
    tiny_prefix, tmp_path, languages, overlap
):
    """A watched set of half the training pairs, its English side first: as en->fr it removes
    no training pair; as en->es it is those es->en pairs read backwards, removed."""
    src, tgt = languages
    for lang, side in ((src, "en"), (tgt, "es")):
        half = Path(f"{tiny_prefix}.{side}").read_text().splitlines(keepends=True)[:100]
        (tmp_path / f"watched.{lang}").write_text("".join(half))
    watched = SetConfig(str(tmp_path / "watched"), src_lang=src, tgt_lang=tgt)
    d = DataConfig(
        train=tiny_prefix,
        dev=[SetConfig(f"{tiny_prefix}-dev"), watched],
        test="",
        directions=["es->en", f"{src}->{tgt}"],
        vocab_size=100,
    )
    assert d.watched_directions() == [languages]
    batching = Batching(4096, 64, 0, 256, 5, "bos")
    data = prepare_training_data(d, batching, tmp_path / "tok", resume=False)
    (corpus,) = data.report["corpora"]
    assert corpus["removed"].get("overlap", 0) == overlap
    assert [dev.watched for dev in data.dev_sets] == [False, True]


# ----------------------------------------------------------------------------- imported models


def quick_fine_tune(init: Path, out: Path, train: str, dev: str, *extra: str) -> object:
    """`tf train finetune --init` for two updates, validating a few short sentences."""
    return tf(
        "train", "finetune", "--init", init, "--out", out,
        *sets(
            f"data.train={train}",
            f"data.dev={dev}",
            "train.max_steps=2",
            "train.eval_every=2",
            "train.max_tokens=512",
            "train.eval_bleu_sentences=4",
            "decode.max_len_a=0",
            "decode.max_len_b=5",
            *extra,
        ),
    )  # fmt: skip


def test_an_opus_mt_import_tuned_into_one_language_watches_the_other(
    multilingual_import,  # noqa: F811
    tiny_prefix,
    tmp_path,
):
    """es->fra and es->spa (`>>fra<<`, `>>spa<<`), tuned into fra alone, a spa dev set beside
    (the fixture's Spanish as its references: other numbers than fra's English)."""
    pairs = fra_corpus(tiny_prefix, tmp_path)
    shutil.copy(f"{tiny_prefix}-dev.es", f"{pairs}-dev.spa")
    dev = f"[{{corpus: {pairs}-dev, tgt_lang: fra}}, {{corpus: {pairs}-dev, tgt_lang: spa}}]"
    run = tmp_path / "run"
    result = quick_fine_tune(multilingual_import, run, pairs, dev, "data.tgt_lang=fra")
    assert result.exit_code == 0, result.output
    (first, *_) = validations(run)
    assert first["dev_chrf"] == first["dev_chrf/es-fra"]
    assert first["watched_chrf"] == first["dev_chrf/es-spa"]
    assert first["dev_loss"] != first["watched_loss"]


SPA, AST, ENG, FRA = "spa_Latn", "ast_Latn", "eng_Latn", "fra_Latn"


def test_an_nllb_import_tuned_on_one_direction_watches_another(
    nllb_run,  # noqa: F811
    tiny_prefix,
    tmp_path,
):
    """spa_Latn->ast_Latn trained; eng_Latn->fra_Latn watched, on the very pairs it trains on
    read the other way and named as other languages: no training pair is dropped for it. A
    language NLLB lacks is one line naming the nearest it has."""
    for split, source in (("train", tiny_prefix), ("dev", f"{tiny_prefix}-dev")):
        for lang, side in ((SPA, "es"), (AST, "en"), (ENG, "en"), (FRA, "es")):
            shutil.copy(f"{source}.{side}", tmp_path / f"{split}.{lang}")
    train = f"[{{corpus: {tmp_path / 'train'}, src_lang: {SPA}, tgt_lang: {AST}}}]"
    followed = f"{{corpus: {tmp_path / 'dev'}, src_lang: {SPA}, tgt_lang: {AST}}}"
    watched = f"{{corpus: {tmp_path / 'train'}, src_lang: {ENG}, tgt_lang: {FRA}}}"
    run = tmp_path / "run"
    result = quick_fine_tune(nllb_run, run, train, f"[{followed}, {watched}]", "data.test=''")
    assert result.exit_code == 0, result.output
    (first, *_) = validations(run)
    assert first["dev_chrf"] == first[f"dev_chrf/{SPA}-{AST}"]
    assert first["watched_chrf"] == first[f"dev_chrf/{ENG}-{FRA}"]
    assert first["dev_loss"] != first["watched_loss"]
    (corpus,) = json.loads((run / "data.json").read_text())["corpora"]
    assert corpus["removed"]["overlap"] == 0 and corpus["kept"] == 200
    unknown = f"{{corpus: {tmp_path / 'dev'}, src_lang: {ENG}, tgt_lang: ast}}"
    refused = quick_fine_tune(nllb_run, tmp_path / "no", train, f"[{followed}, {unknown}]")
    assert_user_error(refused, "data.dev[1] translates into 'ast'", "202 languages", AST)
    assert not (tmp_path / "no").exists()
