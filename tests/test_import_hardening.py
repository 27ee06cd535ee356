"""`tf import` hardened (issue 56): a Marian model's generation settings, shapes and leftover
weights, half-precision files, two vocabularies with special ids of their own, sharded
pickles, the hint to import a Hugging Face directory, literal special tokens in text.

Stand-ins are built with transformers' own classes (`benchmarks.marian_standin`), no network.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_import import (
    BUNDLED,
    assert_same_logits,
    imported,
    quiet_transformers,
    small_standin,
)
from test_search import EOS, all_outputs, random_step, search, table_step

from benchmarks.marian_standin import TINY, make_standin
from cli.runs.checkpoint import load_checkpoint
from cli.runs.models import load_for_inference
from data.text import read_file_lines
from model.search import LengthPenalty

LINES = read_file_lines(BUNDLED / "dev.es")[:10]
FP32 = ("--set", "decode.precision=fp32")  # transformers computes in float32; tf's auto may not


def decisive_standin(tmp_path: Path, tiny_prefix: str, eos_bias: float = 2.0, **options) -> Path:
    """A tiny stand-in whose choices are clear-cut (weights of spread 0.2) and whose EOS (id 0)
    is likely enough, its output bias raised, that translations end at many lengths: the
    length penalty and the stopping rules decide them, not the length limit alone."""
    from safetensors.torch import load_file, save_file

    quiet_transformers()
    src = read_file_lines(Path(f"{tiny_prefix}.es"))
    tgt = read_file_lines(Path(f"{tiny_prefix}.en"))
    directory = make_standin(
        tmp_path / "standin", src, tgt, TINY, vocab_size=300, init_std=0.2, **options
    )
    weights = load_file(directory / "model.safetensors")
    weights["final_logits_bias"][0, 0] += eos_bias
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def generate(directory: Path, lines: list[str], **settings) -> list[list[int]]:
    """transformers' output ids for `lines` (the start token first), its own settings unless
    `settings` say otherwise."""
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(directory).eval()
    tokenizer = MarianTokenizer.from_pretrained(directory)
    with torch.no_grad():
        out = model.generate(**tokenizer(lines, return_tensors="pt", padding=True), **settings)
    return out.tolist()


def decoded(directory: Path, ids: list[list[int]]) -> list[str]:
    from transformers import MarianTokenizer

    return MarianTokenizer.from_pretrained(directory).batch_decode(ids, skip_special_tokens=True)


def output_tokens(row: list[int], eos: int) -> list[int]:
    """The tokens of one of `generate`'s rows: after the start token, before EOS."""
    tokens = row[1:]
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def edit_json(path: Path, **values) -> None:
    settings = json.loads(path.read_text())
    settings.update(values)
    path.write_text(json.dumps(settings))


# --------------------------------------------------- 7: the model's own generation settings

# The review's generation_config.json (with OPUS-MT's bad_words_ids and forced EOS).
REVIEWED = dict(
    num_beams=6, max_length=16, no_repeat_ngram_size=3, min_length=3, length_penalty=1.0
)
# Every other setting tf takes: new-token limits, early stopping, renormalised log-probabilities.
OTHERS = dict(
    num_beams=5,
    max_new_tokens=19,
    min_new_tokens=2,
    length_penalty=0.6,
    early_stopping=True,
    renormalize_logits=True,
    no_repeat_ngram_size=2,
)


def move_generation_to_config_json(directory: Path) -> None:
    """An older upload: no generation_config.json, its settings in config.json."""
    settings = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").unlink()
    bookkeeping = ("transformers_version", "_from_model_config")
    edit_json(
        directory / "config.json", **{k: v for k, v in settings.items() if k not in bookkeeping}
    )


