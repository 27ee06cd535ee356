"""Stand-ins for NLLB-200, M2M100 and mBART-50, made without a network.

The tokenizers: a SentencePiece model trained on the bundled corpus (BPE as NLLB's and M2M100's,
unigram as mBART-50's; fairseq's <unk> <s> </s> at 0-2, as theirs), wrapped and saved by
transformers' own classes (`save_pretrained`), with the language codes added as the published
tokenizers add them. The models (`make_model_standin`): transformers' own
`M2M100ForConditionalGeneration` (NLLB-200, M2M100) or `MBartForConditionalGeneration`
(mBART-50) at a published configuration or a tiny one, random weights, config.json's vocabulary
the tokenizer's ids and the spare rows the published models have, generation_config.json as
published, saved with `save_pretrained` beside the tokenizer's files. The tests
(`tests/test_many_tokenizers.py`, `tests/test_import_many.py`) and
`benchmarks/import_memory_bench.py` read them as they would read
facebook/nllb-200-distilled-600M's, facebook/m2m100_418M's or
facebook/mbart-large-50-many-to-many-mmt's files.

    python -m benchmarks.fairseq_standin OUT {nllb,m2m100,mbart50} [--model tiny|published]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
from pathlib import Path

import sentencepiece as spm
import torch

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
    out: Path,
    spm_path: Path,
    legacy: bool = False,
    layout: str = "published",
    ids: int = 0,
    without: tuple[str, ...] = (),
) -> Path:
    """An NLLB tokenizer saved into `out` (tokenizer.json, tokenizer_config.json, and the
    SentencePiece model, which the hub's folders hold beside them).

    layout "published": the language codes after the pieces and <mask> last, as in the
    facebook/nllb-* files; "transformers": as `NllbTokenizer` numbers them when it builds a
    tokenizer today (<mask> right after the pieces, then the codes). legacy: the sources end
    in `</s> [code]` (`legacy_behaviour`). ids: fill the vocabulary with pieces SentencePiece
    never produces up to this many ids in all (the published 256,204: the embeddings' size).
    without: language codes left out, as of a model that lacks those languages.
    """
    from transformers import NllbTokenizer
    from transformers.convert_slow_tokenizer import NllbConverter, SentencePieceExtractor

    # transformers' own conversion of the SentencePiece model (fairseq's ids: pieces + 1)
    converted = SentencePieceExtractor(str(spm_path)).extract(NllbTokenizer.model)
    converted = NllbConverter.convert_from_spm(**converted)
    vocab = dict(converted["vocab"])
    codes = [code for code in NLLB_CODES if code not in without]
    filler = max(0, ids - len(vocab) - len(codes) - 1)
    vocab |= {f"\u2581unused{i}": len(vocab) + i for i in range(filler)}
    if layout == "published":
        vocab |= {code: len(vocab) + i for i, code in enumerate(codes)}
        vocab["<mask>"] = len(vocab)
    tokenizer = NllbTokenizer(
        vocab=vocab,
        merges=converted["merges"],
        _spm_precompiled_charsmap=converted["_spm_precompiled_charsmap"],
        additional_special_tokens=codes,
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


# The published configurations (facebook/nllb-200-distilled-600M, facebook/m2m100_418M,
# facebook/mbart-large-50-many-to-many-mmt), less their vocabularies (the tokenizer's ids and
# `SPARE_ROWS`), and the generation settings they publish beside them.
PUBLISHED = {
    "nllb": dict(
        d_model=1024,
        encoder_layers=12,
        decoder_layers=12,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        activation_function="relu",
        max_position_embeddings=1024,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.0,
        encoder_layerdrop=0,
        decoder_layerdrop=0,
        scale_embedding=True,
    ),
}
PUBLISHED["m2m100"] = dict(PUBLISHED["nllb"], encoder_layerdrop=0.05, decoder_layerdrop=0.05)
PUBLISHED["mbart50"] = dict(
    PUBLISHED["nllb"], activation_function="gelu", attention_dropout=0.0, dropout=0.1
)
GENERATION = {
    "nllb": dict(max_length=200),
    "m2m100": dict(max_length=200, num_beams=5, early_stopping=True),
    "mbart50": dict(max_length=200, num_beams=5, early_stopping=True, forced_eos_token_id=2),
}
# Rows of the published embeddings past the tokenizer's ids (NLLB-200: 256,206 for 256,204;
# M2M100: 128,112 for 128,104): fairseq padded its dictionaries with words never written.
SPARE_ROWS = {"nllb": 2, "m2m100": 8, "mbart50": 0}
# A tiny model of each kind (d_model 16, 2+2 layers), its published activation and dropouts.
TINY = {
    kind: dict(
        published,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=256,
    )
    for kind, published in PUBLISHED.items()
}


def make_model_standin(
    out: Path,
    kind: str,
    tokenizer: Path,
    shape: dict | None = None,
    seed: int = 0,
    telling: bool = True,
    generation: dict | None = None,
) -> Path:
    """The stand-in model of `kind` ("nllb", "m2m100", "mbart50") saved into `out` with the
    tokenizer files of the folder `tokenizer` (see the module docstring); returns `out`.

    shape: config.json's widths and dropouts (`TINY`, or `PUBLISHED[kind]`; the kind's with
    a tiny model by default). telling: weights drawn so that a random model's translations
    depend on their sources and end at many lengths (`make_telling`), else transformers'
    own initialisation. generation: settings besides the published ones (None values drop
    them).
    """
    from transformers import GenerationConfig

    from data.tokenizer import Tokenizer

    ids = Tokenizer.load(tokenizer).tgt_vocab_size
    family = "mbart" if kind == "mbart50" else "m2m_100"
    shape = dict(shape or TINY[kind])
    config = _config(family, shape, ids + SPARE_ROWS[kind], kind)
    torch.manual_seed(seed)
    model = _model(family, config).eval()
    if telling:
        make_telling(model, ids)
    settings = dict(GENERATION[kind], bos_token_id=0, pad_token_id=1, eos_token_id=2)
    settings.update(decoder_start_token_id=2, **(generation or {}))
    model.generation_config = GenerationConfig(
        **{k: v for k, v in settings.items() if v is not None}
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for path in tokenizer.iterdir():
        if path.is_file():
            shutil.copyfile(path, out / path.name)
    return out


def _config(family: str, shape: dict, vocab_size: int, kind: str):
    from transformers import M2M100Config, MBartConfig

    ids = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    if family == "m2m_100":
        return M2M100Config(**shape, vocab_size=vocab_size, **ids)
    return MBartConfig(
        **shape,
        vocab_size=vocab_size,
        forced_eos_token_id=2,
        tokenizer_class="MBart50Tokenizer",  # as facebook/mbart-large-50-*-mmt's config says
        **ids,
    )


def _model(family: str, config):
    from transformers import M2M100ForConditionalGeneration, MBartForConditionalGeneration

    cls = M2M100ForConditionalGeneration if family == "m2m_100" else MBartForConditionalGeneration
    return cls(config)


def make_telling(model, ids: int, eos: int = 2) -> None:
    """Weights for a random model that tells its sources apart and ends its translations at
    many lengths, every norm and bias off its start (a weight copied to the wrong place
    shows), and whose spare rows (ids past `ids`) are never written, as a trained model's are
    not.

    Random layers over tied embeddings mostly repeat one token whatever the source: here each
    matrix keeps its input's scale (std 1/sqrt(fan in)), attention is peaked (queries and keys
    x 3) and the decoder leans on the source (cross-attention's values and output x 4). The
    decoder's last norm gets one scale for every dimension and biases that sum to D: a logit
    is then y . e over y = c h + b with h of mean 0, so an embedding row of a constant k adds
    k D to its logit whatever the state: the EOS's a little (100 lines of the bundled dev set
    translate to 70 to 99 distinct lines of several lengths), the spare rows' -10 D, never
    chosen nor counted in a softmax.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.3)
            elif p.dim() == 1 or "final_logits_bias" in name:
                p.normal_(0.0, 0.05)
            elif "embed_positions" in name:  # mBART's learned table
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, p.size(1) ** -0.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(3.0)
            if name.endswith(("encoder_attn.v_proj.weight", "encoder_attn.out_proj.weight")):
                p.mul_(4.0)
        base = model.model
        norm = base.decoder.layer_norm
        norm.weight.fill_(3.0)
        norm.bias.sub_(norm.bias.mean()).add_(1.0)  # sums to D
        eos_logit = 3.0 if hasattr(model, "final_logits_bias") else 8.0  # mBART's, M2M100's
        base.shared.weight[eos] += eos_logit / norm.weight.numel()
        base.shared.weight[ids:] = -10.0


