"""Small plotting helpers the notebooks share: value heat-maps, return histograms, error-vs-samples curves.

Each function draws on the axes it is given (or a new one) and returns those axes, so a notebook can
put several panels side by side and still style them. Nothing here calls ``plt.show()``.
"""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

__all__ = ["plot_value_heatmap", "plot_return_distribution", "plot_error_vs_samples"]


def _as_grid(name: str, array, shape: tuple[int, int]) -> np.ndarray:
    """``array`` (one entry per cell, row-major) reshaped to ``shape``, or a ValueError naming ``name``."""
    array = np.asarray(array)
    if array.size != shape[0] * shape[1]:
        raise ValueError(f"{name} must have {shape[0] * shape[1]} entries (one per cell of shape {shape}), got {array.size}")
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

    ``values`` has one entry per state, in the row-major order of the gridworld (``row * n_cols + col``).
    ``walls`` (booleans, same size) marks cells drawn blank and left unannotated; NaN values are drawn
    blank too. Pass the same ``vmin``/``vmax`` to panels that should share one colour scale.
    """
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be (n_rows, n_cols) with positive sizes, got {shape!r}")
    grid = _as_grid("values", values, shape).astype(float)
    blank = np.isnan(grid)
    if walls is not None:
        blank |= _as_grid("walls", walls, shape).astype(bool)
    ax = plt.gca() if ax is None else ax
    colours = matplotlib.colormaps[cmap].with_extremes(bad="0.25")  # walls, unknown values: dark grey
    image = ax.imshow(np.ma.masked_array(grid, mask=blank), cmap=colours, vmin=vmin, vmax=vmax)
    low, high = image.get_clim()
    for (row, col), value in np.ndenumerate(grid):
        if blank[row, col]:
            continue
        extreme = high > low and abs((value - low) / (high - low) - 0.5) > 0.35
        ax.text(col, row, format(value, fmt), ha="center", va="center", fontsize=9,
                color="white" if extreme else "black")
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
    """Histogram of sampled returns, with their mean (dashed) and, if given, the exact value (solid).

    The value of a state is the mean of this distribution (eq. ``eq-value``); the spread is what makes
    Monte Carlo estimates noisy.
    """
    returns = np.asarray(returns, dtype=float).ravel()
    if returns.size == 0:
        raise ValueError("returns must contain at least one sampled return")
    ax = plt.gca() if ax is None else ax
    ax.hist(returns, bins=bins, color="0.7", edgecolor="0.4")
    if true_value is not None:
        ax.axvline(true_value, color="tab:red", linewidth=2, label=f"exact value {true_value:.3f}")
    ax.axvline(returns.mean(), color="tab:blue", linestyle="--", label=f"sample mean {returns.mean():.3f}")
    ax.set_xlabel("return $G_0$")
    ax.set_ylabel("episodes")
    ax.legend(loc="upper left", fontsize=8)
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

    With ``reference_std`` (the standard deviation of one sample) it also draws ``reference_std / sqrt(n)``,
    the standard error of a mean: a Monte Carlo estimate should follow that line, slope -1/2.
    """
    n_samples = np.asarray(n_samples, dtype=float)
    errors = np.asarray(errors, dtype=float)
    if n_samples.shape != errors.shape:
        raise ValueError(f"errors must have the shape of n_samples {n_samples.shape}, got {errors.shape}")
    ax = plt.gca() if ax is None else ax
    ax.loglog(n_samples, errors, marker="o", markersize=3, label=label)
    if reference_std is not None:
        ax.loglog(n_samples, reference_std / np.sqrt(n_samples), "k--", label=r"$\sigma / \sqrt{n}$")
    ax.set_xlabel("episodes averaged, $n$")
    ax.set_ylabel("error")
    ax.legend(fontsize=8)
    if title is not None:
        ax.set_title(title)
    return ax
