"""Results over few runs, reported the rliable way: robust aggregates with stratified-bootstrap
intervals.

Agarwal et al. (2021), "Deep Reinforcement Learning at the Edge of the Statistical Precipice": with
the handful of runs deep RL can afford, a point estimate (the mean of three seeds) hides how much it
would move with other seeds. Report an interval estimate instead, of an aggregate that a single odd
run cannot drag far: the interquartile mean (IQM), the mean of the middle 50% of all runs and tasks.

The layout is rliable's: a score matrix is ``[runs, tasks]``, one row per run (seed), one column per
task. The bootstrap is stratified by task: each resample draws, for every task separately, as many
runs as the task has, with replacement, from that task's own runs (tasks are never mixed, and each
task draws its own runs). The interval is the percentile interval of the statistic over the
resamples, as rliable's ``get_interval_estimates(..., method="percentile")`` computes it (with
``np.percentile``'s default linear interpolation). Numpy only: the IQM is
``scipy.stats.trim_mean(scores, 0.25, axis=None)``, reimplemented.

With one task and few runs, the stratified bootstrap is the plain bootstrap over runs, and its
interval is too narrow: a resample can never spread wider than the runs themselves, so with 3 runs a
"95%" percentile interval of the mean covers the true mean in about three experiments of four. It is
a floor on the uncertainty, not a guarantee; more runs (or more tasks) are the cure.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

__all__ = [
    "STATISTICS",
    "CURVE_STATISTICS",
    "iqm",
    "aggregate",
    "stratified_bootstrap_ci",
    "curve_band",
]

STATISTICS = ("mean", "median", "iqm", "optimality_gap")  # rliable's aggregate metrics
CURVE_STATISTICS = ("mean", "iqm")  # statistics over the runs of one task, at each point of a curve
IQM_CUT = 0.25  # the fraction trimmed at each end
_CHUNK_ELEMENTS = 1 << 22  # resampled scores held in memory at once (32 MiB of float64)


def _finite_array(name: str, values) -> np.ndarray:
    """``values`` as a non-empty float64 array with no NaN or inf, or a ValueError naming
    ``name``."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be an array of numbers, got {type(values).__name__}"
        ) from None
    if array.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(
            f"{name} must be finite (no NaN or inf), got {int((~np.isfinite(array)).sum())} "
            f"non-finite of {array.size} values"
        )
    return array


def _score_matrix(scores) -> np.ndarray:
    """``scores`` as a ``[runs, tasks]`` matrix; a 1-D array is one task's runs."""
    array = _finite_array("scores", scores)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"scores must be 1-D [runs] or 2-D [runs, tasks], got shape {array.shape}")
    return array


def _check_statistic(statistic, allowed: tuple[str, ...]) -> str:
    if statistic not in allowed:
        raise ValueError(f"statistic must be one of {allowed}, got {statistic!r}")
    return statistic


def _check_bootstrap(reps, confidence, seed) -> None:
    if not isinstance(reps, Integral) or isinstance(reps, bool) or reps < 1:
        raise ValueError(f"reps must be an integer >= 1, got {reps!r}")
    if (
        not isinstance(confidence, Real)
        or isinstance(confidence, bool)
        or not 0.0 < confidence < 1.0
    ):
        raise ValueError(
            f"confidence must be a number strictly between 0 and 1, got {confidence!r}"
        )
    if seed is not None and (not isinstance(seed, Integral) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}")


def _check_threshold(threshold) -> float:
    if (
        not isinstance(threshold, Real)
        or isinstance(threshold, bool)
        or not math.isfinite(threshold)
    ):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    return float(threshold)


def _trim_mean_last_axis(x: np.ndarray) -> np.ndarray:
    """The 25% trimmed mean along the last axis, exactly as ``scipy.stats.trim_mean``:
    ``int(0.25 * n)`` values are cut at each end (none when n < 4), and the mean of the rest is
    taken."""
    n = x.shape[-1]
    cut = int(IQM_CUT * n)
    if cut == 0:
        return x.mean(axis=-1)
    middle = np.partition(x, (cut, n - cut - 1), axis=-1)[..., cut : n - cut]
    return middle.mean(axis=-1)


def iqm(scores, axis: int | None = None):
    """The interquartile mean: the mean of the middle 50% of ``scores``, trimming 25% at each end.

    Semantics of ``scipy.stats.trim_mean(scores, proportiontocut=0.25, axis=axis)``, which rliable's
    ``aggregate_iqm`` calls with ``axis=None``: over the flattened array by default,
    ``int(0.25 * n)`` values cut from each end of the sorted ``n`` values (so with fewer than 4
    values nothing is cut and the IQM is the mean; with 5 to 7 one value is cut at each end).
    Returns a float for ``axis=None``, else an array.
    """
    array = _finite_array("scores", scores)
    if axis is None:
        return float(_trim_mean_last_axis(array.ravel()))
    return _trim_mean_last_axis(np.moveaxis(array, axis, -1))


