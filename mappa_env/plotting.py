"""Figures drawn without pyplot, so that plotting never changes the user's matplotlib setup.

``matplotlib.use("Agg")`` followed by pyplot would switch the backend of whoever imported
us (an inline or widget backend in a notebook) and register figures in pyplot's global
list. A :class:`matplotlib.figure.Figure` made directly needs neither: ``savefig`` picks
the renderer from the file's suffix, and the figure is freed like any other object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mappa_env._optional import require

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(
    nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], purpose: str = "plots"
) -> tuple[Figure, Any]:
    """A figure and its axes, as ``pyplot.subplots`` makes them, outside pyplot.

    Args:
        nrows: Rows of the axes grid.
        ncols: Columns of the axes grid.
        figsize: Width and height in inches.
        purpose: What the figure is for, named in the error when matplotlib is missing.

    Returns:
        The figure and its axes: one ``Axes`` for a 1x1 grid, else an array of them
        (squeezed like ``pyplot.subplots``).

    Raises:
        MissingExtraError: When matplotlib is not installed.
    """
    figure_module = require("matplotlib.figure", "agents", purpose=purpose)
    figure = figure_module.Figure(figsize=figsize)
    return figure, figure.subplots(nrows, ncols)
