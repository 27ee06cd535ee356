"""Parallel corpora: every source loads through `datasets`, so one pipeline serves them all.

A corpus is a `datasets.Dataset` with string columns "src" and "tgt"; `encode_corpus` turns it
into "src_ids"/"tgt_ids", `filter_pairs` drops unusable pairs, `token_ids` loads ids for the
batch iterator. Local files are read by `datasets`' own builders, so large corpora stay
memory-mapped Arrow files and every step after loading is cached by `datasets`.

Spec forms (see `load_corpus`):
    PREFIX                      PREFIX.SRC and PREFIX.TGT, one sentence a line
    FILE.tsv                    SRC<TAB>TGT a line; an optional first line naming the languages
    FILE.jsonl                  {"translation": {SRC: .., TGT: ..}} or {SRC: .., TGT: ..} a line
                                (each local file may be gzipped: PREFIX.SRC.gz, FILE.tsv.gz, ...)
    hf:NAME[:CONFIG][@SPLIT]    datasets.load_dataset(NAME, CONFIG, split=SPLIT); SPLIT "train"
    bundled:NAME/SPLIT          a corpus shipped in data/corpora/ (bible-es-en: es and en)
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.utils import tqdm as datasets_tqdm

from data.batching import RaggedIds
from data.clean import first_row_holding
from data.errors import InputError, counted
from data.text import nul_problem, open_bytes, read_line_blocks

if TYPE_CHECKING:
    from data.tokenizer import Tokenizer

# tf reports its own progress: `datasets`' logging and bars are quiet unless turned on
# (`data.pipeline` shows its bars while reading a large corpus). Set here, where every corpus
# is read, rather than at start-up: `tf translate` need not import `datasets` (0.5 s).
datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()

BUNDLED_DIR = Path(__file__).parent / "corpora"
_ARROW_BATCH = 65_536  # rows per Arrow batch when measuring lengths
_ENCODE_VERSION = "1"  # bump when `encode_corpus` changes, to invalidate its cached outputs
_LINES_VERSION = "2"  # bump when `_write_lines` changes, likewise (2: NULs refused)


SIDES = ("src", "tgt")


def load_corpus(
    spec: str, src_lang: str, tgt_lang: str, sides: tuple[str, ...] = SIDES
) -> datasets.Dataset:
    """Load a parallel corpus as a Dataset with string columns "src" and "tgt".

    Args:
        spec: a path prefix, a .tsv or .jsonl file (.gz allowed), `hf:NAME[:CONFIG][@SPLIT]` or
            `bundled:NAME/SPLIT` (see the module docstring).
        src_lang, tgt_lang: language codes: file suffixes, TSV header fields, JSON keys.
        sides: the columns wanted; ("src",) reads the sources alone (`tf distill`), so the
            other side need not exist (no PREFIX.TGT file, no TGT key in a JSON line).

    Returns:
        The pairs in file order (the `sides` asked of each), memory-mapped where `datasets`
        caches them.

    Raises:
        InputError: a missing or unreadable file, invalid UTF-8, misaligned or malformed lines,
            an unknown hub dataset, or no pairs at all; the message names the file (and line).
    """
    if src_lang == tgt_lang:
        raise InputError(f"{spec}: source and target language are both {src_lang!r}")
    langs = {side: lang for side, lang in zip(SIDES, (src_lang, tgt_lang)) if side in sides}
    if spec.startswith("hf:"):
        ds = _load_hub(spec, langs)
    elif spec.startswith("bundled:"):
        ds = _load_parallel(_bundled_prefix(spec, src_lang, tgt_lang), langs)
    elif spec.endswith((".tsv", ".tsv.gz")):
        ds = _load_tsv(_existing(Path(spec)), src_lang, tgt_lang).select_columns(list(langs))
    elif spec.endswith((".jsonl", ".jsonl.gz")):
        ds = _load_jsonl(_existing(Path(spec)), langs)
    else:
        ds = _load_parallel(spec, langs)
    if len(ds) == 0:
        raise InputError(f"{spec}: the corpus has no sentence pairs")
    if spec.startswith("hf:") or spec.endswith((".jsonl", ".jsonl.gz")):
        # Text files are refused at a NUL byte as they are read; JSON's "\u0000" is decoded.
        found = first_row_holding(ds, ["\0"])
        if found is not None:
            raise InputError(nul_problem(where_row(spec, src_lang, tgt_lang, found[0])))
    return ds


def where_row(spec: str, src_lang: str, tgt_lang: str, row: int) -> str:
    """Where row `row` (0-based) of `load_corpus(spec, src_lang, tgt_lang)` lies, for an error:
    "FILE:LINE" in the file's own numbers (a TSV's header line and a JSON Lines file's blank
    lines, which the reader skips, counted), "PREFIX:LINE" for the line of both PREFIX.SRC and
    PREFIX.TGT, "hf:NAME row N" for a hub dataset."""
    if spec.startswith("hf:"):
        return f"{spec} row {row + 1}"
    if spec.endswith((".tsv", ".tsv.gz")):
        first = _load_lines(Path(spec))[0]["text"]  # cached: read in full before
        return f"{spec}:{row + 1 + _tsv_header(first, src_lang, tgt_lang)[0]}"
    if spec.endswith((".jsonl", ".jsonl.gz")):
        return f"{spec}:{_jsonl_line(Path(spec), row)}"
    return f"{spec}:{row + 1}"


# --- local files ---------------------------------------------------------------------------


def anchored_spec(spec: str) -> str:
    """`spec` with its local path made absolute (read from the working directory), so that it
    names the same files from any directory: a PREFIX, a .tsv or .jsonl file, or an `hf:`
    dataset that is a local folder (`datasets` reads a name that exists as a path there).
    Hub names, `bundled:` corpora and "" (no set) are as they were."""
    if not spec or spec.startswith("bundled:"):
        return spec
    if spec.startswith("hf:"):
        name = spec.removeprefix("hf:").partition("@")[0].partition(":")[0]
        if not name or os.path.isabs(name) or not os.path.exists(name):
            return spec
        return "hf:" + os.path.abspath(name) + spec.removeprefix(f"hf:{name}")
    return os.path.abspath(spec)


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return path


def _side_file(prefix: str, lang: str) -> Path:
    """PREFIX.LANG, else PREFIX.LANG.gz."""
    plain, packed = Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")
    if plain.is_file():
        return plain
    if packed.is_file():
        return packed
    raise InputError(f"{plain}: no such file (nor {packed.name})")


def _load_parallel(prefix: str, langs: dict[str, str]) -> datasets.Dataset:
    """Line-aligned files PREFIX.LANG, one a side of `langs` ({"src": SRC, "tgt": TGT}, or one
    of them), through `_load_lines`."""
    paths = {side: _side_file(prefix, lang) for side, lang in langs.items()}
    sides = {side: _load_lines(path).rename_column("text", side) for side, path in paths.items()}
    if len(sides) == 1:
        return next(iter(sides.values()))
    src, tgt = sides["src"], sides["tgt"]
    if len(src) != len(tgt):
        raise InputError(
            f"{paths['src']}: has {counted(len(src), 'line')} but {paths['tgt']} has "
            f"{len(tgt)}; parallel files must align line by line"
        )
    return datasets.concatenate_datasets([src, tgt], axis=1)


def _load_lines(path: Path) -> datasets.Dataset:
    """One row per line of a UTF-8 text file (gzip read through), column "text".

    The lines are split by `data.text.read_line_blocks`, as `tf translate` and `tf eval` split
    them, not by the "text" builder, which also breaks lines at a lone carriage return or a
    Unicode line separator. Decoded a block at a time, they are written as one Arrow file in
    the `datasets` cache, keyed by the file's path, size, inode and times, and memory-
    mapped from there: a second read of the same file is free, and no process holds the text.
    """
    stat = path.stat()
    empty = InputError(f"{path}: the file is empty")
    if stat.st_size == 0:
        raise empty
    # The inode and the change time too: a file rewritten with its size and its modification
    # time kept (`cp -p`, rsync) is another file all the same.
    key = (
        f"lines-v{_LINES_VERSION}:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:"
        f"{stat.st_ino}:{stat.st_ctime_ns}"
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    arrow = Path(datasets.config.HF_DATASETS_CACHE) / "tf-lines" / f"{digest}.arrow"
    if not arrow.is_file():
        _write_lines(path, arrow)
    ds = datasets.Dataset.from_file(str(arrow))
    if len(ds) == 0:  # an empty .gz
        raise empty
    return ds


def _write_lines(path: Path, arrow: Path) -> None:
    """The lines of `path` as an Arrow stream file, written whole or not at all (a renamed
    partial file: a killed start leaves nothing a later one would trust)."""
    arrow.parent.mkdir(parents=True, exist_ok=True)
    partial = arrow.with_name(f"{arrow.name}.partial-{os.getpid()}")
    schema = pa.schema([("text", pa.string())])
    # `datasets`' own bar: shown when `tf` turns its bars on (on a terminal).
    bar = datasets_tqdm(
        total=path.stat().st_size, desc=f"reading {path}", unit="B", unit_scale=True, leave=False
    )
    try:
        with open(path, "rb") as raw, pa.ipc.new_stream(str(partial), schema) as writer:
            f = gzip.open(raw) if path.suffix == ".gz" else raw  # the bar counts bytes on disk
            for lines in read_line_blocks(f, str(path)):
                writer.write_batch(pa.record_batch([pa.array(lines, pa.string())], schema))
                bar.update(raw.tell() - bar.n)
        os.replace(partial, arrow)
    finally:
        bar.close()
        partial.unlink(missing_ok=True)


def _check_text(path: Path) -> None:
    """InputError at the first line of `path` that is not UTF-8, or for an empty file; one
    streaming pass, nothing kept (the "json" builder reads the file itself)."""
    with open_bytes(path) as f:
        if sum(len(lines) for lines in read_line_blocks(f, str(path))) == 0:
            raise InputError(f"{path}: the file is empty")


def _load_tsv(path: Path, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    """SRC<TAB>TGT lines, read by the "text" builder and split here.

    The "csv" builder would treat quote characters in the text as CSV quoting, and its errors
    name no line. A first line holding exactly the two language codes is a header; it may
    name them in either order.
    """
    lines = _load_lines(path)
    has_header, swap = _tsv_header(lines[0]["text"], src_lang, tgt_lang)
    pairs = lines.map(
        _split_tsv_lines,
        batched=True,
        with_indices=True,
        remove_columns=["text"],
        fn_kwargs={"path": str(path), "swap": swap},
        desc="Reading TSV",
    )
    return pairs.select(range(1, len(pairs))) if has_header else pairs


def _tsv_header(first: str, src_lang: str, tgt_lang: str) -> tuple[bool, bool]:
    """(whether the first line of a TSV is a header, whether it names the target first)."""
    fields = first.split("\t")
    has_header = sorted(fields) == sorted([src_lang, tgt_lang])
    return has_header, has_header and fields[0] == tgt_lang


def _split_tsv_lines(batch: dict, indices: list[int], path: str, swap: bool) -> dict:
    """A batch of TSV lines into "src"/"tgt" columns; InputError at a line without 2 fields."""
    src, tgt = [], []
    for index, line in zip(indices, batch["text"], strict=True):
        fields = line.split("\t")
        if len(fields) != 2:
            raise InputError(
                f"{path}:{index + 1}: expected 2 tab-separated fields, found {len(fields)}"
            )
        if swap:
            fields.reverse()
        src.append(fields[0])
        tgt.append(fields[1])
    return {"src": src, "tgt": tgt}


def _load_jsonl(path: Path, langs: dict[str, str]) -> datasets.Dataset:
    """JSON Lines through the "json" builder (Arrow's fast reader), the languages `langs`
    ({"src": SRC, "tgt": TGT}, or one of them) read.

    When the builder fails, or what it read lacks a language, the file is scanned line by
    line to name the first bad line: the builder's own errors do not.
    """
    _check_text(path)
    problem = InputError(f"{path}: not a JSON Lines file of {'-'.join(langs.values())} text")
    # The builder logs its parse errors itself; ours below names the line instead.
    json_logger = logging.getLogger("datasets.packaged_modules.json.json")
    level = json_logger.level
    json_logger.setLevel(logging.CRITICAL)
    try:
        ds = datasets.load_dataset("json", data_files=str(path), split="train")
        return _select_sides(ds, langs, str(path))
    except InputError as err:
        problem = err
    except (datasets.exceptions.DatasetsError, ValueError, pa.ArrowException):
        pass
    finally:
        json_logger.setLevel(level)
    _find_bad_json_line(path, list(langs.values()))
    raise problem


def _find_bad_json_line(path: Path, langs: list[str]) -> None:
    """Raise InputError at the first line that is not a pair in the file's format.

    The first line fixes the format: translation ({"translation": {..}}) or flat.
    """
    nested = None
    with open_bytes(path) as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():  # skipped by the builder, as it is here
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as err:
                raise InputError(f"{where}: not valid JSON ({err.msg})") from None
            if nested is None:
                nested = isinstance(row, dict) and "translation" in row
            pair = row.get("translation") if nested and isinstance(row, dict) else row
            for lang in langs:
                if not isinstance(pair, dict) or not isinstance(pair.get(lang), str):
                    form = '{"translation": {...}}' if nested else "{...}"
                    raise InputError(f"{where}: no {lang!r} text in {form}")


def _jsonl_line(path: Path, row: int) -> int:
    """The line of `path` that the JSON builder read as row `row` (0-based): it skips blank
    lines."""
    with open_bytes(path) as f:
        rows = (number for number, raw in enumerate(f, start=1) if raw.strip())
        return next(itertools.islice(rows, row, None))


# --- hub and bundled corpora ----------------------------------------------------------------


def _load_hub(spec: str, langs: dict[str, str]) -> datasets.Dataset:
    """`hf:NAME[:CONFIG][@SPLIT]` through `datasets.load_dataset` (a hub name or a local path)."""
    name, _, split = spec.removeprefix("hf:").partition("@")
    name, _, config = name.partition(":")
    if not name:
        raise InputError(f"{spec}: no dataset name (expected hf:NAME[:CONFIG][@SPLIT])")
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "train")
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as err:
        # OSError covers DatasetNotFoundError, FileNotFoundError and ConnectionError;
        # ValueError an unknown config or split.
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{spec}: cannot load dataset {name!r}: {reason}") from None
    return _select_sides(ds, langs, spec)


def _bundled_prefix(spec: str, src_lang: str, tgt_lang: str) -> str:
    """The path prefix of `bundled:NAME/SPLIT` inside data/corpora/."""
    name, _, split = spec.removeprefix("bundled:").partition("/")
    corpus = BUNDLED_DIR / name
    if not name or not corpus.is_dir():
        known = ", ".join(sorted(p.name for p in BUNDLED_DIR.iterdir() if p.is_dir()))
        raise InputError(f"{spec}: no bundled corpus {name!r} (bundled: {known})")
    files = [p.name for p in corpus.iterdir() if p.name != "README.md"]
    splits = sorted({f.split(".")[0] for f in files})
    if split not in splits:
        raise InputError(f"{spec}: no split {split!r} (splits: {', '.join(splits)})")
    langs = sorted({f.split(".")[1] for f in files if f.startswith(f"{split}.")} - {"ids"})
    for lang in (src_lang, tgt_lang):
        if lang not in langs:
            raise InputError(f"{spec}: no {lang!r} side (languages: {', '.join(langs)})")
    return str(corpus / split)


# --- columns --------------------------------------------------------------------------------


def _select_sides(ds: datasets.Dataset, langs: dict[str, str], name: str) -> datasets.Dataset:
    """Columns "src"/"tgt" (those of `langs`, {"src": SRC, "tgt": TGT}) from translation rows
    ({"translation": {SRC: .., TGT: ..}}) or from flat columns named by the languages;
    InputError if neither holds strings for each."""
    translation = ds.features.get("translation")
    if isinstance(translation, (dict, datasets.Translation)):
        ds = ds.select_columns(["translation"]).flatten()  # columns "translation.SRC", ...
        columns = [f"translation.{lang}" for lang in langs.values()]
    else:
        columns = list(langs.values())
    for column in columns:
        feature = ds.features.get(column)
        if not (
            isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
        ):
            raise InputError(
                f"{name}: no {column.split('.')[-1]!r} text, in a 'translation' column or its own "
                f"(columns: {', '.join(ds.column_names)})"
            )
        nulls = ds.data.column(column).null_count
        if nulls:
            raise InputError(f"{name}: {nulls} rows have no {column.split('.')[-1]!r} text")
    ds = ds.select_columns(columns)
    return ds.rename_columns(dict(zip(columns, langs)))


# --- encoding, filtering, loading ids -------------------------------------------------------


def encode_corpus(
    ds: datasets.Dataset, tokenizer: Tokenizer, *, batch_size: int = 1000
) -> datasets.Dataset:
    """Tokenize a corpus into int32 columns "src_ids" and "tgt_ids" (no BOS/EOS).

    The result's fingerprint is derived from the corpus's fingerprint and the tokenizer's
    digest, so `datasets` reuses a cached encoding of the same corpus with the same model.

    Args:
        ds: columns "src" and "tgt" (as from `load_corpus`).
        tokenizer: the tokenizer to apply.
        batch_size: sentences per call into SentencePiece.

    Returns:
        The encoded corpus, rows aligned with `ds`; the text columns are dropped.
    """
    key = f"encode-v{_ENCODE_VERSION}:{ds._fingerprint}:{tokenizer.digest()}"
    ids = datasets.List(datasets.Value("int32"))

    def encode(batch: dict) -> dict:
        return {
            "src_ids": tokenizer.encode_src(batch["src"]),
            "tgt_ids": tokenizer.encode_tgt(batch["tgt"]),
        }

    return ds.map(
        encode,
        batched=True,
        batch_size=batch_size,
        remove_columns=ds.column_names,
        features=datasets.Features({"src_ids": ids, "tgt_ids": ids}),
        new_fingerprint=hashlib.sha256(key.encode()).hexdigest()[:32],
        desc="Encoding",
    )


def pair_lengths(ds: datasets.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(N,) source and target lengths: tokens if encoded ("src_ids"), else characters of the
    text stripped of surrounding white space."""
    if {"src_ids", "tgt_ids"} <= set(ds.column_names):
        return _lengths(ds, "src_ids"), _lengths(ds, "tgt_ids")
    return _lengths(ds, "src"), _lengths(ds, "tgt")


def _lengths(ds: datasets.Dataset, column: str) -> np.ndarray:
    """Lengths of one list or string column, read in Arrow batches (memory stays bounded)."""
    parts = []
    for table in ds.select_columns([column]).with_format("arrow").iter(batch_size=_ARROW_BATCH):
        values = table.column(column)
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            lengths = pc.utf8_length(pc.utf8_trim_whitespace(values))
        else:
            lengths = pc.list_value_length(values)
        parts.append(lengths.fill_null(0).to_numpy().astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def filter_pairs(
    ds: datasets.Dataset,
    *,
    max_len: int | None = None,
    max_len_ratio: float | None = None,
    name: str = "corpus",
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Drop pairs with an empty side, a side longer than `max_len`, or too unequal lengths.

    Lengths are tokens on an encoded corpus ("src_ids"/"tgt_ids", as fairseq filters) and
    characters on text. Each dropped pair is counted under the first reason that applies.

    Args:
        ds: an encoded corpus, or one with text columns "src"/"tgt".
        max_len: longest side kept (None: no limit).
        max_len_ratio: largest longer/shorter length ratio kept (None: no limit).
        name: names the corpus in the error message (e.g. its spec).

    Returns:
        (kept pairs, counts {"empty": n, "too_long": n, "ratio": n, "kept": n}).

    Raises:
        InputError: no pair is left.
    """
    src_len, tgt_len = pair_lengths(ds)
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = np.zeros_like(empty)
    if max_len is not None:
        too_long = ~empty & ((src_len > max_len) | (tgt_len > max_len))
    ratio = np.zeros_like(empty)
    if max_len_ratio is not None:
        longer, shorter = np.maximum(src_len, tgt_len), np.minimum(src_len, tgt_len)
        ratio = ~empty & ~too_long & (longer > max_len_ratio * shorter)
    keep = ~(empty | too_long | ratio)
    counts = {
        "empty": int(empty.sum()),
        "too_long": int(too_long.sum()),
        "ratio": int(ratio.sum()),
        "kept": int(keep.sum()),
    }
    if counts["kept"] == 0:
        raise InputError(
            f"{name}: no sentence pairs left after filtering ({counts['empty']} empty, "
            f"{counts['too_long']} too long, {counts['ratio']} over the length ratio)"
        )
    if counts["kept"] == len(ds):
        return ds, counts
    return ds.select(np.flatnonzero(keep)), counts


def token_ids(ds: datasets.Dataset, column: str) -> RaggedIds:
    """Load one id column ("src_ids" or "tgt_ids") into memory for `BatchIterator`."""
    table = ds.select_columns([column]).with_format("arrow")[:]
    array = table.column(column).combine_chunks()
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.flatten().to_numpy()
    return RaggedIds(values=values, offsets=offsets - offsets[0])
