"""The k-armed bandit testbed of Sutton & Barto, Chapter 2: exploration before states (Chapter 3
opens with it).

All runs of an experiment are simulated at once, as rows of arrays: ``runs`` independent bandit
problems, each with true action values ``q*(a) ~ N(0, 1)`` and rewards ``R ~ N(q*(a), 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BanditResult:
    """Per step, averaged over runs: the reward earned and the fraction of runs that chose an
    optimal arm."""

    average_reward: np.ndarray
    optimal_action: np.ndarray


def _random_argmax(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row-wise argmax with ties broken uniformly at random."""
    is_best = values >= values.max(axis=1, keepdims=True)
    return np.argmax(is_best * rng.random(values.shape), axis=1)


def run_bandit(
    epsilon: float = 0.0,
    step_size: float | None = None,
    initial_value: float = 0.0,
    ucb_c: float | None = None,
    k: int = 10,
    steps: int = 1000,
    runs: int = 2000,
    seed: int = 0,
) -> BanditResult:
    """Run an action-value method on ``runs`` testbed problems for ``steps`` steps
    (eq-bandit-update).

    ``epsilon``: probability of a uniform random arm. ``step_size``: constant alpha, or None for
    sample averages (alpha = 1/n). ``initial_value``: Q_1, optimistic when large. ``ucb_c``: choose
    ``argmax Q + c sqrt(ln t / N)`` instead (eq-ucb); an arm never tried counts as maximising.
    """
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
    if step_size is not None and not 0 < step_size <= 1:
        raise ValueError(
            f"step_size must be in (0, 1] or None (sample averages), got {step_size!r}"
        )
    if ucb_c is not None and ucb_c <= 0:
        raise ValueError(f"ucb_c must be > 0 or None, got {ucb_c!r}")
    for name, value in (("k", k), ("steps", steps), ("runs", runs)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    rng = np.random.default_rng(seed)
    q_star = rng.normal(size=(runs, k))
    optimal = q_star >= q_star.max(axis=1, keepdims=True)
    Q, N = np.full((runs, k), float(initial_value)), np.zeros((runs, k))
    rows = np.arange(runs)
    average_reward, optimal_action = np.zeros(steps), np.zeros(steps)
    for t in range(steps):
        if ucb_c is None:
            scores = Q
        else:
            bonus = ucb_c * np.sqrt(np.log(t + 1) / np.maximum(N, 1e-300))
            scores = np.where(N == 0, np.inf, Q + bonus)
        actions = _random_argmax(scores, rng)
        explore = rng.random(runs) < epsilon
        actions[explore] = rng.integers(k, size=int(explore.sum()))
        rewards = rng.normal(q_star[rows, actions], 1.0)
        N[rows, actions] += 1
        alpha = 1.0 / N[rows, actions] if step_size is None else step_size
        Q[rows, actions] += alpha * (rewards - Q[rows, actions])
        average_reward[t], optimal_action[t] = rewards.mean(), optimal[rows, actions].mean()
    return BanditResult(average_reward, optimal_action)
