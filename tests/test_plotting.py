"""rlkit.plotting: the figures say what the numbers say."""

import matplotlib

matplotlib.use("Agg")  # no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from rlkit.plotting import (  # noqa: E402
    plot_error_vs_samples,
    plot_mean_and_band,
    plot_return_distribution,
    plot_value_heatmap,
)
from rlkit.statistics import curve_band  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _annotations(ax):
    """``{(row, col): text}`` for the numbers written in the cells."""
    return {
        (round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts
    }


def test_heatmap_writes_each_value_in_its_cell():
    values = np.arange(6, dtype=float) / 4 - 0.5  # row-major: state 4 is row 1, col 1
    ax = plot_value_heatmap(values, (2, 3), fmt=".2f", title="v")
    expected = {divmod(s, 3): format(v, ".2f") for s, v in enumerate(values)}
    assert _annotations(ax) == expected
    assert ax.get_title() == "v"
    np.testing.assert_allclose(ax.images[0].get_array().filled(np.nan), values.reshape(2, 3))


def test_heatmap_leaves_walls_and_nan_blank():
    values = np.array([1.0, 2.0, np.nan, 4.0])
    walls = np.array([False, True, False, False])
    ax = plot_value_heatmap(values, (2, 2), walls=walls, fmt=".1f")
    assert _annotations(ax) == {(0, 0): "1.0", (1, 1): "4.0"}
    shown = ax.images[0].get_array()
    assert shown.mask.tolist() == [[False, True], [True, False]]


def test_heatmap_shared_colour_scale():
    _, (left, right) = plt.subplots(1, 2)
    plot_value_heatmap([0.0, 1.0], (1, 2), ax=left, vmin=-1, vmax=1)
    plot_value_heatmap([0.5, 0.5], (1, 2), ax=right, vmin=-1, vmax=1)
    assert left.images[0].get_clim() == right.images[0].get_clim() == (-1, 1)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"values": np.zeros(5), "shape": (2, 3)}, "values"),
        ({"values": np.zeros(6), "shape": (2, 3), "walls": np.zeros(4, bool)}, "walls"),
        ({"values": np.zeros(6), "shape": (6,)}, "shape"),
    ],
)
def test_heatmap_bad_shapes_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        plot_value_heatmap(**kwargs)


def test_return_distribution_marks_mean_and_exact_value():
    returns = np.array([-1.0, 0.0, 0.5, 1.0])
    ax = plot_return_distribution(returns, true_value=0.2, bins=4)
    positions = sorted(line.get_xdata()[0] for line in ax.lines)
    assert positions == pytest.approx(sorted([returns.mean(), 0.2]))
    assert sum(patch.get_height() for patch in ax.patches) == len(returns)
    with pytest.raises(ValueError, match="^returns must"):
        plot_return_distribution([])


def test_error_vs_samples_reference_line_is_sigma_over_sqrt_n():
    n = np.array([1, 4, 16, 64])
    ax = plot_error_vs_samples(n, 2.0 / np.sqrt(n), reference_std=2.0)
    measured, reference = ax.lines
    np.testing.assert_allclose(reference.get_ydata(), measured.get_ydata())
    assert ax.get_xscale() == ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="^errors must"):
        plot_error_vs_samples(n, np.ones(3))


def _band_limits(ax, x):
    """``(low, high)`` of the shaded band at each x, read back from the polygon that fill_between
    drew."""
    vertices = ax.collections[0].get_paths()[0].vertices
    low = np.array([vertices[np.isclose(vertices[:, 0], value), 1].min() for value in x])
    high = np.array([vertices[np.isclose(vertices[:, 0], value), 1].max() for value in x])
    return low, high


RUNS = np.array(
    [
        [0.0, 1.0, 2.0, 3.0],
        [1.0, 3.0, 2.0, 5.0],
        [2.0, 2.0, 8.0, 4.0],
        [1.0, 0.0, 2.0, 4.0],
        [9.0, 2.0, 3.0, 4.0],
    ]
)
X = np.array([10.0, 20.0, 30.0, 40.0])


def test_mean_and_band_default_is_the_normal_95_interval():
    ax = plot_mean_and_band(X, RUNS, label="runs")
    np.testing.assert_allclose(ax.lines[0].get_ydata(), RUNS.mean(axis=0))
    half = 1.96 * RUNS.std(axis=0, ddof=1) / np.sqrt(len(RUNS))
    low, high = _band_limits(ax, X)
    np.testing.assert_allclose(low, RUNS.mean(axis=0) - half)
    np.testing.assert_allclose(high, RUNS.mean(axis=0) + half)
    plt.close("all")
    low, high = _band_limits(plot_mean_and_band(X, RUNS, band="std"), X)
    np.testing.assert_allclose(high - low, 2 * RUNS.std(axis=0, ddof=1))


