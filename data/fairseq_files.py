"""The files of NLLB-200's, M2M100's and mBART-50's tokenizers (`data.fairseq` reads them as
transformers does): which family's they are (`TokenizerFamily`: NLLB, M2M100, MBART50), what tf
keeps of transformers' settings (`FairseqSettings`, tf_tokenizer.json), and every id's piece
(tokenizer.json's, M2M100's vocab.json, else fairseq's layout over SentencePiece's ids).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import sentencepiece as spm

from data.errors import InputError
from data.fairseq_languages import M2M100_CODES, MBART50_CODES, NLLB_CODES, WMT21_CODES
from data.files import read_json_object, write_json
from data.tokenizer_base import pieces_by_id, read_vocabulary

SPM = "sentencepiece.bpe.model"
TOKENIZER_JSON = "tokenizer.json"
VOCAB = "vocab.json"
HF_CONFIG = "tokenizer_config.json"
SETTINGS = "tf_tokenizer.json"
# Files of transformers' that an import carries along, unread by tf (an export writes them back).
CARRIED = ("special_tokens_map.json", "added_tokens.json")
SPECIAL_TOKENS = {"bos_id": "<s>", "pad_id": "<pad>", "eos_id": "</s>", "unk_id": "<unk>"}
MASK = "<mask>"


@dataclass(frozen=True)
class TokenizerFamily:
    """What one family's tokenizer files hold and how transformers reads them."""

    kind: str  # as tf_tokenizer.json names it
    title: str  # as messages name it
    classes: tuple[str, ...]  # its transformers classes (tokenizer_config.json's tokenizer_class)
    lang_token: str  # a language's code piece, {lang} filled in
    code: re.Pattern[str]  # what a code piece looks like (among tokenizer.json's added tokens)
    # transformers' lists of its code pieces, in its order, by tokenizer_config.json's
    # `language_codes` (M2M100's "m2m100" or "wmt21"); the first where it names none.
    code_lists: dict[str, tuple[str, ...]]
    # the files it cannot do without: one of each group ((SPM, TOKENIZER_JSON): either cuts text)
    needs: tuple[tuple[str, ...], ...]
    # transformers reads it with SentencePiece in Python (M2M100), not with the `tokenizers`
    # library (NLLB, mBART-50), whose decoder joins the pieces its own way.
    sentencepiece_decodes: bool
    # transformers' decode cleans up spaces where tokenizer_config.json asks it to (its
    # `tokenizers` BPE, NLLB's, never: transformers 5 calls that cleanup destructive).
    cleans_up: bool

    def language(self, code: str) -> str:
        """The language a code piece names ("__fr__" -> "fr", "fra_Latn" -> "fra_Latn")."""
        head, tail = self.lang_token.split("{lang}")
        return code[len(head) : len(code) - len(tail)]

    def codes_in(self, config: dict, path: Path) -> tuple[str, ...]:
        """Transformers' list of the code pieces that `config` (tokenizer_config.json) names."""
        name = config.get("language_codes", next(iter(self.code_lists)))
        if name not in self.code_lists:
            known = " or ".join(self.code_lists)
            raise InputError(f"{path}: language_codes must be {known}, not {name!r}")
        return self.code_lists[name]


NLLB = TokenizerFamily(
    "nllb",
    "NLLB-200",
    ("NllbTokenizer", "NllbTokenizerFast"),
    "{lang}",
    re.compile(r"[a-z]{3}_[A-Z][a-z]{3}"),
    {"nllb": NLLB_CODES},
    ((SPM, TOKENIZER_JSON),),
    sentencepiece_decodes=False,
    cleans_up=False,
)
M2M100 = TokenizerFamily(
    "m2m100",
    "M2M100",
    ("M2M100Tokenizer",),
    "__{lang}__",
    re.compile(r"__[a-z]{2,3}__"),
    {
        "m2m100": tuple(f"__{lang}__" for lang in M2M100_CODES),
        "wmt21": tuple(f"__{lang}__" for lang in WMT21_CODES),
    },
    ((SPM,), (VOCAB,)),
    sentencepiece_decodes=True,
    cleans_up=True,
)
MBART50 = TokenizerFamily(
    "mbart50",
    "mBART-50",
    ("MBart50Tokenizer", "MBart50TokenizerFast"),
    "{lang}",
    re.compile(r"[a-z]{2}_[A-Z]{2}"),
    {"mbart50": MBART50_CODES},
    ((SPM, TOKENIZER_JSON),),
    sentencepiece_decodes=False,
    cleans_up=True,
)
FAMILIES = {family.kind: family for family in (NLLB, M2M100, MBART50)}


