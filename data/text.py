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


def read_lines(stream: Iterable[bytes], source: str) -> Iterator[str]:
    """Decode the lines of a byte stream as UTF-8, without their line ends.

    Args:
        stream: an open binary file (or any iterable of byte lines split at b"\\n").
        source: names the input in errors (a path or "<stdin>").

    Raises:
        InputError: `source:LINE: not valid UTF-8 (byte 0x..)`, or an unreadable gzip file.
    """
    try:
        for number, raw in enumerate(stream, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(
                    f"{source}:{number}: not valid UTF-8 (byte 0x{raw[err.start]:02x})"
                ) from None
            yield line.removeprefix(BOM) if number == 1 else line
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise InputError(f"{source}: not a readable gzip file ({err})") from None


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
