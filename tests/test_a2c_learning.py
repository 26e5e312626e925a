"""A2C learns CartPole-v1 with its tested preset (rl-baselines3-zoo's settings): each seed is
trained once."""

import pytest

from rlkit.a2c import A2CConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = pytest.mark.learning


def greedy_score(run_cache, seed):
    """The greedy mean return over 100 episodes of seed `seed`, trained once per test run."""

    def train_and_evaluate():
        result = train(A2CConfig.for_env("CartPole-v1", seed=seed))
        assert result.history[-1]["step"] == result.config.total_steps == 500_000
        return evaluate(result, episodes=100)

    return run_cache.get(f"a2c-cartpole-seed{seed}", train_and_evaluate)


@pytest.mark.parametrize("seed", SEEDS)
def test_a2c_trains_each_seed_for_its_500k_steps(run_cache, seed):
    print(f"seed {seed}: greedy mean return over 100 episodes {greedy_score(run_cache, seed)}")


def test_a2c_reaches_475_within_500k_steps_on_at_least_two_of_three_seeds(run_cache):
    greedy_scores = {seed: greedy_score(run_cache, seed) for seed in SEEDS}
    print(f"greedy mean return over 100 episodes, by seed: {greedy_scores}")
    assert sum(score >= 475 for score in greedy_scores.values()) >= 2
