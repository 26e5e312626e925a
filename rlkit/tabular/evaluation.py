"""Policy evaluation two ways: the exact linear solve of the Bellman equation, and Monte Carlo
rollouts."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlkit.advantages import discounted_returns


def uniform_random_policy(n_states: int, n_actions: int) -> np.ndarray:
    """``pi[s, a] = 1 / n_actions`` for every state: the policy Chapter 1 evaluates."""
    return np.full((n_states, n_actions), 1.0 / n_actions)


def check_policy(policy: np.ndarray, n_states: int, n_actions: int) -> None:
    if policy.shape != (n_states, n_actions):
        raise ValueError(f"policy must have shape ({n_states}, {n_actions}), got {policy.shape}")
    if np.any(policy < 0) or not np.allclose(policy.sum(axis=1), 1.0):
        raise ValueError(
            "policy rows must be probability distributions (non-negative, summing to 1)"
        )


def exact_policy_values(
    P: np.ndarray,
    R: np.ndarray,
    policy: np.ndarray,
    gamma: float,
    terminal: np.ndarray | None = None,
) -> np.ndarray:
    """Solve the Bellman expectation equation ``v = r_pi + gamma * P_pi v`` (eq-bellman-matrix)
    exactly.

    ``P[s, a, s']``, ``R[s, a]`` and ``policy[s, a]`` are arrays; terminal states have value 0, so
    with ``gamma = 1`` the system is solvable whenever the policy reaches a terminal state with
    probability 1.
    """
    n_states, n_actions = R.shape
    if P.shape != (n_states, n_actions, n_states):
        raise ValueError(f"P must have shape ({n_states}, {n_actions}, {n_states}), got {P.shape}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    check_policy(policy, n_states, n_actions)
    P_pi = np.einsum("sa,sat->st", policy, P)
    r_pi = np.einsum("sa,sa->s", policy, R)
    if terminal is not None:
        terminal = np.asarray(terminal)
        if terminal.shape != (n_states,) or terminal.dtype != bool:
            raise ValueError(
                f"terminal must be a boolean array of shape ({n_states},), got {terminal.dtype} "
                f"{terminal.shape}"
            )
        P_pi[terminal] = 0.0
        r_pi[terminal] = 0.0
    if gamma == 1.0:
        # Decided on the support of P_pi, not by the solver: rounding turns an exactly singular
        # I - P_pi into a nearly singular one that solves to values of 1e16, on some machines only.
        stuck = never_terminating_states(P_pi, terminal)
        if stuck.size:
            raise ValueError(
                "I - gamma * P_pi is singular: with gamma = 1 the policy must reach a terminal "
                f"state, and from states {stuck.tolist()[:10]} it never does"
            )
    try:
        return np.linalg.solve(np.eye(n_states) - gamma * P_pi, r_pi)
    except np.linalg.LinAlgError as error:
        raise ValueError(f"I - gamma * P_pi is singular (gamma = {gamma})") from error


def never_terminating_states(P_pi: np.ndarray, terminal: np.ndarray | None) -> np.ndarray:
    """The states from which no path of positive probability under ``P_pi`` reaches a terminal
    state."""
    # a row that sums to less than 1 ends the episode with the missing probability
    reaches = P_pi.sum(axis=1) < 1 - 1e-9
    if terminal is not None:
        reaches |= terminal
    moves = P_pi > 0
    while True:
        grown = reaches | moves[:, reaches].any(axis=1)
        if np.array_equal(grown, reaches):
            return np.flatnonzero(~reaches)
        reaches = grown


def _episode_return(
    env: gym.Env,
    cumulative_policy: np.ndarray,
    start_state: int,
    gamma: float,
    rng: np.random.Generator,
):
    state, _ = env.reset(options={"start_state": start_state})
    rewards = []
    terminated = truncated = False
    while not (terminated or truncated):
        action = int(np.searchsorted(cumulative_policy[state], rng.random(), side="right"))
        state, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
    returns = discounted_returns(torch.tensor([rewards], dtype=torch.float64), gamma)
    return float(returns[0, 0])


def monte_carlo_policy_values(
    env: gym.Env,
    policy: np.ndarray,
    gamma: float,
    episodes_per_state: int = 100,
    seed: int = 0,
    states: list[int] | None = None,
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Estimate ``v_pi(s) = E[G_0 | S_0 = s]`` (eq-value) by averaging sampled returns from each
    start state.

    Returns ``(values, returns)``: the sample means (NaN for states not evaluated) and every sampled
    return per state. An episode cut by a time limit is truncated, not terminated: its return misses
    the discounted tail, a bias of at most ``gamma**limit * max|v|`` that the caller keeps small.
    """
    if episodes_per_state < 1:
        raise ValueError(f"episodes_per_state must be >= 1, got {episodes_per_state!r}")
    n_states, n_actions = env.observation_space.n, env.action_space.n
    check_policy(policy, n_states, n_actions)
    terminal = env.unwrapped.terminal | env.unwrapped.walls
    states = [s for s in range(n_states) if not terminal[s]] if states is None else list(states)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    cumulative_policy = np.cumsum(policy, axis=1)
    cumulative_policy[:, -1] = 1.0  # guard against rounding: an action is always drawn
    values = np.full(n_states, np.nan)
    values[terminal] = 0.0
    sampled = {}
    for state in states:
        sampled[state] = np.array(
            [
                _episode_return(env, cumulative_policy, state, gamma, rng)
                for _ in range(episodes_per_state)
            ]
        )
        values[state] = sampled[state].mean()
    return values, sampled