@pytest.mark.parametrize(
    "settings, where, eos_bias",
    [
        (REVIEWED, "generation_config.json", 2.0),
        (OTHERS, "generation_config.json", 1.0),
        (REVIEWED, "config.json", 2.0),
    ],
    ids=["reviewed", "others", "older-config-json"],
)
def test_generation_settings_are_imported_so_translate_equals_generate(
    tmp_path, tiny_prefix, settings, where, eos_bias
):
    directory = decisive_standin(tmp_path, tiny_prefix, eos_bias, generation=settings)
    if where == "config.json":
        move_generation_to_config_json(directory)
    out = tmp_path / "run"
    result = tf("import", directory, "-o", out)
    assert result.exit_code == 0, result.output
    assert f"decoding as transformers' generate, from {where}" in result.output
    assert f"beam_size={settings['num_beams']} (num_beams {settings['num_beams']})" in result.output
    record = json.loads((out / "import.json").read_text())["generation"]
    assert record["from"] == where
    assert {"num_beams": settings["num_beams"]} in [item["from"] for item in record["imported"]]

    ours = tf("translate", out, *FP32, input="\n".join(LINES) + "\n")
    assert ours.exit_code == 0, ours.output
    theirs = generate(directory, LINES)  # no arguments: the model's own settings
    assert ours.stdout.splitlines() == decoded(directory, theirs)
    ends = {len(output_tokens(row, eos=0)) for row in theirs}
    assert len(ends) > 2  # outputs of several lengths, not all cut at the limit


def test_the_length_limits_count_as_transformers_counts_them(tmp_path, tiny_prefix):
    """max_length counts the start token and the EOS forced before it; min_length the start."""
    directory = decisive_standin(
        tmp_path, tiny_prefix, generation=dict(max_length=16, min_length=3)
    )
    decode = load_checkpoint(imported(directory, tmp_path) / "checkpoints" / "last.pt")
    decode = decode["config"]["decode"]
    assert (decode["max_len_a"], decode["max_len_b"], decode["min_len"]) == (0, 14, 2)
    assert (decode["length_penalty"], decode["length_penalty_form"]) == (1.0, "power")
    assert (decode["beam_stop"], decode["patience"], decode["score_forced_eos"]) == (
        "current_length",
        0,
        False,
    )
    longest = max(len(row) for row in generate(directory, LINES, num_beams=1, min_length=3))
    assert longest == 16  # the start token, 14 tokens, the forced EOS


def test_settings_without_an_equivalent_are_listed_with_why(tmp_path, tiny_prefix):
    settings = dict(repetition_penalty=1.2, num_return_sequences=2, bad_words_ids=[[5, 6]])
    directory = decisive_standin(tmp_path, tiny_prefix, generation=settings)
    out = tmp_path / "run"
    result = tf("import", directory, "-o", out)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("not imported: "))
    assert "repetition_penalty 1.2 (tf has no repetition penalty)" in line
    assert "num_return_sequences 2" in line
    assert "bad_words_ids [[5, 6]] (tf bans no token but <pad>)" in line  # <pad> itself: banned
    refused = json.loads((out / "import.json").read_text())["generation"]["not_imported"]
    assert {n["key"] for n in refused} == {
        "repetition_penalty",
        "num_return_sequences",
        "bad_words_ids",
    }
    assert all(n["why"] for n in refused)


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(num_beams="six"), "generation_config.json: num_beams must be a positive integer"),
        (dict(early_stopping="soon"), 'early_stopping must be true, false or "never"'),
        (dict(bad_words_ids=[["<pad>"]]), "bad_words_ids must be lists of token ids"),
    ],
    ids=["beams", "early-stopping", "bad-words"],
)
def test_a_bad_generation_setting_is_one_line(tmp_path, tiny_prefix, values, message):
    directory = small_standin(tmp_path, tiny_prefix)
    edit_json(directory / "generation_config.json", **values)
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(result, message)
    assert not (tmp_path / "run").exists()


# The search rules behind them, on hand-written step functions.


def power_outputs(step, max_len: int, vocab_size: int, alpha: float):
    """Every output of sentence 0 with its score log P / |Y| ** alpha, best first."""
    gnmt = all_outputs(step, 0, max_len, vocab_size, 0.0)  # alpha 0: the log-probabilities
    scored = [(tokens, log_p / (len(tokens) + 1) ** alpha) for tokens, log_p in gnmt]
    return sorted(scored, key=lambda pair: pair[1], reverse=True)


