"""Model-free learners against exact DP values and Sutton & Barto's published results."""

import gymnasium as gym
import numpy as np
import pytest

import rlkit  # noqa: F401
from rlkit.envs import TabularMDP
from rlkit.tabular import (
    exact_policy_values,
    expected_sarsa,
    greedy_path,
    greedy_policy,
    mc_control,
    mc_prediction,
    n_step_td_prediction,
    off_policy_mc_prediction,
    q_from_v,
    q_learning,
    sarsa,
    td0_prediction,
    td_lambda_prediction,
    uniform_random_policy,
    value_iteration,
)

SEEDS = [0, 1, 2]
INNER = slice(1, 6)  # the five non-terminal states A-E of the random walk


def make(layout, **kwargs):
    return gym.make("rlkit/GridWorld-v0", layout=layout, disable_env_checker=True, **kwargs)


def left_right(p_right=0.5):
    """A policy for the 1x7 random walk that moves right with probability p_right, else left."""
    policy = np.zeros((7, 4))
    policy[:, 1], policy[:, 3] = p_right, 1 - p_right
    return policy


# ---------------------------------------------------- prediction on the 4x4 gridworld (Example 4.1)


@pytest.fixture(scope="module")
def gridworld_4x4():
    env = make("sutton_barto_4x4", max_episode_steps=100_000)
    mdp = TabularMDP.from_gymnasium(env)
    exact = exact_policy_values(mdp.P, mdp.R, uniform_random_policy(16, 4), 1.0, mdp.terminal)
    return env, exact


@pytest.mark.learning
@pytest.mark.parametrize("seed", SEEDS)
def test_monte_carlo_is_within_half_a_unit_of_the_dp_values_after_30000_episodes(
    gridworld_4x4, seed
):
    env, exact = gridworld_4x4
    V, _ = mc_prediction(env, uniform_random_policy(16, 4), gamma=1.0, episodes=30_000, seed=seed)
    print(f"seed {seed}: max |MC - DP| = {np.abs(V - exact).max():.3f}")
    assert np.abs(V - exact).max() < 0.5


@pytest.mark.learning
@pytest.mark.parametrize("seed", SEEDS)
def test_td0_is_within_half_a_unit_of_the_dp_values_after_30000_episodes(gridworld_4x4, seed):
    env, exact = gridworld_4x4
    V, _ = td0_prediction(
        env,
        uniform_random_policy(16, 4),
        alpha=0.01,
        gamma=1.0,
        episodes=30_000,
        seed=seed,
        average_from=10_000,
    )
    print(f"seed {seed}: max |TD(0) - DP| = {np.abs(V - exact).max():.3f}")
    assert np.abs(V - exact).max() < 0.5


# --------------------------------------------------- the random walk (Example 6.2): v = 1/6 ... 5/6

RANDOM_WALK_VALUES = np.arange(1, 6) / 6


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "learner",
    [
        lambda env, seed: td0_prediction(env, left_right(), alpha=0.02, episodes=3000, seed=seed),
        lambda env, seed: n_step_td_prediction(
            env, left_right(), n=4, alpha=0.02, episodes=3000, seed=seed
        ),
        lambda env, seed: td_lambda_prediction(
            env, left_right(), lam=0.8, alpha=0.02, episodes=3000, seed=seed
        ),
        lambda env, seed: mc_prediction(env, left_right(), episodes=3000, seed=seed),
    ],
    ids=["td0", "n_step", "td_lambda", "monte_carlo"],
)
def test_prediction_methods_find_the_random_walk_values(learner, seed):
    V, history = learner(make("random_walk_5"), seed)
    np.testing.assert_allclose(V[INNER], RANDOM_WALK_VALUES, atol=0.1)
    assert V[0] == V[6] == 0.0 and len(history["episode_length"]) == 3000


