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

import yaml

from cli.config import ConfigError, check_type
from cli.device import pick_device
from cli.inference.bulk import translate_corpus
from cli.inference.engines import load_engine
from data.config import CorpusConfig, DataConfig, direction_name
from data.errors import InputError
from data.files import check_dir
from data.pipeline import load_set
from data.tokenizer import Tokenizer


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
        named = [c for value in corpora for c in named_corpora(value, src_lang, tgt_lang)]
        check_corpus_tags(named, engine.tokenizer)
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


def named_corpora(value: str, src_lang: str, tgt_lang: str) -> list[CorpusConfig]:
    """The corpora one `--corpus` names, as data.train takes them: a spec (PREFIX, .tsv,
    .jsonl, hf:..., bundled:...), or in YAML a corpus `{corpus: SPEC, src_lang: ...,
    tgt_lang: ..., reverse: ..., tag: ...}` or a list of them, read by the config's own
    schema. A corpus that names no languages is in the direction translated (`src_lang`,
    `tgt_lang`: its files' suffixes; the other way round where it says `reverse`).

    Raises:
        ConfigError: a mapping the schema refuses (an unknown key, a wrong type), naming it;
            a weight, which would change nothing here (each source is translated once).
    """
    text = value.strip()
    if not text.startswith(("{", "[")):  # a spec (a path may hold ":" or look like a number)
        return [CorpusConfig(value, src_lang=src_lang, tgt_lang=tgt_lang)]
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--corpus {value}: not a corpus in YAML ({e.problem})") from None
    hint = list[CorpusConfig] if isinstance(raw, list) else CorpusConfig
    parsed = check_type(raw, hint, "corpus", f"--corpus {value}")
    named = parsed if isinstance(parsed, list) else [parsed]
    if any(c.weight != CorpusConfig.weight for c in named):
        raise ConfigError(
            f"--corpus {value}: a weight changes nothing here (each source is translated once)"
        )
    return [
        replace(
            c,
            src_lang=c.src_lang or (tgt_lang if c.reverse else src_lang),
            tgt_lang=c.tgt_lang or (src_lang if c.reverse else tgt_lang),
        )
        for c in named
    ]


def check_corpus_tags(corpora: list[CorpusConfig], tokenizer: Tokenizer) -> None:
    """A named corpus's tag is a piece the teacher reserves (one of its training corpora's):
    any other would be read as the text it spells.

    Raises:
        InputError: naming the tag and the teacher's tags.
    """
    for c in corpora:
        if c.tag and c.tag not in tokenizer.tags:
            reserved = ", ".join(tokenizer.tags) or "none"
            raise InputError(
                f"--corpus {c.corpus}: tag {c.tag!r} is no reserved piece of the teacher's "
                f"tokenizer (its tags: {reserved})"
            )


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