@pytest.mark.parametrize("alpha", [0.6, 1.0, 2.0])
def test_a_beam_holding_every_prefix_is_exact_with_the_power_penalty(alpha):
    step, vocab_size, max_len, nbest = random_step(vocab_size=6), 6, 3, 5
    lp = LengthPenalty(alpha, power=True)
    (hyps,) = search(step, 1, [max_len], beam_size=150, length_penalty=lp, nbest=nbest, patience=0)
    best = power_outputs(step, max_len, vocab_size, alpha)[:nbest]
    assert [h.tokens for h in hyps] == [tokens for tokens, _ in best]
    assert [h.score for h in hyps] == pytest.approx([score for _, score in best])
    assert LengthPenalty(alpha, power=True)(4) == pytest.approx(4**alpha)


def test_current_length_stops_where_transformers_estimate_does():
    # [] finishes first (log 0.5 = -0.69), then [4] (log 0.27 / 2 = -0.65): beam_size 2 of
    # them. The live [4 4] has log 0.1575 = -1.85: at its 2 tokens -0.92, worse than the worst
    # finished, so transformers' estimate stops with [4]. Bounded at its longest (-1.85 / 6) it
    # can still win, and does: [4 4] ends with log 0.99, (-1.85 - 0.01) / 3 = -0.62.
    table = {(): {EOS: 0.5, 4: 0.45}, (4,): {EOS: 0.6, 4: 0.35}, (4, 4): {EOS: 0.99}}
    step = table_step(table, vocab_size=6)
    lp = LengthPenalty(1.0, power=True)
    options = dict(beam_size=2, length_penalty=lp, patience=0.0)
    ((estimated,),) = search(step, 1, [5], beam_stop="current_length", **options)
    ((bounded,),) = search(step, 1, [5], beam_stop="bound", **options)
    assert estimated.tokens == [4] and estimated.score == pytest.approx(math.log(0.27) / 2)
    assert bounded.tokens == [4, 4]
    assert bounded.score == pytest.approx(math.log(0.45 * 0.35 * 0.99) / 3)


def test_a_forced_eos_counts_as_certain_without_score_forced_eos():
    table = {(): {4: 0.9}, (4,): {4: 0.9}, (4, 4): {4: 0.9, EOS: 0.01}}
    step = table_step(table, vocab_size=6)
    (counted,) = search(step, 1, [2])
    (certain,) = search(step, 1, [2], score_forced_eos=False)
    assert counted.tokens == certain.tokens == [4, 4]
    assert counted.log_prob == pytest.approx(math.log(0.81 * 0.01))
    assert certain.log_prob == pytest.approx(math.log(0.81))


def test_renormalize_shares_out_what_the_rules_forbid():
    # min_len 1 forbids EOS (0.5) at the first step: 4 (0.3) is then 0.6 of what is left.
    table = {(): {EOS: 0.5, 4: 0.3, 5: 0.19}, (4,): {EOS: 0.9}}
    step = table_step(table, vocab_size=6)
    (plain,) = search(step, 1, [3], min_len=1)
    (renormalized,) = search(step, 1, [3], min_len=1, renormalize=True)
    assert plain.tokens == renormalized.tokens == [4]
    assert plain.log_prob == pytest.approx(math.log(0.3 * 0.9))
    assert renormalized.log_prob == pytest.approx(math.log(0.6 * 0.9))


