"""What every tokenizer kind shares: the interface the rest of `tf` uses (`BaseTokenizer`) and
the SentencePiece helpers the kinds are built from.

The kinds are `tf`'s own SentencePiece models (`data.tokenizer.Tokenizer`), an OPUS-MT model's
(`data.marian`) and NLLB-200's, M2M100's and mBART-50's (`data.fairseq`). Each imports this
module and nothing of the others; `Tokenizer.load` (data/tokenizer.py) imports them all and
picks one from the files in a directory.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from data.errors import InputError
from data.files import read_json_object

THREADS = os.cpu_count() or 1  # SentencePiece encodes a list of sentences in parallel
# What a SentencePiece model's trainer_spec keeps of where it was trained, not what it is: the
# paths (model_prefix: the folder it was trained into, a run's) and the machine's cores.
PROVENANCE = ("model_prefix", "input", "seed_sentencepieces_file", "num_threads")
SENTENCEPIECE_SUFFIXES = (".model", ".spm")  # tf's, fairseq's sentencepiece.bpe.model, Marian's
SPACE = "\u2581"  # SentencePiece's escaped space, the "▁" piece


class BaseTokenizer(ABC):
    """Text to ids and back, for a model's source and target sides.

    Attributes:
        directory: the directory the tokenizer's files were read from.
        joint: True when both sides share one vocabulary.
        pad_id, unk_id, bos_id, eos_id: the special ids (bos_id None where there is no BOS).
        src_vocab_size, tgt_vocab_size: the number of ids of each side.
        tags: {piece: id} of the reserved pieces a source may start with (tf's corpus tags,
            a multilingual model's language tokens), each taken whole from a line's start.
        languages: {language as the model's users name it: its token in `tags`} where the
            model reads or writes a language token of its own (NLLB's "fra_Latn"); else empty.
        src_lang: the language the model's files name as a source's where a line names none
            (tokenizer_config.json's `src_lang`), or None.
        lang_token: the form of a language's token where the kind's files fix one, {lang}
            filled in (an OPUS-MT vocabulary's ">>{lang}<<", the only pieces it reads as
            tags), or None: a run's `data.lang_token` says.
        threads: SentencePiece's threads per `encode_*` call.
        hf_class: the transformers class that reads the kind's own files (an imported model's:
            "MarianTokenizer", "NllbTokenizer" ...), which a Hugging Face export ships as they
            are; None for tf's own SentencePiece models, which it ships as a fast tokenizer
            built from them (`cli.exporters.hf_tokenizer`).
    """

    directory: Path
    joint: bool
    pad_id: int
    unk_id: int
    bos_id: int | None
    eos_id: int
    src_vocab_size: int
    tgt_vocab_size: int
    tags: dict[str, int]
    languages: dict[str, str]
    src_lang: str | None = None
    lang_token: str | None = None
    threads: int = THREADS
    hf_class: str | None = None
    _paths: list[Path]  # the files that make the tokenizer what it is: `model_paths`

    @abstractmethod
    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source sentences to the ids the encoder reads (with what the kind appends)."""

    @abstractmethod
    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Target sentences to ids; no BOS/EOS (the batching adds them)."""

    @abstractmethod
    def decode_src(self, ids: list[list[int]]) -> list[str]:
        """Source ids back to text, one string per row; special ids decode to nothing."""

    @abstractmethod
    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Target ids back to text, one string per row; special ids decode to nothing."""

    @abstractmethod
    def src_pieces(self, text: str) -> list[str]:
        """The source pieces of one sentence, e.g. ["▁Él", "▁com", "ió"]."""

    @abstractmethod
    def src_id_pieces(self, ids: list[int]) -> list[str]:
        """The source pieces named by `ids` (a truncated sentence keeps only its ids)."""

    @abstractmethod
    def tgt_piece_ids(self, pieces: list[str]) -> list[int]:
        """The target ids of `pieces` (as an engine working on pieces returns them)."""

    @abstractmethod
    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """The target pieces named by `ids`."""

    @abstractmethod
    def src_vocabulary(self) -> list[str]:
        """The source pieces in id order."""

    @abstractmethod
    def tgt_vocabulary(self) -> list[str]:
        """The target pieces in id order."""

    def tagged_src(self, tag_ids: list[int], ids: list[int]) -> list[int]:
        """A source's ids (`encode_src` of its text alone) with those of the tags it starts
        with (a corpus tag, a language token), where the kind puts them: first."""
        return [*tag_ids, *ids]

    def truncate_src(self, ids: list[int], max_len: int) -> list[int]:
        """A source's ids cut to `max_len` (kinds that frame a source keep its frame)."""
        return list(ids[:max_len])

    @property
    def src_pad_id(self) -> int:
        """The source side's padding id: `pad_id` (an imported Marian model's two
        vocabularies may give it another, `data.marian.MarianTokenizer`)."""
        return self.pad_id

    def decoder_start_id(self, start: str) -> int:
        """The id the decoder starts from: `model.decoder_start`, "bos", "pad" or "eos"."""
        found = {"bos": self.bos_id, "pad": self.pad_id, "eos": self.eos_id}[start]
        if found is None:
            raise InputError(
                f"{self.directory}: the tokenizer has no {start.upper()} for the decoder to "
                "start from (model.decoder_start)"
            )
        return found

    def tag_id(self, tag: str) -> int:
        """The id of a reserved tag piece; InputError if the tokenizer has no such tag."""
        if tag not in self.tags:
            known = ", ".join(self.tags) or "none"
            raise InputError(f"{self.directory}: no tag {tag!r} in the tokenizer (tags: {known})")
        return self.tags[tag]

    def language_id(self, language: str) -> int:
        """The id of `language`'s token (`languages`): what a source says it is written in,
        or the decoder's forced first token.

        Raises:
            InputError: the tokenizer has no such language; the closest it has are named.
        """
        if language not in self.languages:
            asked = language.lower()  # "fr" -> fra_Latn, fra_Latn -> "fr", then by spelling
            close = [name for name in self.languages if name.lower().startswith(asked)]
            close += [name for name in self.languages if asked.startswith(name.lower()[:2])]
            close += difflib.get_close_matches(language, self.languages, n=3)
            hint = f"; closest: {', '.join(dict.fromkeys(close[:3]))}" if close else ""
            raise InputError(
                f"{self.directory}: no language {language!r} among the tokenizer's "
                f"{len(self.languages)}{hint}"
            )
        return self.tags[self.languages[language]]

    def vocabulary_words(self) -> str | None:
        """The kind's vocabulary in words, as a model card names it after its size ("Marian's
        vocabulary over SentencePiece"); None for tf's own, which the run's settings name."""
        return None

    @abstractmethod
    def save_settings(self, directory: Path, src_lang: str, tgt_lang: str) -> None:
        """What tf reads of transformers' settings, written beside a copy of the kind's files
        in `directory` (an import's run/tokenizer/), the run's default languages among them
        where the kind keeps them."""

    @abstractmethod
    def save_hf_config(
        self, directory: Path, max_positions: int, src_lang: str, tgt_lang: str
    ) -> None:
        """tokenizer_config.json beside a copy of the kind's own files in a Hugging Face export
        (`directory`): the class that reads them (`hf_class`), the longest source, the
        languages."""

    def check_growable(self) -> None:
        """Raise InputError where the kind cannot take new tokens at the next ids (a new
        language's, `data.added_tokens`); every kind can unless it says otherwise."""
        return None

    @abstractmethod
    def append_tokens(self, tokens: list[str]) -> None:
        """Append `tokens` to the kind's files in `directory` (a run's own copy), each at the
        next id, in the form the kind's files keep (`data.added_tokens`)."""

    def model_paths(self) -> list[Path]:
        """The files the tokenizer is read from (an import copies them into the run)."""
        return list(self._paths)

    def digest(self) -> str:
        """sha256 (hex) of what `model_paths` hold (`content`): identifies the tokenizer in
        caches and checkpoints, one digest for two tokenizers of the same content."""
        return _sha256((path.name, self.content(path)) for path in self._paths)

    def content(self, path: Path) -> bytes:
        """What the file `path` (one of `model_paths`) holds, as `digest` hashes it and an
        export publishes it: a SentencePiece model less where and on how many threads it was
        trained (`without_provenance`), so that two models of the same pieces, scores and
        settings trained into two folders have one digest (and ensemble), and an export
        names no folder of the machine that trained it; any other file, its bytes."""
        if path.suffix in SENTENCEPIECE_SUFFIXES:
            return without_provenance(path.read_bytes())
        return path.read_bytes()

    def digests(self) -> tuple[str, ...]:
        """The digests a checkpoint of this tokenizer may record as its `tokenizer_digest`:
        `digest`, and the sha256 of the files' bytes, which runs recorded before the digest
        left out where SentencePiece trained a model (their checkpoints load as they did)."""
        files = _sha256((path.name, path.read_bytes()) for path in self._paths)
        return tuple(dict.fromkeys((self.digest(), files)))


def without_provenance(model: bytes) -> bytes:
    """A SentencePiece model's protobuf less its `PROVENANCE` fields: the same pieces, scores
    and settings, encoding and decoding alike."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(model)
    spec = proto.trainer_spec
    for name in PROVENANCE:
        if name in spec.DESCRIPTOR.fields_by_name:  # (an older protobuf may lack one)
            spec.ClearField(name)
    return proto.SerializeToString(deterministic=True)


def _sha256(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 (hex) of (name, content) pairs, in order."""
    sha = hashlib.sha256()
    for name, content in files:
        sha.update(name.encode())
        sha.update(content)
    return sha.hexdigest()


def load_sentencepiece(path: Path) -> spm.SentencePieceProcessor:
    """Load one SentencePiece model, as an InputError if the file is not one."""
    model = spm.SentencePieceProcessor()
    try:
        model.load(str(path))
    except (OSError, RuntimeError):
        raise InputError(f"{path}: not a SentencePiece model") from None
    return model


def split_tags(text: str, tags: tuple[str, ...]) -> tuple[list[str], str]:
    """The reserved pieces of `tags` that `text` starts with (white space around them or not),
    in order, and the rest of it (all of it when it starts with none)."""
    heads: list[str] = []
    rest = text.lstrip()
    while tags and rest.startswith(tags):  # (startswith tries a tuple in C)
        tag = max((t for t in tags if rest.startswith(t)), key=len)
        heads.append(tag)
        rest = rest[len(tag) :].lstrip()
    return heads, rest if heads else text


def decode_rows(model: spm.SentencePieceProcessor, ids: list[list[int]]) -> list[str]:
    """One string per row, and none for no rows (SentencePiece reads `[]` as one empty row)."""
    rows = [list(map(int, row)) for row in ids]
    return model.decode(rows) if rows else []


def read_vocabulary(path: Path) -> dict[str, int]:
    """A {piece: id} vocabulary (vocab.json) whose ids are 0 .. V-1, each once."""
    vocab = read_json_object(path)
    if not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in vocab.items()
    ):
        raise InputError(f"{path}: not a vocabulary (a JSON object of piece: id)")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise InputError(f"{path}: its ids are not 0 to {len(vocab) - 1}, each once")
    return vocab


def pieces_by_id(vocab: dict[str, int]) -> list[str]:
    """The pieces of a vocabulary whose ids are 0 .. V-1, in id order."""
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces
