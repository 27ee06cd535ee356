"""New language tokens appended to a copy of a tokenizer's files (`data.new_languages`), each
at the next id: every id there was keeps its id and its piece, so a model's embedding rows stay
where they are and one new row per token follows them.

Each kind keeps its own files' form (`BaseTokenizer.append_tokens`):
- tf's SentencePiece model (joint.model, or src.model where each side has its own: a language
  token is a source piece): a user-defined piece appended to its protobuf, which SentencePiece
  takes whole wherever it stands in the list;
- an OPUS-MT (Marian) vocab.json: the `>>xyz<<` piece at its size (target_vocab.json, a
  second vocabulary's, is the decoder's: its tokens are never sources);
- NLLB-200's and mBART-50's files: tokenizer.json's added tokens (a special one, as the
  published codes are), tokenizer_config.json's list of codes, tf_tokenizer.json's codes.
M2M100's codes follow its vocab.json in transformers' fixed list, which its tokenizer class
cannot grow, and an NLLB or mBART-50 model without tokenizer.json numbers <mask> after the
codes: both are refused in one line (`BaseTokenizer.check_growable`).
"""

from __future__ import annotations

from pathlib import Path

from data.errors import InputError
from data.tokenizer import Tokenizer
from data.tokenizer_base import BaseTokenizer


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
    tokenizer.check_growable()


def add_tokens(directory: Path, tokens: list[str]) -> None:
    """Append `tokens` to the tokenizer in `directory` (a run's own copy), each at the next id.

    Raises:
        InputError: `check_addable`'s refusals.
    """
    if not tokens:
        return
    tokenizer = Tokenizer.load(directory)
    check_addable(tokenizer, tokens)
    tokenizer.append_tokens(tokens)
