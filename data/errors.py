"""The one exception type for problems with what the user gave us, and how messages count."""

from __future__ import annotations


class InputError(Exception):
    """A user-facing problem with an input.

    ``str()`` is one line, ``"FILE:LINE: problem"`` or ``"FILE: problem"``: the CLI prints it
    after ``error:`` and exits with status 2, without a traceback.
    """


def counted(n: int, noun: str, plural: str = "") -> str:
    """`n` and its noun, singular for 1: "1 process", "2 processes" (`plural`; default: the
    noun and "s")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
