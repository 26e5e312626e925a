"""rlkit's own environments, registered with gymnasium under the ``rlkit/`` namespace."""

import gymnasium as gym

from rlkit.envs.gridworld import LAYOUTS, GridWorld, Layout
from rlkit.envs.probes import PROBES, ProbeEnv, probe_failures
from rlkit.envs.tabular import TabularMDP

__all__ = ["GridWorld", "Layout", "LAYOUTS", "TabularMDP", "PROBES", "ProbeEnv", "probe_failures"]

if "rlkit/GridWorld-v0" not in gym.registry:
    gym.register(
        id="rlkit/GridWorld-v0", entry_point="rlkit.envs.gridworld:GridWorld", max_episode_steps=100
    )
for _probe_id, _probe in PROBES.items():  # the probes end by termination only: no time limit
    if _probe_id not in gym.registry:
        gym.register(id=_probe_id, entry_point=f"rlkit.envs.probes:{_probe.__name__}")
