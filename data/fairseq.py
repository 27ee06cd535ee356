"""The tokenizers of NLLB-200, M2M100 and mBART-50 (fairseq trained all three), read as
transformers' `NllbTokenizer`, `M2M100Tokenizer` and `MBart50Tokenizer` read them.

    sentencepiece.bpe.model  the SentencePiece model that cuts text into pieces
    tokenizer.json           NLLB, mBART-50: every id (the pieces', the codes', <mask>'s);
                             where it is alone, what cuts text too (see below)
    vocab.json               M2M100: the pieces' ids; its language codes follow them
    tokenizer_config.json    transformers' settings (tokenizer_class, legacy_behaviour, ...)
    tf_tokenizer.json        what tf reads of them (`FairseqSettings`), written at import

The ids are fairseq's dictionary's: <s> <pad> </s> <unk> at 0-3, then the pieces, then the
language codes and <mask> wherever the files put them. tokenizer.json says where (the
published facebook/nllb-* files: the codes after the pieces and <mask> last; a tokenizer
transformers 5 builds and saves: <mask> first); without one, fairseq's layout (SentencePiece's
ids + 1, then the codes, then <mask>), which transformers' converters build too. M2M100's
vocab.json numbers its pieces in fairseq's dictionary order, and its codes follow it, in
transformers' order (`data.fairseq_languages`). A piece the vocabulary lacks is <unk>.

A source is `[code] X </s>` (NLLB's `legacy_behaviour`: `X </s> [code]`), as transformers frames
it with `src_lang` the code. tf puts the code at the start of the line ("fra_Latn Hola",
"__fr__ Hola", "fr_XX Hola"; the codes are the tokenizer's tags), and a line without one is
`X </s>`. A target is its pieces alone: the batching adds the EOS, and the decoder's first
token, the target's code, is forced by the run. Decoding drops what transformers'
`decode(skip_special_tokens=True)` drops (<s>, <pad>, </s>, <unk>, <mask>, the codes) and
cleans up spaces before punctuation where it does (`clean_up_tokenization_spaces`, which
transformers 5 ignores for NLLB's BPE). As for Marian, text is text: a literal "</s>" in a line
is cut into pieces, where transformers reads it as its special id. SentencePiece cuts the
text, as it did for fairseq's training: a space at a line's end is nothing (transformers 5's
NLLB tokenizer, built on the `tokenizers` library, makes it a "▁"; tf strips lines anyway).

An NLLB-200 or mBART-50 directory that `transformers` 5 saved holds tokenizer.json and
tokenizer_config.json alone (its `save_pretrained` writes no sentencepiece.bpe.model): there the
`tokenizers` library cuts the text by tokenizer.json, as transformers' fast tokenizers do
(transformers 4 reads the file as it is; transformers 5 builds its tokenizer from the file's
vocabulary, to the same ids), its special tokens typed in a line read as text, as above.
M2M100's tokenizer is SentencePiece's in Python: transformers 5 still saves its model.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from data.errors import InputError
from data.fairseq_files import (
    CARRIED,
    FAMILIES,
    HF_CONFIG,
    M2M100,
    MASK,
    MBART50,
    NLLB,
    SETTINGS,
    SPECIAL_TOKENS,
    SPM,
    TOKENIZER_JSON,
    VOCAB,
    FairseqSettings,
    TokenizerFamily,
    added_token,
    all_pieces,
    check_files,
    derive_settings,
    family_of,
    is_fairseq_tokenizer,
    named_family,
    numbered_pieces,
    read_fast_tokenizer,
    read_settings,
)
from data.files import read_json_object, write_json
from data.tokenizer_base import SPACE, BaseTokenizer, load_sentencepiece, split_tags

# What the rest of tf takes from here: the tokenizer, and its files' names and families.
__all__ = [
    "CARRIED",
    "FAMILIES",
    "HF_CONFIG",
    "M2M100",
    "MASK",
    "MBART50",
    "NLLB",
    "SETTINGS",
    "SPM",
    "TOKENIZER_JSON",
    "VOCAB",
    "FairseqSettings",
    "FairseqTokenizer",
    "TokenizerFamily",
    "family_of",
    "is_fairseq_tokenizer",
]

# transformers' `clean_up_tokenization`, in its order.
CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't")]
CLEAN_UP += [(" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]


class FairseqTokenizer(BaseTokenizer):
    """The tokenizer interface (`data.tokenizer_base`) over an NLLB-200, M2M100 or mBART-50
    model's files (see the module docstring): one vocabulary for both sides (`joint`).

    Attributes (besides `BaseTokenizer`'s): family: the model family (`NLLB`, `M2M100`,
    `MBART50`); settings: what tf reads of transformers' settings (`FairseqSettings`, saved
    as tf_tokenizer.json by `settings.save`); tags: {code piece: id}, the language codes alone;
    languages: {language: code piece} ("fr": "__fr__").
    """

    title = "NLLB/M2M100/mBART-50"  # as messages name the kind

    def __init__(self, directory: Path, family: TokenizerFamily | None = None) -> None:
        """Read the tokenizer in `directory`, of `family` (else the one its files name).

        Raises:
            InputError: a file missing or not what it should be, naming it.
        """
        self.directory = directory
        self.family = family = family or named_family(directory)
        check_files(directory, family)
        # What cuts text into pieces: SentencePiece, as fairseq trained the model, or where
        # transformers 5 saved tokenizer.json alone, the `tokenizers` library over it.
        self._spm = load_sentencepiece(directory / SPM) if (directory / SPM).is_file() else None
        self._fast = read_fast_tokenizer(directory / TOKENIZER_JSON) if self._spm is None else None
        numbered = numbered_pieces(directory, family, self._spm)
        self.settings = (
            read_settings(directory / SETTINGS)
            if (directory / SETTINGS).is_file()
            else derive_settings(directory, family, numbered)
        )
        if self.settings.kind != family.kind:
            raise InputError(
                f"{directory / SETTINGS}: kind {self.settings.kind}, not {family.kind}"
            )
        self._pieces = all_pieces(directory, numbered, family, self.settings)
        self._vocab: dict[str, int] = {}
        for i, piece in enumerate(self._pieces):
            self._vocab.setdefault(piece, i)  # (a piece numbered twice reads as its first id)
        for name, piece in SPECIAL_TOKENS.items():
            if piece not in self._vocab:
                raise InputError(f"{directory}: no {piece} in the vocabulary")
            setattr(self, name, self._vocab[piece])
        self.joint = True
        self.hf_class = family.classes[0]
        self.src_vocab_size = self.tgt_vocab_size = len(self._pieces)
        self.tags = {code: self._vocab[code] for code in self.settings.codes}
        self._code_starts = tuple(self.tags)
        self.languages = {family.language(code): code for code in self.settings.codes}
        self.src_lang = self.settings.src_lang
        # What transformers' decode skips: tokenizer.json's special added tokens, and (where
        # there is none) <s> <pad> </s> <unk>, the codes and <mask>.
        special = [*SPECIAL_TOKENS.values(), *self.tags, *([MASK] if MASK in self._vocab else [])]
        self._skipped = set(numbered.special) | {self._vocab[p] for p in special}
        names = [SPM, TOKENIZER_JSON, VOCAB, HF_CONFIG, *CARRIED, SETTINGS]
        self._paths = [directory / name for name in names if (directory / name).is_file()]

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Sources to ids: `[code] X </s>` (legacy: `X </s> [code]`) for a line that starts
        with a code, `X </s>` for one that does not."""
        split = [split_tags(text, self._code_starts) for text in texts]
        rows = self._encode([rest for _, rest in split])
        return [
            self._framed([self.tags[c] for c in codes], row) for (codes, _), row in zip(split, rows)
        ]

    def tagged_src(self, tag_ids: list[int], ids: list[int]) -> list[int]:
        """`ids` (`X </s>`) with the source's code where `encode_src` puts it (legacy: last)."""
        return [*ids, *tag_ids] if self.settings.legacy_behaviour else [*tag_ids, *ids]

    def _framed(self, codes: list[int], row: list[int]) -> list[int]:
        if self.settings.legacy_behaviour:
            return [*row, self.eos_id, *codes]
        return [*codes, *row, self.eos_id]

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """The ids of the pieces SentencePiece (or tokenizer.json alone) cuts each text into;
        nothing added. SentencePiece's pieces are looked up as strings, as transformers'
        M2M100Tokenizer looks them up: fairseq built M2M100's vocab.json from SentencePiece's
        output, where a character the model lacks is itself ("É"), so the vocabulary numbers
        some of those."""
        if self._spm is None:
            return [encoding.ids for encoding in self._fast_encodings(texts)]
        vocab, unk = self._vocab, self.unk_id
        rows = self._spm.encode(list(texts), out_type=str, num_threads=self.threads)
        return [[vocab.get(p, unk) for p in row] for row in rows]

    def _fast_encodings(self, texts: list[str]) -> list:
        """tokenizer.json's encodings of `texts`, nothing added. One at a time, no slower than
        `encode_batch` (docs/performance.md), and no thread pool of the `tokenizers` library's
        to carry into the processes `data.prepared` forks to encode a large corpus."""
        return [self._fast.encode(text, add_special_tokens=False) for text in texts]

    def truncate_src(self, ids: list[int], max_len: int) -> list[int]:
        """Cut to `max_len` as transformers truncates: the leading codes and the final
        `</s>` (and a legacy source's code after it) are kept, the text between is cut."""
        if len(ids) <= max_len:
            return list(ids)
        codes = set(self.tags.values())
        head = next((n for n, i in enumerate(ids) if i not in codes), len(ids))
        tail = next((n for n, i in enumerate(reversed(ids)) if i not in codes), len(ids))
        if tail < len(ids) and ids[len(ids) - 1 - tail] == self.eos_id:
            tail += 1
        keep = max(0, max_len - head - tail)
        return [*ids[:head], *ids[head : head + keep], *ids[len(ids) - tail :]][:max_len]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Targets to ids; no code, no EOS (the run forces the one, the batching adds the other)."""
        return self._encode(texts)

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        return self.decode_tgt(ids)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """As transformers' `decode(ids, skip_special_tokens=True)`: the codes, <s>, <pad>,
        </s>, <unk> and <mask> go."""
        return [self._decode(row) for row in ids]

    def _decode(self, row: list[int]) -> str:
        kept = [self._pieces[i] for i in map(int, row) if i not in self._skipped]
        if self.family.sentencepiece_decodes:  # transformers' M2M100Tokenizer, stripped
            text = self._spm.decode_pieces(kept).strip()
        else:  # the `tokenizers` Metaspace decoder: every "▁" a space, but the first piece's
            text = "".join(p.replace(SPACE, "" if n == 0 else " ") for n, p in enumerate(kept))
        if self.settings.clean_up_tokenization_spaces:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text

    def src_pieces(self, text: str) -> list[str]:
        codes, rest = split_tags(text, self._code_starts)
        if self._spm is None:
            return codes + self._fast_encodings([rest])[0].tokens
        return codes + self._spm.encode(rest, out_type=str)

    def src_id_pieces(self, ids: list[int]) -> list[str]:
        return self.tgt_pieces(ids)

    def tgt_piece_ids(self, pieces: list[str]) -> list[int]:
        return [self._vocab.get(p, self.unk_id) for p in pieces]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self._pieces[int(i)] for i in ids]

    def src_vocabulary(self) -> list[str]:
        return list(self._pieces)

    def tgt_vocabulary(self) -> list[str]:
        return list(self._pieces)

    def vocabulary_words(self) -> str:
        codes = len(self.tags)
        return f"{self.family.title}'s (SentencePiece, {codes} language codes)"

    def save_settings(self, directory: Path, src_lang: str, tgt_lang: str) -> None:
        """tf_tokenizer.json (`FairseqSettings`): its languages are its files' own."""
        self.settings.save(directory)

    def save_hf_config(
        self, directory: Path, max_positions: int, src_lang: str, tgt_lang: str
    ) -> None:
        """The original's tokenizer_config.json is among the files where the run keeps it
        (`model_paths`); else one of its class and the settings tf read of the original's
        (`hf_config`)."""
        if any(path.name == HF_CONFIG for path in self.model_paths()):
            return
        text = json.dumps(self.hf_config(max_positions), indent=1) + "\n"
        (directory / HF_CONFIG).write_text(text, encoding="utf-8")

    def hf_config(self, max_positions: int) -> dict:
        """tokenizer_config.json for the files: its class and the settings tf read of the
        original's (`FairseqSettings`), its special tokens."""
        s = self.settings
        config = {
            "tokenizer_class": self.hf_class,
            "src_lang": s.src_lang,
            "tgt_lang": None,
            "clean_up_tokenization_spaces": s.clean_up_tokenization_spaces,
            "model_max_length": max_positions,
            "bos_token": "<s>",
            "eos_token": "</s>",
            "sep_token": "</s>",
            "cls_token": "<s>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "additional_special_tokens": list(s.codes),
        }
        if self.family is NLLB:
            config["legacy_behaviour"] = s.legacy_behaviour
        lists = [name for name, codes in self.family.code_lists.items() if codes == s.codes]
        if self.family is M2M100 and lists:  # M2M100's list or WMT21's
            config["language_codes"] = lists[0]
        if MASK in self._vocab:
            config["mask_token"] = MASK
        return config

    def check_growable(self) -> None:
        """M2M100's codes follow its vocab.json in transformers' fixed list, which its class
        cannot grow; without tokenizer.json, NLLB-200's and mBART-50's <mask> follows the
        codes."""
        if self.family is M2M100:
            raise InputError(
                f"{self.directory}: M2M100's tokenizer takes its codes from transformers' "
                "fixed list: a new language needs NLLB-200 or mBART-50"
            )
        if not (self.directory / TOKENIZER_JSON).is_file():
            raise InputError(
                f"{self.directory / TOKENIZER_JSON}: missing, and a new language's id needs "
                "it (without it, <mask> follows the codes)"
            )

    def append_tokens(self, tokens: list[str]) -> None:
        """Each a code after every id, special as the published codes are: in tokenizer.json's
        added tokens, tokenizer_config.json's list of codes, tf_tokenizer.json's codes."""
        directory, size = self.directory, self.src_vocab_size
        data = read_json_object(directory / TOKENIZER_JSON)
        data["added_tokens"] = [
            *data.get("added_tokens", []),
            *(added_token(c, size + i) for i, c in enumerate(tokens)),
        ]
        write_json(directory / TOKENIZER_JSON, data)
        config = read_json_object(directory / HF_CONFIG, default={})
        for key in ("extra_special_tokens", "additional_special_tokens"):
            if isinstance(config.get(key), list):  # transformers' list of the codes
                config[key] = [*config[key], *tokens]
        if config:
            write_json(directory / HF_CONFIG, config)
        settings = self.settings
        replace(settings, codes=(*settings.codes, *tokens)).save(directory)

    def __repr__(self) -> str:
        return (
            f"FairseqTokenizer({str(self.directory)!r}, {self.family.title}, "
            f"vocab {self.src_vocab_size}, {len(self.tags)} languages)"
        )
