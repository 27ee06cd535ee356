"""Issue 35, the training side: what used to go silently wrong with exit status 0 (a validation
that sampled, counts that did not add up, a tag that was a word, a weight that dropped a corpus,
two runs on one TensorBoard curve) is now right or a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from test_cli import tf

from cli.config import ConfigError, load_config
from data.clean import Reference
from data.prepared import Filters, prepare_corpus


def train(out: Path, tiny_prefix: str, *sets: str, train_spec: str | None = None):
    settings = [
        f"data.train={train_spec or tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "train.max_steps=1",
        "train.eval_bleu_sentences=8",
        *sets,
    ]
    return tf("train", "tiny", "--out", out, *[a for s in settings for a in ("--set", s)])


def validations(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for line in lines if "dev_bleu" in (r := json.loads(line))]


def test_validation_decodes_greedily_whatever_the_sampling_settings(tmp_path, tiny_prefix):
    """Item 3: with decode.sampling_topk set (a reverse model's config), dev BLEU is the greedy
    search's: the same at every seed, and the same as without sampling."""
    scores = []
    for name, sets in [
        ("greedy", []),
        ("seed1", ["decode.sampling_topk=5", "decode.seed=1"]),
        ("seed2", ["decode.sampling_topk=-1", "decode.seed=2", "decode.sampling_temperature=3"]),
    ]:
        result = train(tmp_path / name, tiny_prefix, "train.eval_on_start=true", *sets)
        assert result.exit_code == 0, result.output
        scores.append([(r["dev_bleu"], r["dev_chrf"]) for r in validations(tmp_path / name)])
    assert scores[0] == scores[1] == scores[2]
    assert len(scores[0]) == 2  # step 0 and the end
    # Those settings do sample when asked to: the validation above ignored them.
    lines = Path(f"{tiny_prefix}-dev.es").read_text()
    greedy = tf("translate", tmp_path / "greedy", "--greedy", input=lines)
    sampled = tf(
        "translate", tmp_path / "seed2", "--greedy", "--set", "decode.sampling_topk=-1",
        "--set", "decode.seed=2", "--set", "decode.sampling_temperature=3", input=lines,
    )  # fmt: skip
    assert greedy.exit_code == sampled.exit_code == 0
    assert greedy.stdout != sampled.stdout


def corpus(pairs: list[tuple[str, str]]) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})


# One pair per rule, or more; the rule each is removed by (None: kept), in TEXT_RULES' order.
PAIRS = [
    ("Hola mundo.", "Hello world.", None),
    ("", "Nothing on one side.", "empty"),
    ("Nada al otro lado.", "", "empty"),
    ("   ", "Blank.", "empty"),
    ("Vacío.", " \t ", "empty"),
    ("", "", "empty"),
    ("12, 13 - 14.", "12, 13 - 14!", "junk"),
    ("Jesús lloró.", "Jesús lloró.", "copy"),
    ("Una frase del dev.", "A new sentence.", "overlap"),
    ("Hola   mundo.", "Hello world. ", "duplicate"),
    ("y " * 40 + "fin.", "and " * 40 + "end.", "too_long"),
    ("Sí.", "Yes, he said so to them all.", "ratio"),
    ("Dijo 3 cosas.", "He said 3 things.", None),
]


@pytest.mark.parametrize("clean", [True, False])
def test_every_cleaning_count_adds_up(tiny_tokenizer, clean):
    """Item 4: every pair read is kept or counted under exactly one rule; the empty pairs
    (the text rules' or, without cleaning, the token rules') are counted as empty."""
    ds = corpus([(s, t) for s, t, _ in PAIRS])
    dev = corpus([("Una frase del dev.", "Something.")])
    filters = Filters(clean, max_len=30, max_len_ratio=3.0)
    counts = prepare_corpus(ds, tiny_tokenizer, filters, Reference.of([dev]), "pairs").counts
    assert counts["read"] == counts["kept"] + sum(counts["removed"].values()) == len(PAIRS)
    assert counts["removed"]["empty"] == 5
    if clean:
        expected = {rule: sum(r == rule for *_, r in PAIRS) for rule in counts["removed"]}
        assert counts["removed"] == expected and counts["kept"] == 2