@pytest.mark.parametrize("statistic", ["mean", "iqm"])
def test_mean_and_band_bootstrap_draws_curve_band(statistic):
    ax = plot_mean_and_band(
        X,
        RUNS,
        band="bootstrap",
        statistic=statistic,
        reps=500,
        confidence=0.9,
        seed=3,
        color="tab:red",
    )
    centre, expected_low, expected_high = curve_band(
        RUNS, statistic, reps=500, confidence=0.9, seed=3
    )
    np.testing.assert_allclose(ax.lines[0].get_ydata(), centre)
    low, high = _band_limits(ax, X)
    np.testing.assert_allclose(low, expected_low)
    np.testing.assert_allclose(high, expected_high)
    # 5 runs: the lowest and the highest are cut at each x (9.0 and 8.0 do not count)
    if statistic == "iqm":
        np.testing.assert_allclose(centre, [4 / 3, 5 / 3, 7 / 3, 4.0])


def test_mean_and_band_bad_arguments():
    with pytest.raises(ValueError, match="^band must"):
        plot_mean_and_band(X, RUNS, band="sem")
    with pytest.raises(ValueError, match="^statistic must"):
        plot_mean_and_band(X, RUNS, statistic="iqm")  # the IQM only with the bootstrap band
    with pytest.raises(ValueError, match="^statistic must"):
        plot_mean_and_band(X, RUNS, band="bootstrap", statistic="median")
    with pytest.raises(ValueError, match="^runs must"):
        plot_mean_and_band(X[:3], RUNS)


def test_book_style_draws_for_the_page_column_in_colour_blind_safe_colours():
    from rlkit.plotting import OKABE_ITO, PAGE_WIDTH_INCHES, book_style

    with matplotlib.rc_context():
        book_style()
        fig, ax = plt.subplots()
        assert fig.get_figwidth() == PAGE_WIDTH_INCHES and fig.dpi == 100
        assert [line.get_color() for line in ax.plot(np.zeros((2, 3)))] == list(OKABE_ITO[:3])
        for key in ("font.size", "xtick.labelsize", "legend.fontsize"):
            assert (
                matplotlib.font_manager.FontProperties(
                    size=matplotlib.rcParams[key]
                ).get_size_in_points()
                >= 10
            )
        plt.close(fig)


def test_check_page_figure_refuses_wide_figures_and_small_text():
    from rlkit.plotting import check_page_figure

    with matplotlib.rc_context({"figure.dpi": 100}):
        wide = plt.figure(figsize=(13, 3.8))
        with pytest.raises(ValueError, match="fig must be at most 7.8 inches wide"):
            check_page_figure(wide)
        small = plt.figure(figsize=(7, 3))
        small.gca().set_title("tiny", fontsize=6)
        with pytest.raises(ValueError, match=r"at least 10.0 pt .* 6 pt: 'tiny'"):
            check_page_figure(small)
        fine = plt.figure(figsize=(7, 3))
        fine.gca().set_title("readable", fontsize=11)
        fine.gca().tick_params(labelsize=10)
        assert check_page_figure(fine) is fine
        plt.close("all")


def test_mean_and_band_can_show_each_run():
    fig, ax = plt.subplots()
    runs = np.array([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 2.5, 3.5]])
    plot_mean_and_band([0, 1, 2], runs, ax=ax, show_runs=True)
    lines = ax.get_lines()
    assert len(lines) == 4 and all(line.get_linestyle() == ":" for line in lines[1:])
    np.testing.assert_allclose(lines[2].get_ydata(), runs[1])
    plt.close(fig)


def test_glue_figure_refuses_a_figure_the_page_cannot_show():
    from rlkit.book import glue_figure

    wide = plt.figure(figsize=(12, 3))
    with pytest.raises(ValueError, match="fig must be at most 7.8 inches wide"):
        glue_figure("too-wide", wide)
    plt.close(wide)


def test_glue_hands_numpy_scalars_to_the_page_as_python_numbers(monkeypatch):
    """The page formats a glued value's text: ``np.float64(0.5)`` fails where ``0.5`` reads."""
    myst_nb = pytest.importorskip("myst_nb")
    from rlkit.book import glue

    handed = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: handed.update({name: value}))
    glue("share", np.float64(0.25))
    glue("count", np.int64(3))
    glue("figure-free", "text")
    assert handed == {"share": 0.25, "count": 3, "figure-free": "text"}
    assert type(handed["share"]) is float and type(handed["count"]) is int
