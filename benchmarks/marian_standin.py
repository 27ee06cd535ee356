"""A stand-in for a published OPUS-MT model, made without a network: a `MarianMTModel` with
opus-mt-es-en's configuration (or a smaller one) and random weights, and SentencePiece models
and a vocabulary trained on the bundled corpus in Marian's layout, saved as the hub's files
are (`save_pretrained`, source.spm, target.spm, vocab.json, tokenizer_config.json,
generation_config.json). The tests and `benchmarks/finetune_bench.py` import it as they would
import Helsinki-NLP/opus-mt-es-en.

    python -m benchmarks.marian_standin OUT [--small]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import sentencepiece as spm
import torch

# opus-mt-es-en's published config.json, less its vocabulary (ours is trained here).
OPUS_MT_ES_EN = dict(
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    activation_function="swish",
    max_position_embeddings=512,
    dropout=0.1,
    attention_dropout=0.0,
    activation_dropout=0.0,
    scale_embedding=True,
    share_encoder_decoder_embeddings=True,
    static_position_embeddings=True,
    normalize_embedding=False,
)
TINY = dict(
    OPUS_MT_ES_EN,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=256,
)


def train_spm(lines: list[str], prefix: Path, vocab_size: int) -> spm.SentencePieceProcessor:
    """A unigram model as OPUS-MT's are (<unk>, <s>, </s> at 0, 1, 2)."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
        num_threads=1,
    )
    prefix.with_suffix(".vocab").unlink()
    return spm.SentencePieceProcessor(model_file=f"{prefix}.model")


def marian_vocabulary(models: list[spm.SentencePieceProcessor], extra: list[str]) -> dict:
    """Marian's vocabulary of both models' pieces: </s> 0, <unk> 1, the pieces (the source's
    first, then the target's it lacks, then `extra`), <pad> last (transformers' converter)."""
    pieces = ["</s>", "<unk>"]
    for model in models:
        pieces += [model.id_to_piece(i) for i in range(3, model.get_piece_size())]
    pieces += extra
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    vocab["<pad>"] = len(vocab)
    return vocab


def make_standin(
    out: Path,
    src_lines: list[str],
    tgt_lines: list[str],
    shape: dict = OPUS_MT_ES_EN,
    vocab_size: int = 8000,
    separate: bool = False,
    language_tokens: tuple[str, ...] = (),
    seed: int = 0,
    init_std: float = 0.02,
    vocabulary: int = 0,
    generation: dict | None = None,
    target_vocabulary: int = 0,
) -> Path:
    """Write the stand-in model to `out` (see the module docstring); returns `out`.

    separate: two vocabularies (vocab.json, target_vocab.json) and untied encoder and decoder
    embeddings (share_encoder_decoder_embeddings false). language_tokens: a multilingual
    model's target-language tokens (">>fra<<", ...), in the vocabulary. init_std: the
    weights' spread (a larger one makes a random model's choices clear-cut). vocabulary: fill
    the vocabulary up to this many pieces with ones the SentencePiece models never produce
    (opus-mt-es-en has 65,001; the output layer's cost grows with it); target_vocabulary: the
    same for target_vocab.json (separate: a size of its own, so its <pad> has another id, the
    decoder's start; config.json's pad_token_id is the smaller vocabulary's, which transformers
    can pad both embeddings with). generation: settings
    of its generation_config.json besides OPUS-MT's (beam 4, max_length 512, pad banned, EOS
    forced at the limit), or with a None value without them.
    """
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    out.mkdir(parents=True, exist_ok=True)
    source = train_spm(src_lines, out / "source", vocab_size)
    target = train_spm(tgt_lines, out / "target", vocab_size)
    (out / "source.model").rename(out / "source.spm")
    (out / "target.model").rename(out / "target.spm")
    if separate:
        vocab = marian_vocabulary([source], list(language_tokens))
        target_vocab = fill(marian_vocabulary([target], []), target_vocabulary)
        (out / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False))
    else:
        vocab = target_vocab = marian_vocabulary([source, target], list(language_tokens))
    vocab = fill(vocab, vocabulary)
    if not separate:
        target_vocab = vocab
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer_config = {"source_lang": "es", "target_lang": "en", "separate_vocabs": separate}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    start = target_vocab["<pad>"]
    pad = min(vocab["<pad>"], start)
    config = MarianConfig(
        **dict(shape, share_encoder_decoder_embeddings=not separate),
        vocab_size=len(vocab),
        decoder_vocab_size=len(target_vocab),
        pad_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        forced_eos_token_id=0,
        decoder_start_token_id=start,
        init_std=init_std,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # a trained model's output bias is not zero: make this one's neither
        model.final_logits_bias.normal_(0.0, init_std)
    settings = dict(
        bad_words_ids=[[start]],
        bos_token_id=0,
        decoder_start_token_id=start,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=512,
        num_beams=4,
        pad_token_id=pad,
    )
    settings.update(generation or {})
    model.generation_config = GenerationConfig(
        **{k: v for k, v in settings.items() if v is not None}
    )
    model.save_pretrained(out, safe_serialization=True)
    return out


def fill(vocab: dict[str, int], size: int) -> dict[str, int]:
    """`vocab` filled up to `size` pieces with ones no SentencePiece model produces, before
    its <pad>, which stays last."""
    filler = [f"\u2581unused{i}" for i in range(max(0, size - len(vocab)))]
    if not filler:
        return vocab
    vocab = dict(vocab)
    pad = vocab.pop("<pad>")
    vocab.update({piece: pad + i for i, piece in enumerate(filler)})
    vocab["<pad>"] = len(vocab)
    return vocab


def bundled_lines(n: int) -> tuple[list[str], list[str]]:
    """The first n pairs of the bundled training corpus."""
    from data.corpus import load_corpus

    ds = load_corpus("bundled:bible-es-en/train", "es", "en").select(range(n))
    return list(ds["src"]), list(ds["tgt"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--small", action="store_true", help="a tiny model, for tests")
    args = parser.parse_args()
    src, tgt = bundled_lines(28_045)
    shape = TINY if args.small else OPUS_MT_ES_EN
    make_standin(args.out, src, tgt, shape, vocab_size=1000 if args.small else 8000)
    print(args.out)


if __name__ == "__main__":
    main()
