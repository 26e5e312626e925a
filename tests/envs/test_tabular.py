"""TabularMDP: gymnasium's toy-text tables and rlkit's gridworlds as arrays."""

import gymnasium as gym
import numpy as np
import pytest

import rlkit  # noqa: F401
from rlkit.envs import TabularMDP

TOY_TEXT = ["FrozenLake-v1", "CliffWalking-v1", "Taxi-v4"]


@pytest.mark.parametrize("env_id", TOY_TEXT + ["rlkit/GridWorld-v0"])
def test_models_are_proper_distributions_with_absorbing_terminals(env_id):
    mdp = TabularMDP.from_gymnasium(gym.make(env_id))
    np.testing.assert_allclose(mdp.P.sum(axis=2), 1.0)
    assert mdp.terminal.any()
    for state in np.flatnonzero(mdp.terminal):
        assert np.all(mdp.P[state, :, state] == 1.0) and np.all(mdp.R[state] == 0.0)


@pytest.mark.parametrize("env_id", TOY_TEXT)
def test_expected_rewards_and_probabilities_match_the_toy_text_table(env_id):
    env = gym.make(env_id)
    mdp = TabularMDP.from_gymnasium(env)
    table = env.unwrapped.P
    for state in np.flatnonzero(~mdp.terminal)[:60]:
        for action in range(mdp.n_actions):
            transitions = table[state][action]
            assert mdp.R[state, action] == pytest.approx(sum(p * r for p, _, r, _ in transitions))
            for probability, next_state, _, _ in transitions:
                assert mdp.P[state, action, next_state] >= probability - 1e-12


def test_frozen_lake_terminals_are_the_holes_and_the_goal():
    mdp = TabularMDP.from_gymnasium(gym.make("FrozenLake-v1"))
    desc = gym.make("FrozenLake-v1").unwrapped.desc.astype(str).ravel()
    np.testing.assert_array_equal(mdp.terminal, np.isin(desc, ["H", "G"]))
    assert mdp.shape == (4, 4)


def test_cliff_walking_model_agrees_with_step():
    env = gym.make("CliffWalking-v1").unwrapped
    mdp = TabularMDP.from_gymnasium(env)
    for state in np.flatnonzero(~mdp.terminal):
        for action in range(4):
            env.reset()
            env.s = int(state)
            next_state, reward, terminated, _, _ = env.step(action)
            assert mdp.P[state, action, next_state] == 1.0 and mdp.R[state, action] == reward
            assert terminated == mdp.terminal[next_state]


def test_a_gridworld_is_the_same_model_either_way():
    env = gym.make("rlkit/GridWorld-v0", layout="sutton_barto_4x4")
    P, R, terminal = env.unwrapped.model()
    mdp = TabularMDP.from_gymnasium(env)
    np.testing.assert_array_equal(mdp.P, P)
    np.testing.assert_array_equal(mdp.R, R)
    assert mdp.shape == (4, 4)


def test_bad_models_and_environments_raise_clear_errors():
    with pytest.raises(ValueError, match="Discrete observation_space"):
        TabularMDP.from_gymnasium(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="P must have shape"):
        TabularMDP(np.ones((2, 2, 3)) / 3, np.zeros((2, 2)), np.zeros(2, dtype=bool))
    with pytest.raises(ValueError, match="probability distribution"):
        TabularMDP(np.ones((2, 2, 2)), np.zeros((2, 2)), np.zeros(2, dtype=bool))
    with pytest.raises(ValueError, match="terminal"):
        TabularMDP(np.ones((2, 2, 2)) / 2, np.zeros((2, 2)), np.zeros(2))
    table = {
        0: {0: [(1.0, 1, 0.0, True)]},
        1: {0: [(1.0, 1, 0.0, False)]},
        2: {0: [(1.0, 1, 0.0, False)]},
    }
    with pytest.raises(ValueError, match="entered both with and without termination"):
        TabularMDP._from_toy_text(table, 3, 1, None, np.array([0.0, 0.0, 1.0]))
