"""DQN's pieces against hand computations; its config against bad input. (Learning:
tests/test_dqn_learning.py.)"""

import numpy as np
import pytest
import torch

from rlkit.dqn import DQNConfig, ReplayBuffer, epsilon_at, td_targets, train


class FixedQ(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table)

    def forward(self, obs):
        return self.table[obs[:, 0].long()]


def test_td_targets_single_and_double_by_hand():
    online, target = FixedQ([[0.0, 0.0], [5.0, 1.0]]), FixedQ([[0.0, 0.0], [2.0, 3.0]])
    next_obs = torch.tensor([[1.0], [1.0]])
    rewards, terminated = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])
    single = td_targets(target, online, rewards, next_obs, terminated, 0.5, double=False)
    double = td_targets(target, online, rewards, next_obs, terminated, 0.5, double=True)
    # max of the target net
    torch.testing.assert_close(single, torch.tensor([1.0 + 0.5 * 3.0, 1.0]))
    # online picks a=0, target values it
    torch.testing.assert_close(double, torch.tensor([1.0 + 0.5 * 2.0, 1.0]))


def test_replay_buffer_wraps_around():
    buffer = ReplayBuffer(3, 1)
    for i in range(5):
        buffer.add([i], i % 2, float(i), [i + 1], i == 4)
    assert buffer.size == 3 and sorted(buffer.rewards.tolist()) == [2.0, 3.0, 4.0]
    obs, _, rewards, next_obs, _ = buffer.sample(10, torch.Generator().manual_seed(0))
    torch.testing.assert_close(next_obs - obs, torch.ones(10, 1))
    torch.testing.assert_close(rewards, obs[:, 0])


def test_epsilon_decays_linearly_then_stays():
    config = DQNConfig.for_env(
        "CartPole-v1",
        total_steps=1000,
        exploration_fraction=0.5,
        start_epsilon=1.0,
        end_epsilon=0.1,
    )
    assert epsilon_at(0, config) == 1.0
    assert epsilon_at(250, config) == pytest.approx(0.55)
    assert epsilon_at(900, config) == pytest.approx(0.1)


def test_the_cartpole_preset_fills_only_what_the_caller_leaves_out():
    config = DQNConfig.for_env("CartPole-v1", learning_rate=1e-4)
    assert (
        config.learning_rate == 1e-4
        and config.train_frequency == 256
        and config.hidden_sizes == (256, 256)
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": -1e-3}, "learning_rate"),
        ({"buffer_size": 32, "batch_size": 64}, "buffer_size"),
        ({"total_steps": 0}, "total_steps"),
        ({"gamma": 1.5}, "gamma"),
        ({"end_epsilon": -0.1}, "end_epsilon"),
    ],
)
def test_bad_config_raises_a_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DQNConfig(**kwargs)


def test_a_continuous_action_environment_is_refused():
    with pytest.raises(ValueError, match="env_id must be an environment with Discrete actions"):
        train(DQNConfig.for_env("Pendulum-v1", total_steps=10))


def test_same_seed_same_numbers():
    config = dict(
        env_id="CartPole-v1",
        total_steps=600,
        learning_starts=100,
        train_frequency=50,
        gradient_steps=5,
        buffer_size=1000,
        hidden_sizes=(16,),
        seed=3,
    )
    first, second = train(DQNConfig.for_env(**config)), train(DQNConfig.for_env(**config))
    for a, b in zip(first.agent.parameters(), second.agent.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert first.history == second.history


def test_a_truncated_step_is_stored_with_its_true_final_observation_and_not_as_terminal(
    monkeypatch,
):
    """Gymnasium 1.x: the time limit truncates; DQN must still bootstrap from the state it stopped
    in."""
    import gymnasium as gym
    from gymnasium.envs.classic_control import CartPoleEnv

    import rlkit.dqn as dqn

    if "rlkit-test/CartPole5-v0" not in gym.registry:
        gym.register("rlkit-test/CartPole5-v0", entry_point=CartPoleEnv, max_episode_steps=5)
    stored = []
    original_add = dqn.ReplayBuffer.add
    monkeypatch.setattr(
        dqn.ReplayBuffer,
        "add",
        lambda self, *transition: stored.append(transition) or original_add(self, *transition),
    )
    train(
        DQNConfig.for_env(
            "rlkit-test/CartPole5-v0", total_steps=20, learning_starts=100, buffer_size=64, seed=1
        )
    )
    assert len(stored) == 20
    for index, (_obs, action, _reward, next_obs, terminated) in enumerate(stored):
        assert not terminated  # five steps never topple CartPole from its start
        # the truncated step: its next_obs is the final observation, not a reset one
        if index % 5 == 4:
            replay = gym.make("CartPole-v1")
            replay.reset()
            replay.unwrapped.state = stored[index][0].copy()
            expected, *_ = replay.step(int(action))
            np.testing.assert_allclose(next_obs, expected, rtol=1e-6)
            if index + 1 < len(stored):
                # the next episode starts elsewhere
                assert not np.allclose(stored[index + 1][0], next_obs)
        elif index + 1 < len(stored):
            np.testing.assert_array_equal(stored[index + 1][0], next_obs)
