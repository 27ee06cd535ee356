"""An export publishes nothing of where its run was trained: its config, model card and
tokenizer files name a run's paths (recorded absolute: `cli.runs.run_dir.anchored`) by their
names alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import tf

from cli.config import TF_CONFIG, load_config
from cli.exporters.published import published_config
from data.config import CorpusConfig, SetConfig

REPO = Path(__file__).resolve().parents[1]  # where the fixture corpora lie


def places(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The machine's folders a run of these tests names: the test's temporary root (runs,
    tokenizers) and the repository (the corpora), as bytes to look for in any file."""
    return [str(tmp_path_factory.getbasetemp().resolve()).encode(), str(REPO).encode()]


def leaks(export: Path, machine: list[bytes]) -> list[str]:
    """Every file of `export` that holds one of the `machine` folders, with the folder."""
    found = []
    for path in sorted(p for p in export.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.name}: {place.decode()}" for place in machine if place in data]
    return found


@pytest.fixture(scope="module")
def fine_tune(trained, tiny_prefix, tmp_path_factory) -> Path:
    """One update of `trained` fine-tuned on corpora listed with absolute paths."""
    run = tmp_path_factory.mktemp("fine_tune") / "run"
    sets = [
        f"data.train=[{{corpus: {tiny_prefix}}}]",
        f"data.dev=[{{corpus: {tiny_prefix}-dev}}]",
        "train.max_steps=1",
    ]
    result = tf("train", "tiny", "--init", trained, "--out", run, *(f"--set={s}" for s in sets))
    assert result.exit_code == 0, result.output
    return run


@pytest.mark.parametrize("to", ["ctranslate2", "huggingface"])
def test_no_path_of_the_run_reaches_an_export(trained, tiny_prefix, to, tmp_path_factory):
    out = tmp_path_factory.mktemp("published") / to
    assert tiny_prefix in (trained / "config.yaml").read_text()  # the run's corpus, absolute
    trained_into = (trained / "tokenizer" / "joint.model").read_bytes()  # SentencePiece's
    assert str(trained.resolve()).encode() in trained_into  # model_prefix
    result = tf("export", trained, "--to", to, "-o", out)
    assert result.exit_code == 0, result.output
    assert leaks(out, places(tmp_path_factory)) == []
    data = load_config(out / TF_CONFIG).data
    assert (data.train, data.dev) == ("tiny", "tiny-dev")
    if to == "huggingface":
        assert "- training: `tiny`\n" in (out / "README.md").read_text()


def test_no_path_of_a_fine_tune_or_its_init_reaches_its_card(fine_tune, tmp_path_factory):
    out = tmp_path_factory.mktemp("published") / "huggingface"
    result = tf("export", fine_tune, "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    assert leaks(out, places(tmp_path_factory)) == []
    card = (out / "README.md").read_text()
    assert "fine-tuned with `tf` from `run`" in card  # `trained`, by its name
    assert "- training: `tiny` (es-en, weight 1)" in card
    assert "| training | 1 update of " in card
    assert load_config(out / TF_CONFIG).train.init == "run"


@pytest.mark.parametrize("to", ["ctranslate2", "huggingface"])
def test_no_path_of_an_imported_directory_reaches_an_export(tiny_prefix, to, tmp_path_factory):
    """A run imported from a local folder (recorded absolute, `import.json`) names it in its
    card by its name."""
    from test_import import imported, small_standin

    root = tmp_path_factory.mktemp("imported")
    run = imported(small_standin(root, tiny_prefix), root)
    out = tmp_path_factory.mktemp("published") / to
    result = tf("export", run, "--to", to, "-o", out)
    assert result.exit_code == 0, result.output
    assert leaks(out, places(tmp_path_factory)) == []
    if to == "huggingface":
        assert "imported into `tf` from `standin`" in (out / "README.md").read_text()


def test_published_config_names_every_path_setting_by_its_name():
    config = load_config(
        "tiny",
        [
            "data.tokenizer=/srv/alice/runs/base/tokenizer",
            "train.init=/srv/alice/runs/base/checkpoints/best.pt",
        ],
    )
    data = config.data
    config.data.train = [
        CorpusConfig("/srv/alice/corpora/europarl.tsv"),
        CorpusConfig("hf:/srv/alice/sets/opus:es-en@train", weight=2.0),
        CorpusConfig("hf:Helsinki-NLP/europarl:en-es@train"),
        CorpusConfig("bundled:bible-es-en/train"),
    ]
    config.data.dev = [SetConfig("/srv/alice/corpora/dev", reverse=True)]
    config.data.test = "relative/test"
    shown = published_config(config)
    assert [c.corpus for c in shown.data.train] == [
        "europarl.tsv",
        "hf:opus:es-en@train",
        "hf:Helsinki-NLP/europarl:en-es@train",
        "bundled:bible-es-en/train",
    ]
    assert shown.data.train[1].weight == 2.0 and shown.data.dev[0].reverse
    assert (shown.data.dev[0].corpus, shown.data.test) == ("dev", "test")
    assert (shown.data.tokenizer, shown.train.init) == ("tokenizer", "base/best.pt")
    assert data.train[0].corpus == "/srv/alice/corpora/europarl.tsv"  # the run's, untouched
