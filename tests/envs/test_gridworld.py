"""The gridworld family: a proper gymnasium env whose model reproduces Sutton & Barto's tables."""

import warnings
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlkit  # noqa: F401  (registers rlkit/GridWorld-v0)
from rlkit.envs import LAYOUTS, GridWorld, Layout
from rlkit.tabular import exact_policy_values, uniform_random_policy

# Sutton & Barto (2018), Figure 4.1, k = infinity: the random policy on the 4x4 gridworld.
SUTTON_BARTO_4X4_RANDOM = np.array(
    [[0, -14, -20, -22], [-14, -18, -20, -20], [-20, -20, -18, -14], [-22, -20, -14, 0]]
)
# Sutton & Barto (2018), Figure 3.2 (right): the random policy on the 5x5 gridworld, gamma = 0.9.
SUTTON_BARTO_5X5_RANDOM = np.array(
    [
        [3.3, 8.8, 4.4, 5.3, 1.5],
        [1.5, 3.0, 2.3, 1.9, 0.5],
        [0.1, 0.7, 0.7, 0.4, -0.4],
        [-1.0, -0.4, -0.4, -0.6, -1.2],
        [-1.9, -1.3, -1.2, -1.4, -2.0],
    ]
)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_passes_gymnasiums_env_checker_without_a_warning(layout):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker reports problems as warnings
        for render_mode in (None, "rgb_array", "ansi"):
            check_env(
                gym.make("rlkit/GridWorld-v0", layout=layout, render_mode=render_mode).unwrapped
            )


def test_registered_env_truncates_at_its_time_limit_without_terminating():
    # a continuing task: never terminates
    env = gym.make("rlkit/GridWorld-v0", layout="sutton_barto_5x5")
    env.reset(seed=0)
    for step in range(100):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not terminated
    assert truncated and step == 99


def random_policy_values(layout):
    env = GridWorld(layout)
    P, R, terminal = env.model()
    return exact_policy_values(
        P, R, uniform_random_policy(env.n_states, 4), LAYOUTS[layout].gamma, terminal
    )


def test_the_4x4_random_policy_values_equal_sutton_and_barto_figure_4_1():
    np.testing.assert_allclose(
        random_policy_values("sutton_barto_4x4").reshape(4, 4), SUTTON_BARTO_4X4_RANDOM, atol=1e-9
    )


def test_the_5x5_random_policy_values_equal_sutton_and_barto_figure_3_2():
    np.testing.assert_allclose(
        random_policy_values("sutton_barto_5x5").reshape(5, 5), SUTTON_BARTO_5X5_RANDOM, atol=0.05
    )


def test_the_dyna_maze_shortest_path_is_14_steps_as_in_sutton_and_barto_example_8_1():
    env = GridWorld("dyna_maze")
    P, _, terminal = env.model()
    start, goal = int(env.start_states[0]), int(np.flatnonzero(env.grid.ravel() == "G")[0])
    distance = {start: 0}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        for next_state in np.flatnonzero(P[state].sum(axis=0)):
            if int(next_state) not in distance:
                distance[int(next_state)] = distance[state] + 1
                frontier.append(int(next_state))
    assert distance[goal] == 14


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_tabulated_model_agrees_with_step(layout):
    env = GridWorld(layout)
    P, R, terminal = env.model()
    for state in np.flatnonzero(~terminal):
        for action in range(4):
            env.reset(options={"start_state": int(state)})
            next_state, reward, terminated, _, _ = env.step(action)
            assert P[state, action, next_state] == 1.0
            assert R[state, action] == reward
            assert terminated == bool(env.terminal[next_state])


def test_chapter1_rewards_goal_and_trap_and_bumps_cost_nothing():
    env = GridWorld("chapter1")
    env.reset(options={"start_state": 7 - 4})  # (0, 3), above the trap at (1, 3)
    assert env.step(2)[1:3] == (-1.0, True)
    env.reset(options={"start_state": 10})  # (2, 2), left of the goal at (2, 3)
    assert env.step(1)[1:3] == (1.0, True)
    env.reset(options={"start_state": 0})
    assert env.step(0)[:3] == (0, 0.0, False)  # off the grid: stay, no cost


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="layout"):
        GridWorld("no_such_layout")
    with pytest.raises(ValueError, match="unknown cell characters"):
        Layout(rows=("S.?",))
    with pytest.raises(ValueError, match="rows"):
        Layout(rows=("S..", "."))
    with pytest.raises(ValueError, match="jumps"):
        Layout(rows=("A..",), jumps={"A": ("a", 1.0)})
    with pytest.raises(ValueError, match="gamma"):
        Layout(rows=("S.G",), gamma=1.5)
    env = GridWorld("chapter1")
    with pytest.raises(ValueError, match="start_state"):
        env.reset(options={"start_state": 5})  # a wall
    env.reset()
    with pytest.raises(ValueError, match="action"):
        env.step(4)
    with pytest.raises(ValueError, match="render_mode"):
        GridWorld("chapter1", render_mode="human")


def test_rgb_render_draws_the_agent():
    env = GridWorld("chapter1", render_mode="rgb_array")
    env.reset(options={"start_state": 0})
    image = env.render()
    assert image.shape == (4 * 32, 4 * 32, 3) and image.dtype == np.uint8
    assert tuple(image[16, 16]) == (40, 90, 200) and tuple(image[16, 48]) != (40, 90, 200)
    ansi = GridWorld("chapter1", render_mode="ansi")
    ansi.reset(options={"start_state": 0})
    assert ansi.render().splitlines()[0] == "@..."
