"""Lines of text, read the same way by training, translation and evaluation.

Only a line feed ends a line (a carriage return before it is dropped, so CRLF files read as
LF files). A lone carriage return, a form feed or a Unicode line separator inside a line is
data: splitting there as Python's `str.splitlines` (and so `datasets`' text builder) does would
misalign a source file against its target file without a word.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from data.errors import InputError

BOM = "\ufeff"
_BLOCK = 1 << 24  # bytes `read_line_blocks` decodes at a time


def _not_utf8(source: str, number: int, raw: bytes, start: int) -> InputError:
    return InputError(f"{source}:{number}: not valid UTF-8 (byte 0x{raw[start]:02x})")


def nul_problem(where: str) -> str:
    """What is wrong with text holding a NUL: valid UTF-8 (byte 0x00, or JSON's "\\u0000"),
    but no text (a binary file, a broken export); SentencePiece would read it as <unk>, and a
    model learn from it without a word."""
    return f"{where}: holds a NUL character (U+0000), which text never holds"


def _check_no_nul(raw: bytes, before: int, source: str) -> None:
    """InputError naming the line (counted from `before`) of the first NUL in `raw`, whole
    lines; one `bytes.find`, at memory speed."""
    at = raw.find(b"\0")
    if at >= 0:
        number = before + raw.count(b"\n", 0, at) + 1
        raise InputError(nul_problem(f"{source}:{number}"))


def read_lines(stream: Iterable[bytes], source: str) -> Iterator[str]:
    """Decode the lines of a byte stream as UTF-8, without their line ends.

    Args:
        stream: an open binary file (or any iterable of byte lines split at b"\\n").
        source: names the input in errors (a path or "<stdin>").

    Raises:
        InputError: `source:LINE: not valid UTF-8 (byte 0x..)`, a NUL byte on the line, or
            an unreadable gzip file.
    """
    try:
        for number, raw in enumerate(stream, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(source, number, raw, err.start) from None
            _check_no_nul(raw, number - 1, source)
            yield line.removeprefix(BOM) if number == 1 else line
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise InputError(f"{source}: not a readable gzip file ({err})") from None


def read_line_blocks(stream: BinaryIO, source: str, size: int = _BLOCK) -> Iterator[list[str]]:
    """The lines `read_lines` gives, a list per block of about `size` bytes: one decode and one
    split per block instead of a step per line (a corpus of millions of lines reads at disk
    speed). The same errors, naming the same line."""
    before, rest = 0, b""  # lines in earlier blocks; the bytes after the last line feed
    try:
        while chunk := stream.read(size):
            block = rest + chunk
            end = block.rfind(b"\n")
            if end < 0:
                rest = block
                continue
            block, rest = block[:end], block[end + 1 :]
            lines = decode_text(block, before, source).split("\n")
            if b"\r" in block:
                lines = [line[:-1] if line.endswith("\r") else line for line in lines]
            if before == 0:
                lines[0] = lines[0].removeprefix(BOM)
            before += len(lines)
            yield lines
        if rest:  # a last line without a line feed keeps a carriage return at its end
            line = decode_text(rest, before, source)
            yield [line.removeprefix(BOM) if before == 0 else line]
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise InputError(f"{source}: not a readable gzip file ({err})") from None


def decode_text(block: bytes, before: int, source: str) -> str:
    """UTF-8 text of whole lines, without a NUL; the error names the line (counted from
    `before`)."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as err:
        number = before + block.count(b"\n", 0, err.start) + 1
        raise _not_utf8(source, number, block, err.start) from None
    _check_no_nul(block, before, source)
    return text


def open_bytes(path: Path) -> BinaryIO:
    """A file opened for reading bytes; `.gz` files are decompressed on the fly."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def check_readable(path: Path) -> None:
    """Fail now, before any work, if `path` cannot be read as text.

    Anything readable that is not a directory is text: a regular file, and also a named pipe
    (the shell's `<(command)`) or a character device such as /dev/stdin, which can be read only
    once, as they stream (callers never open them twice, nor count their lines first).

    Raises:
        InputError: `path` does not exist, is a directory, or is not readable.
    """
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a text file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot be read (permission denied)")


def read_file_lines(path: Path) -> list[str]:
    """All lines of a (possibly gzipped) UTF-8 text file or pipe, read once, as `read_lines`
    reads them."""
    check_readable(path)
    with open_bytes(path) as f:
        return list(read_lines(f, str(path)))
