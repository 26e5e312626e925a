"""Planning against Sutton & Barto's published tables, the exact linear solve, and each other."""

import gymnasium as gym
import numpy as np
import pytest

import rlkit  # noqa: F401
from rlkit.envs import TabularMDP
from rlkit.tabular import (
    dyna_q,
    exact_policy_values,
    greedy_path,
    greedy_policy,
    policy_evaluation,
    policy_iteration,
    q_from_v,
    uniform_random_policy,
    value_iteration,
)
from tests.envs.test_gridworld import SUTTON_BARTO_4X4_RANDOM, SUTTON_BARTO_5X5_RANDOM

# Sutton & Barto (2018), Figure 3.5 (middle): v_* of the 5x5 gridworld, gamma = 0.9.
SUTTON_BARTO_5X5_OPTIMAL = np.array(
    [
        [22.0, 24.4, 22.0, 19.4, 17.5],
        [19.8, 22.0, 19.8, 17.8, 16.0],
        [17.8, 19.8, 17.8, 16.0, 14.4],
        [16.0, 17.8, 16.0, 14.4, 13.0],
        [14.4, 16.0, 14.4, 13.0, 11.7],
    ]
)


def gridworld(layout):
    return TabularMDP.from_gymnasium(gym.make("rlkit/GridWorld-v0", layout=layout))


@pytest.mark.parametrize("in_place", [False, True])
def test_policy_evaluation_reproduces_example_4_1(in_place):
    mdp = gridworld("sutton_barto_4x4")
    V = policy_evaluation(
        mdp, uniform_random_policy(16, 4), gamma=1.0, tol=1e-10, in_place=in_place
    )
    np.testing.assert_allclose(V.reshape(4, 4), SUTTON_BARTO_4X4_RANDOM, atol=1e-6)


def test_in_place_sweeps_converge_in_fewer_sweeps():
    mdp = gridworld("sutton_barto_4x4")
    synchronous, in_place = [], []
    policy_evaluation(mdp, uniform_random_policy(16, 4), 1.0, tol=1e-6, history=synchronous)
    policy_evaluation(
        mdp, uniform_random_policy(16, 4), 1.0, tol=1e-6, in_place=True, history=in_place
    )
    assert len(in_place) < len(synchronous)
    assert synchronous[-1] < 1e-6 <= synchronous[-2]


def test_the_5x5_random_and_optimal_values_equal_figures_3_2_and_3_5():
    mdp = gridworld("sutton_barto_5x5")
    v_pi = policy_evaluation(mdp, uniform_random_policy(25, 4), gamma=0.9)
    np.testing.assert_allclose(v_pi.reshape(5, 5), SUTTON_BARTO_5X5_RANDOM, atol=0.05)
    v_star, policy = value_iteration(mdp, gamma=0.9, tol=1e-10)
    np.testing.assert_allclose(v_star.reshape(5, 5), SUTTON_BARTO_5X5_OPTIMAL, atol=0.05)
    v_pi_star, pi_star = policy_iteration(mdp, gamma=0.9)
    np.testing.assert_allclose(v_pi_star, v_star, atol=1e-8)
    q_star = q_from_v(mdp, v_star, 0.9)
    # from A every action jumps to A' (+10): all tie
    np.testing.assert_allclose(q_star[1], q_star[1, 0])
    for optimal in (policy, pi_star):  # ties may be broken differently; both must be optimal
        np.testing.assert_allclose(
            exact_policy_values(mdp.P, mdp.R, optimal, 0.9, mdp.terminal), v_star, atol=1e-8
        )


def test_gamma_one_ties_policy_iteration_progresses_and_value_iteration_says_why_it_cannot():
    mdp = TabularMDP.from_gymnasium(gym.make("FrozenLake-v1", is_slippery=False))
    # moving and bumping tie at V = 1: keep the moving action
    V, policy = policy_iteration(mdp, gamma=1.0)
    assert V[0] == 1.0
    np.testing.assert_allclose(exact_policy_values(mdp.P, mdp.R, policy, 1.0, mdp.terminal)[0], 1.0)
    with pytest.raises(ValueError, match="never reaches a terminal state"):
        value_iteration(mdp, gamma=1.0)


@pytest.mark.parametrize("is_slippery", [True, False])
def test_value_iteration_policy_iteration_and_the_exact_solve_agree_on_frozen_lake(is_slippery):
    mdp = TabularMDP.from_gymnasium(gym.make("FrozenLake-v1", is_slippery=is_slippery))
    v_vi, pi_vi = value_iteration(mdp, gamma=0.99, tol=1e-12)
    v_pi, pi_pi = policy_iteration(mdp, gamma=0.99)
    np.testing.assert_allclose(v_vi, v_pi, atol=1e-8)
    np.testing.assert_allclose(
        exact_policy_values(mdp.P, mdp.R, pi_vi, 0.99, mdp.terminal), v_pi, atol=1e-8
    )
    np.testing.assert_allclose(
        exact_policy_values(mdp.P, mdp.R, pi_pi, 0.99, mdp.terminal), v_pi, atol=1e-8
    )
    assert v_pi[0] > (0.5 if is_slippery else 0.9)


def test_value_iteration_respects_its_stopping_bound():
    mdp = gridworld("sutton_barto_5x5")
    exact, _ = value_iteration(mdp, gamma=0.9, tol=1e-12)
    for tol in (1.0, 1e-2, 1e-4):
        rough, _ = value_iteration(mdp, gamma=0.9, tol=tol)
        assert np.abs(rough - exact).max() <= tol * 0.9 / (1 - 0.9)


