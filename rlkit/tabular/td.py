"""Model-free tabular RL (Chapter 3): Monte Carlo, TD(0), n-step TD, TD(lambda), SARSA, expected
SARSA, Q-learning.

Every learner runs on a gymnasium environment with Discrete spaces, takes ``seed`` (same seed, same
numbers) and returns ``(Q, history)`` (prediction methods: ``(V, history)``), where ``history``
holds one entry per episode: ``episode_return`` (undiscounted, as the agent earned it online) and
``episode_length``. A time limit truncates an episode: TD targets bootstrap there, and only
termination stops the bootstrap (Chapter 1, "Episodes, termination and truncation").
"""

from __future__ import annotations

import bisect

import gymnasium as gym
import numpy as np
import torch

from rlkit.advantages import discounted_returns
from rlkit.envs.tabular import check_discrete
from rlkit.tabular.evaluation import check_policy

TIE_TOLERANCE = 1e-12


def _check_unit(name: str, value: float, low_open: bool = False) -> None:
    low_ok = value > 0 if low_open else value >= 0
    if not (low_ok and value <= 1):
        raise ValueError(f"{name} must be in {'(0' if low_open else '[0'}, 1], got {value!r}")


def _check_run(env: gym.Env, episodes: int, gamma: float) -> tuple[int, int]:
    check_discrete(env)
    if not (isinstance(episodes, int) and episodes >= 1):
        raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
    _check_unit("gamma", gamma)
    return env.observation_space.n, env.action_space.n


def _history(returns: list[float], lengths: list[int]) -> dict[str, np.ndarray]:
    return {
        "episode_return": np.array(returns, dtype=float),
        "episode_length": np.array(lengths, dtype=int),
    }


def epsilon_greedy(q_row: np.ndarray, epsilon: float, rng: np.random.Generator) -> int:
    """With probability epsilon a uniform action, else a greedy one, ties broken at random."""
    if rng.random() < epsilon:
        return int(rng.integers(q_row.size))
    best = np.flatnonzero(q_row >= q_row.max() - TIE_TOLERANCE)
    return int(best[0]) if best.size == 1 else int(rng.choice(best))


def epsilon_greedy_probabilities(q_row: np.ndarray, epsilon: float) -> np.ndarray:
    """pi(a|s) of the epsilon-greedy policy: epsilon / |A| each, plus 1 - epsilon shared by the
    greedy actions."""
    greedy = q_row >= q_row.max() - TIE_TOLERANCE
    return epsilon / q_row.size + (1.0 - epsilon) * greedy / greedy.sum()


def _sample(cumulative_policy: list[list[float]], state: int, rng: np.random.Generator) -> int:
    return bisect.bisect_right(cumulative_policy[state], rng.random())


def _cumulative(policy: np.ndarray) -> list[list[float]]:
    """Per-state cumulative action probabilities, as lists: bisecting a list is the fastest draw per
    step."""
    cumulative = np.cumsum(policy, axis=1)
    cumulative[:, -1] = 1.0  # rounding must never leave a draw without an action
    return cumulative.tolist()


def _play_episode(env, choose, first_reset_seed=None):
    """Run one episode with ``choose(state) -> action``; return its states, actions and rewards."""
    state, _ = env.reset(seed=first_reset_seed)
    states, actions, rewards = [], [], []
    while True:
        action = choose(state)
        next_state, reward, terminated, truncated, _ = env.step(action)
        states.append(state)
        actions.append(action)
        rewards.append(float(reward))
        state = next_state
        if terminated or truncated:
            return states, actions, rewards


def _returns(rewards: list[float], gamma: float) -> np.ndarray:
    """G_t for every step of one episode (eq-return-recursive), by Chapter 1's
    ``discounted_returns``."""
    return discounted_returns(torch.tensor([rewards], dtype=torch.float64), gamma)[0].numpy()


# ---------------------------------------------------------------- Monte Carlo