def test_ctranslate2_ranks_by_the_power_penalty_as_tf(tmp_path, tiny_prefix):
    """An imported run's length penalty in CTranslate2's engine; the stopping rule it cannot
    run (transformers' estimate) is its own at export (said there), and refused in one line
    when asked for again."""
    run = imported(decisive_standin(tmp_path, tiny_prefix, generation=REVIEWED), tmp_path)
    ct2 = tmp_path / "ct2"
    exported = tf("export", run, "--to", "ctranslate2", "-o", ct2)
    assert exported.exit_code == 0, exported.output
    assert "decode.beam_stop: 'current_length' -> 'bound'" in exported.stdout
    text = "\n".join(LINES) + "\n"
    refused = tf("translate", ct2, *FP32, "--set", "decode.beam_stop=current_length", input=text)
    assert_user_error(refused, "decode.beam_stop current_length", "--set decode.beam_stop=bound")
    # CTranslate2's own rules: a sentence ends once beam_size hypotheses have (patience 1);
    # what its bans forbid (min length, n-grams) is shared out by its softmax (renormalize).
    rules = ["beam_stop=bound", "patience=1", "max_len_b=30", "renormalize=true"]
    sets = [x for rule in rules for x in ("--set", f"decode.{rule}")]
    found = []
    for model in (run, ct2):
        result = tf("translate", model, *FP32, *sets, "--nbest", "3", "--scores", input=text)
        assert result.exit_code == 0, result.output
        found.append([line.split(" ||| ") for line in result.stdout.splitlines()])
    ours, theirs = found
    assert [text for _, text, _ in theirs] == [text for _, text, _ in ours]
    for (*_, a), (*_, b) in zip(theirs, ours, strict=True):
        assert float(a) == pytest.approx(float(b), abs=2e-4)  # float32 sums, 4 decimals


# ---------------------------------------------------------------- 11, 12: shapes and leftovers


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(d_model=64), "has the shape [32], where config.json's model has [64] (d_model,"),
        (dict(encoder_ffn_dim=128, decoder_ffn_dim=128), "fc1.bias has the shape [64], where"),
    ],
    ids=["d_model", "ffn"],
)
def test_every_shape_that_does_not_fit_config_json_is_one_line(
    tmp_path, tiny_prefix, values, message
):
    directory = small_standin(tmp_path, tiny_prefix)
    edit_json(directory / "config.json", **values)
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(result, message)
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def test_a_tensor_of_another_shape_is_named(tmp_path, tiny_prefix):
    from safetensors.torch import load_file, save_file

    directory = small_standin(tmp_path, tiny_prefix)
    weights = load_file(directory / "model.safetensors")
    name = "model.decoder.layers.1.fc2.weight"
    weights[name] = weights[name].T.contiguous()  # (64, 32): transposed
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(result, f"{name} has the shape [64, 32], where config.json's model has")


def test_leftover_weights_are_refused_naming_them(tmp_path, tiny_prefix):
    directory = small_standin(tmp_path, tiny_prefix)  # 2+2 layers
    edit_json(directory / "config.json", decoder_layers=1)
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(
        result,
        "26 tensor(s) that config.json's model does not use: model.decoder.layers.1.",
        "the weights hold 2 decoder layers, config.json's decoder_layers is 1",
    )
    assert not (tmp_path / "run").exists()


def test_a_tensor_of_no_known_name_is_refused(tmp_path, tiny_prefix):
    from safetensors.torch import load_file, save_file

    directory = small_standin(tmp_path, tiny_prefix)
    weights = load_file(directory / "model.safetensors")
    weights["model.encoder.layernorm_embedding.weight"] = torch.ones(TINY["d_model"])
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(result, "does not use: model.encoder.layernorm_embedding.weight")


# ------------------------------------------------------- 13: half precision, sinusoids kept


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_weights_keeping_their_sinusoids_import(tmp_path, tiny_prefix, dtype):
    """A file in fp16 or bf16 whose position tables are Marian's sinusoids, rounded to its
    dtype: imported, its weights those of the file; learned tables are still refused."""
    from safetensors.torch import load_file, save_file

    from model.transformer import sinusoidal_positions

    directory = small_standin(tmp_path, tiny_prefix)
    weights = {k: v.to(dtype) for k, v in load_file(directory / "model.safetensors").items()}
    table = sinusoidal_positions(TINY["max_position_embeddings"], TINY["d_model"], "halves")
    for stack in ("encoder", "decoder"):
        weights[f"model.{stack}.embed_positions.weight"] = table.to(dtype)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    run = imported(directory, tmp_path)
    model, _, _ = load_for_inference(run, torch.device("cpu"))
    shared = weights["model.shared.weight"].float()
    assert torch.equal(model.src_embed.token.weight.detach(), shared)

    noise = torch.randn(table.shape, generator=torch.Generator().manual_seed(0)) * 0.05
    weights["model.encoder.embed_positions.weight"] = (table + noise).to(dtype)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    refused = tf("import", directory, "-o", tmp_path / "learned")
    assert_user_error(refused, "model.encoder.embed_positions are not Marian's sinusoids")


