"""Files: outputs checked before any work and written whole or not at all; JSON objects read
with one-line errors."""

from __future__ import annotations

import functools
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
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
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise InputError(f"{path}: cannot be written: not writable")
        return
    _check_parents(Path(os.path.realpath(path)))  # a symlink's file, written through it


def is_stream(path: Path) -> bool:
    """Whether `path` is there and no regular file: a pipe (`-o >(gzip > x)`, a FIFO), a
    device (`/dev/stdout`, `/dev/null`) or a socket, which a command writes into as it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _check_parents(path: Path) -> None:
    """The nearest existing parent of `path` is a directory we may write in."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{path}: cannot be written: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{path}: cannot be written: {parent} is not writable")


def check_dir(out: Path, flag: str) -> None:
    """Fail now, before any work, if files could not be written into `out`: a directory kept
    with what it holds (a resumed output continues there), or made.

    Raises:
        InputError: `out` is a file, a parent of it is a file, or it (else its nearest
            existing parent) is not writable.
    """
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: is a file; {flag} needs a directory")
    if not out.is_dir():
        _check_parents(out)
    elif not os.access(out, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot be written: not writable")


def check_output_dir(out: Path, force: bool, flag: str, inputs: Sequence[Path] = ()) -> None:
    """Fail now, before any work, if `out` could not become a new directory that replaces what
    it holds (with `force`), or if writing it could change one of `inputs`, what the command
    reads (a run, its checkpoint, its tokenizer; a model's directory).

    Raises:
        InputError: `out` is, holds or is inside one of `inputs` (with `force` or without),
            is a file, a parent of it is a file, its nearest existing parent is not writable,
            or it is not empty and `force` is off.
    """
    check_apart(out, flag, inputs)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: is a file; {flag} needs a directory")
    _check_parents(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"{out}: exists and is not empty; use --force to replace it")


def check_apart(out: Path, flag: str, inputs: Sequence[Path]) -> None:
    """`out` neither is nor holds an input (replacing it would delete that input), nor lies
    inside one (writing it would change what the command reads: `-o RUN/checkpoints --force`
    would delete the run's checkpoints), symlinks followed.

    Raises:
        InputError: naming `out` and the input.
    """
    where = out.resolve()
    for source in inputs:
        if source.resolve().is_relative_to(where):
            held = "is" if source.resolve() == where else "holds"
            raise InputError(
                f"{out}: {held} {source}, which replacing it would delete; give another {flag}"
            )
        if where.is_relative_to(source.resolve()):
            raise InputError(
                f"{out}: is inside {source}, which this command reads; give another {flag} "
                "outside it"
            )


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
    A symlink stays one: the file it names is replaced. A pipe, device or socket (`is_stream`)
    is written into as it is: it cannot be replaced, nor written whole or not at all.
    """
    check_output(path)
    if is_stream(path):
        with open(path, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        return
    path = Path(os.path.realpath(path))
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


def read_json_object(path: Path, default: dict | None = None) -> dict:
    """The JSON object in `path` (`default` when given and there is no such file).

    Raises:
        InputError: missing, unreadable, not JSON, or not an object, naming the file.
    """
    if default is not None and not path.is_file():
        return default
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: not a JSON object")
    return value


def shown_path(path: str) -> str:
    """What a published file (an export's config and model card, /health) calls a path: its
    name alone, never where it lies on the machine that wrote it; a run's checkpoint
    (RUN/checkpoints/best.pt) as RUN/best.pt, which says which run it was. "" stays "".
    """
    if not path:
        return path
    where = Path(os.path.abspath(path))
    if where.parent.name == "checkpoints":
        return f"{where.parent.parent.name}/{where.name}"
    return where.name


def shown_spec(spec: str) -> str:
    """A setting that names files (a corpus spec, a tokenizer folder, a checkpoint) as
    `shown_path` shows a path: a local one (PREFIX, FILE.tsv, a folder, `hf:` of a local
    folder, which `data.corpus.anchored_spec` records absolute) by its name alone, with its
    `hf:` config and split; hub names and `bundled:` corpora as they are."""
    if not spec or spec.startswith("bundled:"):
        return spec
    if spec.startswith("hf:"):
        name = spec.removeprefix("hf:").partition("@")[0].partition(":")[0]
        if not os.path.isabs(name):  # a hub name
            return spec
        return "hf:" + shown_path(name) + spec.removeprefix(f"hf:{name}")
    return shown_path(spec)
