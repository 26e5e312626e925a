"""Small plotting helpers the notebooks share: value heat-maps, policy arrows, paths, return
histograms, curves.

Each function draws on the axes it is given (or a new one) and returns those axes, so a notebook can
put several panels side by side and still style them. Nothing here calls ``plt.show()``.
"""

from __future__ import annotations

import matplotlib
import matplotlib.figure
import matplotlib.pyplot as plt
import matplotlib.text
import numpy as np
from matplotlib.axes import Axes

from rlkit.statistics import curve_band

__all__ = [
    "book_style",
    "check_page_figure",
    "plot_value_heatmap",
    "plot_policy_arrows",
    "plot_path",
    "plot_return_distribution",
    "plot_error_vs_samples",
    "plot_mean_and_band",
]


# Okabe and Ito's eight colours, which stay distinct under the common colour-vision deficiencies
OKABE_ITO = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)
# The book's text column shows about 790 CSS pixels: 7.8 inches at 100 dots per inch, so that a
# figure is shown at its own size and its text at the size it was drawn.
PAGE_WIDTH_INCHES = 7.8
BOOK_DPI = 100
SMALLEST_FONT_POINTS = 10.0


def book_style() -> None:
    """The figure style of every notebook: figures drawn for the page column at 100 dpi, text of at
    least 10 pt, Okabe and Ito's colours."""
    matplotlib.rcParams.update(
        {
            "figure.dpi": BOOK_DPI,
            "savefig.dpi": BOOK_DPI,
            "figure.figsize": (PAGE_WIDTH_INCHES, 3.6),
            "font.size": SMALLEST_FONT_POINTS,
            "axes.titlesize": 11,
            "axes.labelsize": SMALLEST_FONT_POINTS,
            "xtick.labelsize": SMALLEST_FONT_POINTS,
            "ytick.labelsize": SMALLEST_FONT_POINTS,
            "legend.fontsize": SMALLEST_FONT_POINTS,
            "legend.title_fontsize": SMALLEST_FONT_POINTS,
            "figure.titlesize": 11,
            "axes.prop_cycle": matplotlib.cycler(color=list(OKABE_ITO)),
            "lines.linewidth": 1.6,
        }
    )


def check_page_figure(fig: matplotlib.figure.Figure) -> matplotlib.figure.Figure:
    """``fig``, if the page can show it at its own size with readable text: at most
    ``PAGE_WIDTH_INCHES`` wide at ``BOOK_DPI``, and no visible text smaller than 10 pt; else a
    ValueError that names what is wrong."""
    width = fig.get_figwidth() * fig.dpi / BOOK_DPI
    if width > PAGE_WIDTH_INCHES + 1e-9:
        raise ValueError(
            f"fig must be at most {PAGE_WIDTH_INCHES} inches wide at {BOOK_DPI} dpi (the page "
            f"column), got {width:.2f}"
        )
    small = sorted(
        {
            (text.get_fontsize(), text.get_text()[:40])
            for text in fig.findobj(matplotlib.text.Text)
            if text.get_visible()
            and text.get_text().strip()
            and text.get_fontsize() < SMALLEST_FONT_POINTS
        }
    )
    if small:
        raise ValueError(
            f"fig's text must be at least {SMALLEST_FONT_POINTS} pt where the page shows it, got "
            + "; ".join(f"{size:g} pt: {text!r}" for size, text in small[:5])
        )
    return fig


def _as_grid(name: str, array, shape: tuple[int, int]) -> np.ndarray:
    """``array`` (one entry per cell, row-major) reshaped to ``shape``, or a ValueError naming
    ``name``."""
    array = np.asarray(array)
    if array.size != shape[0] * shape[1]:
        raise ValueError(
            f"{name} must have {shape[0] * shape[1]} entries (one per cell of shape {shape}), got "
            f"{array.size}"
        )
    return array.reshape(shape)


