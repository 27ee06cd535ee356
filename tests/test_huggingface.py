"""`tf export --to huggingface`, drop-in: loaded as any translation model is (`AutoTokenizer`,
`AutoModelForSeq2SeqLM`, `generate(**tokenizer(lines, padding=True))`, nothing else), it gives
`tf translate --greedy`'s output; and its model card says what a Hub reader needs."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_cli import tf
from test_export import SENTENCES, ending, exported, ours, sharp  # noqa: F401 - fixtures

from cli.inference.decoding import encode_sources, translate_ids
from cli.inference.engines import length_limit
from cli.runs.checkpoint import load_checkpoint, save_atomic
from cli.runs.models import load_for_inference

# Lines of several lengths, in one padded batch.
LINES = [
    *SENTENCES,
    "La tierra",
    "Y fue la tarde y la mañana el día primero.",
    "Y llamó Dios a la luz Día, y a las tinieblas llamó Noche.",
]


def with_decode(run: Path, out: Path, **decode) -> Path:
    """A copy of `run` whose checkpoint's config has these decode settings."""
    shutil.copytree(run, out)
    path = out / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    ckpt["config"]["decode"].update(decode)
    save_atomic(ckpt, path)
    return out


def drop_in(directory: Path, lines: list[str]) -> list[str]:
    """What a `transformers` user runs, with no knowledge of tf."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSeq2SeqLM.from_pretrained(directory)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    return tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)


def tf_greedy(run: Path, lines: list[str]) -> list[str]:
    result = tf(
        "translate",
        run,
        "--greedy",
        "--set",
        "decode.precision=fp32",
        input="\n".join(lines) + "\n",
    )
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_the_export_translates_as_tf_greedy(ending, tmp_path_factory):  # noqa: F811
    """With a length limit that is one number (decode.max_len_a 0), every line: those that end
    and those cut at the limit."""
    run = with_decode(
        ending, tmp_path_factory.mktemp("uniform") / "run", max_len_a=0.0, max_len_b=12
    )
    directory = exported(run, "huggingface", tmp_path_factory)
    assert drop_in(directory, LINES) == tf_greedy(run, LINES)
    lengths = {len(t) for t in ours(run, beam_size=1, max_len_a=0.0, max_len_b=12)}
    assert len(lengths) > 1 and 12 in lengths  # some ended, some were cut


def test_the_export_translates_as_tf_greedy_what_tf_ends(ending, tmp_path_factory):  # noqa: F811
    """With tf's per-sentence limit (a * len(src) + b): every line that tf ends before it."""
    directory = exported(ending, "huggingface", tmp_path_factory)
    model, tok, config = load_for_inference(ending, torch.device("cpu"))
    src = encode_sources(tok, SENTENCES, model.config.max_positions, "test", 1)
    ended = [
        i
        for i, (ids, out) in enumerate(zip(src, ours(ending, beam_size=1)))
        if len(out) < int(config.decode.max_len_a * len(ids) + config.decode.max_len_b)
    ]
    assert ended  # the comparison below compares something
    got, expected = drop_in(directory, SENTENCES), tf_greedy(ending, SENTENCES)
    assert [got[i] for i in ended] == [expected[i] for i in ended]


