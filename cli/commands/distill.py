"""`tf distill`: sequence-level knowledge distillation data (Kim & Rush, 2016).

The teacher translates its own training sources (beam search, batched); a student then trains
on the teacher's outputs instead of the references, with the teacher's tokenizer
(`data.tokenizer`). The corpus is written as OUT/train.SRC and OUT/train.TGT, with
OUT/distill.json recording the teacher's checkpoint and decode settings.

Resumable: translations go to a hidden partial file, flushed as they come; a killed run
restarts after its last complete line, and OUT/train.TGT appears (by rename) only once whole,
so no later step can read a half-written corpus as a corpus.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from cli.device import pick_device
from cli.exporters.ctranslate2 import is_ctranslate2_dir
from cli.files import atomic_output
from cli.inference.engines import load_engine
from cli.training.checkpoint import load_checkpoint, resolve_checkpoint
from data.corpus import load_corpus

FLUSH_EVERY = 256  # lines between flushes of the partial translation


def run_distill(teacher: str, out: Path, overrides: list[str], device_name: str) -> str:
    """Translate the teacher's training sources into OUT (see the module docstring)."""
    from tqdm import tqdm

    engine = load_engine(teacher, pick_device(device_name), overrides)
    d = engine.config.data
    src_path, tgt_path = out / f"train.{d.src_lang}", out / f"train.{d.tgt_lang}"
    if src_path.is_file() and tgt_path.is_file():
        return f"{out}: already distilled ({tgt_path})"
    out.mkdir(parents=True, exist_ok=True)
    # One source sentence a line: a line break inside a hub dataset's sentence becomes a space.
    sources = [
        " ".join(s.splitlines()) for s in load_corpus(d.train, d.src_lang, d.tgt_lang)["src"]
    ]
    if not src_path.is_file():
        with atomic_output(src_path) as f:
            f.write("".join(s + "\n" for s in sources))
    partial = out / f".{tgt_path.name}.partial"
    done = complete_lines(partial)
    bar = tqdm(total=len(sources), initial=done, desc="distill", unit="line", file=sys.stderr)
    with open(partial, "a", encoding="utf-8") as f:
        for n, (_, hyps) in enumerate(engine.stream(sources[done:], str(src_path)), start=1):
            f.write(engine.tokenizer.decode_tgt([hyps[0].tokens])[0] + "\n")
            bar.update(1)
            if n % FLUSH_EVERY == 0:
                f.flush()
                os.fsync(f.fileno())
        f.flush()
        os.fsync(f.fileno())
    bar.close()
    with atomic_output(out / "distill.json") as f:
        json.dump(record(teacher, engine.config, len(sources)), f, indent=1)
    os.replace(partial, tgt_path)
    return f"{out}: {len(sources)} pairs distilled by {teacher}"


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


def record(teacher: str, config, pairs: int) -> dict:
    """What made the corpus: the teacher's checkpoint (or exported directory) and decoding."""
    if is_ctranslate2_dir(teacher):
        source = {"ctranslate2": str(Path(teacher).resolve())}
    else:
        checkpoint, _ = resolve_checkpoint(teacher)
        source = {
            "checkpoint": str(checkpoint.resolve()),
            "step": load_checkpoint(checkpoint).get("step"),
        }
    return {**source, "corpus": config.data.train, "pairs": pairs, "decode": asdict(config.decode)}
