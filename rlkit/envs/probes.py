"""Probe environments: five tiny tasks whose exact answers are known, for debugging deep RL (Jones,
2021).

Each probe isolates one part of an agent. Run them in order: a failure on probe k, after probes 1 to
k - 1 passed, points at the part that probe k adds.

1. ``ProbeConstantReward``: one action, one step, observation 0, reward +1. ``V = 1``: the value
   loss and target.
2. ``ProbeObservationReward``: one action, one step, observation -1 or +1 at random, reward =
   observation. ``V(o) = o``: the value network uses its input.
3. ``ProbeDelayedReward``: one action, two steps, observation 0 then 1, reward 0 then +1.
   ``V(0) = gamma``, ``V(1) = 1``: discounting and bootstrapping.
4. ``ProbeActionReward``: two actions, one step, observation 0, reward -1 for action 0 and +1 for
   action 1. ``Q = (-1, +1)``, best action 1: the policy gradient (or Q's argmax).
5. ``ProbeActionObservationReward``: two actions, one step, observation -1 or +1 at random, reward
   +1 when the action matches the observation's sign (action 1 for +1, action 0 for -1), else -1.
   ``Q(-1) = (+1, -1)``, ``Q(+1) = (-1, +1)``: the policy uses its input.

Every episode ends by *termination*, never by truncation, so nothing is ever bootstrapped after its
last step. The observation returned with the last step repeats the last one seen, so an agent that
wrongly bootstraps across the end finds a value of ``r / (1 - gamma)``, far from the reference.
Rewards are a function of the observation and the action alone (``reward``), and since every probe
with two actions lasts one step, ``Q^pi = Q*`` for every policy: the value of any policy follows
from ``q_values``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class ProbeEnv(gym.Env):
    """What the five probes share: ``Box(-1, 1, (1,))`` float32 observations,
    ``Discrete(n_actions)`` actions, episodes of ``horizon`` steps that end by termination, and the
    exact references as class methods.

    The per-episode state is three plain attributes, ``t`` (steps taken), ``obs`` (the current
    observation) and ``done``, plus Gymnasium's ``np_random``, so that a checkpoint can save and
    restore it.
    """

    metadata = {"render_modes": []}
    n_actions = 1
    horizon = 1
    OBSERVATIONS: tuple[float, ...] = (0.0,)  # every observation an episode can show
    checks = ""  # what a failure points to
    expected = ""  # the exact answer, in words

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.n_actions)
        self.t, self.obs, self.done = 0, np.zeros(1, dtype=np.float32), True

    def first_observation(self) -> float:
        return 0.0

    def next_observation(self) -> float:
        """The observation after a step that did not end the episode (only the two-step probe has
        one)."""
        raise NotImplementedError

    @staticmethod
    def reward(obs, action):
        """The reward of ``action`` at observation ``obs`` (its one number); also elementwise, on
        arrays."""
        return 1.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.done = 0, False
        self.obs = np.array([self.first_observation()], dtype=np.float32)
        return self.obs.copy(), {}

    def step(self, action):
        if self.done:
            raise RuntimeError(
                f"{type(self).__name__}.step() after the episode ended: call reset() first"
            )
        if not self.action_space.contains(action):
            raise ValueError(f"action must be in {self.action_space}, got {action!r}")
        reward = float(self.reward(self.obs[0], int(action)))
        self.t += 1
        self.done = self.t == self.horizon
        if not self.done:
            self.obs = np.array([self.next_observation()], dtype=np.float32)
        return self.obs.copy(), reward, self.done, False, {}

    @classmethod
    def observations(cls) -> np.ndarray:
        """Every observation an episode can show, ``[N, 1]`` float32: where to evaluate an agent."""
        return np.array(cls.OBSERVATIONS, dtype=np.float32)[:, None]

    @classmethod
    def q_values(cls, obs: np.ndarray, gamma: float) -> np.ndarray:
        """Exact ``Q(s, a)``, ``[..., n_actions]``, for observations ``[..., 1]``; the same for
        every policy."""
        o = np.asarray(obs, dtype=np.float64)[..., 0]
        return np.stack(
            [
                np.broadcast_to(cls.reward(o, np.full(o.shape, a)), o.shape)
                for a in range(cls.n_actions)
            ],
            axis=-1,
        ).astype(np.float64)

    @classmethod
    def expected_values(cls, obs: np.ndarray, gamma: float) -> np.ndarray:
        """Exact ``V*(s)``, the value of the optimal policy, ``[...]``."""
        return cls.q_values(obs, gamma).max(axis=-1)

    @classmethod
    def policy_values(cls, obs: np.ndarray, action_probs: np.ndarray, gamma: float) -> np.ndarray:
        """Exact ``V^pi(s) = sum_a pi(a|s) Q(s, a)`` of a policy given by its probabilities
        ``[..., n_actions]``."""
        return (np.asarray(action_probs, dtype=np.float64) * cls.q_values(obs, gamma)).sum(axis=-1)

    @classmethod
    def optimal_actions(cls, obs: np.ndarray) -> np.ndarray:
        """The best action at each observation, ``[...]`` (ties cannot happen: the rewards differ by
        2)."""
        return cls.q_values(obs, gamma=1.0).argmax(axis=-1)


class ProbeConstantReward(ProbeEnv):
    """Probe 1: one action, one step, observation 0, reward +1."""

    checks = (
        "the value loss and its target: a critic that cannot fit a constant is broken at the loss"
    )
    expected = "V(0) = 1"


class ProbeObservationReward(ProbeEnv):
    """Probe 2: one action, one step, observation -1 or +1 at random, reward equal to the
    observation."""

    OBSERVATIONS = (-1.0, 1.0)
    checks = (
        "that the value network uses its input (and the batching keeps observations with "
        "their rewards)"
    )
    expected = "V(-1) = -1, V(+1) = +1"

    def first_observation(self) -> float:
        return float(self.np_random.choice(self.OBSERVATIONS))

    @staticmethod
    def reward(obs, action):
        return obs


class ProbeDelayedReward(ProbeEnv):
    """Probe 3: one action, two steps, observation 0 then 1, reward 0 then +1."""

    horizon = 2
    OBSERVATIONS = (0.0, 1.0)
    checks = (
        "discounting and bootstrapping: the first state's value comes only through the second's"
    )
    expected = "V(0) = gamma, V(1) = 1"

    def next_observation(self) -> float:
        return 1.0

    @staticmethod
    def reward(obs, action):
        return np.where(obs == 1.0, 1.0, 0.0)

    @classmethod
    def q_values(cls, obs, gamma):
        o = np.asarray(obs, dtype=np.float64)[..., :1]
        # the first step's reward is 0, then V(1) = 1 discounted once
        return np.where(o == 1.0, 1.0, gamma)


class ProbeActionReward(ProbeEnv):
    """Probe 4: two actions, one step, observation 0, reward -1 for action 0 and +1 for action 1."""

    n_actions = 2
    checks = "the policy gradient (or Q's argmax): the only thing to learn is which action pays"
    expected = "Q(0) = (-1, +1), best action 1, V*(0) = 1"

    @staticmethod
    def reward(obs, action):
        return np.where(action == 1, 1.0, -1.0)


class ProbeActionObservationReward(ProbeEnv):
    """Probe 5: two actions, one step, observation -1 or +1 at random, reward +1 when the action
    matches the observation's sign (action 1 for +1, action 0 for -1), else -1."""

    n_actions = 2
    OBSERVATIONS = (-1.0, 1.0)
    checks = "that the policy uses its input: the best action depends on the observation"
    expected = "Q(-1) = (+1, -1), Q(+1) = (-1, +1), best action 1 for +1 and 0 for -1, V* = 1"

    def first_observation(self) -> float:
        return float(self.np_random.choice(self.OBSERVATIONS))

    @staticmethod
    def reward(obs, action):
        return np.where((action == 1) == (obs > 0), 1.0, -1.0)


