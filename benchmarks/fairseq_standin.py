"""Stand-ins for the tokenizers of NLLB-200, M2M100 and mBART-50, made without a network: a
SentencePiece model trained on the bundled corpus (BPE as NLLB's and M2M100's, unigram as
mBART-50's; fairseq's <unk> <s> </s> at 0-2, as theirs), wrapped and saved by transformers' own
classes (`save_pretrained`), with the language codes added as the published tokenizers add
them. The tests (`tests/test_many_tokenizers.py`) read them as they would read
facebook/nllb-200-distilled-600M's, facebook/m2m100_418M's or
facebook/mbart-large-50-many-to-many-mmt's files.

    python -m benchmarks.fairseq_standin OUT {nllb,m2m100,mbart50}
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
from pathlib import Path

import sentencepiece as spm

from data.fairseq_languages import M2M100_CODES, NLLB_CODES

SPM = "sentencepiece.bpe.model"


def train_spm(lines: list[str], out: Path, vocab_size: int, model_type: str) -> Path:
    """A SentencePiece model with SentencePiece's own special ids (<unk> <s> </s> at 0-2, no
    <pad>), as fairseq's models have: out/sentencepiece.bpe.model."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / SPM.removesuffix(".model")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    Path(f"{prefix}.vocab").unlink()
    return out / SPM


def nllb_tokenizer(
    out: Path, spm_path: Path, legacy: bool = False, layout: str = "published"
) -> Path:
    """An NLLB tokenizer saved into `out` (tokenizer.json, tokenizer_config.json, and the
    SentencePiece model, which the hub's folders hold beside them).

    layout "published": the language codes after the pieces and <mask> last, as in the
    facebook/nllb-* files; "transformers": as `NllbTokenizer` numbers them when it builds a
    tokenizer today (<mask> right after the pieces, then the codes). legacy: the sources end
    in `</s> [code]` (`legacy_behaviour`).
    """
    from transformers import NllbTokenizer
    from transformers.convert_slow_tokenizer import NllbConverter, SentencePieceExtractor

    # transformers' own conversion of the SentencePiece model (fairseq's ids: pieces + 1)
    converted = SentencePieceExtractor(str(spm_path)).extract(NllbTokenizer.model)
    converted = NllbConverter.convert_from_spm(**converted)
    vocab = dict(converted["vocab"])
    if layout == "published":
        vocab |= {code: len(vocab) + i for i, code in enumerate(NLLB_CODES)}
        vocab["<mask>"] = len(vocab)
    tokenizer = NllbTokenizer(
        vocab=vocab,
        merges=converted["merges"],
        _spm_precompiled_charsmap=converted["_spm_precompiled_charsmap"],
        additional_special_tokens=list(NLLB_CODES),
        legacy_behaviour=legacy,
        clean_up_tokenization_spaces=True,  # as the published config says (ignored for BPE)
    )
    tokenizer.save_pretrained(out)
    shutil.copyfile(spm_path, out / SPM)
    return out


def m2m100_tokenizer(out: Path, spm_path: Path, lines: list[str]) -> Path:
    """An M2M100 tokenizer saved into `out` (vocab.json, sentencepiece.bpe.model,
    tokenizer_config.json, added_tokens.json). vocab.json is fairseq's dictionary of `lines`:
    <s> <pad> </s> <unk>, then the pieces seen, most frequent first (so its ids are not
    SentencePiece's, and pieces never seen are <unk>, as in M2M100's). The codes are
    additional special tokens, as the published special_tokens_map.json lists them."""
    from transformers import M2M100Tokenizer

    model = spm.SentencePieceProcessor(model_file=str(spm_path))
    counts = collections.Counter(p for row in model.encode(lines, out_type=str) for p in row)
    pieces = ["<s>", "<pad>", "</s>", "<unk>", *(p for p, _ in counts.most_common())]
    staging = out.with_name(f".{out.name}.vocab")
    staging.mkdir(parents=True, exist_ok=True)
    vocab_file = staging / "vocab.json"
    vocab_file.write_text(json.dumps({p: i for i, p in enumerate(dict.fromkeys(pieces))}))
    tokenizer = M2M100Tokenizer(
        vocab_file=str(vocab_file),
        spm_file=str(spm_path),
        additional_special_tokens=[f"__{code}__" for code in M2M100_CODES],
        clean_up_tokenization_spaces=True,
    )
    tokenizer.save_pretrained(out)
    shutil.rmtree(staging)
    return out


def mbart50_tokenizer(out: Path, spm_path: Path, tokenizer_json: bool = True) -> Path:
    """An mBART-50 tokenizer saved into `out`: `MBart50Tokenizer` converts the SentencePiece
    model as it converts the hub's (fairseq's ids, the codes after the pieces, <mask> last).
    Without tokenizer_json, the folder holds what an upload without tokenizer.json holds
    (sentencepiece.bpe.model and tokenizer_config.json), which transformers converts again."""
    from transformers import MBart50Tokenizer

    source = out.with_name(f".{out.name}.spm")
    source.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spm_path, source / SPM)
    tokenizer = MBart50Tokenizer.from_pretrained(source, clean_up_tokenization_spaces=True)
    tokenizer.save_pretrained(out)
    shutil.copyfile(spm_path, out / SPM)
    shutil.rmtree(source)
    if not tokenizer_json:
        (out / "tokenizer.json").unlink()
    return out


def main() -> None:
    from benchmarks.marian_standin import bundled_lines

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("kind", choices=["nllb", "m2m100", "mbart50"])
    args = parser.parse_args()
    src, tgt = bundled_lines(5000)
    model_type = "unigram" if args.kind == "mbart50" else "bpe"
    spm_path = train_spm(src + tgt, args.out.with_name(f".{args.out.name}.train"), 8000, model_type)
    if args.kind == "nllb":
        nllb_tokenizer(args.out, spm_path)
    elif args.kind == "m2m100":
        m2m100_tokenizer(args.out, spm_path, src + tgt)
    else:
        mbart50_tokenizer(args.out, spm_path)
    shutil.rmtree(spm_path.parent)
    print(args.out)


if __name__ == "__main__":
    main()
