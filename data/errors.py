"""The one exception type for problems with what the user gave us."""

from __future__ import annotations


class InputError(Exception):
    """A user-facing problem with an input.

    ``str()`` is one line, ``"FILE:LINE: problem"`` or ``"FILE: problem"``: the CLI prints it
    after ``error:`` and exits with status 2, without a traceback.
    """