@dataclass(frozen=True)
class FairseqSettings:
    """tf_tokenizer.json: what tf reads of transformers' settings, as one JSON object.

    {"kind": "nllb", "codes": ["ace_Arab", ...], "legacy_behaviour": false,
     "src_lang": "eng_Latn", "clean_up_tokenization_spaces": false}

    kind: "nllb", "m2m100" or "mbart50". codes: the language-code pieces, in id order (M2M100's
    ids are vocab.json's size + their place here). legacy_behaviour: NLLB's sources end in
    `</s> [code]`. src_lang: the language tokenizer_config.json names as the source's (None
    where it names none). clean_up_tokenization_spaces: decoding removes the space before
    punctuation (" ," -> ","), as transformers' decode does for this tokenizer's files.
    """

    kind: str
    codes: tuple[str, ...]
    legacy_behaviour: bool = False
    src_lang: str | None = None
    clean_up_tokenization_spaces: bool = False

    def save(self, directory: Path) -> Path:
        """Write tf_tokenizer.json into `directory`; returns its path."""
        path = directory / SETTINGS
        write_json(path, {**asdict(self), "codes": list(self.codes)})
        return path


def read_settings(path: Path) -> FairseqSettings:
    """A tf_tokenizer.json, each key checked.

    Raises:
        InputError: not a JSON object of those keys and types, naming the file and the key.
    """
    value = read_json_object(path)
    known = {f.name for f in fields(FairseqSettings)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InputError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    if value.get("kind") not in FAMILIES:
        raise InputError(
            f"{path}: kind must be one of {', '.join(FAMILIES)}, not {value.get('kind')!r}"
        )
    codes = value.get("codes")
    if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
        raise InputError(f"{path}: codes must be a list of the language codes' pieces")
    for key in ("legacy_behaviour", "clean_up_tokenization_spaces"):
        if not isinstance(value.get(key, False), bool):
            raise InputError(f"{path}: {key} must be true or false")
    if not isinstance(value.get("src_lang"), (str, type(None))):
        raise InputError(f"{path}: src_lang must be a language or null")
    return FairseqSettings(**{**value, "codes": tuple(codes)})


def family_of(directory: Path) -> TokenizerFamily | None:
    """The family of the tokenizer in `directory`: the one tf_tokenizer.json names, else the one
    of tokenizer_config.json's tokenizer_class; None where neither says and there is no
    sentencepiece.bpe.model.

    Raises:
        InputError: sentencepiece.bpe.model with nothing that says whose it is.
    """
    if (directory / SETTINGS).is_file():
        return FAMILIES[read_settings(directory / SETTINGS).kind]
    config = read_json_object(directory / HF_CONFIG, default={})
    for family in FAMILIES.values():
        if config.get("tokenizer_class") in family.classes:
            return family
    if (directory / SPM).is_file():  # (a tokenizer.json alone may be any model's)
        classes = ", ".join(c for f in FAMILIES.values() for c in f.classes)
        raise InputError(
            f"{directory / HF_CONFIG}: no tokenizer_class tf reads ({classes}) for the "
            f"{SPM} beside it"
        )
    return None


def named_family(directory: Path) -> TokenizerFamily:
    """`family_of(directory)`, which must name one."""
    family = family_of(directory)
    if family is None:
        raise InputError(
            f"{directory / SPM}: missing (an NLLB-200, M2M100 or mBART-50 tokenizer needs it, "
            f"or NLLB-200's and mBART-50's {TOKENIZER_JSON}, and a {HF_CONFIG} naming its "
            "tokenizer_class)"
        )
    return family


def is_fairseq_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds an NLLB-200, M2M100 or mBART-50 tokenizer (or what looks like
    one: `FairseqTokenizer` says what is wrong with it)."""
    if (directory / SETTINGS).is_file() or (directory / SPM).is_file():
        return True
    try:
        return family_of(directory) is not None
    except InputError:
        return True


def added_token(content: str, id: int) -> dict:
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


@dataclass(frozen=True)
class Numbered:
    """The ids a model's files give: its pieces in id order, the ids of tokenizer.json's special
    added tokens, and whether the files number the codes (tokenizer.json) or leave them to
    follow the pieces (vocab.json; SentencePiece's own ids)."""

    pieces: list[str]
    special: frozenset[int]
    numbers_codes: bool


def check_files(directory: Path, family: TokenizerFamily) -> None:
    """InputError naming the first file `family` needs that `directory` lacks (its `needs`)."""
    for group in family.needs:
        if not any((directory / name).is_file() for name in group):
            needs = " and ".join(" or ".join(names) for names in family.needs)
            raise InputError(
                f"{directory / group[0]}: missing (an {family.title} tokenizer needs {needs})"
            )


def read_fast_tokenizer(path: Path):
    """tokenizer.json as a `tokenizers.Tokenizer` that cuts a text into its pieces alone: no
    truncation or padding the file may keep, its special tokens typed in a text read as text.

    Raises:
        InputError: not a tokenizer the `tokenizers` library reads, naming the file.
    """
    from tokenizers import Tokenizer as Fast

    try:
        fast = Fast.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception for any malformed file
        why = " ".join(str(e).split())[:120]
        raise InputError(f"{path}: not a tokenizer the tokenizers library reads ({why})") from None
    fast.no_truncation()
    fast.no_padding()
    fast.encode_special_tokens = True
    return fast


def numbered_pieces(
    directory: Path, family: TokenizerFamily, sp: spm.SentencePieceProcessor | None
) -> Numbered:
    """The pieces' ids: vocab.json's (M2M100), tokenizer.json's, or fairseq's layout over
    SentencePiece's (its <unk> <s> </s> at 0-2 become <s> <pad> </s> <unk>, the rest move up
    one, as transformers' converters number them). `sp`: None where tokenizer.json is alone."""
    if family is M2M100:
        return Numbered(pieces_by_id(read_vocabulary(directory / VOCAB)), frozenset(), False)
    path = directory / TOKENIZER_JSON
    if sp is None:
        return _read_tokenizer_json(path)
    if path.is_file():
        numbered = _read_tokenizer_json(path)
        known = set(numbered.pieces)
        missing = [p for p in _spm_pieces(sp) if p not in known]
        if missing:
            raise InputError(
                f"{path}: lacks {len(missing)} pieces of {SPM} (first {missing[0]!r}): "
                "they are not one tokenizer's files"
            )
        return numbered
    return Numbered([*SPECIAL_TOKENS.values(), *_spm_pieces(sp)], frozenset(), False)


def _spm_pieces(sp: spm.SentencePieceProcessor) -> list[str]:
    """SentencePiece's pieces after its <unk> <s> </s>."""
    return [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]


def _read_tokenizer_json(path: Path) -> Numbered:
    """tokenizer.json's pieces by id: its model's vocabulary (BPE's {piece: id}, Unigram's
    [[piece, score], ...]) and its added tokens (which win where both number a piece).

    Raises:
        InputError: no vocabulary there, or ids that are not 0 .. V-1 each once.
    """
    data = read_json_object(path)
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        numbered = {i: p for p, i in vocab.items()}
    elif isinstance(vocab, list) and all(isinstance(row, list) and row for row in vocab):
        numbered = {i: row[0] for i, row in enumerate(vocab)}
    else:
        raise InputError(f"{path}: no model.vocab of pieces")
    added = data.get("added_tokens") or []
    if not all(isinstance(t, dict) and {"id", "content"} <= t.keys() for t in added):
        raise InputError(f"{path}: added_tokens must be objects with an id and a content")
    numbered |= {t["id"]: t["content"] for t in added}
    ids = sorted(numbered)
    if ids != list(range(len(ids))) or not all(isinstance(p, str) for p in numbered.values()):
        raise InputError(f"{path}: its ids are not 0 to {len(ids) - 1}, each once, of pieces")
    special = frozenset(t["id"] for t in added if t.get("special"))
    return Numbered([numbered[i] for i in ids], special, True)


def all_pieces(
    directory: Path, numbered: Numbered, family: TokenizerFamily, settings: FairseqSettings
) -> list[str]:
    """Every id's piece: the files' where they number the codes (each code must be there),
    else the pieces, then the codes (then NLLB's and mBART-50's <mask>)."""
    if numbered.numbers_codes:
        numbered_pieces = set(numbered.pieces)
        missing = [code for code in settings.codes if code not in numbered_pieces]
        if missing:
            raise InputError(f"{directory / TOKENIZER_JSON}: no language code {missing[0]!r}")
        return numbered.pieces
    return [*numbered.pieces, *settings.codes, *([] if family is M2M100 else [MASK])]


def derive_settings(
    directory: Path, family: TokenizerFamily, numbered: Numbered
) -> FairseqSettings:
    """tf's settings of a model's own files (see `FairseqSettings`): the codes are
    tokenizer.json's special added tokens that look like the family's codes, in id order, or
    where there is no tokenizer.json, transformers' list; the rest is tokenizer_config.json's.

    Raises:
        InputError: a setting of tokenizer_config.json of another type than transformers reads.
    """
    path = directory / HF_CONFIG
    config = read_json_object(path, default={})
    legacy = config.get("legacy_behaviour", False) if family is NLLB else False
    clean_up = config.get("clean_up_tokenization_spaces", False)
    src_lang = config.get("src_lang")
    for key, value, kind in (
        ("legacy_behaviour", legacy, bool),
        ("clean_up_tokenization_spaces", clean_up, bool),
        ("src_lang", src_lang, (str, type(None))),
    ):
        if not isinstance(value, kind):
            raise InputError(f"{path}: {key} {value!r} is not what transformers reads there")
    if numbered.numbers_codes:
        pieces, special = numbered.pieces, numbered.special
        codes = tuple(p for i, p in enumerate(pieces) if i in special and family.code.fullmatch(p))
    else:
        codes = family.codes_in(config, path)
    return FairseqSettings(family.kind, codes, legacy, src_lang, clean_up and family.cleans_up)