def _aggregate_batched(samples: np.ndarray, statistic: str, threshold: float) -> np.ndarray:
    """``statistic`` of each ``[runs, tasks]`` matrix in ``samples[..., runs, tasks]``, shape
    ``samples.shape[:-2]``."""
    if statistic == "mean":  # mean over tasks of each task's mean over runs
        return samples.mean(axis=-2).mean(axis=-1)
    if statistic == "median":  # median over tasks of each task's mean over runs
        return np.median(samples.mean(axis=-2), axis=-1)
    if statistic == "iqm":  # over all runs of all tasks together
        return _trim_mean_last_axis(samples.reshape(*samples.shape[:-2], -1))
    return threshold - np.minimum(samples, threshold).mean(axis=(-2, -1))  # optimality_gap


def aggregate(scores, statistic: str = "iqm", *, threshold: float = 1.0) -> float:
    """One number for a score matrix ``[runs, tasks]`` (a 1-D array is one task), as rliable's
    metrics compute it.

    - ``"mean"``: the mean over tasks of each task's mean over runs (``aggregate_mean``);
    - ``"median"``: the median over tasks of each task's mean over runs (``aggregate_median``; with
      one task, the mean);
    - ``"iqm"``: the interquartile mean of all runs of all tasks together (``aggregate_iqm``);
    - ``"optimality_gap"``: ``threshold - mean(min(scores, threshold))``, how far the scores fall
      short of ``threshold`` on average, scores above it counting as ``threshold`` (rliable's
      ``gamma``, 1 for normalised scores).
    """
    matrix = _score_matrix(scores)
    statistic = _check_statistic(statistic, STATISTICS)
    return float(_aggregate_batched(matrix, statistic, _check_threshold(threshold)))


def _percentile_interval(
    replicates: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval along axis 0, with ``np.percentile``'s linear interpolation (as arch,
    under rliable)."""
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha], axis=0)
    return low, high


def stratified_bootstrap_ci(
    scores,
    statistic: str = "iqm",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int | None = 0,
    *,
    threshold: float = 1.0,
) -> tuple[float, float, float]:
    """``(point, low, high)``: ``statistic`` of ``scores`` ``[runs, tasks]`` and its
    stratified-bootstrap interval.

    Each of ``reps`` resamples draws, independently for every task, ``runs`` indices with
    replacement and takes that task's scores at them (rliable's ``StratifiedBootstrap``: tasks are
    never mixed); the interval runs from the ``(1 - confidence) / 2`` to the
    ``(1 + confidence) / 2`` quantile of the statistic over the resamples (rliable's
    ``method="percentile"``). A 1-D ``scores`` is one task. ``statistic`` is one of
    :data:`STATISTICS` (see :func:`aggregate`); the same ``seed`` gives the same interval (``None``:
    fresh randomness).
    """
    matrix = _score_matrix(scores)
    statistic = _check_statistic(statistic, STATISTICS)
    _check_bootstrap(reps, confidence, seed)
    threshold = _check_threshold(threshold)
    runs, tasks = matrix.shape
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // matrix.size)
    replicates = np.empty(reps)
    columns = np.arange(tasks)
    for start in range(0, reps, chunk):
        size = min(chunk, reps - start)
        rows = rng.integers(0, runs, size=(size, runs, tasks))  # per task, its own draw of runs
        replicates[start : start + size] = _aggregate_batched(
            matrix[rows, columns], statistic, threshold
        )
    low, high = _percentile_interval(replicates, confidence)
    return float(_aggregate_batched(matrix, statistic, threshold)), float(low), float(high)


def curve_band(
    curves, statistic: str = "iqm", reps: int = 2000, confidence: float = 0.95, seed: int | None = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(point, low, high)``, each of shape ``[points]``: a statistic of learning curves over runs,
    with a band.

    ``curves`` is ``[runs, points]``, one task: row ``i`` is run ``i``'s curve at the same x values.
    At every point, the statistic over runs (``"iqm"`` or ``"mean"``) and its bootstrap percentile
    interval, the one-task case of :func:`stratified_bootstrap_ci`. The resampled runs are drawn
    once for all points (a resample takes whole curves), so the band costs one set of draws and
    moves smoothly along x; at each point on its own it is the same bootstrap. (rliable draws every
    point separately; each point's interval follows the same distribution either way.)
    """
    array = _finite_array("curves", curves)
    if array.ndim != 2:
        raise ValueError(f"curves must be 2-D [runs, points], got shape {array.shape}")
    statistic = _check_statistic(statistic, CURVE_STATISTICS)
    _check_bootstrap(reps, confidence, seed)
    runs, points = array.shape
    columns = np.ascontiguousarray(array.T)  # [points, runs]
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, runs, size=(reps, runs))
    chunk = max(1, _CHUNK_ELEMENTS // array.size)
    replicates = np.empty((reps, points))
    for start in range(0, reps, chunk):
        resampled = columns[:, rows[start : start + chunk]]  # [points, size, runs]
        replicates[start : start + chunk] = _point_statistic(resampled, statistic).T
    low, high = _percentile_interval(replicates, confidence)
    return _point_statistic(columns, statistic), low, high


def _point_statistic(x: np.ndarray, statistic: str) -> np.ndarray:
    """The statistic over the last axis (the runs of one task)."""
    return x.mean(axis=-1) if statistic == "mean" else _trim_mean_last_axis(x)
