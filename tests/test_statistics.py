"""rlkit.statistics against hand-computed values, scipy's trim_mean and rliable's stratified
bootstrap.

The reference numbers marked "rliable" were produced offline, once, in a scratch virtual environment
that is not part of the project (rliable 1.2.0, arch 7.2.0, scipy 1.17.1, numpy 2.4.6, pandas 2.3.3:
arch 7.2 does not import under pandas 3), with

    np.random.seed(0)  # rliable's StratifiedBootstrap draws from numpy's global generator
    point, ci = rliable.library.get_interval_estimates(
        {"x": scores}, lambda s: np.array([rliable.metrics.aggregate_<statistic>(s)]), reps=200_000)

(default method "percentile", confidence 0.95); the trim_mean references with
``scipy.stats.trim_mean(x, 0.25, axis=...)`` in the same environment. Nothing here needs either
package.
"""

import numpy as np
import pytest

from rlkit.statistics import aggregate, curve_band, iqm, stratified_bootstrap_ci

# ---------------------------------------------------------------- the interquartile mean


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([10.0], 10.0),  # n < 4: nothing is cut, the IQM is the mean
        ([1.0, 2.0, 6.0], 3.0),
        ([4.0, 1.0, 3.0, 2.0], 2.5),  # n = 4: cut 1 at each end -> mean(2, 3)
        ([5.0, 1.0, 4.0, 2.0, 3.0], 3.0),  # n = 5: int(1.25) = 1 -> mean(2, 3, 4)
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3.5),  # n = 6: int(1.5) = 1 -> mean(2..5)
        # n = 7: int(1.75) = 1 -> mean(3..7): outliers gone
        (
            [100.0, -50.0, 3.0, 4.0, 5.0, 6.0, 7.0],
            5.0,
        ),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 4.5),  # n = 8: cut 2 -> mean(3..6)
        # a score matrix is flattened: mean(1, 2, 3, 4)
        (
            [[1.0, 100.0], [2.0, 3.0], [4.0, -7.0]],
            2.5,
        ),
    ],
)
def test_iqm_by_hand(values, expected):
    assert iqm(values) == pytest.approx(expected, rel=1e-12)


# scipy.stats.trim_mean(x, 0.25, axis=None), computed offline (see the module docstring)
SCIPY_TRIM_MEAN = [
    ([-0.35, -20.08, -0.63, -0.57, -4.26], -1.82),
    ([2.29, 9.95, -34.07, -10.28, 1.99, 40.31], 0.9875),
    ([-0.76, -7.77, -5.71, 14.85, 0.76, -8.45, -10.84], -4.386),
    ([-29.2, 0.21, -17.64, 8.49, 1.64, 28.07, 5.51, -6.38, -4.36], -0.6759999999999998),
    ([-4.57, 3.54, 5.85, -13.67, 0.5, 1.03, -27.28, -24.77, -13.57, 59.94], -4.456666666666667),
    ([6.76, -6.83, 0.32, 0.2, 9.35, -16.04, 3.71, 17.59, -10.73, 0.15, 4.03], 1.1914285714285715),
]
SCIPY_MATRIX = [
    [-0.5, 18.6, 1.8],
    [-7.9, -6.2, -4.2],
    [7.6, 2.5, 2.7],
    [18.1, 13.2, -14.9],
    [-5.3, -13.3, -7.5],
]
SCIPY_AXIS0 = [0.6, 3.1666666666666665, -3.2999999999999994]
SCIPY_AXIS1 = [
    6.633333333333334,
    -6.1000000000000005,
    4.266666666666667,
    5.466666666666666,
    -8.700000000000001,
]


@pytest.mark.parametrize(
    ("values", "expected"), SCIPY_TRIM_MEAN, ids=[f"n={len(v)}" for v, _ in SCIPY_TRIM_MEAN]
)
def test_iqm_matches_scipy_trim_mean_hard_coded(values, expected):
    assert iqm(values) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_iqm_along_an_axis_matches_scipy_hard_coded():
    np.testing.assert_allclose(iqm(SCIPY_MATRIX, axis=0), SCIPY_AXIS0, rtol=1e-12)
    np.testing.assert_allclose(iqm(SCIPY_MATRIX, axis=1), SCIPY_AXIS1, rtol=1e-12)
    np.testing.assert_allclose(iqm(SCIPY_MATRIX, axis=-1), SCIPY_AXIS1, rtol=1e-12)
    # hand check of one column: sorted [-7.9, -5.3, -0.5, 7.6, 18.1], cut 1 at each end
    assert iqm(SCIPY_MATRIX, axis=0)[0] == pytest.approx((-5.3 - 0.5 + 7.6) / 3)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 40, 101])
