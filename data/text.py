"""Lines of text, read the same way by training, translation and evaluation.

Only a line feed ends a line (a carriage return before it is dropped, so CRLF files read as
LF files). A lone carriage return, a form feed or a Unicode line separator inside a line is
data: splitting there as Python's `str.splitlines` (and so `datasets`' text builder) does would
misalign a source file against its target file without a word.
"""

from __future__ import annotations

import gzip
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


def read_file_lines(path: Path) -> list[str]:
    """All lines of a (possibly gzipped) UTF-8 text file, as `read_lines` reads them."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    with open_bytes(path) as f:
        return list(read_lines(f, str(path)))