def mc_prediction(env, policy, gamma=1.0, episodes=1000, first_visit=True, seed=0):
    """Monte Carlo prediction of ``v_pi`` (eq-mc-prediction): average the returns that follow visits
    to each state."""
    n_states, n_actions = _check_run(env, episodes, gamma)
    check_policy(policy, n_states, n_actions)
    rng, cumulative = np.random.default_rng(seed), _cumulative(policy)
    totals, counts = np.zeros(n_states), np.zeros(n_states)
    episode_returns, lengths = [], []
    for episode in range(episodes):
        states, _, rewards = _play_episode(
            env, lambda s: _sample(cumulative, s, rng), seed if episode == 0 else None
        )
        first_step = {}
        for t, state in enumerate(states):
            first_step.setdefault(state, t)
        G = 0.0
        # G <- r_t + gamma G, backwards (eq-return-recursive)
        for t in reversed(range(len(states))):
            G = rewards[t] + gamma * G
            if not first_visit or first_step[states[t]] == t:
                totals[states[t]] += G
                counts[states[t]] += 1
        episode_returns.append(sum(rewards))
        lengths.append(len(rewards))
    return np.divide(totals, counts, out=np.zeros(n_states), where=counts > 0), _history(
        episode_returns, lengths
    )


def mc_control(env, episodes=1000, gamma=1.0, epsilon=0.1, seed=0):
    """On-policy first-visit Monte Carlo control with an epsilon-soft (epsilon-greedy) policy
    (Sutton & Barto 5.4)."""
    n_states, n_actions = _check_run(env, episodes, gamma)
    _check_unit("epsilon", epsilon)
    rng = np.random.default_rng(seed)
    Q, counts = np.zeros((n_states, n_actions)), np.zeros((n_states, n_actions))
    episode_returns, lengths = [], []
    for episode in range(episodes):
        states, actions, rewards = _play_episode(
            env, lambda s: epsilon_greedy(Q[s], epsilon, rng), seed if episode == 0 else None
        )
        returns = _returns(rewards, gamma)
        first_visits = {}
        for t, pair in enumerate(zip(states, actions)):
            first_visits.setdefault(pair, t)
        for (state, action), t in first_visits.items():
            counts[state, action] += 1
            Q[state, action] += (returns[t] - Q[state, action]) / counts[state, action]
        episode_returns.append(sum(rewards))
        lengths.append(len(rewards))
    return Q, _history(episode_returns, lengths)


def off_policy_mc_prediction(
    env, target_policy, behaviour_policy, gamma=1.0, episodes=1000, weighted=True, seed=0
):
    """Off-policy Monte Carlo prediction of ``q_pi`` from episodes of a behaviour policy b (Sutton &
    Barto 5.6).

    Each return is weighted by the importance ratio ``W = prod_k pi(a_k|s_k) / b(a_k|s_k)`` of the
    steps after the pair (eq-importance-ratio): the ancestor of PPO's probability ratio (Chapter 7).
    Weighted importance sampling divides by the sum of the weights (biased, far lower variance);
    ordinary importance sampling divides by the number of visits (every-visit, as here: consistent
    but biased; the first-visit version is unbiased).
    """
    n_states, n_actions = _check_run(env, episodes, gamma)
    check_policy(target_policy, n_states, n_actions)
    check_policy(behaviour_policy, n_states, n_actions)
    if np.any((target_policy > 0) & (behaviour_policy == 0)):
        raise ValueError(
            "behaviour_policy must give every action the target policy takes a non-zero "
            "probability (coverage)"
        )
    rng, cumulative = np.random.default_rng(seed), _cumulative(behaviour_policy)
    Q, weights = np.zeros((n_states, n_actions)), np.zeros((n_states, n_actions))
    episode_returns, lengths = [], []
    for episode in range(episodes):
        states, actions, rewards = _play_episode(
            env, lambda s: _sample(cumulative, s, rng), seed if episode == 0 else None
        )
        G, W = 0.0, 1.0
        for state, action, reward in zip(reversed(states), reversed(actions), reversed(rewards)):
            G = gamma * G + reward
            weights[state, action] += W if weighted else 1.0
            step = W / weights[state, action] if weighted else 1.0 / weights[state, action]
            Q[state, action] += step * ((G if weighted else W * G) - Q[state, action])
            W *= target_policy[state, action] / behaviour_policy[state, action]
            if W == 0.0 and weighted:
                break  # nothing earlier in the episode can be reached by the target policy
        episode_returns.append(sum(rewards))
        lengths.append(len(rewards))
    return Q, _history(episode_returns, lengths)


