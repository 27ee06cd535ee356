"""A `tf` SentencePiece model as a Hugging Face fast tokenizer (`tokenizer.json`) that encodes
exactly as `Tokenizer.encode_src` does and appends nothing.

MarianTokenizer appends an EOS to every source, with no way to turn that off, and our models
take sources without one: a model given the extra token translates differently (how much:
docs/performance.md). One case is tf's own: a reserved tag ("<bt> text", a multilingual
model's "<2en> text") is the tag's id without the "▁" SentencePiece puts before it, and the
tags a line starts with are followed by the rest encoded as a sentence of its own ("<2en>Y"
is "<2en> Y", as training puts tag ids before the encoded text). A fast tokenizer built from
the same SentencePiece model, with no post-processor, gives the model exactly what `tf` gives
it, so `AutoTokenizer` and `generate` need no extra lines; its ids are the export's (`<pad>`
last, OPUS-MT's layout: `cli.families.marian.vocabulary_order`). Built with `tokenizers`
itself, following the model's own settings, as SentencePiece encodes:

- normalizer: the model's precompiled character map (nmt_nfkc), then its whitespace rules:
  leading, trailing and repeated spaces removed, spaces escaped as "▁", the "▁" dummy prefix;
- pre-tokenizer: the user-defined pieces (a corpus's tag "<bt>", a target-language token
  "<2en>") a line starts with cut off, the dummy prefix (before the rest too), the "▁" before
  each user-defined piece removed, as `Tokenizer.encode_src` does, and those pieces isolated,
  which SentencePiece always emits whole;
- model: BPE with every split of each piece ranked by that piece's score (SentencePiece merges
  the adjacent pair whose union scores best), or Unigram with the pieces' scores, where the
  special, unknown and byte pieces are never chosen while characters can spell the text
  (SentencePiece never matches them: "<s>" typed in a sentence is three characters, or unknown
  ones; only there, with unigram models, does this tokenizer differ);
- decoder: the unknown piece as SentencePiece writes it (" ⁇ "), byte pieces back to bytes,
  every "▁" before the first character dropped (the dummy prefix, and any whitespace pieces a
  model put first), the others back to spaces. The unknown piece is a named special token
  (CTranslate2's converter reads it from the tokenizer), so `skip_special_tokens` drops it,
  as it does with OPUS-MT's MarianTokenizer, where tf writes " ⁇ ".
"""

from __future__ import annotations

import re
from pathlib import Path

from data.errors import InputError
from data.tokenizer import Tokenizer

NORMAL, USER_DEFINED = 1, 4  # SentencePiece piece types (the others: unknown, control, byte...)
UNIGRAM, BPE = 1, 2  # SentencePiece model types
NEVER = -1e9  # a Unigram score no segmentation takes while characters can spell the text
TOKENIZER_JSON = "tokenizer.json"


def read_model_proto(path: Path):
    """The SentencePiece ModelProto of `path` (its pieces, trainer and normalizer specs)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # the generated module needs protobuf
        raise InputError("--to huggingface needs protobuf: pip install 'tf[export]'") from None
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    return proto


def fast_tokenizer(path: Path, order: list[int] | None = None):
    """A `tokenizers.Tokenizer` that encodes and decodes as the SentencePiece model `path`;
    its id i is the model's id order[i] (the model's own ids without `order`)."""
    from tokenizers import Tokenizer as Fast
    from tokenizers import decoders
    from tokenizers.models import BPE as BPEModel
    from tokenizers.models import Unigram

    proto = read_model_proto(path)
    trainer, pieces = proto.trainer_spec, list(proto.pieces)
    order = list(range(len(pieces))) if order is None else order
    user_defined = [p.piece for p in pieces if p.type == USER_DEFINED]
    byte_fallback = trainer.byte_fallback
    if trainer.model_type == BPE:
        vocab = {pieces[old].piece: new for new, old in enumerate(order)}
        model = BPEModel(
            vocab=vocab,
            merges=bpe_merges(pieces),
            unk_token=pieces[trainer.unk_id].piece,
            fuse_unk=True,
            byte_fallback=byte_fallback,
            ignore_merges=bool(user_defined),  # an isolated user-defined piece stays whole
        )
    elif trainer.model_type == UNIGRAM:
        matched = (NORMAL, USER_DEFINED)
        scored = [(p.piece, p.score if p.type in matched else NEVER) for p in pieces]
        vocab = [scored[old] for old in order]
        model = Unigram(vocab, unk_id=order.index(trainer.unk_id), byte_fallback=byte_fallback)
    else:
        raise InputError(f"{path}: only BPE and unigram SentencePiece models can be exported")
    fast = Fast(model)
    fast.normalizer = normalizer(proto.normalizer_spec)
    fast.pre_tokenizer = pre_tokenizer(proto.normalizer_spec, user_defined)
    spec = proto.normalizer_spec
    steps = [decoders.Replace(pieces[trainer.unk_id].piece, trainer.unk_surface)]
    steps += [decoders.ByteFallback()] if byte_fallback else []
    steps.append(decoders.Fuse())  # one string: leading "▁" may span several pieces
    if spec.add_dummy_prefix or spec.remove_extra_whitespaces:  # as SentencePiece decodes
        steps.append(decoders.Strip(content="▁", left=1 << 30, right=0))
    steps.append(decoders.Replace("▁", " "))
    fast.decoder = decoders.Sequence(steps)
    return fast


def bpe_merges(pieces) -> list[tuple[str, str]]:
    """Every (left, right) split of a normal piece into two normal pieces, best piece first
    (score, then id): merging by these ranks merges as SentencePiece's BPE does."""
    normal = {p.piece: (p.score, i) for i, p in enumerate(pieces) if p.type == NORMAL}
    ranked = []
    for piece, (score, i) in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-score, i, left, right))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def pre_tokenizer(spec, user_defined: list[str]):
    """The user-defined pieces a line starts with cut off, so that the rest is a sentence of
    its own; the dummy prefix (on that rest too); then each user-defined piece cut out whole
    (longest first), without the "▁" before it."""
    from tokenizers import Regex, pre_tokenizers

    pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
    steps = []
    if user_defined:  # "<2en>Y" is "<2en> Y": the tags, then "Y" as a sentence ("▁Y")
        leading = Regex(f"\\A(?:{pattern})(?:▁?(?:{pattern}))*")
        steps.append(pre_tokenizers.Split(leading, behavior="isolated"))
    if spec.add_dummy_prefix:
        steps.append(
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
        )
    if user_defined:
        steps.append(pre_tokenizers.Split(Regex(f"▁(?={pattern})"), behavior="removed"))
        steps.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    return pre_tokenizers.Sequence(steps)


def normalizer(spec):
    """SentencePiece's normalisation, in its order: character map, then whitespace."""
    from tokenizers import Regex, normalizers

    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece leaves tabs and the rest
        steps += [
            normalizers.Replace(Regex(r"\A +| +\z"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if spec.add_dummy_prefix:
        # SentencePiece always adds the prefix; Metaspace skips it before a leading "▁".
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    return normalizers.Sequence(steps)


def write_tokenizer(
    tokenizer: Tokenizer, out: Path, max_positions: int, order: list[int] | None = None
) -> None:
    """tokenizer.json and tokenizer_config.json: what `AutoTokenizer.from_pretrained` loads;
    its id i is the tokenizer's id order[i] (`cli.families.marian.vocabulary_order`)."""
    from transformers import PreTrainedTokenizerFast

    if not tokenizer.joint:
        raise InputError("Marian takes one vocabulary: export needs a joint tokenizer")
    (path,) = tokenizer.model_paths()
    pieces = tokenizer.src_vocabulary()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=fast_tokenizer(path, order),
        pad_token=pieces[tokenizer.pad_id],
        unk_token=pieces[tokenizer.unk_id],  # CTranslate2's converter needs it named
        bos_token=pieces[tokenizer.bos_id],
        eos_token=pieces[tokenizer.eos_id],
        model_max_length=max_positions,  # the longest source the model takes
        padding_side="right",
        clean_up_tokenization_spaces=False,  # "end ." stays as SentencePiece decodes it
        split_special_tokens=True,  # "<s>" typed in a sentence is text, as in SentencePiece
    )
    fast.save_pretrained(out)


def exported_order(directory: Path, tokenizer: Tokenizer) -> list[int]:
    """How an export's ids map onto `tokenizer`, the run's own beside them: the export's id i
    is the tokenizer's order[i] (`cli.families.marian.vocabulary_order`), read from the pieces
    of its tokenizer.json; the tokenizer's own ids where it wrote none (a Marian tokenizer's
    files keep theirs).

    Raises:
        InputError: tokenizer.json is unreadable, or its pieces are not the tokenizer's.
    """
    from tokenizers import Tokenizer as Fast

    path = directory / TOKENIZER_JSON
    pieces = tokenizer.src_vocabulary()
    if not path.is_file() or not tokenizer.joint:
        return list(range(len(pieces)))
    try:
        vocab = Fast.from_file(str(path)).get_vocab()  # {piece: the export's id}
    except Exception as e:  # tokenizers raises its own Exception for any malformed file
        raise InputError(f"{path}: not a readable tokenizer ({str(e)[:120]})") from None
    if sorted(vocab.values()) != list(range(len(pieces))) or set(vocab) != set(pieces):
        raise InputError(f"{path}: its pieces are not those of {tokenizer.model_paths()[0]}")
    order = [0] * len(pieces)
    for i, piece in enumerate(pieces):
        order[vocab[piece]] = i
    return order