def test_td_lambda_with_lambda_zero_is_exactly_td0():
    env = make("random_walk_5")
    td0, _ = td0_prediction(env, left_right(), alpha=0.1, episodes=50, seed=4)
    td_lambda, _ = td_lambda_prediction(env, left_right(), lam=0.0, alpha=0.1, episodes=50, seed=4)
    np.testing.assert_allclose(td_lambda, td0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_off_policy_monte_carlo_recovers_q_pi_and_weighting_cuts_the_error(seed):
    env = make("random_walk_5")
    mdp = TabularMDP.from_gymnasium(env)
    target, behaviour = left_right(0.8), left_right(0.5)
    q_pi = q_from_v(mdp, exact_policy_values(mdp.P, mdp.R, target, 1.0, mdp.terminal), 1.0)
    weighted, _ = off_policy_mc_prediction(
        env, target, behaviour, episodes=3000, weighted=True, seed=seed
    )
    ordinary, _ = off_policy_mc_prediction(
        env, target, behaviour, episodes=3000, weighted=False, seed=seed
    )
    moves = [1, 3]
    assert np.abs(weighted - q_pi)[INNER][:, moves].max() < 0.05
    assert np.abs(ordinary - q_pi)[INNER][:, moves].max() < 0.2


def test_monte_carlo_control_learns_a_near_optimal_policy():
    env = make("sutton_barto_4x4", max_episode_steps=100_000)
    mdp = TabularMDP.from_gymnasium(env)
    v_star, _ = value_iteration(mdp, 1.0)
    Q, _ = mc_control(env, episodes=3000, gamma=1.0, epsilon=0.1, seed=0)
    v_greedy = exact_policy_values(mdp.P, mdp.R, greedy_policy(Q), 1.0, mdp.terminal)
    # every state reaches a corner, at most 2 steps late
    assert np.abs(v_greedy - v_star).max() <= 2.0
    # discounted, so that waiting in place (up/down bump) costs something: right is strictly best
    Q_walk, _ = mc_control(make("random_walk_5"), episodes=300, gamma=0.9, epsilon=0.1, seed=0)
    assert np.all(Q_walk[INNER].argmax(axis=1) == 1)


# ---------------------------------------------------------------- cliff walking (Example 6.6)

CLIFF_RUNS = 50


@pytest.fixture(scope="module")
def cliff_runs():
    env = gym.make("CliffWalking-v1")
    runs = {}
    for name, learner in (("sarsa", sarsa), ("q_learning", q_learning)):
        trained = [
            learner(env, episodes=500, alpha=0.5, gamma=1.0, epsilon=0.1, seed=seed)
            for seed in range(CLIFF_RUNS)
        ]
        runs[name] = {
            "online": np.array(
                [history["episode_return"][400:500].mean() for _, history in trained]
            ),
            "greedy_steps": np.array(
                [len(greedy_path(env, Q, max_steps=200)[0]) - 1 for Q, _ in trained]
            ),
        }
    return runs


@pytest.mark.learning
def test_sarsa_earns_more_online_than_q_learning_on_the_cliff(cliff_runs):
    sarsa_mean, q_mean = (
        cliff_runs["sarsa"]["online"].mean(),
        cliff_runs["q_learning"]["online"].mean(),
    )
    print(f"mean online return, episodes 400-500: SARSA {sarsa_mean:.1f}, Q-learning {q_mean:.1f}")
    assert sarsa_mean - q_mean >= 15


@pytest.mark.learning
def test_q_learning_greedy_path_is_the_optimal_13_steps_and_sarsa_takes_the_safe_way(cliff_runs):
    q_steps, sarsa_steps = (
        cliff_runs["q_learning"]["greedy_steps"],
        cliff_runs["sarsa"]["greedy_steps"],
    )
    print(
        f"Q-learning greedy path of 13 steps in {np.mean(q_steps == 13):.0%} of runs; SARSA's "
        f"median {np.median(sarsa_steps)}"
    )
    assert np.mean(q_steps == 13) >= 0.9
    assert np.median(sarsa_steps) > 13


def test_expected_sarsa_runs_and_is_reproducible():
    env = gym.make("CliffWalking-v1")
    first = expected_sarsa(env, episodes=30, seed=3)
    second = expected_sarsa(env, episodes=30, seed=3)
    np.testing.assert_array_equal(first[0], second[0])
    assert first[1]["episode_return"].shape == (30,)


# ----------------------------------------------------------- truncation, reproducibility, bad input


def test_td_targets_bootstrap_at_a_time_limit():
    """With a 1-step time limit on the continuing 5x5 task, only bootstrapping lets Q exceed one
    reward (10)."""
    env = make("sutton_barto_5x5", max_episode_steps=1)
    Q, _ = q_learning(env, episodes=20_000, alpha=0.1, gamma=0.9, epsilon=0.5, seed=0)
    assert Q.max() > 20  # q_*(A, .) = 10 + 0.9 * v_*(A') = 24.4


@pytest.mark.parametrize("learner", [sarsa, q_learning, expected_sarsa])
def test_control_is_reproducible_for_a_seed(learner):
    env = gym.make("CliffWalking-v1")
    Q1, h1 = learner(env, episodes=20, seed=11)
    Q2, h2 = learner(env, episodes=20, seed=11)
    np.testing.assert_array_equal(Q1, Q2)
    np.testing.assert_array_equal(h1["episode_return"], h2["episode_return"])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: q_learning(gym.make("CartPole-v1"), episodes=1), "Discrete observation_space"),
        (lambda: sarsa(gym.make("CliffWalking-v1"), episodes=1, alpha=0.0), "alpha"),
        (lambda: sarsa(gym.make("CliffWalking-v1"), episodes=1, epsilon=1.5), "epsilon"),
        (lambda: q_learning(gym.make("CliffWalking-v1"), episodes=0), "episodes"),
        (lambda: q_learning(gym.make("CliffWalking-v1"), episodes=1, gamma=-0.5), "gamma"),
        (
            lambda: td0_prediction(make("random_walk_5"), np.ones((7, 4)), episodes=1),
            "probability distributions",
        ),
        (
            lambda: n_step_td_prediction(make("random_walk_5"), left_right(), n=0, episodes=1),
            "n must be",
        ),
        (
            lambda: td_lambda_prediction(make("random_walk_5"), left_right(), lam=2.0, episodes=1),
            "lam",
        ),
        (
            lambda: td0_prediction(make("random_walk_5"), left_right(), episodes=5, average_from=5),
            "average_from",
        ),
        (
            lambda: off_policy_mc_prediction(
                make("random_walk_5"), left_right(0.5), left_right(1.0), episodes=1
            ),
            "coverage",
        ),
    ],
)
def test_bad_input_raises_a_value_error_that_says_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------ hand cases: discounting, truncation, expectations


