"""Environments that fail on purpose: one raises on its 30th step (the A3C test of a worker that
fails with an exception), one pays NaN rewards from its 300th step (a loss that turns NaN
mid-training), one pays NumPy float32 rewards (state a checkpoint must keep as NumPy scalars).

Registered on import, so an ``env_id`` of ``"tests.crashing_env:rlkit-test/CrashingCartPole-v0"``
reaches worker processes (Gymnasium imports the module named before the colon).
"""

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class CrashingCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps_taken = 0

    def step(self, action):
        self.steps_taken += 1
        if self.steps_taken == 30:
            raise FloatingPointError("simulated failure inside the environment at step 30")
        return super().step(action)


if "rlkit-test/CrashingCartPole-v0" not in gym.registry:
    gym.register(
        id="rlkit-test/CrashingCartPole-v0", entry_point=CrashingCartPole, max_episode_steps=500
    )


class NaNRewardCartPole(CartPoleEnv):
    """CartPole whose reward turns NaN from its 300th step on: a loss that turns NaN
    mid-training."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps_taken = 0

    def step(self, action):
        self.steps_taken += 1
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float("nan") if self.steps_taken >= 300 else reward, terminated, truncated, info


if "rlkit-test/NaNRewardCartPole-v0" not in gym.registry:
    gym.register(
        id="rlkit-test/NaNRewardCartPole-v0", entry_point=NaNRewardCartPole, max_episode_steps=500
    )


class Float32RewardCartPole(CartPoleEnv):
    """CartPole paying its reward as a NumPy float32: episode statistics then hold NumPy scalars."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, np.float32(reward), terminated, truncated, info


if "rlkit-test/Float32RewardCartPole-v0" not in gym.registry:
    gym.register(
        id="rlkit-test/Float32RewardCartPole-v0",
        entry_point=Float32RewardCartPole,
        max_episode_steps=500,
    )
