"""The tokenizer of an OPUS-MT (Marian) model, read as `transformers.MarianTokenizer` reads it.

    source.spm, target.spm   SentencePiece models that only cut text into pieces
    vocab.json               the pieces' ids: {"</s>": 0, "<unk>": 1, ..., "<pad>": V - 1}
    target_vocab.json        the target side's, where the model has two vocabularies
    tokenizer_config.json    `separate_vocabs` (and languages), as transformers writes it

The ids are those of the vocabulary, not of the SentencePiece models: a piece missing from it
is `<unk>`. Every source ends in EOS, as Marian's models were trained; targets get EOS (and the
decoder's start) from the batching, as every `tf` model's. Two vocabularies may give `</s>`,
`<unk>` and `<pad>` different ids (and be of different sizes): each side then reads its own,
`pad_id`, `eos_id` and `unk_id` being the target's (the decoder's start, its end, what the
search bans) and `src_pad_id` the source's padding.

A multilingual model expects a target-language token at the start of the source (`>>fra<<`):
the vocabulary's `>>...<<` entries are the tokenizer's tags, taken from the start of a line as
`tf`'s corpus tags are. Otherwise text is text: a literal `</s>`, `<unk>` or `<pad>` in a line
is cut into pieces like any other word, where transformers' MarianTokenizer reads it as its
special id (a user's "</s>" becomes an end of sentence in mid-source). There is no BOS: the
decoder starts from `<pad>` (`model.decoder_start: pad`).
"""

from __future__ import annotations

import json
from pathlib import Path

import sentencepiece as spm

from data.errors import InputError
from data.files import read_json_object, write_json
from data.tokenizer_base import (
    THREADS,
    BaseTokenizer,
    load_sentencepiece,
    pieces_by_id,
    read_vocabulary,
)

SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG = "vocab.json", "target_vocab.json", "tokenizer_config.json"
SPECIAL_TOKENS = {"eos_id": "</s>", "unk_id": "<unk>", "pad_id": "<pad>"}
WORD = "\u2581"  # SentencePiece's word boundary, "▁"


