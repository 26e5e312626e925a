"""rlkit's own environments, registered with gymnasium under the ``rlkit/`` namespace."""

import gymnasium as gym

from rlkit.envs.gridworld import LAYOUTS, GridWorld, Layout
from rlkit.envs.tabular import TabularMDP

__all__ = ["GridWorld", "Layout", "LAYOUTS", "TabularMDP"]

if "rlkit/GridWorld-v0" not in gym.registry:
    gym.register(id="rlkit/GridWorld-v0", entry_point="rlkit.envs.gridworld:GridWorld", max_episode_steps=100)
