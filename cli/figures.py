"""Figures without pyplot, for `tf plot` and `tf translate --attention`.

matplotlib is an optional extra (`pip install 'tf[plot]'`). Figures are drawn on a `Figure` with an
Agg canvas of their own rather than through pyplot: no global backend or figure list is touched, so
nothing needs a display and nothing leaks when many pictures are written in one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from data.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def require_matplotlib(command: str) -> None:
    """Fail with a one-line InputError naming `command` when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"matplotlib is needed for {command}: pip install 'tf[plot]'") from None


def new_figure(width: float, height: float, command: str) -> Figure:
    """An empty figure rendered by Agg, or a one-line InputError without matplotlib.

    Args:
        width, height: the size in inches.
        command: what needs matplotlib, named in the error (e.g. "tf plot").
    """
    # The package first: its submodules, once imported, would be found even without it.
    require_matplotlib(command)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: savefig renders with Agg
    return figure