def is_marian_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds a Marian tokenizer (its SentencePiece models and vocabulary)."""
    return (directory / SOURCE_SPM).is_file() or (directory / VOCAB).is_file()


class MarianTokenizer(BaseTokenizer):
    """The tokenizer interface (`data.tokenizer_base`) over Marian's files (see the module
    docstring).

    Attributes (besides `BaseTokenizer`'s): bos_id is None (Marian has no BOS); separate: the
    target side has a vocabulary of its own (`joint` is then False); pad_id, eos_id, unk_id:
    the target vocabulary's, src_pad_id, src_eos_id, src_unk_id the source's (the same ids
    unless two vocabularies give them others).
    """

    title = "Marian"  # as messages name the kind
    lang_token = ">>{lang}<<"  # OPUS-MT's: `_is_language_token`'s pieces are its tags
    hf_class = "MarianTokenizer"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.threads = THREADS
        settings = read_json_object(directory / TOKENIZER_CONFIG, default={})
        self.separate = bool(settings.get("separate_vocabs"))
        names = [SOURCE_SPM, TARGET_SPM, VOCAB] + ([TARGET_VOCAB] if self.separate else [])
        for path in (directory / name for name in names):
            if not path.is_file():
                raise InputError(f"{path}: missing (a Marian tokenizer needs {', '.join(names)})")
        if (directory / TOKENIZER_CONFIG).is_file():  # says separate_vocabs: part of its identity
            names.append(TOKENIZER_CONFIG)
        self._paths = [directory / name for name in names]
        self._src = load_sentencepiece(directory / SOURCE_SPM)
        self._tgt = load_sentencepiece(directory / TARGET_SPM)
        self.src_vocab = read_vocabulary(directory / VOCAB)
        self.tgt_vocab = (
            read_vocabulary(directory / TARGET_VOCAB) if self.separate else self.src_vocab
        )
        self.joint = not self.separate
        src_ids = _special_ids(self.src_vocab, directory / VOCAB)
        tgt_ids = (
            _special_ids(self.tgt_vocab, directory / TARGET_VOCAB) if self.separate else src_ids
        )
        self.eos_id, self.unk_id, self.pad_id = (tgt_ids[k] for k in ("eos_id", "unk_id", "pad_id"))
        self.src_eos_id, self.src_unk_id = src_ids["eos_id"], src_ids["unk_id"]
        self._src_pad_id = src_ids["pad_id"]
        self.bos_id = None
        self.src_vocab_size, self.tgt_vocab_size = len(self.src_vocab), len(self.tgt_vocab)
        self._src_pieces = pieces_by_id(self.src_vocab)
        self._tgt_pieces = pieces_by_id(self.tgt_vocab)
        # The target-language tokens of a multilingual model (transformers lists them only
        # for a shared vocabulary, but reads one at the start of any source).
        self.tags = {p: i for p, i in self.src_vocab.items() if _is_language_token(p)}
        self.languages = {}  # its tokens go before sources, named by the run (data.lang_token)

    @property
    def src_pad_id(self) -> int:
        return self._src_pad_id

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source sentences to ids, EOS appended; a leading `>>xx<<` is one token (as
        `MarianTokenizer.remove_language_code` splits it off before SentencePiece)."""
        split = [_split_language_code(text) for text in texts]
        pieces = self._src.encode(
            [rest for _, rest in split], out_type=str, num_threads=self.threads
        )
        unk, vocab = self.src_unk_id, self.src_vocab
        return [
            [vocab.get(p, unk) for p in code + row] + [self.src_eos_id]
            for (code, _), row in zip(split, pieces)
        ]

    def truncate_src(self, ids: list[int], max_len: int) -> list[int]:
        """Cut to `max_len` with the EOS kept last, as transformers truncates."""
        return list(ids) if len(ids) <= max_len else [*ids[: max_len - 1], self.src_eos_id]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Target sentences to ids; no EOS (the batching adds it)."""
        pieces = self._tgt.encode(list(texts), out_type=str, num_threads=self.threads)
        unk, vocab = self.unk_id, self.tgt_vocab
        return [[vocab.get(p, unk) for p in row] for row in pieces]

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        special = (self.src_eos_id, self.src_pad_id, self.src_unk_id)
        return [self._detokenize(self._src, self._src_pieces, special, row) for row in ids]

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """As `MarianTokenizer.decode(..., skip_special_tokens=True)`: EOS, pad and unk go."""
        special = (self.eos_id, self.pad_id, self.unk_id)
        return [self._detokenize(self._tgt, self._tgt_pieces, special, row) for row in ids]

    def _detokenize(
        self, model: spm.SentencePieceProcessor, pieces: list[str], special: tuple, ids
    ) -> str:
        kept = [pieces[int(i)] for i in ids if int(i) not in special]
        # SentencePiece leaves the word boundaries of pieces it does not know (a vocabulary's
        # other side, the language tokens) as they are: transformers replaces them after.
        return model.decode_pieces(kept).replace(WORD, " ").strip()

    def src_pieces(self, text: str) -> list[str]:
        code, rest = _split_language_code(text)
        return code + self._src.encode(rest, out_type=str)

    def src_id_pieces(self, ids: list[int]) -> list[str]:
        return [self._src_pieces[int(i)] for i in ids]

    def tgt_piece_ids(self, pieces: list[str]) -> list[int]:
        return [self.tgt_vocab.get(p, self.unk_id) for p in pieces]  # the target's <unk>

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self._tgt_pieces[int(i)] for i in ids]

    def src_vocabulary(self) -> list[str]:
        return list(self._src_pieces)

    def tgt_vocabulary(self) -> list[str]:
        return list(self._tgt_pieces)

    def vocabulary_words(self) -> str:
        return "Marian's vocabulary over SentencePiece"

    def save_settings(self, directory: Path, src_lang: str, tgt_lang: str) -> None:
        """tokenizer_config.json: its vocabularies (`separate_vocabs`) and the run's languages."""
        settings = {"separate_vocabs": self.separate}
        settings |= {"source_lang": src_lang, "target_lang": tgt_lang}
        (directory / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=1) + "\n")

    def save_hf_config(
        self, directory: Path, max_positions: int, src_lang: str, tgt_lang: str
    ) -> None:
        """The tokenizer_config.json that makes `AutoTokenizer` a MarianTokenizer over the
        files."""
        settings = {
            "tokenizer_class": self.hf_class,
            "source_lang": src_lang,
            "target_lang": tgt_lang,
            "separate_vocabs": self.separate,
            "model_max_length": max_positions,
        }
        with open(directory / TOKENIZER_CONFIG, "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=1)

    def append_tokens(self, tokens: list[str]) -> None:
        """Each a piece of vocab.json at its size (target_vocab.json, a second vocabulary's, is
        the decoder's: a language token is never a target)."""
        vocab = read_json_object(self.directory / VOCAB)
        added = {t: len(vocab) + i for i, t in enumerate(tokens)}
        write_json(self.directory / VOCAB, vocab | added)

    def __repr__(self) -> str:
        sizes = f"{self.src_vocab_size}" + (f"/{self.tgt_vocab_size}" if self.separate else "")
        return f"MarianTokenizer({str(self.directory)!r}, vocab {sizes})"


def _is_language_token(piece: str) -> bool:
    return piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4


def _split_language_code(text: str) -> tuple[list[str], str]:
    """([">>fra<<"], the rest) for a text that starts with a language code, else ([], text):
    transformers' `MarianTokenizer.remove_language_code`, character for character."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2 :]
    return [], text


def _special_ids(vocab: dict[str, int], path: Path) -> dict[str, int]:
    missing = [piece for piece in SPECIAL_TOKENS.values() if piece not in vocab]
    if missing:
        raise InputError(f"{path}: no {', '.join(missing)} in the vocabulary")
    return {name: vocab[piece] for name, piece in SPECIAL_TOKENS.items()}
