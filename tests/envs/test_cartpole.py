"""rlkit's batched CartPole against Gymnasium's CartPole-v1: same transitions, same ends, same
autoreset layout."""

import gymnasium as gym
import numpy as np
import pytest

from rlkit.envs.cartpole import (
    THETA_THRESHOLD,
    X_THRESHOLD,
    BatchedCartPole,
    cartpole_dynamics,
    cartpole_terminated,
)


def gymnasium_step(env, state, action):
    """Gymnasium's own transition from ``state`` (its float64 state is what it steps from)."""
    env.state, env.steps_beyond_terminated = state.copy(), None
    _, reward, terminated, _, _ = env.step(int(action))
    return env.state.copy(), reward, terminated


def test_10k_random_transitions_match_gymnasium_in_float64():
    rng = np.random.default_rng(0)
    low, high = (
        [-X_THRESHOLD, -3.0, -THETA_THRESHOLD, -3.5],
        [X_THRESHOLD, 3.0, THETA_THRESHOLD, 3.5],
    )
    states, actions = rng.uniform(low, high, size=(10_000, 4)), rng.integers(0, 2, size=10_000)
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    reference = [gymnasium_step(env, s, a) for s, a in zip(states, actions)]
    ours = cartpole_dynamics(states, actions)
    np.testing.assert_allclose(ours, np.array([r[0] for r in reference]), rtol=0, atol=1e-6)
    terminated = cartpole_terminated(ours)
    assert np.array_equal(terminated, [r[2] for r in reference])
    assert 0.02 < terminated.mean() < 0.5  # both outcomes were exercised
    # the step that ends an episode is rewarded too, as ours
    assert all(r[1] == 1.0 for r in reference)


def test_episodes_played_from_the_same_start_match_gymnasium_step_by_step():
    """Start both from Gymnasium's reset state and play the same actions until the pole falls."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    ours = BatchedCartPole(1)
    ours.reset(seed=0)
    ours.state[0] = env.unwrapped.state
    rng = np.random.default_rng(1)
    for _ in range(500):
        action = int(rng.integers(0, 2))
        obs, reward, terminated, truncated, _ = env.step(action)
        our_obs, our_reward, our_terminated, our_truncated, info = ours.step(np.array([action]))
        assert (
            our_reward[0] == reward
            and our_terminated[0] == terminated
            and our_truncated[0] == truncated
        )
        if terminated or truncated:
            # bit-identical float32 observation
            np.testing.assert_array_equal(info["final_obs"][0], obs)
            break
        np.testing.assert_array_equal(our_obs[0], obs)
    else:
        pytest.fail("the random policy never dropped the pole in 500 steps")


def test_same_step_autoreset_layout_and_truncation_at_500():
    envs = BatchedCartPole(3)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    obs, _ = envs.reset(seed=0)
    # a hand-written balancing controller: push toward where the pole is falling
    for step in range(1, 501):
        actions = (obs[:, 2] + 0.5 * obs[:, 3] + 0.01 * obs[:, 0] + 0.1 * obs[:, 1] > 0).astype(
            np.int64
        )
        obs, rewards, terminated, truncated, info = envs.step(actions)
        if step < 500:
            assert not truncated.any() and info == {}
    assert truncated.all() and not terminated.any()
    assert info["_final_obs"].all() and np.abs(np.stack(info["final_obs"])).max() > 0
    # the new episodes' first observations
    assert np.abs(obs).max() <= 0.05 and (envs.elapsed_steps == 0).all()


def test_reset_is_seeded_and_observations_are_float32():
    first, _ = BatchedCartPole(4).reset(seed=7)
    again, _ = BatchedCartPole(4).reset(seed=7)
    other, _ = BatchedCartPole(4).reset(seed=8)
    assert first.dtype == np.float32 and first.shape == (4, 4)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert np.abs(first).max() <= 0.05


@pytest.mark.parametrize(
    "actions", [np.array([0, 2]), np.array([0]), np.array([[0, 1]]), np.array([-1, 0])]
)
def test_bad_actions_raise(actions):
    envs = BatchedCartPole(2)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="actions must be 2 values in"):
        envs.step(actions)


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(num_envs=0), "num_envs"), (dict(num_envs=2, max_episode_steps=0), "max_episode_steps")],
)
def test_bad_construction_raises(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BatchedCartPole(**kwargs)