def test_iqm_matches_scipy_when_installed(n):
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(n).standard_t(2, size=(n, 3))
    assert iqm(x) == pytest.approx(stats.trim_mean(x, 0.25, axis=None), rel=1e-12)
    np.testing.assert_allclose(iqm(x, axis=0), stats.trim_mean(x, 0.25, axis=0), rtol=1e-12)


# ---------------------------------------------------------------- aggregates

# rliable's layout: 5 runs (rows) of 3 tasks (columns), normalised scores
SCORES = np.array(
    [
        [0.12, 1.05, 0.48],
        [0.35, 0.88, 0.51],
        [0.08, 1.31, 0.47],
        [0.27, 0.95, 0.93],
        [0.19, 0.71, 0.55],
    ]
)
# 10 runs
ONE_TASK = np.array([212.0, 487.5, 500.0, 350.25, 498.0, 130.0, 455.5, 500.0, 401.0, 276.75])

# (scores, statistic): (point, low, high) from rliable, reps=200,000 (see the module docstring)
RLIABLE = {
    ("SCORES", "mean"): (0.5900000000000001, 0.5126666666666667, 0.6760000000000002),
    ("SCORES", "median"): (0.5880000000000001, 0.48200000000000004, 0.7620000000000001),
    ("SCORES", "iqm"): (0.5722222222222222, 0.4911111111111111, 0.6777777777777777),
    ("SCORES", "optimality_gap"): (0.43399999999999994, 0.3640000000000001, 0.496),
    ("ONE_TASK", "mean"): (381.1, 298.15, 454.8),
    ("ONE_TASK", "iqm"): (411.5, 288.125, 487.4166666666667),
}
DATA = {"SCORES": SCORES, "ONE_TASK": ONE_TASK}


def test_aggregates_by_hand():
    task_means = SCORES.mean(axis=0)  # [0.202, 0.98, 0.588]
    assert aggregate(SCORES, "mean") == pytest.approx(task_means.mean())
    assert aggregate(SCORES, "median") == pytest.approx(0.588)
    # 15 scores, int(3.75) = 3 cut at each end: the middle 9 of the sorted scores
    assert aggregate(SCORES, "iqm") == pytest.approx(np.sort(SCORES.ravel())[3:12].mean())
    # scores above 1 count as 1: 1.05 and 1.31 are clipped
    assert aggregate(SCORES, "optimality_gap") == pytest.approx(1 - np.minimum(SCORES, 1).mean())
    assert aggregate(SCORES, "optimality_gap", threshold=2.0) == pytest.approx(2 - SCORES.mean())
    # one task: the median of task means is the mean
    assert aggregate([3.0, 1.0, 2.0], "median") == pytest.approx(2.0)
    assert aggregate([3.0, 1.0, 8.0], "median") == pytest.approx(4.0)


@pytest.mark.parametrize(("data", "statistic"), list(RLIABLE))
def test_point_estimates_match_rliable(data, statistic):
    expected = RLIABLE[(data, statistic)][0]
    assert aggregate(DATA[data], statistic) == pytest.approx(expected, rel=1e-12)
    assert stratified_bootstrap_ci(DATA[data], statistic, reps=10)[0] == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize(("data", "statistic"), list(RLIABLE))
def test_interval_matches_rliable(data, statistic):
    # two Monte Carlo estimates of the same percentiles (different generators): measured over 10
    # seeds, ours stayed within 0.9% of the interval's width of rliable's 200,000-replicate numbers
    _, low, high = stratified_bootstrap_ci(
        DATA[data], statistic, reps=50_000, confidence=0.95, seed=0
    )
    _, ref_low, ref_high = RLIABLE[(data, statistic)]
    width = ref_high - ref_low
    assert low == pytest.approx(ref_low, abs=0.02 * width)
    assert high == pytest.approx(ref_high, abs=0.02 * width)


# ---------------------------------------------------------------- the bootstrap


@pytest.mark.parametrize("statistic", ["mean", "median", "iqm", "optimality_gap"])
@pytest.mark.parametrize("seed", range(5))
def test_interval_contains_the_point_estimate(statistic, seed):
    scores = np.random.default_rng(seed).normal(0.8, 0.3, size=(6, 4))
    point, low, high = stratified_bootstrap_ci(scores, statistic, reps=1000, seed=seed)
    assert low <= point <= high
    assert low < high


