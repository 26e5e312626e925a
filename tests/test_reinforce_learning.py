"""REINFORCE with a baseline learns CartPole-v1 with its tested preset: each seed is trained
once."""

import pytest

from rlkit.reinforce import ReinforceConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = pytest.mark.learning


def greedy_score(run_cache, seed):
    """The greedy mean return over 100 episodes of seed `seed`, trained once per test run."""

    def train_and_evaluate():
        result = train(ReinforceConfig.for_env("CartPole-v1", seed=seed))
        assert result.config.baseline and result.config.total_steps <= 200_000
        # the last update may finish its episodes
        assert result.history[-1]["step"] < 200_000 + 8 * 500
        return evaluate(result, episodes=100)

    return run_cache.get(f"reinforce-cartpole-seed{seed}", train_and_evaluate)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_trains_each_seed_within_200k_steps(run_cache, seed):
    print(f"seed {seed}: greedy mean return over 100 episodes {greedy_score(run_cache, seed)}")


def test_reinforce_with_a_baseline_reaches_400_on_at_least_two_of_three_seeds(run_cache):
    greedy_scores = {seed: greedy_score(run_cache, seed) for seed in SEEDS}
    print(f"greedy mean return over 100 episodes, by seed: {greedy_scores}")
    assert sum(score >= 400 for score in greedy_scores.values()) >= 2
