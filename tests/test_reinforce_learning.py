"""REINFORCE with a baseline learns CartPole-v1 with its tested preset: each seed is trained once."""

import pytest

from rlkit.reinforce import ReinforceConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = pytest.mark.learning


@pytest.fixture(scope="module")
def greedy_scores():
    scores = {}
    for seed in SEEDS:
        result = train(ReinforceConfig(env_id="CartPole-v1", seed=seed))
        assert result.config.baseline and result.config.total_steps <= 200_000
        assert (
            result.history[-1]["step"] < 200_000 + 8 * 500
        )  # the last update may finish its episodes
        scores[seed] = evaluate(result, episodes=100)
    return scores


def test_reinforce_with_a_baseline_reaches_400_on_at_least_two_of_three_seeds(greedy_scores):
    print(f"greedy mean return over 100 episodes, by seed: {greedy_scores}")
    assert sum(score >= 400 for score in greedy_scores.values()) >= 2
