"""Fixed-length rollouts: the last observation carried across updates, truncation bootstrapped,
termination not."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlkit.nets import ActorCritic
from rlkit.rollouts import RolloutCollector, make_vector_env

GAMMA = 0.9


def collector_for(num_envs=3, num_steps=7, time_limit=None, batched=False, seed=0):
    torch.manual_seed(seed)
    kwargs = None if time_limit is None else {"max_episode_steps": time_limit}
    envs = make_vector_env("CartPole-v1", num_envs, batched=batched, env_kwargs=kwargs)
    agent = ActorCritic.for_spaces(envs.single_observation_space, envs.single_action_space)
    return RolloutCollector(envs, agent, num_steps, GAMMA, seed=seed), agent


def test_shapes_and_the_observation_carried_across_collects():
    collector, agent = collector_for()
    first = collector.collect()
    assert first.obs.shape == (
        3,
        7,
        4,
    ) and first.actions.shape == first.rewards.shape == first.dones.shape == (3, 7)
    second = collector.collect()
    with torch.no_grad():
        # the bootstrap is V(next obs)
        torch.testing.assert_close(first.last_value, agent.value(second.obs[:, 0]))
    assert collector.env_steps == 42


def test_rollout_replays_in_gymnasium_with_the_stored_actions():
    """Step fresh Gymnasium envs, seeded alike, with the stored actions: same observations, rewards
    and ends."""
    collector, agent = collector_for(num_envs=2, num_steps=60, time_limit=25)
    rollout = collector.collect()
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=25)] * 2,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=0)
    for t in range(60):
        np.testing.assert_array_equal(rollout.obs[:, t].numpy(), obs)
        obs, rewards, terminated, truncated, info = envs.step(rollout.actions[:, t].numpy())
        assert np.array_equal(rollout.dones[:, t].numpy(), terminated | truncated)
        expected = rewards.astype(np.float32).copy()
        for index in np.flatnonzero(truncated & ~terminated):
            with torch.no_grad():
                expected[index] += (
                    GAMMA * agent.value(torch.as_tensor(info["final_obs"][index])).item()
                )
        np.testing.assert_allclose(rollout.rewards[:, t].numpy(), expected, rtol=1e-6)
    assert rollout.dones.sum() >= 4 and (rollout.rewards > 1).any()  # both kinds of end happened


def test_terminated_steps_are_not_bootstrapped_and_returns_are_logged():
    collector, _ = collector_for(num_envs=4, num_steps=200)
    rollout = collector.collect()  # no time limit reached in 200 steps: every end is a termination
    assert rollout.dones.sum() > 0
    assert torch.all(rollout.rewards == 1.0)
    assert len(rollout.episode_returns) == int(rollout.dones.sum()) == len(rollout.episode_lengths)
    assert rollout.episode_returns == [float(n) for n in rollout.episode_lengths]


def test_batched_cartpole_collects_the_same_layout():
    collector, _ = collector_for(num_envs=5, num_steps=100, batched=True)
    rollout = collector.collect()
    assert rollout.obs.shape == (5, 100, 4) and rollout.dones.sum() > 0 and rollout.episode_returns


def test_a_next_step_autoreset_env_is_refused():
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
    agent = ActorCritic.for_spaces(envs.single_observation_space, envs.single_action_space)
    with pytest.raises(ValueError, match="envs must be a vector env in SAME_STEP"):
        RolloutCollector(envs, agent, 5, GAMMA, seed=0)


def test_continuous_actions_are_stored_as_drawn_not_clipped():
    torch.manual_seed(0)
    envs = make_vector_env("Pendulum-v1", 2)
    agent = ActorCritic.for_spaces(envs.single_observation_space, envs.single_action_space)
    with torch.no_grad():
        agent.log_std.fill_(2.0)  # wide: many draws fall outside [-2, 2]
    rollout = RolloutCollector(envs, agent, 50, GAMMA, seed=0).collect()
    # stored unclipped (the log-probability is of this draw)
    assert rollout.actions.abs().max() > 2.0


@pytest.mark.parametrize(
    "env_id, num_envs, batched, match",
    [
        ("NoSuchEnv-v9", 2, False, "env_id must be a registered gymnasium environment"),
        ("CartPole-v1", 0, False, "num_envs must be an integer >= 1"),
        ("Acrobot-v1", 2, True, "batched_env must be False for 'Acrobot-v1'"),
    ],
)
def test_bad_vector_env_requests_raise(env_id, num_envs, batched, match):
    with pytest.raises(ValueError, match=match):
        make_vector_env(env_id, num_envs, batched=batched)