# ----------------------------------------------- 14: two vocabularies, special ids of their own


def test_separate_vocabularies_with_their_own_special_ids_equal_transformers(tmp_path, tiny_prefix):
    """vocab.json's <pad> 299 (300 pieces), target_vocab.json's 599 (600): transformers pads
    both embeddings with the smaller and starts the decoder from the target's. tf reads each
    side's ids: sources end in the source's EOS and are padded with its pad, the decoder
    starts from (and never outputs) the target's, and fine-tuning batches both."""
    directory = decisive_standin(tmp_path, tiny_prefix, separate=True, target_vocabulary=600)
    vocab = json.loads((directory / "vocab.json").read_text())
    target_vocab = json.loads((directory / "target_vocab.json").read_text())
    assert (vocab["<pad>"], target_vocab["<pad>"]) == (299, 599)
    run = imported(directory, tmp_path)
    model, tokenizer, _ = load_for_inference(run, torch.device("cpu"))
    assert (tokenizer.src_pad_id, tokenizer.pad_id) == (299, 599)
    assert model.src_embed.token.padding_idx == 299 and model.tgt_embed.token.padding_idx == 599

    tgt = read_file_lines(BUNDLED / "dev.en")[:10]
    assert_same_logits(directory, run, LINES, tgt)  # sources of several lengths: padded
    greedy = ("--greedy", "--set", "decode.max_len_b=12", *FP32)
    ours = tf("translate", run, *greedy, input="\n".join(LINES) + "\n")
    assert ours.exit_code == 0, ours.output
    theirs = generate(directory, LINES, num_beams=1, max_new_tokens=13)
    # Their decode skips the source's special ids (its id 299 is a target word here): ours
    # decodes their ids.
    expected = tokenizer.decode_tgt([output_tokens(row, tokenizer.eos_id) for row in theirs])
    assert ours.stdout.splitlines() == expected
    beam = tf("translate", run, *FP32, input="\n".join(LINES) + "\n")  # the imported beam 4
    assert beam.stdout.splitlines() == tokenizer.decode_tgt(
        [output_tokens(row, tokenizer.eos_id) for row in generate(directory, LINES)]
    )
    # Exported again: one pad id both embeddings hold (the smaller, as transformers has it).
    hf = tmp_path / "hf"
    again = tf("export", run, "--to", "huggingface", "-o", hf)
    assert again.exit_code == 0, again.output
    assert json.loads((hf / "config.json").read_text())["pad_token_id"] == 299
    assert_same_logits(hf, run, LINES, tgt)
    assert generate(hf, LINES, num_beams=1, max_new_tokens=13) == theirs

    short = ["--set", "train.max_steps=1", "--set", "train.max_tokens=256"]
    short += ["--set", "train.eval_bleu_sentences=4"]
    data = ["--set", f"data.train={tiny_prefix}", "--set", f"data.dev={tiny_prefix}-dev"]
    tuned = tf("train", "finetune", "--init", run, "--out", tmp_path / "ft", *data, *short)
    assert tuned.exit_code == 0, tuned.output


# --------------------------------------------------------------- 15: sharded pytorch_model.bin


