"""Model-based RL (Chapter 2): planning with a known model, and Dyna-Q, which learns the model it
plans with.

Sweeps are array code: one sweep of synchronous evaluation or value iteration is a matrix product
over all states at once. Every function takes ``history``: a list to which the largest value change
of each sweep is appended, for convergence plots.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlkit.envs.tabular import TabularMDP
from rlkit.tabular.evaluation import check_policy, exact_policy_values
from rlkit.tabular.td import _check_alpha, _check_run, _check_unit, _history, epsilon_greedy

# actions within this of the best count as tied (floating-point noise is not a preference)
TIE_TOLERANCE = 1e-9


def _check_gamma(gamma: float, mdp: TabularMDP) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if gamma == 1.0 and not mdp.terminal.any():
        raise ValueError(
            "gamma = 1 needs an MDP with terminal states: with none, values of a continuing task "
            "diverge"
        )


def _check_tol(tol: float) -> None:
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")


def q_from_v(mdp: TabularMDP, V: np.ndarray, gamma: float) -> np.ndarray:
    """``Q[s, a] = R[s, a] + gamma * sum_s' P[s, a, s'] V[s']`` (eq-q-from-v), 0 on terminal
    states."""
    Q = mdp.R + gamma * mdp.P @ np.where(mdp.terminal, 0.0, V)
    Q[mdp.terminal] = 0.0
    return Q


def greedy_policy(Q: np.ndarray, current: np.ndarray | None = None) -> np.ndarray:
    """A deterministic policy as a ``[S, A]`` array of probabilities: the best action, ties to the
    lowest index.

    With ``current`` (a policy), a state keeps its current most likely action while that action is
    still among the best: policy iteration then stops instead of hopping between equally good
    policies, and at ``gamma = 1`` never swaps a move towards the goal for an equally valued bump
    into a wall.
    """
    tied = Q >= Q.max(axis=1, keepdims=True) - TIE_TOLERANCE
    best = np.argmax(tied, axis=1)
    if current is not None:
        kept = current.argmax(axis=1)
        best = np.where(tied[np.arange(len(Q)), kept], kept, best)
    return np.eye(Q.shape[1])[best]


def policy_evaluation(
    mdp: TabularMDP,
    policy: np.ndarray,
    gamma: float,
    tol: float = 1e-10,
    in_place: bool = False,
    max_sweeps: int = 100_000,
    history: list | None = None,
) -> np.ndarray:
    """Iterative policy evaluation (eq-policy-evaluation): sweep ``V <- r_pi + gamma P_pi V`` until
    it moves < tol.

    Synchronous sweeps compute every new value from the old vector (one matrix product); in-place
    sweeps (``in_place=True``, Gauss-Seidel) use each new value as soon as it is computed, which
    usually needs fewer sweeps.
    """
    _check_gamma(gamma, mdp)
    _check_tol(tol)
    check_policy(policy, mdp.n_states, mdp.n_actions)
    P_pi = np.einsum("sa,sat->st", policy, mdp.P)
    r_pi = np.einsum("sa,sa->s", policy, mdp.R)
    P_pi[mdp.terminal], r_pi[mdp.terminal] = 0.0, 0.0
    V = np.zeros(mdp.n_states)
    for _ in range(max_sweeps):
        if in_place:
            change = 0.0
            for state in range(mdp.n_states):
                new = r_pi[state] + gamma * P_pi[state] @ V
                change, V[state] = max(change, abs(new - V[state])), new
        else:
            new_V = r_pi + gamma * P_pi @ V
            change, V = np.abs(new_V - V).max(), new_V
        if history is not None:
            history.append(change)
        if change < tol:
            return V
    raise RuntimeError(
        f"policy_evaluation did not converge to tol={tol} in max_sweeps={max_sweeps}"
    )


def policy_iteration(
    mdp: TabularMDP,
    gamma: float,
    policy: np.ndarray | None = None,
    max_iterations: int = 1_000,
    history: list | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Policy iteration: evaluate exactly (eq-bellman-matrix), improve greedily, until the policy is
    stable.

    Returns ``(V, policy)``; ``history`` receives the number of states whose action changed per
    iteration.
    """
    _check_gamma(gamma, mdp)
    policy = (
        np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions) if policy is None else policy
    )
    check_policy(policy, mdp.n_states, mdp.n_actions)
    for _ in range(max_iterations):
        V = exact_policy_values(mdp.P, mdp.R, policy, gamma, mdp.terminal)
        improved = greedy_policy(q_from_v(mdp, V, gamma), current=policy)
        changed = int((np.abs(improved - policy).sum(axis=1) > 0).sum())
        if history is not None:
            history.append(changed)
        if np.array_equal(improved, policy):
            return V, policy
        policy = improved
    raise RuntimeError(f"policy_iteration did not stabilise in max_iterations={max_iterations}")


