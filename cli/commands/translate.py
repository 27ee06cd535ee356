"""`tf translate`: raw text in, detokenised translations out (stdin/stdout or files).

Input is read in chunks so that a large file streams with bounded memory; inside a chunk the
sentences are sorted by length into batches and the output is put back in input order. Input
that is no file (a terminal, a pipe) is translated as it arrives: each line, or each group of
lines that came together, is answered as soon as it is complete, as fairseq-interactive does,
with a prompt on a terminal.
"""

from __future__ import annotations

import os
import stat
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from cli.device import pick_device
from cli.inference.decoding import as_they_arrive, chunks, format_hypotheses
from cli.inference.engines import load_engine
from cli.inference.requests import read_requests
from data.errors import InputError
from data.files import atomic_output, check_output
from data.text import check_readable, read_lines
from model.transformer import Transformer

INPUT_FORMATS = ("text", "jsonl")

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
) -> None:
    """The `tf translate` command: stdin/FILE (or a pipe, `-i <(cmd)`) to stdout/FILE, with the
    run's decode settings changed by `overrides` (`decode.KEY=VALUE`); RUN may be an exported
    CTranslate2 directory; `int8` runs the PyTorch model's linear layers in int8 with a scale
    per row of activations (`model.int8`); with `attention`, also a heatmap of the
    cross-attention of each line's best translation (`cli.inference.heatmaps`); `to`, a
    multilingual model's output language."""
    from cli.inference.heatmaps import prepare_attention, write_attention  # matplotlib: optional

    check_arguments(input_path, output_path, input_format)
    engine = load_engine(run, pick_device(device_name), overrides, int8, to, frm)
    tokenizer, config = engine.tokenizer, engine.config
    if attention is not None:
        if not isinstance(engine.model, Transformer) or int8:
            raise InputError("--attention needs one run's PyTorch model in fp32")
        prepare_attention(attention, config.model)
    source = str(input_path) if input_path else "<stdin>"
    raw = open(input_path, "rb") if input_path else sys.stdin.buffer  # noqa: SIM115
    # What to type: the language lines are read in (--from, the model's one or default), else
    # every one it reads into the output language.
    reads = engine.frm or engine.default_source() or "/".join(engine.source_langs())
    prompt = start_prompt(raw, reads)
    group = chunks if is_regular_file(raw) else as_they_arrive
    items = read_lines(raw, source)
    if input_format == "jsonl":  # {"text": ..., "prefix": ..., "constraints": [...]} a line
        items = read_requests(items, source)
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
                    write_attention(engine.model, tokenizer, attention, n, src_ids, hyps[0].tokens)
                if output_path is None:
                    out.flush()  # stdout: show each translation as soon as its group is done
                if prompt:
                    sys.stderr.write(prompt)
                    sys.stderr.flush()
        finally:
            if input_path:
                raw.close()


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