# The registered id of each probe, in the order to run them; the class holds ``checks``,
# ``expected`` and the exact references (``q_values``, ``expected_values``, ``policy_values``,
# ``optimal_actions``).
PROBES: dict[str, type[ProbeEnv]] = {
    "rlkit/ProbeConstantReward-v0": ProbeConstantReward,
    "rlkit/ProbeObservationReward-v0": ProbeObservationReward,
    "rlkit/ProbeDelayedReward-v0": ProbeDelayedReward,
    "rlkit/ProbeActionReward-v0": ProbeActionReward,
    "rlkit/ProbeActionObservationReward-v0": ProbeActionObservationReward,
}


def probe_failures(
    env_id: str,
    gamma: float,
    values=None,
    q_values=None,
    action_probs=None,
    value_tol: float = 0.1,
    min_prob: float = 0.9,
) -> list[str]:
    """Compare an agent's predictions with a probe's exact answers; one line per failure (empty: it
    passed).

    Each prediction is evaluated at ``PROBES[env_id].observations()``: ``values`` ``[N]`` (a
    critic's V), ``q_values`` ``[N, n_actions]``, ``action_probs`` ``[N, n_actions]`` (the policy).
    ``values`` is compared with the value of the agent's own policy when ``action_probs`` is given
    (what a critic estimates), with ``V*`` otherwise; ``q_values`` with the exact Q; a policy must
    give the best action more than ``min_prob``.
    """
    if env_id not in PROBES:
        raise ValueError(f"env_id must be one of {sorted(PROBES)}, got {env_id!r}")
    probe = PROBES[env_id]
    obs = probe.observations()
    failures = []

    def compare(name: str, got, want) -> None:
        got = np.asarray(got, dtype=np.float64).reshape(np.shape(want))
        for index in np.ndindex(got.shape):
            if not abs(got[index] - want[index]) <= value_tol:  # also fails on NaN
                failures.append(
                    f"{env_id}: {name} at observation {obs[index[0], 0]:+g}"
                    f"{f', action {index[1]}' if len(index) > 1 else ''} is {got[index]:.3f}, "
                    f"expected {want[index]:.3f} (+- {value_tol}); this probe checks {probe.checks}"
                )

    if values is not None:
        want = (
            probe.expected_values(obs, gamma)
            if action_probs is None
            else probe.policy_values(obs, np.asarray(action_probs), gamma)
        )
        compare("V", values, want)
    if q_values is not None:
        compare("Q", q_values, probe.q_values(obs, gamma))
    if action_probs is not None and probe.n_actions > 1:
        probs = np.asarray(action_probs, dtype=np.float64).reshape(len(obs), probe.n_actions)
        best = probe.optimal_actions(obs)
        for i, action in enumerate(best):
            if not probs[i, action] > min_prob:
                failures.append(
                    f"{env_id}: pi(best action {action} | observation {obs[i, 0]:+g}) is "
                    f"{probs[i, action]:.3f}, expected > {min_prob}; this probe checks "
                    f"{probe.checks}"
                )
    return failures
