"""The bulk translator: a large file of sentences translated into a corpus, batched, with a
progress bar, resumable after a kill, recording what made it. `tf distill` (the teacher's
training sources) and `tf backtranslate` (monolingual target-language text, through a reverse
model) are its users.

The corpus is OUT/train.SRC (the sentences translated) and OUT/train.TGT (their translations),
with OUT/NAME.json recording what made it: the model (its checkpoint or exported directory,
with a digest of its weights), the engine, the device, every decode setting (the sampling seed
too) and a digest of the sources. What identifies the model and the sources is their digests:
their paths are kept for the reader, and a path spelled otherwise (relative or absolute, an
identical copy) is the same input. OUT/train.SRC is (re)written with this run's sources at its
start; translations go to a hidden partial file, flushed every FLUSH_EVERY lines (translated in
groups of that many, so a kill loses at most one group), with that record beside it. A killed
run restarts after its last complete line if the same model, sources, engine, device and
settings made it, and starts over (saying why, in one line) otherwise, so a corpus never mixes
two models, two searches or two texts. OUT/train.TGT appears (by rename) only once whole and
checked against train.SRC line for line, so no later step can read a half-written or
misaligned corpus as a corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cli.inference.decoding import chunks, hypothesis_texts
from cli.inference.engines import Engine
from cli.runs.checkpoint import load_checkpoint
from cli.runs.model_dirs import is_ctranslate2_dir, resolve_checkpoint
from data.errors import InputError, counted
from data.files import atomic_output

log = logging.getLogger(__name__)

# Lines translated at once and then flushed to the partial translation: what a kill may lose.
# Each group is sorted by length into batches of decode.max_tokens, so a larger one pads less.
FLUSH_EVERY = 256
# Settings that change how fast, never what is written: a resume may change them (a smaller GPU
# needs a smaller batch). And where the model lies: its sha256 is what identifies it.
IGNORED = {"decode.max_tokens", "checkpoint", "ctranslate2"}
DONE = {"distill": "distilled", "backtranslate": "back-translated"}  # NAME -> what OUT is then


def translate_corpus(
    engine: Engine,
    model: str,
    device: torch.device,
    sources: list[str],
    out: Path,
    name: str,
    extra: dict[str, Any],
) -> str:
    """Translate `sources` (one sentence each) with `engine` (loaded from `model`) into the
    corpus OUT/train (see the module docstring), its files named by the languages of the
    engine's direction (`Engine.direction`); `name` names the record (NAME.json) and the
    progress bar, `extra` goes into the record beside what made the translations and a digest
    of the sources (a partial file of other sources is never continued): where the sources
    came from, for the reader (a path: never compared, the digest is).

    Raises:
        InputError: OUT already holds a whole corpus that other settings or other sources
            made, or whose two sides do not match line for line.
    """
    text = "".join(s + "\n" for s in sources)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    # What was translated belongs to the record as much as what translated it.
    made_by = {**producer(model, engine, device), **extra, "sources_sha256": sha}
    ignored = IGNORED | set(extra)
    src_lang, tgt_lang = engine.direction(f"tf {name}")
    src_path, tgt_path = out / f"train.{src_lang}", out / f"train.{tgt_lang}"
    record = out / f"{name}.json"
    if src_path.is_file() and tgt_path.is_file():
        return already_made(record, src_path, tgt_path, made_by, len(sources), DONE[name], ignored)
    out.mkdir(parents=True, exist_ok=True)
    if not src_path.is_file() or file_digest(src_path) != sha:  # another text's, or none
        with atomic_output(src_path) as f:
            f.write(text)
    partial = out / f".{tgt_path.name}.partial"
    done = resume_point(partial, made_by, ignored)
    translate_into(partial, engine, sources, done, str(src_path), name)
    check_side_by_side(src_path, partial, sha, len(sources))
    with atomic_output(record) as f:
        json.dump({**made_by, "pairs": len(sources)}, f, indent=1)
    os.replace(partial, tgt_path)
    record_path(partial).unlink(missing_ok=True)
    return f"{out}: {counted(len(sources), 'pair')} {DONE[name]} by {model}"


def translate_into(
    partial: Path, engine: Engine, sources: list[str], done: int, source: str, name: str
) -> None:
    """Append the translations of sources[done:] to `partial`, FLUSH_EVERY lines at a time:
    each group is searched, written and synced before the next is read (FLUSH_EVERY is read
    at call time)."""
    from tqdm import tqdm

    every = FLUSH_EVERY
    bar = tqdm(total=len(sources), initial=done, desc=name, unit="line", file=sys.stderr)
    with open(partial, "a", encoding="utf-8") as f:
        stream = engine.stream(sources[done:], source, lambda lines: chunks(lines, every), done + 1)
        for n, (_, hyps) in enumerate(stream, start=1):
            f.write(hypothesis_texts(engine.tokenizer, hyps[:1])[0] + "\n")
            bar.update(1)
            if n % every == 0:  # a group's last line: the search of the next one starts now
                f.flush()
                os.fsync(f.fileno())
        f.flush()
        os.fsync(f.fileno())
    bar.close()


def check_side_by_side(src_path: Path, tgt_path: Path, sha: str, pairs: int) -> None:
    """The two sides of a corpus match: `src_path` holds the sources of digest `sha`, and
    `tgt_path` a line for each of its `pairs`; else an InputError, for a corpus whose sides
    are misaligned would train a model on wrong pairs without a word."""
    if file_digest(src_path) != sha:
        raise InputError(
            f"{src_path}: not the sources this run translates (another text, or changed since); "
            "give another --out, or remove it"
        )
    lines = count_lines(tgt_path)
    if lines != pairs:
        raise InputError(
            f"{tgt_path}: {lines} translations for the {pairs} lines of {src_path.name}; "
            "give another --out, or remove it"
        )


def producer(model: str, engine: Engine, device: torch.device) -> dict[str, Any]:
    """What decides the translations: the model's weights (path, step, sha256), the engine,
    the device type (`decode.precision: auto` is bf16 on one, fp32 on another) and every
    decode setting."""
    if is_ctranslate2_dir(model):
        directory = Path(model).resolve()
        source = {"ctranslate2": str(directory), "sha256": file_digest(directory / "model.bin")}
    else:
        checkpoint, _ = resolve_checkpoint(model)
        source = {
            "checkpoint": str(checkpoint.resolve()),
            "step": load_checkpoint(checkpoint).get("step"),
            "sha256": file_digest(checkpoint),
        }
    return {
        **source,
        "engine": engine.kind,
        "device": device.type,
        "decode": asdict(engine.config.decode),
    }


def file_digest(path: Path) -> str:
    """sha256 (hex) of a file, read in blocks (a checkpoint may be gigabytes)."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


