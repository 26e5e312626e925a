"""The k-armed testbed: the shapes of Sutton & Barto's Figures 2.2, 2.3 and 2.4, and exact limiting
cases."""

import numpy as np
import pytest

from rlkit.tabular import run_bandit

# "after 1,000 steps": the last 100 steps of 1,000, averaged over 2,000 runs
LAST = slice(900, 1000)


@pytest.fixture(scope="module")
def figure_2_2():
    return {epsilon: run_bandit(epsilon=epsilon, seed=0) for epsilon in (0.0, 0.01, 0.1)}


def test_epsilon_greedy_beats_greedy_on_reward_and_optimal_action(figure_2_2):
    greedy, explorer = figure_2_2[0.0], figure_2_2[0.1]
    assert explorer.average_reward[LAST].mean() > greedy.average_reward[LAST].mean() + 0.2
    assert explorer.optimal_action[LAST].mean() > greedy.optimal_action[LAST].mean() + 0.3
    # the figure: about 80%, capped by exploration
    assert 0.75 < explorer.optimal_action[LAST].mean() < 0.85
    assert figure_2_2[0.01].optimal_action[LAST].mean() > greedy.optimal_action[LAST].mean()


def test_optimistic_initial_values_beat_realistic_epsilon_greedy_late():
    optimistic = run_bandit(epsilon=0.0, initial_value=5.0, step_size=0.1, seed=1)
    realistic = run_bandit(epsilon=0.1, initial_value=0.0, step_size=0.1, seed=1)
    assert optimistic.optimal_action[LAST].mean() > realistic.optimal_action[LAST].mean()
    # the early dip
    assert optimistic.optimal_action[:5].mean() < realistic.optimal_action[:5].mean() + 0.05


def test_ucb_beats_epsilon_greedy_on_average_reward():
    ucb = run_bandit(ucb_c=2.0, seed=2)
    explorer = run_bandit(epsilon=0.1, seed=2)
    assert ucb.average_reward[LAST].mean() > explorer.average_reward[LAST].mean()


def test_uniform_random_play_matches_its_closed_form():
    result = run_bandit(epsilon=1.0, steps=200, runs=4000, seed=3)
    assert abs(result.optimal_action.mean() - 0.1) < 0.01  # one arm in ten is optimal
    assert abs(result.average_reward.mean()) < 0.03  # E[q*(a)] = 0 for a uniform arm


def test_reproducible_and_validated():
    np.testing.assert_array_equal(
        run_bandit(0.1, steps=50, runs=10, seed=5).average_reward,
        run_bandit(0.1, steps=50, runs=10, seed=5).average_reward,
    )
    for kwargs, name in (
        ({"epsilon": 1.5}, "epsilon"),
        ({"step_size": 0.0}, "step_size"),
        ({"ucb_c": -1.0}, "ucb_c"),
        ({"k": 0}, "k"),
        ({"steps": 0}, "steps"),
        ({"runs": 2.5}, "runs"),
    ):
        with pytest.raises(ValueError, match=name):
            run_bandit(**kwargs)