def shard(weights: dict[str, torch.Tensor], directory: Path, pattern: str, index: str) -> None:
    """`weights` in three files named by `pattern` (its shard number, the count), with the
    index transformers writes beside them."""
    names = sorted(weights)
    parts = [names[i::3] for i in range(3)]
    weight_map = {}
    for n, part in enumerate(parts, 1):
        name = pattern.format(n, len(parts))
        torch.save({k: weights[k] for k in part}, directory / name)
        weight_map |= dict.fromkeys(part, name)
    (directory / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_weights_import_as_the_single_file(tmp_path, tiny_prefix):
    """pytorch_model-0000N-of-0000M.bin with its index, each read with weights_only=True, and
    sharded safetensors (save_pretrained's own): the same weights as one file."""
    from safetensors.torch import load_file
    from transformers import MarianMTModel

    directory = small_standin(tmp_path, tiny_prefix)
    single = load_checkpoint(imported(directory, tmp_path) / "checkpoints" / "last.pt")["model"]
    weights = load_file(directory / "model.safetensors")

    MarianMTModel.from_pretrained(directory).save_pretrained(directory, max_shard_size="40KB")
    assert (directory / "model.safetensors.index.json").is_file()
    (directory / "model.safetensors").unlink()
    sharded = tmp_path / "safetensors-shards"
    assert tf("import", directory, "-o", sharded).exit_code == 0

    for path in directory.glob("model*.safetensors*"):
        path.unlink()
    shard(weights, directory, "pytorch_model-{:05d}-of-{:05d}.bin", "pytorch_model.bin.index.json")
    pickled = tmp_path / "pickled-shards"
    result = tf("import", directory, "-o", pickled)
    assert result.exit_code == 0, result.output
    assert json.loads((pickled / "import.json").read_text())["weights"] == (
        "pytorch_model.bin.index.json"
    )
    for run in (sharded, pickled):
        again = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
        assert all(torch.equal(tensor, again[name]) for name, tensor in single.items())


def test_a_shard_that_would_run_code_is_refused(tmp_path, tiny_prefix):
    import os
    import pickle

    from safetensors.torch import load_file

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {directory / 'pwned'}",))

    directory = small_standin(tmp_path, tiny_prefix)
    weights = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    shard(weights, directory, "pytorch_model-{:05d}-of-{:05d}.bin", "pytorch_model.bin.index.json")
    (directory / "pytorch_model-00002-of-00003.bin").write_bytes(pickle.dumps({"x": Evil()}))
    result = tf("import", directory, "-o", tmp_path / "run")
    assert_user_error(result, "pytorch_model-00002-of-00003.bin: not loadable as plain weights")
    assert not (directory / "pwned").exists() and not (tmp_path / "run").exists()


# ------------------------------------------------- 17: a Hugging Face directory is not a run


def test_a_hugging_face_directory_says_to_import_it(tmp_path, tiny_prefix):
    directory = small_standin(tmp_path, tiny_prefix)
    hint = ("a Hugging Face model", f"`tf import {directory} -o RUN` makes it one")
    assert_user_error(tf("translate", directory, input="hola\n"), *hint)
    init = tf("train", "finetune", "--init", directory, "--out", tmp_path / "ft")
    assert_user_error(init, *hint)
    assert not (tmp_path / "ft").exists()


# ---------------------------------------------------------- 18: literal special tokens are text


def test_literal_special_tokens_in_text_are_text(tmp_path, tiny_prefix):
    """MarianTokenizer reads "</s>" in a line as its EOS id (and "<unk>", "<pad>" as theirs):
    a user's text would end mid-source. tf cuts them into pieces like any other word: the
    only EOS is the last id, no <pad> appears, and the ids are SentencePiece's pieces."""
    from transformers import MarianTokenizer

    directory = small_standin(tmp_path, tiny_prefix)
    run = imported(directory, tmp_path)
    _, ours, _ = load_for_inference(run, torch.device("cpu"))
    line = "Y dijo </s> Dios: <unk> sea la <pad> luz"
    (ids,) = ours.encode_src([line])
    assert ids[-1] == ours.eos_id and ours.eos_id not in ids[:-1] and ours.pad_id not in ids
    vocabulary = ours.src_vocab  # "<", "/", ">"... as SentencePiece cuts them ("<" is <unk>)
    assert ids[:-1] == [vocabulary.get(p, ours.unk_id) for p in ours.src_pieces(line)]
    (theirs,) = MarianTokenizer.from_pretrained(directory)([line])["input_ids"]
    assert theirs.count(ours.eos_id) == 2  # theirs: an EOS in mid-source
    result = tf("translate", run, "--greedy", "--set", "decode.max_len_b=4", input=line + "\n")
    assert result.exit_code == 0 and result.stdout.strip()