def _checked_greedy(mdp: TabularMDP, V: np.ndarray, gamma: float) -> np.ndarray:
    """The greedy policy of V; at gamma = 1 it must also reach a terminal state, which ties can
    prevent."""
    policy = greedy_policy(q_from_v(mdp, V, gamma))
    if gamma == 1.0:
        try:
            exact_policy_values(mdp.P, mdp.R, policy, gamma, mdp.terminal)
        except ValueError as error:
            raise ValueError(
                "value_iteration with gamma = 1: a greedy policy of V* never reaches a terminal "
                "state, because waiting (e.g. bumping into a wall) costs nothing and ties with "
                "progress; use gamma < 1, a step cost, or policy_iteration, which keeps "
                "progressing actions on ties"
            ) from error
    return policy


def value_iteration(
    mdp: TabularMDP,
    gamma: float,
    tol: float = 1e-10,
    max_sweeps: int = 100_000,
    history: list | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Value iteration: sweep the Bellman optimality backup ``V <- max_a Q(V)`` (eq-value-iteration)
    until it moves < tol.

    Returns ``(V, policy)`` with the greedy policy of the final ``V``. With ``gamma < 1`` the error
    after stopping is at most ``tol * gamma / (1 - gamma)``.
    """
    _check_gamma(gamma, mdp)
    _check_tol(tol)
    V = np.zeros(mdp.n_states)
    for _ in range(max_sweeps):
        new_V = q_from_v(mdp, V, gamma).max(axis=1)
        change, V = np.abs(new_V - V).max(), new_V
        if history is not None:
            history.append(change)
        if change < tol:
            return V, _checked_greedy(mdp, V, gamma)
    raise RuntimeError(f"value_iteration did not converge to tol={tol} in max_sweeps={max_sweeps}")


def dyna_q(
    env: gym.Env,
    n_planning: int = 5,
    episodes: int = 50,
    alpha: float = 0.1,
    gamma: float = 0.95,
    epsilon: float = 0.1,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Tabular Dyna-Q (Sutton & Barto 8.2): Q-learning plus ``n_planning`` updates per real step
    from a learned model.

    The model remembers the last ``(reward, next_state, terminated)`` seen after each ``(s, a)``
    (the dynamics are assumed deterministic). Each planning step picks a previously observed state
    at random, then an action previously taken there, and applies the same Q-learning update
    (eq-ch02-dyna-update) to the remembered outcome. ``n_planning = 0`` is plain Q-learning (the
    same algorithm as ``q_learning``, though its random draws, and so its numbers, differ). Returns
    ``(Q, history)`` with ``episode_length`` and ``episode_return`` per episode.
    """
    n_states, n_actions = _check_run(env, episodes, gamma)
    _check_alpha(alpha)
    _check_unit("epsilon", epsilon)
    if not (isinstance(n_planning, int) and n_planning >= 0):
        raise ValueError(f"n_planning must be an integer >= 0, got {n_planning!r}")
    rng = np.random.default_rng(seed)
    Q = np.zeros((n_states, n_actions))
    model: dict[tuple[int, int], tuple[float, int, bool]] = {}
    observed_states: list[int] = []
    actions_taken: dict[int, list[int]] = {}

    def update(state, action, reward, next_state, terminated):
        target = reward + (0.0 if terminated else gamma * Q[next_state].max())
        Q[state, action] += alpha * (target - Q[state, action])

    def remember(state, action, outcome):
        if state not in actions_taken:
            observed_states.append(state)
            actions_taken[state] = []
        if action not in actions_taken[state]:
            actions_taken[state].append(action)
        model[state, action] = outcome

    returns, lengths = [], []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed if episode == 0 else None)
        total, steps = 0.0, 0
        while True:
            action = epsilon_greedy(Q[state], epsilon, rng)
            next_state, reward, terminated, truncated, _ = env.step(action)
            update(state, action, reward, next_state, terminated)
            remember(state, action, (reward, next_state, terminated))
            for _ in range(n_planning):
                planned_state = observed_states[int(rng.integers(len(observed_states)))]
                options = actions_taken[planned_state]
                planned_action = options[int(rng.integers(len(options)))]
                update(planned_state, planned_action, *model[planned_state, planned_action])
            total, steps, state = total + reward, steps + 1, next_state
            if terminated or truncated:
                break
        returns.append(total)
        lengths.append(steps)
    return Q, _history(returns, lengths)
