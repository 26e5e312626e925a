"""PPO learns CartPole-v1 and Pendulum-v1 with its tested presets: each seed is trained once."""

import numpy as np
import pytest

from rlkit.ppo import PPOConfig, evaluate, train

SEEDS = [0, 1, 2]
ENVS = ["CartPole-v1", "Pendulum-v1"]
pytestmark = pytest.mark.learning


def trained_seed(run_cache, env_id, seed):
    """Seed `seed` on `env_id`, trained once per test run: its greedy mean return over 100 episodes
    and its mean training return over the first five updates."""

    def train_and_evaluate():
        result = train(PPOConfig.for_env(env_id, seed=seed))
        config = result.config
        assert (
            config.total_steps - config.batch_size
            < result.history[-1]["step"]
            <= config.total_steps
        )
        return {
            "greedy": evaluate(result, episodes=100),
            "first": float(np.nanmean(result.column("episode_return")[:5])),
        }

    return run_cache.get(f"ppo-{env_id}-seed{seed}", train_and_evaluate)


def scores_and_first_returns(run_cache, env_id):
    runs = {seed: trained_seed(run_cache, env_id, seed) for seed in SEEDS}
    scores = {seed: run["greedy"] for seed, run in runs.items()}
    first_returns = {seed: run["first"] for seed, run in runs.items()}
    print(
        f"{env_id}: greedy mean return over 100 episodes by seed {scores}; "
        f"training return over the first updates {first_returns}"
    )
    return scores, first_returns


@pytest.mark.parametrize("env_id", ENVS)
@pytest.mark.parametrize("seed", SEEDS)
def test_ppo_trains_each_seed_for_its_total_steps(run_cache, env_id, seed):
    print(f"{env_id}, seed {seed}: {trained_seed(run_cache, env_id, seed)}")


def test_ppo_reaches_475_on_cartpole_within_100k_steps_on_every_seed(run_cache):
    scores, _ = scores_and_first_returns(run_cache, "CartPole-v1")
    assert PPOConfig.for_env("CartPole-v1").total_steps == 100_000
    assert all(score >= 475 for score in scores.values()), scores


def test_ppo_improves_pendulum_from_about_minus_1200_to_better_than_minus_400_on_two_of_three_seeds(
    run_cache,
):
    scores, first_returns = scores_and_first_returns(run_cache, "Pendulum-v1")
    assert PPOConfig.for_env("Pendulum-v1").total_steps == 200_000
    # it starts where a random policy is
    assert all(first < -900 for first in first_returns.values()), first_returns
    assert sum(score > -400 for score in scores.values()) >= 2, scores