def always_right():
    return left_right(1.0)


def test_n_step_td_by_hand_with_discount_and_a_truncated_episode():
    """Start C (state 3), always right, cut after 2 steps at E (state 5): n = 2, alpha = 1, gamma =
    0.5, V0 = 1.

    V(C) <- 0 + 0.5 * 0 + 0.25 * V(E) = 0.25; V(D) <- 0 + 0.5 * V(E) = 0.5 (the cut bootstraps from
    E).
    """
    env = make("random_walk_5", max_episode_steps=2)
    V, _ = n_step_td_prediction(
        env, always_right(), n=2, alpha=1.0, gamma=0.5, episodes=1, initial_value=1.0
    )
    assert V[3] == pytest.approx(0.25) and V[4] == pytest.approx(0.5) and V[5] == 1.0


def test_td_lambda_bootstraps_at_a_time_limit():
    """Same episode, TD(0) as TD(lambda = 0): V(C) <- 0.5 * V(D) = 0.5; at the cut V(D) <- 0.5 *
    V(E) = 0.5."""
    env = make("random_walk_5", max_episode_steps=2)
    V, _ = td_lambda_prediction(
        env, always_right(), lam=0.0, alpha=1.0, gamma=0.5, episodes=1, initial_value=1.0
    )
    assert V[3] == pytest.approx(0.5) and V[4] == pytest.approx(0.5)


def test_dyna_q_bootstraps_at_a_time_limit():
    from rlkit.tabular import dyna_q

    env = make("sutton_barto_5x5", max_episode_steps=1)
    Q, _ = dyna_q(env, n_planning=5, episodes=3000, alpha=0.1, gamma=0.9, epsilon=0.5, seed=0)
    # only bootstrapping lets a one-step episode be worth more than one reward (10)
    assert Q.max() > 20


def test_expected_sarsa_uses_the_epsilon_greedy_expectation():
    from rlkit.tabular.td import epsilon_greedy_probabilities

    np.testing.assert_allclose(
        epsilon_greedy_probabilities(np.array([1.0, 3.0, 3.0, 0.0]), 0.2), [0.05, 0.45, 0.45, 0.05]
    )
    env = gym.make("CliffWalking-v1")
    greedy_expected, _ = expected_sarsa(env, episodes=30, epsilon=0.0, seed=2)
    greedy_q, _ = q_learning(env, episodes=30, epsilon=0.0, seed=2)
    # epsilon = 0: the expectation is the max. A tolerance, not equality: the expectation weighs
    # tied best actions by 1/k and sums them, which rounds (3 x q/3 is not always q), while max does
    # not.
    np.testing.assert_allclose(greedy_expected, greedy_q, rtol=0, atol=1e-12)
    exploring_expected, _ = expected_sarsa(env, episodes=30, epsilon=0.3, seed=2)
    exploring_q, _ = q_learning(env, episodes=30, epsilon=0.3, seed=2)
    assert not np.array_equal(exploring_expected, exploring_q)


def test_ordinary_importance_sampling_scales_returns_and_weighted_does_not():
    """After one episode that ends on the right (every return is 1), weighted IS estimates are
    exactly 1; ordinary IS estimates are W * 1 with W a product of ratios 0.8/0.5 and 0.2/0.5, so
    not all 1."""
    env = make("random_walk_5")
    target, behaviour = left_right(0.8), left_right(0.5)
    seed = next(
        s
        for s in range(100)
        if off_policy_mc_prediction(env, target, behaviour, episodes=1, seed=s)[1][
            "episode_return"
        ][0]
        == 1
        and off_policy_mc_prediction(env, target, behaviour, episodes=1, seed=s)[1][
            "episode_length"
        ][0]
        > 3
    )
    weighted, _ = off_policy_mc_prediction(
        env, target, behaviour, episodes=1, weighted=True, seed=seed
    )
    ordinary, _ = off_policy_mc_prediction(
        env, target, behaviour, episodes=1, weighted=False, seed=seed
    )
    visited = weighted != 0
    np.testing.assert_array_equal(weighted[visited], 1.0)
    assert not np.allclose(ordinary[visited], 1.0)
