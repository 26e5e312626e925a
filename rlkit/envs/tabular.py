"""A finite MDP as arrays: what planning (Chapter 2) needs, and what model-free methods (Chapter 3)
never see."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class TabularMDP:
    """``P[s, a, s']`` transition probabilities, ``R[s, a]`` expected rewards, ``terminal[s]``.

    Terminal states absorb: their value is 0 and nothing is earned from them. A transition into a
    terminal state ends the episode. ``shape`` (rows, cols) is set for gridworlds, for plots.
    """

    P: np.ndarray
    R: np.ndarray
    terminal: np.ndarray
    shape: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.R.ndim != 2:
            raise ValueError(f"R must be a [S, A] array, got shape {self.R.shape}")
        n_states, n_actions = self.R.shape
        if self.P.shape != (n_states, n_actions, n_states):
            raise ValueError(
                f"P must have shape ({n_states}, {n_actions}, {n_states}), got {self.P.shape}"
            )
        if np.any(self.P < 0) or not np.allclose(self.P.sum(axis=2), 1.0):
            raise ValueError(
                "P[s, a] must be a probability distribution over next states for every (s, a)"
            )
        if self.terminal.shape != (n_states,) or self.terminal.dtype != bool:
            raise ValueError(
                f"terminal must be a boolean array of shape ({n_states},), got "
                f"{self.terminal.dtype} {self.terminal.shape}"
            )

    @property
    def n_states(self) -> int:
        return self.R.shape[0]

    @property
    def n_actions(self) -> int:
        return self.R.shape[1]

    @classmethod
    def from_gymnasium(cls, env: gym.Env) -> TabularMDP:
        """The model of a gymnasium environment that publishes one.

        rlkit's gridworlds publish ``model()``; gymnasium's toy-text environments (FrozenLake-v1,
        CliffWalking-v1, Taxi-v4) publish
        ``P[s][a] = [(prob, next_state, reward, terminated), ...]``. A state is terminal when the
        transitions into it terminate.
        """
        env = env.unwrapped
        check_discrete(env)
        if hasattr(env, "model"):
            P, R, terminal = env.model()
            return cls(P, R, terminal.astype(bool), getattr(env, "shape", None))
        table = getattr(env, "P", None)
        if not isinstance(table, dict):
            raise ValueError(
                f"{type(env).__name__} publishes no model: expected a toy-text P table or a "
                "model() method"
            )
        shape = getattr(env, "shape", None) or (
            (env.nrow, env.ncol) if hasattr(env, "nrow") else None
        )
        initial = getattr(env, "initial_state_distrib", None)
        return cls._from_toy_text(
            table, env.observation_space.n, env.action_space.n, shape, initial
        )

    @classmethod
    def _from_toy_text(
        cls, table: dict, n_states: int, n_actions: int, shape, initial: np.ndarray | None
    ) -> TabularMDP:
        P = np.zeros((n_states, n_actions, n_states))
        R = np.zeros((n_states, n_actions))
        terminates = np.zeros((n_states, n_actions, n_states), dtype=bool)
        for state in range(n_states):
            for action in range(n_actions):
                for probability, next_state, reward, terminated in table[state][action]:
                    P[state, action, next_state] += probability
                    R[state, action] += probability * reward
                    terminates[state, action, next_state] |= bool(terminated) and probability > 0
        terminal = terminates.any(axis=(0, 1))
        _check_termination_is_a_property_of_states(P, terminates, terminal, initial)
        P[terminal] = 0.0  # terminal states absorb, whatever the table says happens after the end
        for state in np.flatnonzero(terminal):
            P[state, :, state] = 1.0
        R[terminal] = 0.0
        return cls(P, R, terminal, tuple(shape) if shape is not None else None)


def _check_termination_is_a_property_of_states(P, terminates, terminal, initial) -> None:
    """An array model marks states terminal, so every transition into a terminal state must
    terminate.

    Only transitions from states reachable from the start distribution count: Taxi's table also
    moves the taxi around after the passenger was delivered, from states an episode never reaches.
    """
    reachable = (
        np.zeros(len(terminal), dtype=bool)
        if initial is not None
        else np.ones(len(terminal), dtype=bool)
    )
    frontier = np.flatnonzero(initial > 0) if initial is not None else np.array([], dtype=int)
    reachable[frontier] = True
    while frontier.size:
        successors = ((P[frontier] > 0) & ~terminates[frontier]).any(axis=(0, 1))
        frontier = np.flatnonzero(successors & ~reachable)
        reachable[frontier] = True
    continuing_into_terminal = (P[reachable] > 0) & ~terminates[reachable] & terminal[None, None, :]
    if continuing_into_terminal.any():
        bad = sorted(set(np.nonzero(continuing_into_terminal)[2].tolist()))
        raise ValueError(
            f"states {bad} are entered both with and without termination: not a state-terminal MDP"
        )


def check_discrete(env: gym.Env) -> None:
    """Tabular methods need a ``Discrete`` observation space and a ``Discrete`` action space."""
    for name in ("observation_space", "action_space"):
        space = getattr(env, name)
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(f"tabular methods need a Discrete {name}, got {space}")