@pytest.mark.parametrize("tag", ["Y", "\u2581", "<mask>", "<s>", "bt", "<b t>", "<>"])
def test_a_tag_that_could_be_text_is_a_config_error(tiny_prefix, tag):
    """Item 6: a word or a piece of text (every Spanish sentence starting with "Y" would look
    tagged), or a special piece, is refused before any work."""
    spec = f'data.train=[{{corpus: "{tiny_prefix}", tag: "{tag}"}}]'
    with pytest.raises(ConfigError, match=r"data\.train\[0\]\.tag .*a piece no text holds"):
        load_config("tiny", [spec])


def test_a_tag_held_by_a_corpus_text_is_refused_naming_the_line(tmp_path, tiny_prefix):
    """Item 6: "<bt>" is a fine tag until a sentence of some corpus holds it."""
    lines = Path(f"{tiny_prefix}.es").read_text().splitlines()
    lines[6] = "Y dijo <bt> Dios"
    (tmp_path / "mixed.es").write_text("\n".join(lines) + "\n")
    (tmp_path / "mixed.en").write_text(Path(f"{tiny_prefix}.en").read_text())
    mix = f'[{{corpus: "{tmp_path / "mixed"}"}}, {{corpus: "{tiny_prefix}", tag: "<bt>"}}]'
    result = train(tmp_path / "run", tiny_prefix, train_spec=mix)
    assert result.exit_code == 2
    assert f"{tmp_path / 'mixed'}:7: holds the text '<bt>'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("weight", [".inf", ".nan", "-1", "0"])
def test_a_weight_that_is_no_number_of_pairs_is_a_config_error(tiny_prefix, weight):
    """Item 13."""
    spec = f'data.train=[{{corpus: "{tiny_prefix}", weight: {weight}}}]'
    with pytest.raises(ConfigError, match=r"data\.train\[0\]\.weight must be a positive number"):
        load_config("tiny", [spec])


def test_a_weight_that_rounds_a_corpus_to_no_pair_is_one_line(tmp_path, tiny_prefix):
    """Item 13: 0.001 of 200 pairs is none; before, the batcher failed, or a mix silently
    dropped the corpus."""
    mix = f'[{{corpus: "{tiny_prefix}"}}, {{corpus: "{tiny_prefix}-dev", weight: 0.001}}]'
    result = train(tmp_path / "run", tiny_prefix, "data.clean=false", train_spec=mix)
    assert result.exit_code == 2, result.output
    assert "data.train[1]" in result.stderr and "weight 0.001 of its " in result.stderr
    assert "pairs is no pair per epoch" in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def event_files(run: Path) -> list[Path]:
    return sorted((run / "tensorboard").glob("events.out.tfevents.*"))


def test_a_run_from_update_0_starts_its_tensorboard_afresh(tmp_path, tiny_prefix):
    """Item 14: `--force` again, or a run killed before its first checkpoint and resumed, used
    to leave the earlier attempt's event files: two runs on one curve."""
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    assert train(run, tiny_prefix).exit_code == 0
    first = event_files(run)
    assert len(first) == 1
    assert train(run, tiny_prefix, "train.seed=2").exit_code == 2  # refused without --force
    assert event_files(run) == first
    forced = tf(
        "train", "tiny", "--out", run, "--force",
        "--set", f"data.train={tiny_prefix}", "--set", f"data.dev={tiny_prefix}-dev",
        "--set", "train.max_steps=1", "--set", "train.eval_bleu_sentences=8",
    )  # fmt: skip
    assert forced.exit_code == 0, forced.output
    assert len(event_files(run)) == 1 and event_files(run) != first
    # Killed before its first checkpoint: events written, no last.pt.
    (run / "checkpoints" / "last.pt").unlink()
    stale = event_files(run)
    assert tf("train", "--resume", run).exit_code == 0
    assert len(event_files(run)) == 1 and event_files(run) != stale