NLLB_IDS = 256_204  # the published NLLB-200 tokenizer's ids (its embeddings: 256,206 rows)


def main() -> None:
    from benchmarks.marian_standin import bundled_lines

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("kind", choices=["nllb", "m2m100", "mbart50"])
    parser.add_argument(
        "--model",
        choices=["tiny", "published"],
        help="a model beside the tokenizer: tiny, or at the published size (NLLB's with its "
        "256,204 ids), its weights transformers' initialisation",
    )
    args = parser.parse_args()
    src, tgt = bundled_lines(5000)
    model_type = "unigram" if args.kind == "mbart50" else "bpe"
    spm_path = train_spm(src + tgt, args.out.with_name(f".{args.out.name}.train"), 8000, model_type)
    folder = args.out.with_name(f".{args.out.name}.tokenizer") if args.model else args.out
    if args.kind == "nllb":
        nllb_tokenizer(folder, spm_path, ids=NLLB_IDS if args.model == "published" else 0)
    elif args.kind == "m2m100":
        m2m100_tokenizer(folder, spm_path, src + tgt)
    else:
        mbart50_tokenizer(folder, spm_path)
    shutil.rmtree(spm_path.parent)
    if args.model:
        tiny = args.model == "tiny"
        shape = TINY[args.kind] if tiny else PUBLISHED[args.kind]
        make_model_standin(args.out, args.kind, folder, shape, telling=tiny)
        shutil.rmtree(folder)
    print(args.out)


if __name__ == "__main__":
    main()