def plot_value_heatmap(
    values,
    shape: tuple[int, int],
    ax: Axes | None = None,
    title: str | None = None,
    walls=None,
    fmt: str = ".2f",
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "RdYlGn",
) -> Axes:
    """Draw a gridworld's state values as a heat-map with each cell's value written in it.

    ``values`` has one entry per state, in the row-major order of the gridworld
    (``row * n_cols + col``). ``walls`` (booleans, same size) marks cells drawn blank and left
    unannotated; NaN values are drawn blank too. Pass the same ``vmin``/``vmax`` to panels that
    should share one colour scale.
    """
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be (n_rows, n_cols) with positive sizes, got {shape!r}")
    grid = _as_grid("values", values, shape).astype(float)
    blank = np.isnan(grid)
    if walls is not None:
        blank |= _as_grid("walls", walls, shape).astype(bool)
    ax = plt.gca() if ax is None else ax
    # walls, unknown values: dark grey
    colours = matplotlib.colormaps[cmap].with_extremes(bad="0.25")
    image = ax.imshow(np.ma.masked_array(grid, mask=blank), cmap=colours, vmin=vmin, vmax=vmax)
    low, high = image.get_clim()
    for (row, col), value in np.ndenumerate(grid):
        if blank[row, col]:
            continue
        extreme = high > low and abs((value - low) / (high - low) - 0.5) > 0.35
        ax.text(
            col,
            row,
            format(value, fmt),
            ha="center",
            va="center",
            fontsize=SMALLEST_FONT_POINTS,
            color="white" if extreme else "black",
        )
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title)
    return ax


def plot_return_distribution(
    returns,
    ax: Axes | None = None,
    true_value: float | None = None,
    bins: int = 40,
    title: str | None = None,
) -> Axes:
    """Histogram of sampled returns, with their mean (dashed) and, if given, the exact value
    (solid).

    The value of a state is the mean of this distribution (eq. ``eq-value``); the spread is what
    makes Monte Carlo estimates noisy.
    """
    returns = np.asarray(returns, dtype=float).ravel()
    if returns.size == 0:
        raise ValueError("returns must contain at least one sampled return")
    ax = plt.gca() if ax is None else ax
    ax.hist(returns, bins=bins, color="0.7", edgecolor="0.4")
    if true_value is not None:
        ax.axvline(true_value, color="tab:red", linewidth=2, label=f"exact value {true_value:.3f}")
    ax.axvline(
        returns.mean(), color="tab:blue", linestyle="--", label=f"sample mean {returns.mean():.3f}"
    )
    ax.set_xlabel("return $G_0$")
    ax.set_ylabel("episodes")
    ax.legend(loc="upper left")
    if title is not None:
        ax.set_title(title)
    return ax


def plot_error_vs_samples(
    n_samples,
    errors,
    ax: Axes | None = None,
    reference_std: float | None = None,
    title: str | None = None,
    label: str = "root-mean-square error",
) -> Axes:
    """Log-log plot of an estimator's error against the number of samples it averaged.

    With ``reference_std`` (the standard deviation of one sample) it also draws
    ``reference_std / sqrt(n)``, the standard error of a mean: a Monte Carlo estimate should follow
    that line, slope -1/2.
    """
    n_samples = np.asarray(n_samples, dtype=float)
    errors = np.asarray(errors, dtype=float)
    if n_samples.shape != errors.shape:
        raise ValueError(
            f"errors must have the shape of n_samples {n_samples.shape}, got {errors.shape}"
        )
    ax = plt.gca() if ax is None else ax
    ax.loglog(n_samples, errors, marker="o", markersize=3, label=label)
    if reference_std is not None:
        ax.loglog(
            n_samples, reference_std / np.sqrt(n_samples), "k--", label=r"$\sigma / \sqrt{n}$"
        )
    ax.set_xlabel("episodes averaged, $n$")
    ax.set_ylabel("error")
    ax.legend()
    if title is not None:
        ax.set_title(title)
    return ax


# Arrow directions of the gridworld actions 0 up, 1 right, 2 down, 3 left, in (dx, dy) image
# coordinates.
ACTION_ARROWS = np.array([(0.0, -1.0), (1.0, 0.0), (0.0, 1.0), (-1.0, 0.0)])


