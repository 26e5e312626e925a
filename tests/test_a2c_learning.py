"""A2C learns CartPole-v1 with its tested preset (rl-baselines3-zoo's settings): each seed is trained once."""

import pytest

from rlkit.a2c import A2CConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = pytest.mark.learning


@pytest.fixture(scope="module")
def greedy_scores():
    scores = {}
    for seed in SEEDS:
        result = train(A2CConfig(env_id="CartPole-v1", seed=seed))
        assert result.history[-1]["step"] == result.config.total_steps == 500_000
        scores[seed] = evaluate(result, episodes=100)
    return scores


def test_a2c_reaches_475_within_500k_steps_on_at_least_two_of_three_seeds(greedy_scores):
    print(f"greedy mean return over 100 episodes, by seed: {greedy_scores}")
    assert sum(score >= 475 for score in greedy_scores.values()) >= 2