def record_path(partial: Path) -> Path:
    """Where the record of what made `partial` lies: beside it."""
    return partial.with_name(partial.name + ".json")


def resume_point(partial: Path, made_by: dict[str, Any], ignored: set[str]) -> int:
    """The lines of `partial` this run keeps: its complete lines if `made_by` made them (the
    keys in `ignored` aside), else none (it is emptied, and one line says why). The record is
    written when a file starts."""
    if partial.is_file():
        try:
            before = json.loads(record_path(partial).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        changed = differences(before, made_by, True, ignored) if before is not None else None
        if before is not None and not changed:
            return complete_lines(partial)
        if changed is None:
            why = "has no record of the model and settings that made it"
        else:
            was, now = changed
            why = f"was made with {was}, this run uses {now}"
        log.warning("%s %s: starting over", partial, why)
    with atomic_output(record_path(partial)) as f:
        json.dump(made_by, f, indent=1)
    partial.write_bytes(b"")
    return 0


def already_made(
    record: Path,
    src_path: Path,
    tgt_path: Path,
    made_by: dict[str, Any],
    pairs: int,
    done: str,
    ignored: set[str],
) -> str:
    """The answer for a corpus that is already whole: done, if this run asks what made it (the
    keys in `ignored` aside) and its two sides match line for line (`check_side_by_side`)."""
    try:
        before = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = {}  # a corpus made by other means: no record to compare, its sides still are
    # Only the keys both records have: one written by an older tf holds fewer.
    changed = differences(before, made_by, False, ignored)
    if changed:
        was, now = changed
        raise InputError(
            f"{record.parent}: already {done} with {was} ({record.name}), this run asks {now}; "
            "give another --out, or remove it"
        )
    check_side_by_side(src_path, tgt_path, made_by["sources_sha256"], pairs)
    return f"{record.parent}: already {done} ({tgt_path})"


def differences(
    old: dict, new: dict, every_key: bool, ignored: set[str] = IGNORED
) -> tuple[str, str] | None:
    """('key=old, ...', 'key=new, ...') over the dotted keys whose values differ (all keys, or
    only those both hold), the `ignored` ones aside; None when none differ."""
    a, b = flatten(old), flatten(new)
    keys = sorted(set(a) | set(b) if every_key else set(a) & set(b))
    keys = [k for k in keys if k not in ignored and a.get(k) != b.get(k)]
    if not keys:
        return None
    return ", ".join(f"{k}={a.get(k)}" for k in keys), ", ".join(f"{k}={b.get(k)}" for k in keys)


def flatten(record: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def count_lines(path: Path) -> int:
    """The lines of a text file, a last one without its line break included; read in blocks."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def complete_lines(path: Path) -> int:
    """The complete lines in `path` (0 if none), cutting off a last line a kill left unfinished."""
    if not path.is_file():
        return 0
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
    return whole.count(b"\n")
