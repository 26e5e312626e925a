"""DQN learns CartPole-v1 with its tested preset (rl-baselines3-zoo's): each seed is trained
once."""

import pytest

from rlkit.dqn import DQNConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = pytest.mark.learning


def greedy_score(run_cache, seed):
    """The greedy mean return over 100 episodes of seed `seed`, trained once per test run."""

    def train_and_evaluate():
        result = train(DQNConfig.for_env("CartPole-v1", seed=seed))
        assert result.config.total_steps <= 100_000
        return evaluate(result, episodes=100)

    return run_cache.get(f"dqn-cartpole-seed{seed}", train_and_evaluate)


@pytest.mark.parametrize("seed", SEEDS)
def test_dqn_trains_each_seed_within_100k_steps(run_cache, seed):
    print(f"seed {seed}: greedy mean return over 100 episodes {greedy_score(run_cache, seed)}")


def test_dqn_solves_cartpole_on_at_least_two_of_three_seeds(run_cache):
    greedy_scores = {seed: greedy_score(run_cache, seed) for seed in SEEDS}
    print(f"greedy mean return over 100 episodes, by seed: {greedy_scores}")
    assert sum(score >= 475 for score in greedy_scores.values()) >= 2
