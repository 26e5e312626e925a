"""Exact policy evaluation against iterative sweeps; Monte Carlo estimates against the exact
values."""

import gymnasium as gym
import numpy as np
import pytest

import rlkit  # noqa: F401
from rlkit.envs import GridWorld
from rlkit.tabular import exact_policy_values, monte_carlo_policy_values, uniform_random_policy


def iterative_policy_evaluation(P, R, policy, gamma, terminal, sweeps=2000):
    """A hand-written loop over states: v(s) <- sum_a pi(a|s) [R(s,a) + gamma sum_s' P(s'|s,a)
    v(s')]."""
    values = np.zeros(R.shape[0])
    for _ in range(sweeps):
        new = np.zeros_like(values)
        for state in range(R.shape[0]):
            if terminal[state]:
                continue
            for action in range(R.shape[1]):
                new[state] += policy[state, action] * (
                    R[state, action] + gamma * P[state, action] @ values
                )
        values = new
    return values


def test_exact_solve_equals_iterative_sweeps_on_the_chapter1_gridworld():
    P, R, terminal = GridWorld("chapter1").model()
    policy = np.random.default_rng(0).dirichlet(np.ones(4), size=16)
    exact = exact_policy_values(P, R, policy, 0.9, terminal)
    np.testing.assert_allclose(
        exact, iterative_policy_evaluation(P, R, policy, 0.9, terminal), atol=1e-10
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_monte_carlo_estimates_agree_with_the_exact_values(seed):
    env = gym.make("rlkit/GridWorld-v0", layout="chapter1")
    policy = uniform_random_policy(16, 4)
    P, R, terminal = env.unwrapped.model()
    exact = exact_policy_values(P, R, policy, 0.9, terminal)
    estimates, returns = monte_carlo_policy_values(
        env, policy, gamma=0.9, episodes_per_state=300, seed=seed
    )
    for state, sampled in returns.items():
        standard_error = sampled.std(ddof=1) / np.sqrt(sampled.size)
        # 1e-3: truncation at 100 steps
        assert abs(estimates[state] - exact[state]) < 4 * standard_error + 1e-3, state


def test_monte_carlo_is_reproducible_for_a_seed():
    env = gym.make("rlkit/GridWorld-v0")
    first = monte_carlo_policy_values(
        env, uniform_random_policy(16, 4), 0.9, episodes_per_state=5, seed=3
    )[0]
    second = monte_carlo_policy_values(
        env, uniform_random_policy(16, 4), 0.9, episodes_per_state=5, seed=3
    )[0]
    np.testing.assert_array_equal(first, second)


def test_bad_input_raises_clear_errors():
    P, R, terminal = GridWorld("sutton_barto_4x4").model()
    # never reaches a terminal from the bottom row
    always_up = np.tile([1.0, 0.0, 0.0, 0.0], (16, 1))
    with pytest.raises(ValueError, match="singular"):
        exact_policy_values(P, R, always_up, 1.0, terminal)
    # A closed class of 3 states that hop among themselves with probability 1/3: rounding leaves
    # I - P_pi nearly (not exactly) singular, and a bare solve returns values of about 1e16.
    closed = np.zeros((4, 1, 4))
    closed[:3, 0, :3] = 1 / 3
    closed[3, 0, 3] = 1.0
    with pytest.raises(ValueError, match=r"from states \[0, 1, 2\] it never does"):
        exact_policy_values(closed, -np.ones((4, 1)), np.ones((4, 1)), 1.0, np.arange(4) == 3)
    with pytest.raises(ValueError, match="policy"):
        exact_policy_values(P, R, np.ones((16, 3)) / 3, 0.9, terminal)
    with pytest.raises(ValueError, match="gamma"):
        exact_policy_values(P, R, uniform_random_policy(16, 4), 1.1, terminal)
    with pytest.raises(ValueError, match="terminal must be a boolean array"):
        exact_policy_values(P, R, uniform_random_policy(16, 4), 0.9, terminal.astype(int))
    with pytest.raises(ValueError, match="episodes_per_state"):
        monte_carlo_policy_values(
            gym.make("rlkit/GridWorld-v0"), uniform_random_policy(16, 4), 0.9, episodes_per_state=0
        )
