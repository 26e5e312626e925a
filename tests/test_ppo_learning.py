"""PPO learns CartPole-v1 and Pendulum-v1 with its tested presets: each seed is trained once."""

import numpy as np
import pytest

from rlkit.ppo import PPOConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = pytest.mark.learning


def train_and_evaluate(env_id):
    scores, first_returns = {}, {}
    for seed in SEEDS:
        result = train(PPOConfig(env_id=env_id, seed=seed))
        config = result.config
        assert (
            config.total_steps - config.batch_size
            < result.history[-1]["step"]
            <= config.total_steps
        )
        scores[seed] = evaluate(result, episodes=100)
        first_returns[seed] = float(np.nanmean(result.column("episode_return")[:5]))
    print(
        f"{env_id}: greedy mean return over 100 episodes by seed {scores}; "
        f"training return over the first updates {first_returns}"
    )
    return scores, first_returns


def test_ppo_reaches_475_on_cartpole_within_100k_steps_on_every_seed():
    scores, _ = train_and_evaluate("CartPole-v1")
    assert PPOConfig(env_id="CartPole-v1").total_steps == 100_000
    assert all(score >= 475 for score in scores.values()), scores


def test_ppo_improves_pendulum_from_about_minus_1200_to_better_than_minus_400_on_two_of_three_seeds():
    scores, first_returns = train_and_evaluate("Pendulum-v1")
    assert PPOConfig(env_id="Pendulum-v1").total_steps == 200_000
    assert all(first < -900 for first in first_returns.values()), (
        first_returns
    )  # it starts where a random policy is
    assert sum(score > -400 for score in scores.values()) >= 2, scores
