"""Tabular methods: exact evaluation (Chapter 1), planning (Chapter 2) and model-free learning (Chapter 3)."""

from rlkit.tabular.evaluation import exact_policy_values, monte_carlo_policy_values, uniform_random_policy

__all__ = ["exact_policy_values", "monte_carlo_policy_values", "uniform_random_policy"]