def test_q_from_v_and_greedy_policy_on_a_hand_checked_state():
    mdp = gridworld("chapter1")
    V = np.arange(16, dtype=float)
    Q = q_from_v(mdp, V, gamma=0.5)
    # state 10 (row 2, col 2): up -> 6, right -> 11 (goal, terminal: value 0, reward +1), down ->
    # 14, left -> 9
    np.testing.assert_allclose(Q[10], [0.5 * 6, 1.0, 0.5 * 14, 0.5 * 9])
    assert np.all(Q[mdp.terminal] == 0)
    np.testing.assert_array_equal(
        greedy_policy(np.array([[1.0, 3.0, 3.0 - 1e-12, 0.0]])), [[0, 1, 0, 0]]
    )


def test_policy_iteration_history_counts_changed_states_down_to_zero():
    history = []
    policy_iteration(gridworld("sutton_barto_4x4"), gamma=1.0, history=history)
    assert history[-1] == 0 and history[0] > 0


def test_bad_input_raises_clear_errors():
    mdp = gridworld("sutton_barto_5x5")
    random = uniform_random_policy(25, 4)
    with pytest.raises(ValueError, match="gamma must be in"):
        value_iteration(mdp, gamma=1.5)
    with pytest.raises(ValueError, match="gamma = 1 needs an MDP with terminal states"):
        policy_evaluation(mdp, random, gamma=1.0)
    with pytest.raises(ValueError, match="tol must be > 0"):
        value_iteration(mdp, gamma=0.9, tol=-1e-3)
    with pytest.raises(ValueError, match="probability distributions"):
        policy_evaluation(mdp, random * 2, gamma=0.9)
    with pytest.raises(ValueError, match="Discrete"):
        dyna_q(gym.make("CartPole-v1"), n_planning=5, episodes=1)
    with pytest.raises(ValueError, match="n_planning"):
        dyna_q(gym.make("rlkit/GridWorld-v0", layout="dyna_maze"), n_planning=-1, episodes=1)


# ------------------------------------------------------------ Dyna-Q on the Dyna maze (Example 8.1)

DYNA_RUNS = 30


def maze():
    return gym.make(
        "rlkit/GridWorld-v0",
        layout="dyna_maze",
        max_episode_steps=100_000,
        disable_env_checker=True,
    )


def greedy_steps(env, Q):
    path, reached = greedy_path(env, Q, max_steps=100)
    return len(path) - 1 if reached else np.inf


# fixed before measuring: planning needs fewer real episodes
ENOUGH_EPISODES = {
    0: 1000,
    5: 200,
    50: 20,
}


@pytest.fixture(scope="module")
def dyna_runs():
    """Greedy path lengths after 5 episodes and after "enough" episodes, for n = 0, 5, 50, over 30
    runs each."""
    env = maze()
    lengths = {}
    for n, enough in ENOUGH_EPISODES.items():
        after_5 = [
            greedy_steps(env, dyna_q(env, n_planning=n, episodes=5, seed=seed)[0])
            for seed in range(DYNA_RUNS)
        ]
        after_enough = [
            greedy_steps(env, dyna_q(env, n_planning=n, episodes=enough, seed=seed)[0])
            for seed in range(DYNA_RUNS)
        ]
        lengths[n] = (np.array(after_5), np.array(after_enough))
    return lengths


@pytest.mark.learning
def test_planning_finds_a_short_path_in_five_episodes_and_plain_q_learning_does_not(dyna_runs):
    within_16_with_planning = np.mean(dyna_runs[50][0] <= 16)
    within_16_without = np.mean(dyna_runs[0][0] <= 16)
    print(
        f"greedy path <= 16 steps after 5 episodes: n=50 {within_16_with_planning:.0%}, n=0 "
        f"{within_16_without:.0%}"
    )
    assert within_16_with_planning >= 0.9
    assert within_16_without < 0.2


def test_the_true_model_has_a_14_step_shortest_path():
    env = maze()
    mdp = TabularMDP.from_gymnasium(env)
    V, _ = value_iteration(mdp, gamma=0.95)
    assert greedy_steps(env, q_from_v(mdp, V, 0.95)) == 14


@pytest.mark.learning
def test_with_enough_episodes_every_n_settles_on_a_shortest_or_near_shortest_path(dyna_runs):
    """Every n reaches the 14-step path in some runs; the rest settle two steps longer (the top
    route): with epsilon = 0.1 and Q = 0 for transitions never tried, the other route is rarely
    re-explored (the failure that Dyna-Q+'s exploration bonus addresses)."""
    for n, (_, after_enough) in dyna_runs.items():
        print(
            f"n={n}: 14 steps in {np.mean(after_enough == 14):.0%}, <= 16 in "
            f"{np.mean(after_enough <= 16):.0%} of runs"
        )
        assert np.mean(after_enough <= 16) >= 0.9, (n, after_enough)
        assert np.mean(after_enough == 14) >= 0.3, (n, after_enough)


def test_dyna_q_is_reproducible_for_a_seed():
    first = dyna_q(maze(), n_planning=5, episodes=3, seed=7)
    second = dyna_q(maze(), n_planning=5, episodes=3, seed=7)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1]["episode_length"], second[1]["episode_length"])
