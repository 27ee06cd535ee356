"""Several corpora with weights and tags, cleaned by counted rules, ids read from memory-mapped
files: what `data.train` as a list and `data.clean` promise."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from cli.config import load_config
from cli.training import distributed
from cli.training.run import start_run
from cli.training.trainer import Trainer
from data import prepared as prepared_module
from data.batching import BatchIterator
from data.clean import Reference, clean_mask
from data.corpus import load_corpus
from data.prepared import Filters, prepare_corpus
from data.tokenizer import train_tokenizer

SPECIAL = dict(pad_id=0, bos_id=2, eos_id=3)


def rows(n: int, start: int = 10) -> list[list[int]]:
    return [[start + i % 7] * (1 + i % 5) for i in range(n)]


def epoch_rows(it: BatchIterator, epoch: int) -> list[int]:
    return [row for batch in it.epoch_indices(epoch) for row in batch]


# -- weights -----------------------------------------------------------------------------------


def test_weights_give_the_per_epoch_counts_they_promise():
    """Corpus A (10 rows) weight 2: each row twice an epoch; corpus B (20 rows) weight 0.5:
    10 distinct rows an epoch, another 10 the next epoch, so two epochs cover it."""
    data = rows(30)
    it = BatchIterator(data, data, max_tokens=64, seed=3, corpora=[(10, 2.0), (20, 0.5)], **SPECIAL)
    first, second = Counter(epoch_rows(it, 0)), Counter(epoch_rows(it, 1))
    assert all(first[r] == 2 and second[r] == 2 for r in range(10))
    b_first = {r for r in first if r >= 10}
    b_second = {r for r in second if r >= 10}
    assert len(b_first) == len(b_second) == 10 and all(first[r] == 1 for r in b_first)
    assert b_first | b_second == set(range(10, 30))  # covered over two epochs
    assert sum(first.values()) == 10 * 2 + 10


def test_one_corpus_of_weight_one_batches_exactly_as_no_weights():
    data = rows(50)
    plain = BatchIterator(data, data, max_tokens=32, seed=5, **SPECIAL)
    listed = BatchIterator(data, data, max_tokens=32, seed=5, corpora=[(50, 1.0)], **SPECIAL)
    two = BatchIterator(
        data, data, max_tokens=32, seed=5, corpora=[(20, 1.0), (30, 1.0)], **SPECIAL
    )
    for epoch in (0, 1):
        assert plain.epoch_indices(epoch) == listed.epoch_indices(epoch)
        assert plain.epoch_indices(epoch) == two.epoch_indices(epoch)
    assert plain.state_dict() == listed.state_dict()


def test_a_weighted_mix_resumes_mid_epoch_batch_for_batch():
    data = rows(40)
    mix = dict(max_tokens=32, seed=2, corpora=[(15, 3.0), (25, 0.4)], **SPECIAL)
    straight = BatchIterator(data, data, **mix)
    batches = iter(straight)
    for _ in range(5):
        next(batches)
    state = straight.state_dict()
    rest = [b.indices for b in batches]
    resumed = BatchIterator(data, data, **mix)
    resumed.load_state_dict(state)
    assert [b.indices for b in resumed] == rest
    other = BatchIterator(data, data, **{**mix, "corpora": [(15, 1.0), (25, 0.4)]})
    with pytest.raises(ValueError, match="corpora"):
        other.load_state_dict(state)


# -- cleaning ----------------------------------------------------------------------------------


def test_each_cleaning_rule_removes_what_it_should_and_nothing_else():
    pairs = [
        ("Hola mundo.", "Hello world."),  # kept
        ("hola mundo.", "hello world."),  # kept: differs from the first only in case
        ("Hola   mundo.", "Hello world. "),  # duplicate of the first after white space
        ("Jesús lloró.", "Jesús lloró."),  # copy
        ("Una frase del dev.", "A new sentence."),  # overlap: a dev source
        ("Otra frase.", "A test  target."),  # overlap: a test target
        ("12, 13 - 14.", "12, 13 - 14!"),  # junk: no letters
        ("Ver https://example.com/a/b/c/d/e", "See https://example.com/a/b/c/d/e"),  # junk: URL
        ("", "Nothing on one side."),  # empty
        ("Dijo 3 cosas.", "He said 3 things."),  # kept: a digit among words
    ]
    ds = datasets.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
    dev = datasets.Dataset.from_dict({"src": ["Una frase del dev."], "tgt": ["Something."]})
    test = datasets.Dataset.from_dict({"src": ["Algo."], "tgt": ["A test target."]})
    keep, removed = clean_mask(ds, Reference.of([dev, test]))
    assert keep.tolist() == [True, True, False, False, False, False, False, False, False, True]
    assert removed == {"empty": 1, "junk": 2, "copy": 1, "overlap": 2, "duplicate": 1}


@pytest.fixture(scope="module")
def tagged_tokenizer(tmp_path_factory, tiny_prefix):
    src = open(f"{tiny_prefix}.es", encoding="utf-8").read().splitlines()
    tgt = open(f"{tiny_prefix}.en", encoding="utf-8").read().splitlines()
    out = tmp_path_factory.mktemp("tagged")
    return train_tokenizer(src, tgt, out, vocab_size=120, seed=0, tags=["<bt>"])


def test_the_tag_is_one_reserved_piece_at_the_start_of_every_tagged_source(
    tagged_tokenizer, tiny_prefix
):
    tok = tagged_tokenizer
    assert list(tok.tags) == ["<bt>"]
    tag = tok.tag_id("<bt>")
    ids = tok.encode_src(["<bt> Y dijo Dios", "Y dijo Dios", "<bt>"])
    assert ids[0] == [tag, *ids[1]] and ids[2] == [tag]
    assert tok.src_id_pieces([tag]) == ["<bt>"]
    ds = load_corpus(tiny_prefix, "es", "en")
    filters = Filters(clean=False, max_len=500, max_len_ratio=None, tags=("<bt>",))
    tagged = prepare_corpus(ds, tok, filters, None, "tiny")
    plain = prepare_corpus(ds, tok, Filters(False, 500, None), None, "tiny")
    assert isinstance(tagged.src.values, np.memmap)  # read through the page cache
    assert len(tagged.src) == len(plain.src) == len(ds)
    for i in range(len(ds)):
        assert tagged.src[i].tolist() == [tag, *plain.src[i].tolist()]
        assert tagged.tgt[i].tolist() == plain.tgt[i].tolist()
    with pytest.raises(Exception, match="no tag '<nt>'"):
        prepare_corpus(ds, tok, Filters(False, 500, None, ("<nt>",)), None, "tiny")


def test_cleaning_and_encoding_run_once_then_come_from_the_cache(
    tagged_tokenizer, tiny_prefix, monkeypatch
):
    ds = load_corpus(tiny_prefix, "es", "en")
    filters = Filters(clean=True, max_len=150, max_len_ratio=1.1)
    first = prepare_corpus(ds, tagged_tokenizer, filters, Reference.of([]), "tiny")

    def no_work(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(prepared_module, "clean_mask", no_work)
    monkeypatch.setattr(prepared_module, "_encode_to_files", no_work)
    again = prepare_corpus(ds, tagged_tokenizer, filters, Reference.of([]), "tiny")
    assert again.counts == first.counts
    assert np.array_equal(again.src.values, first.src.values)
    assert first.counts["kept"] + sum(first.counts["removed"].values()) == len(ds)
    assert first.counts["removed"]["too_long"] > 0 and first.counts["removed"]["ratio"] > 0


# -- a run -------------------------------------------------------------------------------------


def run_config(tiny_prefix: str, train: str, *overrides: str):
    return load_config(
        "tiny",
        [
            f"data.train={train}",
            f"data.dev={tiny_prefix}-dev",
            "train.precision=fp32",
            "train.eval_every=0",
            *overrides,
        ],
    )


def trainer_for(config, out) -> Trainer:
    return Trainer(config, start_run(config, out, False), distributed.Dist(), torch.device("cpu"))


def test_a_list_of_one_corpus_trains_exactly_as_the_plain_spec(tmp_path, tiny_prefix):
    # One after the other: each trainer seeds the process's generators when it is made.
    plain = trainer_for(run_config(tiny_prefix, tiny_prefix, "train.max_steps=3"), tmp_path / "a")
    plain.fit()
    listed = trainer_for(
        run_config(tiny_prefix, f"[{{corpus: {tiny_prefix}}}]", "train.max_steps=3"),
        tmp_path / "b",
    )
    listed.fit()
    for (name, a), b in zip(plain.model.state_dict().items(), listed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_tagged_weighted_mix_reaches_the_model_and_reports_its_counts(tmp_path, tiny_prefix):
    from cli.commands.train import run_train

    mix = f'[{{corpus: {tiny_prefix}, weight: 2}}, {{corpus: {tiny_prefix}, tag: "<bt>"}}]'
    config = run_config(tiny_prefix, mix, "train.max_steps=1", "data.max_len=200")
    run_train(config, tmp_path / "run", resume=False)
    report = json.loads((tmp_path / "run" / "data.json").read_text())
    first, second = report["corpora"]
    assert first["tag"] is None and second["tag"] == "<bt>"
    assert first["kept"] == second["kept"] and first["per_epoch"] == 2 * first["kept"]
    assert first["read"] == first["kept"] + sum(first["removed"].values()) == 200
    assert set(first["removed"]) == {
        "empty", "junk", "copy", "overlap", "duplicate", "too_long", "ratio"
    }  # fmt: skip
    trainer = trainer_for(config, tmp_path / "again")
    tag = trainer.tokenizer.tag_id("<bt>")
    kept = first["kept"]
    firsts = Counter()
    for batch in trainer.data.train:  # one epoch
        for row, src, pad in zip(batch.indices, batch.src, batch.src_pad_mask):
            firsts[row >= kept] += 1
            assert (src[0].item() == tag) == (row >= kept)  # tagged rows, and only they
            assert (src[~pad] == tag).sum().item() == (row >= kept)
    assert firsts[False] == 2 * firsts[True] == 2 * kept


def test_temperature_shares_follow_the_formula_over_an_epoch(tmp_path, tiny_prefix):
    """data.temperature: corpus i makes a share of the epoch proportional to
    (weight_i x pairs_i) ** (1 / T), within 2%, the epoch keeping its size; data.json says
    each corpus's sampled weight; T = 1 leaves the weights as given."""
    from cli.commands.train import run_train

    small = tmp_path / "small"
    for lang in ("es", "en"):  # a corpus a quarter of the size of the other
        lines = (Path(f"{tiny_prefix}.{lang}").read_text(encoding="utf-8")).splitlines()
        Path(f"{small}.{lang}").write_text("\n".join(lines[:50]) + "\n", encoding="utf-8")
    mix = f"[{{corpus: {tiny_prefix}}}, {{corpus: {small}, weight: 2}}]"
    for temperature in (1, 5):
        config = run_config(
            tiny_prefix, mix, "train.max_steps=1", f"data.temperature={temperature}"
        )
        run = tmp_path / f"t{temperature}"
        run_train(config, run, resume=False)
        big, little = json.loads((run / "data.json").read_text())["corpora"]
        sizes = [1 * big["kept"], 2 * little["kept"]]
        tempered = [n ** (1 / temperature) for n in sizes]
        expected = [t / sum(tempered) for t in tempered]
        trainer = trainer_for(config, tmp_path / f"again{temperature}")
        seen = Counter(row >= big["kept"] for batch in trainer.data.train for row in batch.indices)
        total = seen[False] + seen[True]
        assert total == pytest.approx(sum(sizes), abs=2)  # the epoch keeps its size
        assert seen[True] / total == pytest.approx(expected[1], abs=0.02)
        assert little["per_epoch"] == seen[True] and big["per_epoch"] == seen[False]
        if temperature == 1:
            assert "sampled_weight" not in little and seen[True] == 2 * little["kept"]
        else:
            assert little["sampled_weight"] > 2 and big["sampled_weight"] < 1


