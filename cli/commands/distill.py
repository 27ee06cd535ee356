"""`tf distill`: sequence-level knowledge distillation data (Kim & Rush, 2016).

The teacher translates its own training sources, or those of the corpora `--corpus` names (an
imported teacher's: it has none of its own), with beam search, batched; a student then trains
on the teacher's outputs instead of the references, with the teacher's tokenizer
(`data.tokenizer`) or one of its own. The corpus is written as OUT/train.SRC and OUT/train.TGT, with
OUT/distill.json recording what made it: the teacher (its checkpoint or exported directory,
with a digest of its weights), the engine, the device and every decode setting.

Resumable as `cli.inference.bulk` says: a killed run restarts after its last complete line if
the same teacher and settings made it, and starts over otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cli.device import pick_device
from cli.inference.bulk import translate_corpus
from cli.inference.engines import load_engine
from data.config import CorpusConfig, DataConfig, direction_name
from data.errors import InputError
from data.files import check_dir
from data.pipeline import load_set


def run_distill(
    teacher: str,
    out: Path,
    overrides: list[str],
    device_name: str,
    corpora: list[str] = (),
    to: str = "",
    frm: str = "",
) -> str:
    """Translate the teacher's training sources, or those of `corpora`, into OUT (see the
    module docstring); a multilingual teacher's into the language `to`, from the sources of
    its corpora into that language."""
    check_dir(out, "--out")
    device = pick_device(device_name)
    engine = load_engine(teacher, device, overrides, to=to, frm=frm)
    # A multilingual teacher needs --to (refused here, before any reading); named corpora are
    # read in the direction it then translates.
    src_lang, tgt_lang = engine.direction("tf distill")
    d = engine.config.data
    if corpora:
        named = [CorpusConfig(spec, src_lang=src_lang, tgt_lang=tgt_lang) for spec in corpora]
        d = replace(d, train=named)
    elif not d.corpora():  # an imported teacher: trained on no corpus of ours
        raise InputError(
            f"{teacher}: an imported model, trained on no corpus tf knows; name the sources "
            "to translate with --corpus SPEC (the corpus the student will learn from)"
        )
    # A teacher whose sources say their language reads the corpora of its --from alone.
    chosen = corpora_into(d, tgt_lang, src_lang if engine.target_side else "")
    # The record names what was translated: the corpora into --to alone, each with its direction.
    specs = [f"{c.corpus} ({direction_name(d.direction(c))})" for c in chosen]
    sources = training_sources(d, chosen)
    return translate_corpus(engine, teacher, device, sources, out, "distill", {"corpus": specs})


def corpora_into(d: DataConfig, to: str, frm: str = "") -> list[CorpusConfig]:
    """The corpora a teacher translates: those into `to` (a one-way teacher's: all), from
    `frm` alone where it is given."""
    chosen = [c for c in d.corpora() if d.direction(c)[1] == to]
    chosen = [c for c in chosen if d.direction(c)[0] == frm] if frm else chosen
    if not chosen:
        way = f"from {frm} into {to}" if frm else f"into {to}"
        raise InputError(f"--to {to}: none of the teacher's corpora translates {way}")
    return chosen


def training_sources(d: DataConfig, chosen: list[CorpusConfig]) -> list[str]:
    """The sources of the corpora `chosen`, corpus after corpus, each once, each in its
    direction; a tagged corpus's lines start with its tag, as the teacher saw them (a
    language token is the engine's to put: --to, --from). One sentence a line: a line break
    inside a hub dataset's sentence becomes a space."""
    sources = []
    for c in chosen:
        head = f"{c.tag} " if c.tag else ""
        for text in load_set(d, c, ("src",))["src"]:  # a target side need not exist
            sources.append(head + " ".join(text.splitlines()))
    return sources
