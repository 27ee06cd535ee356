"""Languages on both sides (issue 57, item 4): the source says its own language and the
decoder is made to write the target language's token first (`data.lang_token_side: target`,
NLLB-200's, M2M100's and mBART-50's layout), `--from` beside `--to`."""

from __future__ import annotations

import json

import pytest
import torch
from test_cli import assert_user_error, tf
from test_search import BOS, random_step, search

from cli.config import load_config
from model.search import Prefix

TARGET_SIDE = "data.lang_token_side=target"


def test_a_certain_prefix_token_counts_nothing_in_the_score():
    """transformers' forced_bos_token_id: the forced token's log-probability is 0, so that
    hypotheses rank as the model's own choices after it; a user's prefix keeps its own."""
    step = random_step(vocab_size=7)
    tokens = torch.tensor([[5], [6]])
    certain = search(step, 2, [6, 6], prefix=Prefix(tokens, certain=1))
    counted = search(step, 2, [6, 6], prefix=tokens)
    for b, (a, c) in enumerate(zip(certain, counted)):
        first = step(torch.tensor([BOS]), torch.tensor([[b]]))[0][0, tokens[b, 0]].item()
        assert a.tokens == c.tokens and a.tokens[0] == tokens[b, 0]
        assert a.log_prob == pytest.approx(c.log_prob - first)
    beams = search(step, 2, [6, 6], 3, prefix=Prefix(tokens, certain=1))
    assert all(h.tokens[0] == tokens[b, 0] for b, hyps in enumerate(beams) for h in hyps)


def test_target_side_tokens_in_the_data_section():
    d = load_config("bidirectional", [TARGET_SIDE]).data
    assert [d.source_prefix(c) for c in d.corpora()] == [["<2es>"], ["<2en>"]]  # their own
    assert [d.target_prefix(c) for c in d.corpora()] == [["<2en>"], ["<2es>"]]  # forced first
    one_way = load_config("tiny", [TARGET_SIDE]).data  # a token even for one target language
    assert one_way.lang_tokens() == {"en": "<2en>"} and one_way.source_tokens() == {"es": "<2es>"}
    assert one_way.tags() == ["<2en>", "<2es>"]
    source_side = load_config("bidirectional").data
    assert [source_side.target_prefix(c) for c in source_side.corpora()] == [[], []]


@pytest.fixture(scope="module")
def both_sides(tiny_prefix, tmp_path_factory):
    """A tiny es<->en run whose sources say their own language and whose decoder writes the
    target's token first (NLLB's layout, trained from scratch)."""
    from test_multilingual import both_ways

    run = tmp_path_factory.mktemp("both_sides") / "run"
    result = tf("train", "tiny", "--out", run, *both_ways(tiny_prefix), "--set", TARGET_SIDE)
    assert result.exit_code == 0, result.output
    return run


def test_a_target_side_run_trains_validates_and_translates_with_to_and_from(both_sides):
    from cli.inference.engines import load_engine

    metrics = [json.loads(line) for line in (both_sides / "metrics.jsonl").read_text().splitlines()]
    assert any("dev_bleu/en-es" in m for m in metrics)  # validated with the forced token
    engine = load_engine(str(both_sides), torch.device("cpu"), ["decode.beam_size=1"], to="es")
    ((src_ids, hyps),) = engine.stream(["In the beginning"], "x")
    tok = engine.tokenizer
    assert src_ids[0] == tok.tags["<2en>"]  # the source says it is English
    assert hyps[0].tokens[0] == tok.tgt_piece_ids(["<2es>"])[0]  # the decoder wrote es first
    assert "<2" not in tok.decode_tgt([hyps[0].tokens])[0]  # and it decodes to nothing
    out = tf("translate", both_sides, "--to", "es", "--from", "en", "--greedy", input="Hello\n")
    assert out.exit_code == 0, out.output
    assert "<2" not in out.stdout
    # Into es the model reads English alone: that is the source's language unless said.
    alone = tf("translate", both_sides, "--to", "es", "--greedy", input="Hello\n")
    assert alone.stdout == out.stdout
    assert_user_error(tf("translate", both_sides, "--from", "fr", "--to", "es"), "reads", "'fr'")
    line = json.dumps({"text": "Hola", "to": "en", "from": "es"})
    jsonl = tf("translate", both_sides, "--input-format", "jsonl", "--greedy", input=line + "\n")
    assert jsonl.exit_code == 0, jsonl.output


def test_a_from_of_the_wrong_kind_is_one_line(both_sides):
    line = json.dumps({"text": "Hola", "to": "en", "from": 3})
    result = tf("translate", both_sides, "--input-format", "jsonl", input=line + "\n")
    assert_user_error(result, "<stdin>:1", '"from" must be a language code')


def test_distill_of_a_target_side_teacher_reads_the_corpora_of_its_from(both_sides, tmp_path):
    """Its sources must say their language: it reads those of --from into --to alone."""
    out = tmp_path / "d"
    result = tf("distill", both_sides, "--out", out, "--to", "es", "--beam", "1")
    assert result.exit_code == 0, result.output
    assert "(en-es)" in json.loads((out / "distill.json").read_text())["corpus"][0]
    assert (out / "train.en").is_file() and (out / "train.es").is_file()


def test_a_model_reading_several_languages_into_one_asks_for_from(tiny_prefix, tmp_path):
    """Into en it reads es and fr, and records no default: a line that says nothing of its
    language is refused in one line asking for --from; with --from it translates."""
    import shutil

    prefix = tmp_path / "pairs"
    for lang, into in (("es", "es"), ("es", "fr"), ("en", "en")):
        shutil.copyfile(f"{tiny_prefix}.{lang}", f"{prefix}.{into}")
    both = ", ".join(f'{{corpus: "{prefix}", src_lang: {s}, tgt_lang: en}}' for s in ("es", "fr"))
    run = tmp_path / "run"
    trained = tf(
        "train", "tiny", "--out", run, "--set", f"data.train=[{both}]", "--set", TARGET_SIDE,
        "--set", "train.max_steps=1", "--set", "train.eval_bleu_sentences=2",
        "--set", "data.clean=false",  # the fixture is the head of the dev set
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    asked = tf("translate", run, "--to", "en", "--greedy", input="Hola\n")
    assert_user_error(asked, "--from", "es", "fr")
    assert asked.stdout == ""
    said = tf("translate", run, "--from", "fr", "--to", "en", "--greedy", input="Hola\n")
    assert said.exit_code == 0, said.output