def test_the_tokenizer_gives_the_model_what_tf_gives_it(sharp, tiny_prefix, tmp_path_factory):  # noqa: F811
    from transformers import AutoTokenizer

    directory = exported(sharp, "huggingface", tmp_path_factory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    _, tok, _ = load_for_inference(sharp, torch.device("cpu"))
    moved = tokenizer.convert_tokens_to_ids(tok.src_vocabulary())  # tf's id -> the export's

    def exported_ids(rows: list[list[int]]) -> list[list[int]]:
        return [[moved[i] for i in row] for row in rows]

    lines = Path(f"{tiny_prefix}.es").read_text().splitlines() + [" a  b ", "<s> </s>", "ﬁ ①"]
    assert tokenizer(lines)["input_ids"] == exported_ids(tok.encode_src(lines))  # nothing added
    ids = tok.encode_tgt(Path(f"{tiny_prefix}.en").read_text().splitlines())
    (space,) = tok.tgt_piece_ids(["▁"])
    ids += [[5, 6], [space, space, 30]]  # leading "▁"s
    decoded = tokenizer.batch_decode(exported_ids(ids), skip_special_tokens=True)
    assert decoded == tok.decode_tgt(ids)
    # `<unk>` is named (CTranslate2's converter needs it), so `skip_special_tokens` drops it,
    # as it does with OPUS-MT's MarianTokenizer, where tf writes " ⁇ ".
    unknown = [[tok.unk_id, 5, 6], [7, tok.unk_id]]
    decoded = tokenizer.batch_decode(exported_ids(unknown), skip_special_tokens=True)
    assert decoded == tok.decode_tgt([[5, 6], [7]])
    assert not any(f.name.endswith(".spm") for f in directory.iterdir())  # no MarianTokenizer


def test_the_model_card_says_what_a_hub_reader_needs(trained, tiny_prefix, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    card = export_card(run, tmp_path / "plain")
    assert card.startswith("---\nlanguage:\n- es\n- en\n")  # Hub metadata
    assert "AutoTokenizer.from_pretrained" in card and "AutoModelForSeq2SeqLM" in card
    assert f"`{Path(tiny_prefix).name}`" in card and "d_model 32" in card  # by its name
    assert "Not evaluated" in card
    scores = tf(
        "eval",
        run,
        "--src",
        f"{tiny_prefix}.es",
        "--ref",
        f"{tiny_prefix}.en",
        "--greedy",
        "--json",
        "--limit",
        "10",
    )
    assert scores.exit_code == 0, scores.output
    (run / "eval.json").write_text(scores.stdout)
    card = export_card(run, tmp_path / "scored")
    bleu = json.loads(scores.stdout)
    assert f"| BLEU | {bleu['bleu']:.2f} | `{bleu['bleu_signature']}` |" in card
    assert "chrF" in card and "10 test sentences" in card
    # Scores older than the checkpoint are not this model's.
    best = run / "checkpoints" / "best.pt"
    later = time.time() + 10
    os.utime(best, (later, later))
    assert "Not evaluated" in export_card(run, tmp_path / "stale")


def export_card(run: Path, out: Path) -> str:
    result = tf("export", run, "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    return (out / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_fast_tokenizers_of_other_sentencepiece_models(tiny_prefix, tmp_path, kind):
    """Unigram models, byte fallback and reserved tags encode and decode as SentencePiece."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    from cli.exporters.hf_tokenizer import write_tokenizer
    from data.tokenizer import train_tokenizer

    src = Path(f"{tiny_prefix}.es").read_text().splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text().splitlines()
    tok = train_tokenizer(
        src,
        tgt,
        tmp_path / "tok",
        vocab_size=400,
        seed=0,
        model_type=kind,
        byte_fallback=True,
        tags=["<bt>"],
    )
    write_tokenizer(tok, tmp_path / "hf", 256)
    fast = AutoTokenizer.from_pretrained(tmp_path / "hf")
    sp = spm.SentencePieceProcessor(model_file=str(tok.model_paths()[0]))
    lines = src + tgt + ["日本語 😀", "  a  ", ""]
    assert fast(lines)["input_ids"] == [sp.encode(line) for line in lines]
    # A tag is its id alone, wherever it stands, as tf encodes it (SentencePiece would put a
    # lone "▁" before it, which no training pair has).
    tagged = ["x<bt>y <bt> z", "<bt> a", " <bt>  <bt> b", "<bt>", "<bt>a", "<bt><bt>b c"]
    assert fast(tagged)["input_ids"] == tok.encode_src(tagged)
    assert tok.encode_src(["<bt> a"])[0] == [tok.tags["<bt>"], *sp.encode("a")]
    ids = [sp.encode(line) for line in lines]
    assert fast.batch_decode(ids, skip_special_tokens=True) == [sp.decode(i) for i in ids]


# ------------------------------------------------------- item 4: a language token without a space


def test_a_leading_language_token_without_a_space_encodes_as_with_one(tiny_prefix, tmp_path):
    """Item 4: `<2en>Y dijo` is `<2en> Y dijo`, as training encodes it: the tag's id, then the
    rest of the line encoded as a sentence of its own (its first word keeps its "▁")."""
    from transformers import AutoTokenizer

    from cli.config import load_config
    from cli.families.marian import export_marian
    from cli.runs.models import build_model
    from data.tokenizer import train_tokenizer

    src = Path(f"{tiny_prefix}.es").read_text().splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text().splitlines()
    tok = train_tokenizer(
        src, tgt, tmp_path / "tok", vocab_size=120, seed=0, tags=["<2en>", "<2es>", "<bt>"]
    )
    config = load_config("tiny")
    export_marian(build_model(config, tok), tok, config, tmp_path / "hf")
    fast = AutoTokenizer.from_pretrained(tmp_path / "hf")

    def ids(line: str) -> list[int]:
        return fast(line)["input_ids"]

    en, bt = fast.convert_tokens_to_ids(["<2en>", "<bt>"])
    assert ids("<2en>Y dijo") == ids("<2en> Y dijo") == [en, *ids("Y dijo")]
    assert ids("  <2en>   Y dijo ") == [en, *ids("Y dijo")]
    assert ids("<2en><bt>Y dijo") == ids("<2en> <bt> Y dijo") == [en, bt, *ids("Y dijo")]
    assert fast.convert_ids_to_tokens(ids("<2en>Y"))[1].startswith("▁")
    assert ids("<2en>") == [en]
    lines = ["<2en>Y dijo", "<2en> <bt>Y", " <2es>x<bt>y <bt> z", "<2en>", "a <2en>b", "a<bt>"]
    exported_ids = fast.convert_tokens_to_ids(tok.src_vocabulary())  # tf's id -> the export's
    expected = [[exported_ids[i] for i in row] for row in tok.encode_src(lines)]
    assert [ids(line) for line in lines] == expected  # as `tf translate` encodes them


# ------------------------------------------- item 19: CTranslate2's own converter takes the export

# 100 lines of several lengths, as a user's test set.
HUNDRED = Path(__file__).parent.joinpath("fixtures", "tiny.es").read_text().splitlines()[:100]


@pytest.fixture(scope="module")
def pad_start(sharp, tmp_path_factory) -> Path:  # noqa: F811
    """`sharp` with a decoder that starts from pad (OPUS-MT's, `model.decoder_start: pad`),
    whose embedding row is zero as tf initialises it and as the converter assumes; and an EOS
    row along the way the decoder's states drift from its first steps to later ones, so that
    some outputs end after a few tokens and others run to the length limit."""
    from cli.runs.checkpoint import config_from_checkpoint
    from cli.runs.models import build_model

    run = tmp_path_factory.mktemp("pad_start") / "run"
    shutil.copytree(sharp, run)
    path = run / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    ckpt["config"]["model"]["decoder_start"] = "pad"
    model, tok, config = load_for_inference(sharp, torch.device("cpu"))
    model = build_model(config_from_checkpoint(ckpt, path), tok).eval()
    model.load_state_dict(ckpt["model"])
    assert not model.tgt_embed.token.weight[tok.pad_id].any()  # tf's pad row: zero
    states: list[torch.Tensor] = []  # (N, D) each step: what the output layer reads
    hook = model.generator.register_forward_hook(
        lambda _, x, y: states.append(x[0].reshape(-1, x[0].size(-1)))
    )
    ids = encode_sources(tok, HUNDRED, model.config.max_positions, "test", 1)
    decode = replace(config.decode, beam_size=1, max_len_a=0.0, max_len_b=12, precision="fp32")
    translate_ids(model, tok, ids, decode, torch.device("cpu"))
    hook.remove()
    drift = torch.cat(states[6:12]).mean(0) - torch.cat(states[:3]).mean(0)  # (D,)
    with torch.no_grad():
        model.generator.weight[tok.eos_id] = drift / drift.norm() * 12
    save_atomic({**ckpt, "model": model.state_dict()}, path)
    return run


def converted(hf: Path, out: Path):
    """What every OPUS-MT user runs: CTranslate2's own converter, `ct2-transformers-converter
    --model hf --output_dir out`, then its Translator."""
    import ctranslate2

    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out))
    return ctranslate2.Translator(str(out))


def ct2_tokens(translator, run: Path, lines: list[str], **decode) -> list[list[int]]:
    """tf's search settings run by CTranslate2 (tf's own engine code), tf's ids out."""
    from cli.inference.engines import translate_ids_ct2

    model, tok, config = load_for_inference(run, torch.device("cpu"))
    config = replace(config, decode=replace(config.decode, **decode))
    ids = encode_sources(tok, lines, model.config.max_positions, "test", 1)
    return [h[0].tokens for h in translate_ids_ct2(translator, tok, ids, config)]


def test_the_export_converts_with_ctranslate2s_converter_and_translates_as_tf(
    pad_start, tmp_path_factory
):
    """Item 19: `<pad>` last and the decoder from a zero `<pad>`, as CTranslate2's Marian
    loader assumes. On 100 lines, greedy: token for token as `tf translate` (each sentence's own
    length limit: some outputs end, others are cut there), and `generate` as before. Beam: the
    converter's model is tf's own CTranslate2 export token for token; both leave `<pad>` out of
    the softmax, where tf bans it after (as `generate` does): 33 of these 100 lines differ from
    tf's beam of 3 (19 at 5) on this random model, whose `<pad>` logit is not negligible."""
    import ctranslate2
    from transformers import GenerationConfig

    hf = exported(pad_start, "huggingface", tmp_path_factory)
    hf_config = json.loads((hf / "config.json").read_text())
    pad = hf_config["vocab_size"] - 1
    assert hf_config["pad_token_id"] == hf_config["decoder_start_token_id"] == pad
    assert GenerationConfig.from_pretrained(hf).bad_words_ids == [[pad]]  # as tf bans it
    translator = converted(hf, tmp_path_factory.mktemp("ct2") / "model")
    greedy = dict(beam_size=1, max_len_a=0.5, max_len_b=2)  # a limit some outputs reach
    expected = ours_on(pad_start, HUNDRED, **greedy)
    assert ct2_tokens(translator, pad_start, HUNDRED, **greedy) == expected
    _, tok, config = load_for_inference(pad_start, torch.device("cpu"))
    config = replace(config, decode=replace(config.decode, **greedy))
    limits = [length_limit(len(ids), config) for ids in tok.encode_src(HUNDRED)]
    ended = sum(len(t) < n for t, n in zip(expected, limits))
    assert 10 < ended < 90  # outputs that end, and outputs cut at the limit
    beam = dict(beam_size=3, length_penalty=0.0, min_len=1)
    own = ctranslate2.Translator(str(exported(pad_start, "ctranslate2", tmp_path_factory)))
    assert ct2_tokens(translator, pad_start, HUNDRED, **beam) == ct2_tokens(
        own, pad_start, HUNDRED, **beam
    )
    uniform = with_decode(
        pad_start, tmp_path_factory.mktemp("u") / "run", max_len_a=0.0, max_len_b=12
    )
    again = exported(uniform, "huggingface", tmp_path_factory)
    assert drop_in(again, HUNDRED) == tf_greedy(uniform, HUNDRED)
    assert "converts it exactly" in (hf / "README.md").read_text()


def test_a_model_the_converter_would_change_says_so(sharp, pad_start, tmp_path):  # noqa: F811
    """Item 19: a decoder that starts from a trained BOS (tf's default), or from a `<pad>`
    whose embedding training moved off zero: CTranslate2's converter starts it from zeros.
    The export still converts, and says, in its output and its model card, not to."""
    moved = tmp_path / "moved"
    shutil.copytree(pad_start, moved)
    path = moved / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    ckpt["model"]["tgt_embed.token.weight"][0] = 0.01  # tied: every embedding's pad row
    save_atomic(ckpt, path)
    for run, why in ((sharp, "trained BOS, `<s>`"), (moved, "`<pad>`, where its decoder")):
        out = tmp_path / "exports" / run.parent.name
        result = tf("export", run, "--to", "huggingface", "-o", out / "hf")
        assert result.exit_code == 0, result.output
        assert "note: ct2-transformers-converter would not convert it exactly" in result.stdout
        assert "tf export --to ctranslate2 does" in result.stdout
        card = (out / "hf" / "README.md").read_text()
        assert "**Do not convert with `ct2-transformers-converter`**" in card and why in card
        converted(out / "hf", out / "ct2")  # it converts (no ValueError), but not exactly


def ours_on(run: Path, lines: list[str], **decode) -> list[list[int]]:
    model, tok, config = load_for_inference(run, torch.device("cpu"))
    ids = encode_sources(tok, lines, model.config.max_positions, "test", 1)
    settings = replace(config.decode, **{"precision": "fp32", **decode})
    return [h[0].tokens for h in translate_ids(model, tok, ids, settings, torch.device("cpu"))]


def test_the_export_puts_pad_last_as_opus_mt_does(sharp, tmp_path_factory):  # noqa: F811
    """Item 19: every id of the export (weights, tokenizer, config.json, generation config)
    in OPUS-MT's layout, `<pad>` last; the model computes what tf's does on tf's ids moved
    there."""
    from transformers import AutoTokenizer, GenerationConfig, MarianMTModel

    hf = exported(sharp, "huggingface", tmp_path_factory)
    model, tok, _ = load_for_inference(sharp, torch.device("cpu"))
    V = tok.src_vocab_size
    fast = AutoTokenizer.from_pretrained(hf)
    vocab = sorted(fast.get_vocab().items(), key=lambda item: item[1])
    assert len(vocab) == V and vocab[-1] == ("<pad>", V - 1)
    pieces = tok.src_vocabulary()
    moved = {i: fast.convert_tokens_to_ids(p) for i, p in enumerate(pieces)}  # tf id -> export's
    hf_config = json.loads((hf / "config.json").read_text())
    generation = GenerationConfig.from_pretrained(hf)
    assert hf_config["pad_token_id"] == generation.pad_token_id == V - 1 == moved[tok.pad_id]
    assert hf_config["eos_token_id"] == generation.eos_token_id == moved[tok.eos_id]
    assert hf_config["decoder_start_token_id"] == moved[tok.bos_id]  # sharp starts from BOS
    assert fast.pad_token_id == V - 1 and fast.eos_token_id == moved[tok.eos_id]
    marian = MarianMTModel.from_pretrained(hf).eval()
    src = [[moved[i] for i in row] for row in tok.encode_src(SENTENCES)]
    assert src == fast(SENTENCES)["input_ids"]
    tgt_in = [moved[tok.bos_id], *[moved[i] for i in tok.encode_tgt(["God said"])[0]]]
    ours_in = [tok.bos_id, *tok.encode_tgt(["God said"])[0]]
    order = torch.tensor(sorted(range(V), key=lambda i: moved[i]))  # export's id -> tf's
    with torch.no_grad():
        theirs = marian(
            input_ids=torch.tensor([src[0]]), decoder_input_ids=torch.tensor([tgt_in])
        ).logits
        expected = model(
            torch.tensor([tok.encode_src(SENTENCES)[0]]),
            torch.tensor([ours_in]),
            torch.zeros(1, len(src[0]), dtype=torch.bool),
            None,
        )
    torch.testing.assert_close(theirs, expected[..., order], atol=1e-4, rtol=1e-4)


def test_the_exported_generation_config_bans_repeated_ngrams_as_tf(trained, tmp_path):
    """A run that decodes with `decode.no_repeat_ngram_size` exports it, so that a bare
    `generate` stays `tf translate --greedy`."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    for path in (run / "checkpoints").glob("*.pt"):
        ckpt = load_checkpoint(path)
        ckpt["config"]["decode"]["no_repeat_ngram_size"] = 2
        save_atomic(ckpt, path)
    assert tf("export", run, "--to", "huggingface", "-o", tmp_path / "hf").exit_code == 0
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["no_repeat_ngram_size"] == 2