# ---------------------------------------------------------------- TD prediction


def _initial_values(env, n_states: int, initial_value: float) -> np.ndarray:
    """``initial_value`` everywhere but at known terminal states, whose value is 0 by definition."""
    V = np.full(n_states, float(initial_value))
    terminal = getattr(env.unwrapped, "terminal", None)
    if terminal is not None:
        V[np.asarray(terminal)] = 0.0
    return V


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")


def td0_prediction(
    env, policy, alpha=0.1, gamma=1.0, episodes=1000, seed=0, initial_value=0.0, average_from=None
):
    """TD(0) prediction: ``V(s) <- V(s) + alpha * delta`` with Chapter 1's TD error ``delta``
    (eq-td-error)."""
    return n_step_td_prediction(
        env, policy, 1, alpha, gamma, episodes, seed, initial_value, average_from
    )


def n_step_td_prediction(
    env,
    policy,
    n=1,
    alpha=0.1,
    gamma=1.0,
    episodes=1000,
    seed=0,
    initial_value=0.0,
    average_from=None,
):
    """n-step TD (eq-n-step-return): update ``V(s_t)`` towards
    ``r_t + ... + gamma^(n-1) r_{t+n-1} + gamma^n V(s_{t+n})``.

    Past the end of an episode the return stops if it terminated, and bootstraps from the last state
    if it was truncated. ``n = 1`` is TD(0); ``n`` at least the episode length is Monte Carlo.

    With a constant ``alpha`` the estimate never settles: it keeps jumping around ``v_pi`` by an
    amount that grows with ``alpha``. ``average_from=k`` returns instead the mean of the estimates
    after episodes ``k, k+1, ...`` (Polyak-Ruppert averaging), which cancels most of that noise.
    """
    n_states, n_actions = _check_run(env, episodes, gamma)
    check_policy(policy, n_states, n_actions)
    _check_alpha(alpha)
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if average_from is not None and not (
        isinstance(average_from, int) and 0 <= average_from < episodes
    ):
        raise ValueError(
            f"average_from must be None or an integer in [0, episodes={episodes}), got "
            f"{average_from!r}"
        )
    rng, cumulative = np.random.default_rng(seed), _cumulative(policy)
    average, averaged = np.zeros(n_states), 0
    V = _initial_values(env, n_states, initial_value)
    episode_returns, lengths = [], []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed if episode == 0 else None)
        states, rewards = [state], []
        end, terminated, t = np.inf, False, 0
        while True:
            if t < end:
                state, reward, terminated, truncated, _ = env.step(
                    _sample(cumulative, states[-1], rng)
                )
                states.append(state)
                rewards.append(float(reward))
                if terminated or truncated:
                    end = t + 1
            tau = t - n + 1  # the step whose value is updated now
            if tau >= 0:
                horizon = int(min(tau + n, end))
                G = sum(gamma ** (i - tau) * rewards[i] for i in range(tau, horizon))
                if horizon < end or not terminated:
                    G += gamma ** (horizon - tau) * V[states[horizon]]
                V[states[tau]] += alpha * (G - V[states[tau]])
            if tau == end - 1:
                break
            t += 1
        episode_returns.append(sum(rewards))
        lengths.append(len(rewards))
        if average_from is not None and episode >= average_from:
            averaged += 1
            average += (V - average) / averaged
    return (V if average_from is None else average), _history(episode_returns, lengths)


