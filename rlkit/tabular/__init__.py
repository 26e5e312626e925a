"""Tabular methods: exact evaluation (Chapter 1), planning (Chapter 2) and model-free learning
(Chapter 3)."""

from rlkit.envs.tabular import TabularMDP
from rlkit.tabular.bandits import BanditResult, run_bandit
from rlkit.tabular.evaluation import (
    exact_policy_values,
    monte_carlo_policy_values,
    uniform_random_policy,
)
from rlkit.tabular.planning import (
    dyna_q,
    greedy_policy,
    policy_evaluation,
    policy_iteration,
    q_from_v,
    value_iteration,
)
from rlkit.tabular.td import (
    epsilon_greedy,
    expected_sarsa,
    greedy_path,
    mc_control,
    mc_prediction,
    n_step_td_prediction,
    off_policy_mc_prediction,
    q_learning,
    sarsa,
    td0_prediction,
    td_lambda_prediction,
)

__all__ = [
    "TabularMDP",
    "BanditResult",
    "run_bandit",
    "exact_policy_values",
    "monte_carlo_policy_values",
    "uniform_random_policy",
    "dyna_q",
    "greedy_policy",
    "policy_evaluation",
    "policy_iteration",
    "q_from_v",
    "value_iteration",
    "epsilon_greedy",
    "expected_sarsa",
    "greedy_path",
    "mc_control",
    "mc_prediction",
    "n_step_td_prediction",
    "off_policy_mc_prediction",
    "q_learning",
    "sarsa",
    "td0_prediction",
    "td_lambda_prediction",
]
