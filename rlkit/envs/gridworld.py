"""Chapter 1's gridworld family: one gymnasium environment, many layouts.

A layout is a list of strings, one character per cell:

    ``.`` empty   ``#`` wall   ``S`` start   ``G`` goal   ``X`` trap   ``T`` plain terminal
    ``A``/``B``   jump cells: every action moves to ``a``/``b`` with a bonus
                  (Sutton & Barto Example 3.5)

The state is the cell index ``row * n_cols + col`` (walls included, never visited). Actions are 0
up, 1 right, 2 down, 3 left. Moving into a wall or off the grid leaves the agent in place with
``bump_reward``. Every step earns ``step_reward`` plus the reward of the cell entered, if it is a
terminal. The same layouts serve Chapters 1-3: Sutton & Barto's 4x4 (Example 4.1), 5x5 (Example 3.5)
and the Dyna maze (Example 8.1), and the random walk of Example 6.2, are entries of ``LAYOUTS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

UP, RIGHT, DOWN, LEFT = range(4)
MOVES = np.array([(-1, 0), (0, 1), (1, 0), (0, -1)])
ACTION_NAMES = ("up", "right", "down", "left")
COLOURS = {
    ".": (240, 240, 240),
    "#": (60, 60, 60),
    "S": (200, 220, 255),
    "G": (120, 200, 120),
    "X": (230, 110, 110),
    "T": (170, 170, 170),
    "A": (250, 210, 120),
    "B": (250, 230, 170),
    "a": (240, 240, 240),
    "b": (240, 240, 240),
}
CELL_PIXELS = 32


@dataclass(frozen=True)
class Layout:
    """A gridworld's map and rewards. ``terminal_rewards`` maps a cell character to its entry
    reward."""

    rows: tuple[str, ...]
    step_reward: float = 0.0
    bump_reward: float = 0.0
    terminal_rewards: dict[str, float] = field(
        default_factory=lambda: {"G": 1.0, "X": -1.0, "T": 0.0}
    )
    jumps: dict[str, tuple[str, float]] = field(default_factory=dict)
    gamma: float = 0.9  # the discount the book uses with this layout

    def __post_init__(self) -> None:
        if not self.rows or len({len(row) for row in self.rows}) != 1:
            raise ValueError(f"rows must be non-empty strings of one length, got {self.rows!r}")
        allowed = set(".#S") | set(self.terminal_rewards) | set(self.jumps)
        allowed |= {target for target, _ in self.jumps.values()}
        unknown = set("".join(self.rows)) - allowed
        if unknown:
            raise ValueError(
                f"rows use unknown cell characters {sorted(unknown)}; allowed: {sorted(allowed)}"
            )
        missing = [
            target for target, _ in self.jumps.values() if "".join(self.rows).count(target) != 1
        ]
        if missing:
            raise ValueError(f"jumps targets {missing} must each appear exactly once in rows")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma!r}")


LAYOUTS: dict[str, Layout] = {
    # Chapter 1: reach the goal, avoid the trap, walk round the wall.
    "chapter1": Layout(rows=("S...", ".#.X", "...G", "...."), gamma=0.9),
    # Sutton & Barto Example 4.1: -1 per step until a terminal corner; undiscounted.
    "sutton_barto_4x4": Layout(rows=("T...", "....", "....", "...T"), step_reward=-1.0, gamma=1.0),
    # Sutton & Barto Example 3.5: A -> A' (+10), B -> B' (+5), -1 for trying to leave the grid.
    "sutton_barto_5x5": Layout(
        rows=(".A.B.", ".....", "...b.", ".....", ".a..."),
        bump_reward=-1.0,
        jumps={"A": ("a", 10.0), "B": ("b", 5.0)},
        gamma=0.9,
    ),
    # Sutton & Barto Example 6.2: the random walk A-E, starting in C; +1 for leaving on the right.
    # (Up and down bump in place: evaluate it with a policy that moves left or right.)
    "random_walk_5": Layout(rows=("T..S..G",), terminal_rewards={"T": 0.0, "G": 1.0}, gamma=1.0),
    # Sutton & Barto Example 8.1 (the Dyna maze): +1 on reaching G, 0 otherwise.
    "dyna_maze": Layout(
        rows=(".......#G", "..#....#.", "S.#....#.", "..#......", ".....#...", "........."),
        gamma=0.95,
    ),
}


class GridWorld(gym.Env):
    """A deterministic gridworld MDP as a gymnasium environment (registered as
    ``rlkit/GridWorld-v0``)."""

    metadata = {"render_modes": ["rgb_array", "ansi"], "render_fps": 4}

    def __init__(self, layout: str | Layout = "chapter1", render_mode: str | None = None):
        if isinstance(layout, str):
            if layout not in LAYOUTS:
                raise ValueError(
                    f"layout must be one of {sorted(LAYOUTS)} or a Layout, got {layout!r}"
                )
            layout = LAYOUTS[layout]
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got "
                f"{render_mode!r}"
            )
        self.layout = layout
        self.render_mode = render_mode
        self.grid = np.array([list(row) for row in layout.rows])
        self.shape = self.grid.shape
        self.n_states = self.grid.size
        self.observation_space = gym.spaces.Discrete(self.n_states)
        self.action_space = gym.spaces.Discrete(len(MOVES))
        cells = self.grid.ravel()
        self.walls = cells == "#"
        self.terminal = np.isin(cells, list(layout.terminal_rewards))
        starts = np.flatnonzero(cells == "S")
        self.start_states = starts if starts.size else np.flatnonzero(~self.walls & ~self.terminal)
        self._P, self._R = self._tabulate()
        self._next_state = self._P.argmax(
            axis=2
        ).tolist()  # deterministic dynamics as lookup tables: a fast step()
        self._reward = self._R.tolist()
        self._is_terminal = self.terminal.tolist()
        self.state = int(self.start_states[0])

    def _move(self, state: int, action: int) -> tuple[int, float]:
        """The deterministic dynamics: next state and reward for one (state, action)."""
        row, col = divmod(state, self.shape[1])
        cell = self.grid[row, col]
        if cell in self.layout.jumps:
            target, bonus = self.layout.jumps[cell]
            return int(
                np.flatnonzero(self.grid.ravel() == target)[0]
            ), self.layout.step_reward + bonus
        new_row, new_col = row + MOVES[action][0], col + MOVES[action][1]
        inside = 0 <= new_row < self.shape[0] and 0 <= new_col < self.shape[1]
        if not inside or self.grid[new_row, new_col] == "#":
            return state, self.layout.step_reward + self.layout.bump_reward
        entered = self.grid[new_row, new_col]
        bonus = self.layout.terminal_rewards.get(entered, 0.0)
        return int(new_row * self.shape[1] + new_col), self.layout.step_reward + bonus

    def _tabulate(self) -> tuple[np.ndarray, np.ndarray]:
        """The model as arrays: ``P[s, a, s']`` and expected reward ``R[s, a]``; terminals and walls
        absorb with 0."""
        n_actions = len(MOVES)
        P = np.zeros((self.n_states, n_actions, self.n_states))
        R = np.zeros((self.n_states, n_actions))
        for state in range(self.n_states):
            for action in range(n_actions):
                if self.terminal[state] or self.walls[state]:
                    P[state, action, state] = 1.0
                    continue
                next_state, reward = self._move(state, action)
                P[state, action, next_state] = 1.0
                R[state, action] = reward
        return P, R

    def model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(P, R, terminal)``: the known model that planning (Chapter 2) and the exact solve
        use."""
        return self._P.copy(), self._R.copy(), self.terminal | self.walls

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        start = (options or {}).get("start_state")
        if start is None:
            self.state = int(self.np_random.choice(self.start_states))
        else:
            if not (0 <= int(start) < self.n_states) or self.walls[int(start)]:
                raise ValueError(
                    f"options['start_state'] must be a non-wall state in [0, {self.n_states}), "
                    f"got {start!r}"
                )
            self.state = int(start)
        return self.state, {}

    def step(self, action):
        if not (isinstance(action, (int, np.integer)) and 0 <= action < 4):
            raise ValueError(
                f"action must be in {{0, 1, 2, 3}} (up, right, down, left), got {action!r}"
            )
        if self._is_terminal[self.state]:
            raise RuntimeError("step() called after the episode terminated; call reset() first")
        reward = self._reward[self.state][action]
        self.state = self._next_state[self.state][action]
        return self.state, reward, self._is_terminal[self.state], False, {}

    def render(self):
        if self.render_mode == "ansi":
            cells = self.grid.copy().ravel()
            cells[self.state] = "@"
            return "\n".join("".join(row) for row in cells.reshape(self.shape)) + "\n"
        if self.render_mode == "rgb_array":
            image = np.array([[COLOURS[c] for c in row] for row in self.grid], dtype=np.uint8)
            image = image.repeat(CELL_PIXELS, axis=0).repeat(CELL_PIXELS, axis=1)
            row, col = divmod(self.state, self.shape[1])
            quarter = CELL_PIXELS // 4
            image[
                row * CELL_PIXELS + quarter : (row + 1) * CELL_PIXELS - quarter,
                col * CELL_PIXELS + quarter : (col + 1) * CELL_PIXELS - quarter,
            ] = (40, 90, 200)
            return image
        return None
