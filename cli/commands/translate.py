"""`tf translate`: raw text in, detokenised translations out (stdin/stdout or files).

Input is read in chunks so that a large file streams with bounded memory; inside a chunk the
sentences are sorted by length into batches and the output is put back in input order. Input
that is no file (a terminal, a pipe) is translated as it arrives: each line, or each group of
lines that came together, is answered as soon as it is complete, as fairseq-interactive does,
with a prompt on a terminal.

`--input-format document` (`--document`) and `srt` read the whole input as one document
(`data.documents`, `data.subtitles`): it is parsed before anything is written (a malformed file
is refused in one line), its sentences are translated in the usual length-sorted batches across
the whole file, and it is written back, all but the translated text as it was read.
"""

from __future__ import annotations

import os
import stat
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from cli.device import pick_device
from cli.inference.decoding import (
    Joined,
    as_they_arrive,
    chunks,
    format_hypotheses,
    hypothesis_texts,
    splitter_for,
)
from cli.inference.engines import Engine, load_engine
from cli.inference.requests import read_requests
from data.documents import Document, parse_document
from data.errors import InputError
from data.files import atomic_output, check_output
from data.subtitles import Subtitles, parse_srt
from data.text import check_readable, decode_text, read_lines

INPUT_FORMATS = ("text", "jsonl", "document", "srt")
DOCUMENTS = ("document", "srt")  # read whole, written back around their translations
SRT_CUES = ("spread", "alone")  # a sentence over several cues: translated once, or each cue

if TYPE_CHECKING:
    from cli.inference.heatmaps import AttentionOptions


def run_translate(
    run: str | list[str],
    input_path: Path | None,
    output_path: Path | None,
    overrides: list[str],
    device_name: str,
    scores: bool,
    progress: bool = True,
    attention: AttentionOptions | None = None,
    int8: bool = False,
    input_format: str = "text",
    to: str = "",
    frm: str = "",
    srt_cues: str = "spread",
) -> None:
    """The `tf translate` command: stdin/FILE (or a pipe, `-i <(cmd)`) to stdout/FILE, with the
    run's decode settings changed by `overrides` (`decode.KEY=VALUE`); RUN may be an exported
    CTranslate2 directory; `int8` runs the PyTorch model's linear layers in int8 with a scale
    per row of activations (`model.int8`); with `attention`, also a heatmap of the
    cross-attention of each line's best translation (`cli.inference.heatmaps`); `to`, a
    multilingual model's output language; `input_format` document or srt translates the
    input as one document (`translate_document`, `srt_cues` for subtitles)."""
    from cli.inference.heatmaps import prepare_attention, write_attention  # matplotlib: optional

    check_arguments(input_path, output_path, input_format)
    if input_format in DOCUMENTS:
        check_document_options(input_format, scores, attention is not None, srt_cues)
    engine = load_engine(run, pick_device(device_name), overrides, int8, to, frm)
    if input_format in DOCUMENTS:
        translate_document(engine, input_path, output_path, input_format, srt_cues)
        return
    tokenizer, config = engine.tokenizer, engine.config
    if attention is not None:
        if not engine.attention_heatmaps:
            raise InputError("--attention needs one run's PyTorch model in fp32")
        prepare_attention(attention, config.model)
    source = str(input_path) if input_path else "<stdin>"
    raw = open(input_path, "rb") if input_path else sys.stdin.buffer  # noqa: SIM115
    prompt, group, items = reading(raw, source, input_format, engine)
    results = engine.stream(items, source, group)
    if input_path and progress:
        results = with_progress(results, input_path, counted=group is chunks)
    # A file is written beside its target and renamed at the end: an error leaves no half file.
    with atomic_output(output_path) if output_path else nullcontext(sys.stdout) as out:
        try:
            for n, (src_ids, hyps) in enumerate(results, start=1):
                lines = format_hypotheses(tokenizer, hyps, scores, config.decode.nbest)
                out.write("\n".join(lines) + "\n")
                if attention is not None:
                    check_one_search(hyps[0], source, n)
                    write_attention(engine.model, tokenizer, attention, n, src_ids, hyps[0].tokens)
                if output_path is None:
                    out.flush()  # stdout: show each translation as soon as its group is done
                if prompt:
                    sys.stderr.write(prompt)
                    sys.stderr.flush()
        finally:
            if input_path:
                raw.close()


def reading(raw, source: str, input_format: str, engine: Engine) -> tuple:
    """What `tf translate` reads from `raw`: the prompt to show a terminal (or ""), how lines
    are grouped (whole chunks from a file, as they arrive from a terminal or pipe), and the
    lines (or, jsonl, the requests)."""
    # What to type: the language lines are read in (--from, the model's one or default), else
    # every one it reads into the output language.
    reads = engine.frm or engine.default_source() or "/".join(engine.source_langs())
    prompt = start_prompt(raw, reads)
    group = chunks if is_regular_file(raw) else as_they_arrive
    items = read_lines(raw, source)
    if input_format == "jsonl":  # {"text": ..., "prefix": ..., "constraints": [...]} a line
        items = read_requests(items, source)
    return prompt, group, items