def test_a_pool_of_processes_encodes_exactly_as_one_process(
    tagged_tokenizer, tiny_prefix, tmp_path, monkeypatch
):
    """Large corpora are encoded by forked processes, a block each; the ids, their order and
    the counts must be those of encoding in one process."""
    ds = load_corpus(tiny_prefix, "es", "en")
    ds = datasets.concatenate_datasets([ds, ds.select(range(0, 40, 3))])  # duplicates to clean
    filters = Filters(clean=True, max_len=40, max_len_ratio=1.5, tags=("<bt>",))
    one = prepare_corpus(ds, tagged_tokenizer, filters, None, "tiny")
    threads, pools = tagged_tokenizer.threads, []

    class Spied(prepared_module.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(prepared_module, "ProcessPoolExecutor", Spied)
    monkeypatch.setattr(prepared_module, "_processes", lambda rows: 2)
    monkeypatch.setattr(prepared_module, "_ENCODE_ROWS", 7)  # many blocks, in flight at once
    monkeypatch.setattr(prepared_module, "_cache_dir", lambda *args: tmp_path / "pooled")
    pooled = prepare_corpus(ds, tagged_tokenizer, filters, None, "tiny")
    assert pools and tagged_tokenizer.threads == threads  # a pool ran; the parent's are back
    assert pooled.counts == one.counts and one.counts["removed"]["ratio"] > 0
    assert one.counts["removed"]["duplicate"] > 0  # cleaning's mask applied block by block
    for side in ("src", "tgt"):
        assert np.array_equal(getattr(pooled, side).values, getattr(one, side).values)
        assert np.array_equal(getattr(pooled, side).offsets, getattr(one, side).offsets)