def test_seed_makes_it_reproducible():
    first = stratified_bootstrap_ci(SCORES, "iqm", reps=500, seed=7)
    assert stratified_bootstrap_ci(SCORES, "iqm", reps=500, seed=7) == first
    assert stratified_bootstrap_ci(SCORES, "iqm", reps=500, seed=8) != first
    curves = np.random.default_rng(0).normal(size=(5, 20))
    for a, b in zip(curve_band(curves, reps=300, seed=3), curve_band(curves, reps=300, seed=3)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(
        curve_band(curves, reps=300, seed=3)[1], curve_band(curves, reps=300, seed=4)[1]
    )


def test_wider_confidence_gives_a_wider_interval():
    _, low90, high90 = stratified_bootstrap_ci(ONE_TASK, "mean", reps=4000, confidence=0.90)
    _, low99, high99 = stratified_bootstrap_ci(ONE_TASK, "mean", reps=4000, confidence=0.99)
    assert low99 < low90 and high90 < high99


@pytest.mark.parametrize("statistic", ["mean", "iqm"])
def test_interval_shrinks_as_one_over_sqrt_runs(statistic):
    # 4 times the runs, half the width: averaged over 20 experiments to smooth out the sampling
    # noise
    rng = np.random.default_rng(0)

    def mean_width(runs):
        widths = []
        for index in range(20):
            _, low, high = stratified_bootstrap_ci(
                rng.normal(size=(runs, 2)), statistic, reps=1000, seed=index
            )
            widths.append(high - low)
        return np.mean(widths)

    ratio = mean_width(16) / mean_width(64)
    assert 1.7 < ratio < 2.3, ratio


@pytest.mark.parametrize("statistic", ["mean", "iqm"])
def test_coverage_is_close_to_nominal(statistic):
    # 500 simulated experiments of 40 runs from N(3, 2^2); the population IQM of a symmetric
    # distribution is its mean. A 95% interval should contain the true value in about 95% of them
    # (sd of the estimate ~ 1%).
    rng = np.random.default_rng(1)
    covered = 0
    for experiment in range(500):
        _, low, high = stratified_bootstrap_ci(
            rng.normal(3.0, 2.0, size=40), statistic, reps=500, seed=experiment
        )
        covered += low <= 3.0 <= high
    assert 0.90 <= covered / 500 <= 0.98, covered / 500


def test_few_runs_undercover():
    # the percentile bootstrap cannot spread wider than the runs themselves: with 3 runs a "95%"
    # interval of the mean covers the true mean far less often (the book's caveat about three seeds)
    rng = np.random.default_rng(2)
    covered = sum(
        low <= 0.0 <= high
        for _, low, high in (
            stratified_bootstrap_ci(rng.normal(size=3), "mean", reps=500, seed=e)
            for e in range(500)
        )
    )
    assert 0.6 < covered / 500 < 0.85, covered / 500


def test_stratification_keeps_tasks_apart():
    # every run scores 0 on task 0 and 100 on task 1: a resample drawn within each task always holds
    # 4 zeros and 4 hundreds, so every statistic is the same on every resample. Resampling the 8
    # pooled scores would mix the tasks and give a wide interval.
    scores = np.array([[0.0, 100.0]] * 4)
    for statistic in ("mean", "median", "iqm"):
        point, low, high = stratified_bootstrap_ci(scores, statistic, reps=2000)
        assert point == low == high == 50.0
    pooled = scores.ravel()[np.random.default_rng(0).integers(0, 8, size=(2000, 8))].mean(axis=1)
    # what mixing the tasks would report
    assert np.quantile(pooled, 0.975) - np.quantile(pooled, 0.025) > 40


def test_each_task_draws_its_own_runs():
    # task 1 is the negative of task 0 run by run: resampling whole runs (rows) would always give a
    # mean of 0; rliable's stratified bootstrap draws runs independently per task, so the two
    # columns do not cancel
    runs = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    scores = np.stack([runs, -runs], axis=1)
    point, low, high = stratified_bootstrap_ci(scores, "mean", reps=2000)
    assert point == 0.0
    assert low < -0.3 and high > 0.3
    # the variance of (mean of task 0's resample - mean of task 1's) / 2 is twice that of one task's
    # mean / 4
    _, one_low, one_high = stratified_bootstrap_ci(runs, "mean", reps=20000)
    assert (high - low) == pytest.approx((one_high - one_low) / np.sqrt(2), rel=0.1)


def test_one_dimensional_scores_are_one_task():
    column = stratified_bootstrap_ci(ONE_TASK[:, None], "iqm", reps=300, seed=1)
    assert stratified_bootstrap_ci(ONE_TASK, "iqm", reps=300, seed=1) == column
    assert all(isinstance(value, float) for value in column)


def test_one_run_gives_a_zero_width_interval():
    assert stratified_bootstrap_ci([[0.3, 0.5]], "mean", reps=100) == (0.4, 0.4, 0.4)


# ---------------------------------------------------------------- learning curves


@pytest.mark.parametrize("statistic", ["mean", "iqm"])
def test_curve_band_is_the_bootstrap_at_each_point(statistic):
    curves = np.random.default_rng(0).normal(size=(7, 30)) + np.linspace(0, 5, 30)
    point, low, high = curve_band(curves, statistic, reps=4000, seed=0)
    assert point.shape == low.shape == high.shape == (30,)
    assert np.all(low <= point) and np.all(point <= high)
    expected = curves.mean(axis=0) if statistic == "mean" else iqm(curves, axis=0)
    np.testing.assert_allclose(point, expected, rtol=1e-12)
    # each point on its own: the one-task stratified bootstrap, up to Monte Carlo noise
    for index in (0, 13, 29):
        _, ref_low, ref_high = stratified_bootstrap_ci(
            curves[:, index], statistic, reps=4000, seed=1
        )
        width = ref_high - ref_low
        assert low[index] == pytest.approx(ref_low, abs=0.06 * width)
        assert high[index] == pytest.approx(ref_high, abs=0.06 * width)


def test_curve_band_resamples_whole_curves():
    # a curve that is a constant shift of another keeps its band shifted by the same constant,
    # exactly: the same runs are drawn at every point
    base = np.random.default_rng(0).normal(size=(5, 1))
    curves = base + np.arange(10.0)
    point, low, high = curve_band(curves, "mean", reps=500)
    np.testing.assert_allclose(np.diff(low), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.diff(high), 1.0, atol=1e-12)


def test_curve_band_many_points_in_chunks(monkeypatch):
    import rlkit.statistics as evaluation

    curves = np.random.default_rng(0).normal(size=(4, 50))
    whole = curve_band(curves, "iqm", reps=300, seed=5)
    monkeypatch.setattr(evaluation, "_CHUNK_ELEMENTS", 4 * 50 * 7)  # 7 replicates at a time
    for a, b in zip(whole, curve_band(curves, "iqm", reps=300, seed=5)):
        np.testing.assert_array_equal(a, b)
    single = stratified_bootstrap_ci(SCORES, "iqm", reps=300, seed=5)
    monkeypatch.setattr(evaluation, "_CHUNK_ELEMENTS", 1)
    assert stratified_bootstrap_ci(SCORES, "iqm", reps=300, seed=5) == pytest.approx(single)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: iqm([]), "scores"),
        (lambda: iqm([1.0, np.nan]), "scores"),
        (lambda: iqm(["a", "b"]), "scores"),
        (lambda: aggregate(np.zeros((0, 3))), "scores"),
        (lambda: aggregate([1.0, np.inf]), "scores"),
        (lambda: aggregate(np.zeros((2, 2, 2))), "scores"),
        (lambda: aggregate([1.0, 2.0], "max"), "statistic"),
        (lambda: aggregate([1.0, 2.0], "optimality_gap", threshold=np.nan), "threshold"),
        (lambda: stratified_bootstrap_ci([[1.0, np.nan]]), "scores"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], "average"), "statistic"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], reps=0), "reps"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], reps=2.5), "reps"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], confidence=1.0), "confidence"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], confidence=0.0), "confidence"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], confidence=95), "confidence"),
        (lambda: stratified_bootstrap_ci([1.0, 2.0], seed=-1), "seed"),
        (lambda: curve_band(np.zeros(5)), "curves"),
        (lambda: curve_band(np.zeros((3, 0))), "curves"),
        (lambda: curve_band([[1.0, np.nan], [1.0, 2.0]]), "curves"),
        (lambda: curve_band(np.zeros((3, 4)), "median"), "statistic"),
        (lambda: curve_band(np.zeros((3, 4)), reps=0), "reps"),
        (lambda: curve_band(np.zeros((3, 4)), confidence=-0.5), "confidence"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        call()
