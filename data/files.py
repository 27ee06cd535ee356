"""Output files: checked before any work, written whole or not at all."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from data.errors import InputError


def check_output(path: Path) -> None:
    """Fail now, before any work, if `path` could not be written as a file later.

    Raises:
        InputError: `path` is a directory, a parent of it is a file, or the nearest existing
            parent is not writable.
    """
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{path}: cannot be written: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{path}: cannot be written: {parent} is not writable")


@functools.cache
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(path: Path, mode: str = "w") -> Iterator[IO]:
    """Write `path` through a temporary file beside it, renamed over `path` on success.

    The temporary name is unique (so two processes never write the same one) and created
    exclusively (so it never follows a symlink); it gets the permissions a plain `open` would
    give, not mkstemp's 0600. On any error the temporary file is removed and `path` is as it was.
    """
    check_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def write_json(path: Path, value) -> None:
    """`value` as indented JSON in `path`, atomically (see `atomic_output`)."""
    with atomic_output(path) as f:
        json.dump(value, f, indent=1)