def check_one_search(best, source: str, line: int) -> None:
    """`--attention` draws one search's cross-attention: a line over the model's limit,
    translated in parts, has none of its own, and is refused naming it."""
    if isinstance(best, Joined):
        raise InputError(
            f"{source}:{line}: over the model's limit, translated in {best.parts} parts: "
            "--attention draws one search; split the line into sentences"
        )


def check_document_options(input_format: str, scores: bool, attention: bool, cues: str) -> None:
    """A document is written back as one text: what asks for one line per input line (or
    several) has no meaning there, refused in one line before the model loads."""
    asked = {"--scores": scores, "--attention": attention}
    for flag, given in asked.items():
        if given:
            raise InputError(
                f"{flag} writes one line per input line; --input-format {input_format} writes "
                "the document back: leave it out, or translate line by line (text, jsonl)"
            )
    if cues not in SRT_CUES:
        raise InputError(f"--srt-cues {cues}: expected one of {', '.join(SRT_CUES)}")


def translate_document(
    engine: Engine,
    input_path: Path | None,
    output_path: Path | None,
    input_format: str,
    srt_cues: str = "spread",
) -> None:
    """Translate stdin/FILE as one document (plain text, or SubRip subtitles) to stdout/FILE.

    The whole input is read and parsed first (the sentence splitter of the language it is read
    in, `Engine.reading`), so a malformed file is refused before anything is written; all its
    sentences are translated together in length-sorted batches (a sentence over the model's
    limit in parts, as any line); the document is written at the end, a file atomically.

    Raises:
        InputError: --nbest over 1 (one translation is written back); bad UTF-8 or a NUL,
            or malformed SRT, naming the file and line.
    """
    nbest = engine.config.decode.nbest
    if nbest > 1:
        raise InputError(
            f"--nbest {nbest}: --input-format {input_format} writes one translation of the "
            "document back; translate line by line for n-best lists"
        )
    source = str(input_path) if input_path else "<stdin>"
    raw = input_path.read_bytes() if input_path else sys.stdin.buffer.read()
    document = parse_input(decode_text(raw, 0, source), source, engine, input_format, srt_cues)
    # Messages about one of them name its place among the sentences, not a line of the file.
    results = engine.stream(document.sentences, f"{source} sentence")
    translations = [hypothesis_texts(engine.tokenizer, hyps[:1])[0] for _, hyps in results]
    with atomic_output(output_path) if output_path else nullcontext(sys.stdout) as out:
        out.write(document.render(translations))


def parse_input(
    text: str, source: str, engine: Engine, input_format: str, srt_cues: str
) -> Document | Subtitles:
    """The document `text` is, split into sentences by the rules of the language it is read
    in (--from, or the model's source language)."""
    split = splitter_for(engine.reading(""))
    if input_format == "srt":
        return parse_srt(text, source, split, across_cues=srt_cues == "spread")
    return parse_document(text, split)


def with_progress(results, input_path: Path, counted: bool):
    """`results` behind a progress bar on stderr (on a terminal only); its total is the file's
    lines where it is read in chunks (a pipe is read once: it cannot be counted ahead)."""
    from tqdm import tqdm

    total = count_lines(input_path) if counted else None
    return tqdm(results, desc="translate", unit="line", file=sys.stderr, total=total, disable=None)


def check_arguments(input_path: Path | None, output_path: Path | None, input_format: str) -> None:
    """The command's files and format, each wrong one in one line, before the model loads."""
    if input_format not in INPUT_FORMATS:
        formats = ", ".join(INPUT_FORMATS)
        raise InputError(f"--input-format {input_format}: expected one of {formats}")
    if input_path is not None:
        check_readable(input_path)  # a file, or a pipe such as `<(cmd)` or /dev/stdin
    if output_path is not None:
        check_output(output_path)


def start_prompt(raw, src_langs: str) -> str:
    """On a terminal: say how to use it and show the prompt, which is returned; else ""."""
    if not (raw.isatty() and sys.stderr.isatty()):
        return ""
    prompt = f"{src_langs}> "  # what to type: the language(s) the model reads
    sys.stderr.write(f"Type a sentence and press Enter (Ctrl-D to end).\n{prompt}")
    sys.stderr.flush()
    return prompt


def is_regular_file(stream) -> bool:
    """True for a file on disk (read in whole chunks); False for a terminal, pipe or socket."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError):  # no descriptor (a test's in-memory stream): read it whole
        return True


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)
