"""SentencePiece subword models: train one joint model (or one per side) and load it back;
and `Tokenizer.load`, the one place that reads any tokenizer kind from its files.

The special ids are fixed here, at training time, and nowhere else: every other module reads
them from the loaded model (`Tokenizer.pad_id` ...), so a model trained with other ids would
still be handled correctly.

The kinds share one interface (`data.tokenizer_base.BaseTokenizer`): `tf`'s own models (here),
an OPUS-MT model's (`data.marian`), NLLB-200's, M2M100's and mBART-50's (`data.fairseq`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from data.errors import InputError
from data.fairseq import FairseqTokenizer, is_fairseq_tokenizer
from data.marian import MarianTokenizer, is_marian_tokenizer
from data.tokenizer_base import (
    SPACE,
    BaseTokenizer,
    decode_rows,
    load_sentencepiece,
    split_tags,
)

# The only place these numbers appear; see the module docstring.
SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}

JOINT_MODEL = "joint.model"
TOKENIZER_SETTINGS = "settings.json"  # beside the model(s): what they were trained with
SRC_MODEL = "src.model"
TGT_MODEL = "tgt.model"
MODEL_TYPES = ("bpe", "unigram")
# The imported models' kinds, each with what says a directory holds it, in the order they are
# told apart: M2M100's vocab.json is a Marian file's name too.
IMPORTED = ((FairseqTokenizer, is_fairseq_tokenizer), (MarianTokenizer, is_marian_tokenizer))


def train_tokenizer(
    src_texts: Iterable[str],
    tgt_texts: Iterable[str],
    out_dir: str | os.PathLike,
    *,
    vocab_size: int,
    seed: int,  # no default here: `train.seed` is the one default
    model_type: str = "bpe",
    joint: bool = True,
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    byte_fallback: bool = False,
    tags: Sequence[str] = (),
) -> Tokenizer:
    """Train SentencePiece on the given sentences and save the model(s) into `out_dir`.

    Args:
        src_texts, tgt_texts: sentences of each side; any iterables (consumed once).
        out_dir: where `joint.model` (or `src.model` and `tgt.model`) and a training log go.
        vocab_size: the vocabulary size of each model; an upper bound, so that small corpora
            that cannot fill it still train.
        model_type: "bpe" or "unigram".
        joint: one model shared by both sides (needed to tie all embeddings), else one per side.
        character_coverage: share of characters kept as pieces; the rest map to unk (or bytes).
        seed: seeds SentencePiece's sampling of `input_sentence_size` sentences.
        input_sentence_size: at most this many sentences (per model) are sampled for training,
            which bounds time and memory on large corpora.
        byte_fallback: spell out characters missing from the vocabulary as UTF-8 bytes instead
            of unk (needs `vocab_size` >= 260).
        tags: reserved pieces (e.g. "<bt>" for back-translated sources) that SentencePiece
            never splits: user-defined symbols, read back from the model as `Tokenizer.tags`.

    Returns:
        The trained tokenizer, loaded from `out_dir`.

    Raises:
        InputError: SentencePiece rejected the corpus or the settings.
    """
    if model_type not in MODEL_TYPES:
        raise InputError(f"tokenizer: model_type must be one of {MODEL_TYPES}, not {model_type!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A model of the other layout left from an earlier run would make `load` ambiguous.
    for name in (JOINT_MODEL, SRC_MODEL, TGT_MODEL):
        for stale in (out_dir / name, out_dir / name.replace(".model", ".vocab")):
            stale.unlink(missing_ok=True)

    options = {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "character_coverage": character_coverage,
        "input_sentence_size": input_sentence_size,
        "byte_fallback": byte_fallback,
    }
    if tags:
        options["user_defined_symbols"] = list(tags)
    spm.set_random_generator_seed(seed)
    if joint:
        _train_model(itertools.chain(src_texts, tgt_texts), out_dir / JOINT_MODEL, options)
    else:
        _train_model(src_texts, out_dir / SRC_MODEL, options)
        _train_model(tgt_texts, out_dir / TGT_MODEL, options)
    return Tokenizer.load(out_dir)


def read_tokenizer_settings(directory: Path) -> dict | None:
    """What the tokenizer in `directory` was trained with (`data.pipeline` writes it), or None
    for one that records nothing (an older run's, an imported one)."""
    try:
        return json.loads((directory / TOKENIZER_SETTINGS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _train_model(texts: Iterable[str], model_path: Path, options: dict) -> None:
    """Train one SentencePiece model into `model_path` (and its `.vocab` beside it)."""
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_non_empty(texts),
            model_prefix=str(model_path.with_suffix("")),
            **SPECIAL_IDS,
            # vocab_size is a bound, not a demand: tiny test corpora cannot fill it.
            hard_vocab_limit=False,
            shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1,
            # Errors only: SentencePiece otherwise floods stderr. (Its `logstream` would need
            # a real stderr file descriptor, which embedding programs and test runners lack.)
            minloglevel=2,
            **options,
        )
    except RuntimeError as err:
        raise InputError(f"{model_path}: {_explain(err, options)}") from None


def _explain(err: RuntimeError, options: dict) -> str:
    """One line saying why SentencePiece refused to train."""
    text = " ".join(str(err).split()) or type(err).__name__
    too_small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", text)
    if too_small:
        return (
            f"vocab_size {too_small[1]} is below the {too_small[2]} pieces needed for the "
            f"corpus's characters at character_coverage {options['character_coverage']}; "
            "raise vocab_size or lower character_coverage"
        )
    return f"SentencePiece training failed: {text}"


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    """The non-blank sentences of `texts` (blank lines carry nothing to learn)."""
    return (text for text in texts if text.strip())


class Tokenizer(BaseTokenizer):
    """A pair of SentencePiece models, source and target (the same object when joint).

    `Tokenizer.load` reads this kind and the imported models' (`data.marian`, `data.fairseq`):
    every other module takes any of them, through `BaseTokenizer`'s interface (whose
    attributes these are: pad_id ... read from the model, tags its user-defined pieces).
    """

    def __init__(self, directory: Path, src_path: Path, tgt_path: Path) -> None:
        self.directory = directory
        self.joint = src_path == tgt_path
        self._paths = [src_path] if self.joint else [src_path, tgt_path]
        self._src = load_sentencepiece(src_path)
        self._tgt = self._src if self.joint else load_sentencepiece(tgt_path)
        src_ids, tgt_ids = _special_ids(self._src), _special_ids(self._tgt)
        if src_ids != tgt_ids:
            raise InputError(f"{directory}: src.model and tgt.model use different special ids")
        for name, value in src_ids.items():
            if value < 0:
                raise InputError(f"{src_path}: the model defines no {name.removesuffix('_id')}")
        self.pad_id = src_ids["pad_id"]
        self.unk_id = src_ids["unk_id"]
        self.bos_id = src_ids["bos_id"]
        self.eos_id = src_ids["eos_id"]
        self.src_vocab_size = self._src.get_piece_size()
        self.tgt_vocab_size = self._tgt.get_piece_size()
        self.tags = _user_defined(self._src)  # {"<bt>": id, ...}: reserved source pieces
        # ... and their target ids: a language token the decoder writes first decodes to nothing
        self._tgt_tags = set(
            self.tags.values() if self.joint else _user_defined(self._tgt).values()
        )
        self._tag_starts = tuple(self.tags)
        self.languages = {}  # a run's language tokens are tags, named by its config

    @staticmethod
    def found_in(directory: str | os.PathLike) -> bool:
        """Whether `directory` holds a tokenizer of any kind: `joint.model`, or
        `src.model`/`tgt.model`, or an imported Marian, NLLB-200, M2M100 or mBART-50 model's
        files."""
        directory = Path(directory)
        return (
            (directory / JOINT_MODEL).is_file()
            or (directory / SRC_MODEL).is_file()
            or any(holds(directory) for _, holds in IMPORTED)
        )

    @classmethod
    def load(cls, directory: str | os.PathLike) -> BaseTokenizer:
        """The tokenizer in `directory`, of the kind its files say: an NLLB-200, M2M100 or
        mBART-50 tokenizer (`data.fairseq`: sentencepiece.bpe.model ...), a Marian one
        (`data.marian`: source.spm, vocab.json ...), or tf's own (`joint.model`, or
        `src.model` and `tgt.model`). The fairseq kinds are tried first: M2M100's vocab.json
        is a Marian file's name too.

        Raises:
            InputError: no tokenizer there, two at once, or a file that is not what it should be.
        """
        directory = Path(directory)
        joint = directory / JOINT_MODEL
        src, tgt = directory / SRC_MODEL, directory / TGT_MODEL
        imported = next((kind for kind, holds in IMPORTED if holds(directory)), None)
        if imported is not None:
            if joint.is_file() or src.is_file():
                raise InputError(
                    f"{directory}: holds both a {imported.title} tokenizer and tf's own"
                )
            return imported(directory)
        if joint.is_file() and (src.is_file() or tgt.is_file()):
            raise InputError(f"{directory}: holds both {JOINT_MODEL} and {SRC_MODEL}/{TGT_MODEL}")
        if joint.is_file():
            return cls(directory, joint, joint)
        if src.is_file() and tgt.is_file():
            return cls(directory, src, tgt)
        raise InputError(
            f"{directory}: no tokenizer here "
            f"(expected {JOINT_MODEL}, or {SRC_MODEL} and {TGT_MODEL})"
        )

    def save_settings(self, directory: Path, src_lang: str, tgt_lang: str) -> None:
        """Nothing: tf's own models are all there is (no transformers settings)."""

    def save_hf_config(
        self, directory: Path, max_positions: int, src_lang: str, tgt_lang: str
    ) -> None:
        """Nothing: an export ships tf's models as a fast tokenizer of their own
        (`hf_class` None, `cli.exporters.hf_tokenizer`), whose tokenizer_config.json it writes."""

    def append_tokens(self, tokens: list[str]) -> None:
        """Each a user-defined piece appended to the source's SentencePiece model (joint.model,
        or src.model: a language token is a source piece), which SentencePiece takes whole
        wherever it stands in the list."""
        from sentencepiece import sentencepiece_model_pb2 as pb

        path = self.model_paths()[0]
        proto = pb.ModelProto()
        proto.ParseFromString(path.read_bytes())
        user_defined = pb.ModelProto.SentencePiece.USER_DEFINED
        for token in tokens:
            proto.pieces.add(piece=token, score=0.0, type=user_defined)
        path.write_bytes(proto.SerializeToString())

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source sentences to piece ids; no BOS/EOS added. The tags a line starts with
        (`<bt> text`, `<2en> <bt> text`, a space after each or not) are their ids alone, and
        the rest is encoded as a sentence of its own: as training puts a tagged corpus's tag
        ids before its encoded text, so "<2en>Y" is "<2en> Y" (SentencePiece alone would
        give "<2en>", "Y": the first word without its "▁"). An exported tokenizer does the
        same."""
        if not self.tags:
            return self._encode_untagged(list(texts))
        split = [split_tags(text, self._tag_starts) for text in texts]
        heads, rests = zip(*split) if split else ((), ())
        rows = self._encode_untagged(list(rests))
        return [
            [self.tags[t] for t in head] + row if head else row for head, row in zip(heads, rows)
        ]

    def _encode_untagged(self, texts: list[str]) -> list[list[int]]:
        """SentencePiece's ids, less the lone "▁" it puts before a tag inside a line (which
        no training pair holds: a corpus's text holds no tag)."""
        ids = self._src.encode(texts, out_type=int, num_threads=self.threads)
        space = self._src.piece_to_id(SPACE)
        if not self.tags or space == self.unk_id:
            return ids
        tags = set(self.tags.values())

        def untagged(row: list[int]) -> list[int]:
            return [i for i, j in zip(row, row[1:] + [None]) if not (i == space and j in tags)]

        # `in` scans in C: most rows (every training row) hold no lone "▁" at all.
        return [untagged(row) if space in row else row for row in ids]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Target sentences to piece ids; no BOS/EOS added."""
        return self._tgt.encode(list(texts), out_type=int, num_threads=self.threads)

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        """Source piece ids back to text, one string per row; special ids decode to nothing."""
        return decode_rows(self._src, ids)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Target piece ids back to text, one string per row; special ids and reserved pieces
        (a target language's token, `data.lang_token_side: target`) decode to nothing."""
        tags = self._tgt_tags
        return decode_rows(
            self._tgt, [[i for i in row if i not in tags] for row in ids] if tags else ids
        )

    def src_pieces(self, text: str) -> list[str]:
        """The source pieces of one sentence, e.g. ["▁Él", "▁com", "ió"]."""
        return self._src.encode(text, out_type=str)

    def src_id_pieces(self, ids: list[int]) -> list[str]:
        """The source pieces named by `ids` (a truncated sentence keeps only its ids)."""
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_piece_ids(self, pieces: list[str]) -> list[int]:
        """The target ids of `pieces` (as an engine working on pieces returns them)."""
        return [self._tgt.piece_to_id(p) for p in pieces]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """The target pieces named by `ids`."""
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    def src_vocabulary(self) -> list[str]:
        """The source pieces in id order."""
        return [self._src.id_to_piece(i) for i in range(self.src_vocab_size)]

    def tgt_vocabulary(self) -> list[str]:
        """The target pieces in id order."""
        return [self._tgt.id_to_piece(i) for i in range(self.tgt_vocab_size)]

    def __repr__(self) -> str:
        layout = "joint" if self.joint else "separate"
        sizes = (
            f"{self.src_vocab_size}"
            if self.joint
            else f"{self.src_vocab_size}/{self.tgt_vocab_size}"
        )
        return f"Tokenizer({str(self.directory)!r}, {layout}, vocab {sizes})"


def _special_ids(model: spm.SentencePieceProcessor) -> dict[str, int]:
    """The special ids a model was trained with (-1 where it has none)."""
    return {
        "pad_id": model.pad_id(),
        "unk_id": model.unk_id(),
        "bos_id": model.bos_id(),
        "eos_id": model.eos_id(),
    }


def _user_defined(model: spm.SentencePieceProcessor) -> dict[str, int]:
    """The model's user-defined pieces (its tags), from its own protobuf."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(model.serialized_model_proto())
    user_defined = pb.ModelProto.SentencePiece.USER_DEFINED
    return {p.piece: i for i, p in enumerate(proto.pieces) if p.type == user_defined}
