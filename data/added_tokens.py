"""New language tokens appended to a copy of a tokenizer's files (`data.new_languages`), each
at the next id: every id there was keeps its id and its piece, so a model's embedding rows stay
where they are and one new row per token follows them.

Each kind keeps its own files' form:
- tf's SentencePiece model (joint.model, or src.model where each side has its own: a language
  token is a source piece): a user-defined piece appended to its protobuf, which SentencePiece
  takes whole wherever it stands in the list;
- an OPUS-MT (Marian) vocab.json: the `>>xyz<<` piece at its size (target_vocab.json, a
  second vocabulary's, is the decoder's: its tokens are never sources);
- NLLB-200's and mBART-50's files: tokenizer.json's added tokens (a special one, as the
  published codes are), tokenizer_config.json's list of codes, tf_tokenizer.json's codes.
M2M100's codes follow its vocab.json in transformers' fixed list, which its tokenizer class
cannot grow, and an NLLB or mBART-50 model without tokenizer.json numbers <mask> after the
codes: both are refused in one line (`check_addable`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from data.errors import InputError
from data.fairseq import HF_CONFIG, M2M100, TOKENIZER_JSON, FairseqTokenizer
from data.files import read_json_object, write_json
from data.marian import VOCAB, MarianTokenizer
from data.tokenizer import Tokenizer
from data.tokenizer_base import BaseTokenizer

USER_DEFINED = 4  # SentencePiece's piece type of a user-defined symbol


def check_addable(tokenizer: BaseTokenizer, tokens: list[str]) -> None:
    """Raise InputError where `tokens` cannot join `tokenizer`: a piece it has already (a
    token must be new, or an existing row would mean two things), or a kind that cannot grow."""
    pieces = set(tokenizer.src_vocabulary()) | set(tokenizer.tgt_vocabulary())
    for token in tokens:
        if token in pieces:
            raise InputError(
                f"{tokenizer.directory}: the new language's token {token!r} is a piece of the "
                "tokenizer already (a language the model has, or a word): name another code"
            )
    if isinstance(tokenizer, FairseqTokenizer) and tokenizer.family is M2M100:
        raise InputError(
            f"{tokenizer.directory}: M2M100's tokenizer takes its codes from transformers' "
            "fixed list: a new language needs NLLB-200 or mBART-50"
        )
    if (
        isinstance(tokenizer, FairseqTokenizer)
        and not (tokenizer.directory / TOKENIZER_JSON).is_file()
    ):
        raise InputError(
            f"{tokenizer.directory / TOKENIZER_JSON}: missing, and a new language's id needs "
            "it (without it, <mask> follows the codes)"
        )


def add_tokens(directory: Path, tokens: list[str]) -> None:
    """Append `tokens` to the tokenizer in `directory` (a run's own copy), each at the next id.

    Raises:
        InputError: `check_addable`'s refusals.
    """
    if not tokens:
        return
    tokenizer = Tokenizer.load(directory)
    check_addable(tokenizer, tokens)
    if isinstance(tokenizer, FairseqTokenizer):
        add_codes(tokenizer, tokens)
    elif isinstance(tokenizer, MarianTokenizer):
        vocab = read_json_object(directory / VOCAB)
        write_json(directory / VOCAB, vocab | {t: len(vocab) + i for i, t in enumerate(tokens)})
    else:
        add_user_defined(tokenizer.model_paths()[0], tokens)


def add_codes(tokenizer: FairseqTokenizer, codes: list[str]) -> None:
    """NLLB-200's or mBART-50's files with `codes` after every id, special as its codes are."""
    directory, size = tokenizer.directory, tokenizer.src_vocab_size
    data = read_json_object(directory / TOKENIZER_JSON)
    data["added_tokens"] = [
        *data.get("added_tokens", []),
        *(added(c, size + i) for i, c in enumerate(codes)),
    ]
    write_json(directory / TOKENIZER_JSON, data)
    config = read_json_object(directory / HF_CONFIG, default={})
    for key in ("extra_special_tokens", "additional_special_tokens"):
        if isinstance(config.get(key), list):  # transformers' list of the codes
            config[key] = [*config[key], *codes]
    if config:
        write_json(directory / HF_CONFIG, config)
    settings = tokenizer.settings
    replace(settings, codes=(*settings.codes, *codes)).save(directory)  # tf_tokenizer.json


def added(content: str, id: int) -> dict:
    """A tokenizer.json added token as the published NLLB files hold their codes."""
    return {
        "id": id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def add_user_defined(path: Path, tokens: list[str]) -> None:
    """A SentencePiece model with `tokens` appended as user-defined pieces."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(path.read_bytes())
    for token in tokens:
        proto.pieces.add(piece=token, score=0.0, type=USER_DEFINED)
    path.write_bytes(proto.SerializeToString())
