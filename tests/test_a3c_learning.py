"""A3C learns CartPole-v1 with its preset (two workers): three runs, seeds 0-2 (runs are not
reproducible)."""

import pytest

from rlkit.a3c import A3CConfig, evaluate, train

SEEDS = [0, 1, 2]
pytestmark = [pytest.mark.learning, pytest.mark.alone]  # two workers need both cores


@pytest.fixture(scope="module")
def greedy_scores():
    scores = {}
    for seed in SEEDS:
        result = train(A3CConfig.for_env("CartPole-v1", seed=seed, timeout=900))
        assert result.config.total_steps == 500_000 and result.config.num_workers == 2
        assert result.history[-1]["step"] <= 500_000 + 2 * result.config.num_steps
        scores[seed] = evaluate(result, episodes=100)
    return scores


def test_a3c_reaches_400_within_500k_steps_on_at_least_two_of_three_runs(greedy_scores):
    print(f"greedy mean return over 100 episodes, by run: {greedy_scores}")
    assert sum(score >= 400 for score in greedy_scores.values()) >= 2
