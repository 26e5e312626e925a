"""What a notebook hands to its chapter's page: the numbers and figures the text quotes.

The book's pages paste values that their notebook computed (myst-nb's ``glue``), so that no sentence
quotes a number that the code no longer produces. In a notebook opened outside the book's tool
chain (no myst-nb installed) both functions do nothing but check; the notebook reads the same.
"""

from __future__ import annotations

import matplotlib.figure
import numpy as np

from rlkit.plotting import check_page_figure

__all__ = ["glue", "glue_figure"]


def glue(name: str, value) -> None:
    """Hand ``value`` to the page under ``name`` (``{glue:text}`name``` in the chapter), without
    showing it in the notebook a second time. A NumPy scalar goes as the Python number it holds:
    the page formats the value's text, and ``np.float64(0.5)`` is not a number it can read."""
    if isinstance(value, np.generic):
        value = value.item()
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # a reader's notebook without the book's tool chain
        return
    myst_glue(name, value, display=False)


def glue_figure(name: str, fig: matplotlib.figure.Figure) -> None:
    """Hand ``fig`` to the page under ``name`` (a ``glued-figure`` in the chapter), after checking
    that the page column can show it at its own size with readable text (``check_page_figure``)."""
    glue(name, check_page_figure(fig))