def plot_policy_arrows(
    policy, shape: tuple[int, int], ax: Axes | None = None, skip=None, color: str = "black"
) -> Axes:
    """Draw a gridworld policy as arrows on top of a heat-map: one arrow per action with probability
    > 0, its length proportional to the probability (a deterministic policy shows one full arrow per
    cell).

    ``policy`` is ``[S, 4]`` with actions up, right, down, left; ``skip`` (booleans, one per state)
    marks cells without arrows (walls, terminal states).
    """
    policy = np.asarray(policy, dtype=float)
    n_cells = shape[0] * shape[1]
    if policy.shape != (n_cells, 4):
        raise ValueError(
            f"policy must have shape ({n_cells}, 4) for a grid of shape {shape}, got {policy.shape}"
        )
    skipped = (
        np.zeros(n_cells, dtype=bool)
        if skip is None
        else _as_grid("skip", skip, shape).ravel().astype(bool)
    )
    ax = plt.gca() if ax is None else ax
    for state in np.flatnonzero(~skipped):
        row, col = divmod(int(state), shape[1])
        for (dx, dy), probability in zip(ACTION_ARROWS, policy[state]):
            if probability > 0:
                length = 0.38 * probability
                ax.annotate(
                    "",
                    xy=(col + dx * length, row + dy * length),
                    xytext=(col, row),
                    arrowprops={"arrowstyle": "->", "color": color, "lw": 1.2},
                )
    return ax


def plot_path(
    states,
    shape: tuple[int, int],
    ax: Axes | None = None,
    color: str = "tab:blue",
    label: str | None = None,
    offset: float = 0.0,
) -> Axes:
    """Draw a trajectory of gridworld states (cell indices, row-major) as a line through the cell
    centres.

    ``offset`` shifts the line a little, so that two paths along the same cells stay visible.
    """
    states = np.asarray(states, dtype=int)
    if states.ndim != 1 or states.size == 0:
        raise ValueError(
            f"states must be a non-empty 1-D sequence of cell indices, got shape {states.shape}"
        )
    if states.min() < 0 or states.max() >= shape[0] * shape[1]:
        raise ValueError(
            f"states must be cell indices in [0, {shape[0] * shape[1]}), got "
            f"{states.min()}..{states.max()}"
        )
    rows, cols = np.divmod(states, shape[1])
    ax = plt.gca() if ax is None else ax
    ax.plot(cols + offset, rows + offset, "-o", color=color, markersize=3, linewidth=2, label=label)
    return ax


def plot_mean_and_band(
    x,
    runs,
    ax: Axes | None = None,
    label: str | None = None,
    color: str | None = None,
    band: str = "ci95",
    statistic: str = "mean",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int | None = 0,
    show_runs: bool = False,
) -> Axes:
    """Plot a statistic over runs (rows of ``runs``) against ``x``, with a shaded band (and, with
    ``show_runs``, each run as a thin dotted line).

    ``band="ci95"``: the mean, and a 95% confidence interval of it (1.96 standard errors);
    ``band="std"``: the mean, and one standard deviation of the runs; ``band="bootstrap"``:
    ``statistic`` (``"mean"`` or ``"iqm"``, the interquartile mean) and its bootstrap percentile
    interval at level ``confidence``, from :func:`rlkit.statistics.curve_band` with ``reps`` and
    ``seed``: the rliable way, with no assumption of normal runs (with very few runs every interval
    here is too narrow; see :mod:`rlkit.statistics`). The band says how much of a difference between
    curves is noise.
    """
    runs = np.atleast_2d(np.asarray(runs, dtype=float))
    if runs.shape[1] != len(x):
        raise ValueError(
            f"runs must have one column per x value ({len(x)}), got shape {runs.shape}"
        )
    if band not in ("ci95", "std", "bootstrap"):
        raise ValueError(f"band must be 'ci95', 'std' or 'bootstrap', got {band!r}")
    if band == "bootstrap":
        centre, low, high = curve_band(runs, statistic, reps=reps, confidence=confidence, seed=seed)
    elif statistic != "mean":
        raise ValueError(
            f"statistic must be 'mean' unless band='bootstrap', got {statistic!r} with "
            f"band={band!r}"
        )
    else:
        centre = runs.mean(axis=0)
        spread = runs.std(axis=0, ddof=1) if runs.shape[0] > 1 else np.zeros_like(centre)
        half = 1.96 * spread / np.sqrt(runs.shape[0]) if band == "ci95" else spread
        low, high = centre - half, centre + half
    ax = plt.gca() if ax is None else ax
    (line,) = ax.plot(x, centre, label=label, color=color)
    ax.fill_between(x, low, high, color=line.get_color(), alpha=0.25, linewidth=0)
    if (
        show_runs
    ):  # thin dotted lines in the curve's colour: visible over the band, not confused with it
        for run in runs:
            ax.plot(x, run, color=line.get_color(), linewidth=0.9, linestyle=":", alpha=0.9)
    return ax