def td_lambda_prediction(
    env, policy, lam=0.9, alpha=0.1, gamma=1.0, episodes=1000, seed=0, initial_value=0.0
):
    """TD(lambda) with accumulating eligibility traces: the backward view of the lambda-return
    (eq-lambda-return).

    The lambda-return mixes all n-step returns with weights ``(1 - lam) lam^(n-1)``; the same
    mixture, applied to advantages, is GAE (Chapter 1, eq-gae-sum), which PPO uses (Chapter 7).
    """
    n_states, n_actions = _check_run(env, episodes, gamma)
    check_policy(policy, n_states, n_actions)
    _check_alpha(alpha)
    _check_unit("lam", lam)
    rng, cumulative = np.random.default_rng(seed), _cumulative(policy)
    V = _initial_values(env, n_states, initial_value)
    episode_returns, lengths = [], []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed if episode == 0 else None)
        traces = np.zeros(n_states)
        total, steps = 0.0, 0
        while True:
            next_state, reward, terminated, truncated, _ = env.step(_sample(cumulative, state, rng))
            delta = reward + gamma * (0.0 if terminated else V[next_state]) - V[state]
            traces *= gamma * lam
            traces[state] += 1.0
            V += alpha * delta * traces
            total, steps, state = total + reward, steps + 1, next_state
            if terminated or truncated:
                break
        episode_returns.append(total)
        lengths.append(steps)
    return V, _history(episode_returns, lengths)


# ---------------------------------------------------------------- TD control


def _td_control(env, method, episodes, alpha, gamma, epsilon, seed):
    n_states, n_actions = _check_run(env, episodes, gamma)
    _check_alpha(alpha)
    _check_unit("epsilon", epsilon)
    rng = np.random.default_rng(seed)
    Q = np.zeros((n_states, n_actions))
    episode_returns, lengths = [], []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed if episode == 0 else None)
        action = epsilon_greedy(Q[state], epsilon, rng)
        total, steps = 0.0, 0
        while True:
            next_state, reward, terminated, truncated, _ = env.step(action)
            if method == "sarsa":  # on-policy: bootstrap from the action that will be taken
                next_action = epsilon_greedy(Q[next_state], epsilon, rng)
                bootstrap = Q[next_state, next_action]
            elif method == "expected_sarsa":  # the expectation of that action under the policy
                bootstrap = epsilon_greedy_probabilities(Q[next_state], epsilon) @ Q[next_state]
            else:  # q_learning, off-policy: the greedy action, whatever is taken
                bootstrap = Q[next_state].max()
            target = reward + gamma * (0.0 if terminated else bootstrap)
            Q[state, action] += alpha * (target - Q[state, action])
            if method != "sarsa":
                next_action = epsilon_greedy(Q[next_state], epsilon, rng)
            total, steps, state, action = total + reward, steps + 1, next_state, next_action
            if terminated or truncated:
                break
        episode_returns.append(total)
        lengths.append(steps)
    return Q, _history(episode_returns, lengths)


def sarsa(env, episodes=500, alpha=0.5, gamma=1.0, epsilon=0.1, seed=0):
    """SARSA (eq-sarsa): on-policy TD control, target ``r + gamma Q(s', a')`` with a' the next
    action taken."""
    return _td_control(env, "sarsa", episodes, alpha, gamma, epsilon, seed)


def expected_sarsa(env, episodes=500, alpha=0.5, gamma=1.0, epsilon=0.1, seed=0):
    """Expected SARSA (eq-expected-sarsa): target ``r + gamma sum_a' pi(a'|s') Q(s', a')`` under
    epsilon-greedy pi."""
    return _td_control(env, "expected_sarsa", episodes, alpha, gamma, epsilon, seed)


def q_learning(env, episodes=500, alpha=0.5, gamma=1.0, epsilon=0.1, seed=0):
    """Q-learning (eq-q-learning): off-policy TD control, target ``r + gamma max_a' Q(s', a')``."""
    return _td_control(env, "q_learning", episodes, alpha, gamma, epsilon, seed)


def greedy_path(env, Q, max_steps=1000, seed=None):
    """Follow the greedy policy of ``Q`` (ties to the lowest action) from a reset; return the
    visited states and whether the episode terminated within ``max_steps``."""
    state, _ = env.reset(seed=seed)
    path = [state]
    for _ in range(max_steps):
        state, _, terminated, truncated, _ = env.step(int(np.argmax(Q[state])))
        path.append(state)
        if terminated or truncated:
            return path, bool(terminated)
    return path, False
