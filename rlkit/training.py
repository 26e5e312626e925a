"""What every deep algorithm shares: the result type, seeding, config checks and greedy evaluation."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlkit.envs  # noqa: F401  (registers the rlkit/ environments)


@dataclass
class TrainResult:
    """``train(config)`` returns this: the config used, the trained agent, one history row per update."""

    config: Any
    agent: torch.nn.Module
    history: list[dict[str, float]] = field(default_factory=list)
    critic: torch.nn.Module | None = None  # a learned value function, for algorithms that have one

    def column(self, name: str) -> np.ndarray:
        """One metric over updates, as an array (NaN where a row lacks it)."""
        return np.array([row.get(name, np.nan) for row in self.history], dtype=float)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch, so that the same seed gives the same numbers on CPU."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def require(condition: bool, field_name: str, allowed: str, value: Any) -> None:
    """Raise ``ValueError`` naming the config field and what is allowed, unless ``condition`` holds."""
    if not condition:
        raise ValueError(f"{field_name} must be {allowed}, got {value!r}")


def is_number(value: Any) -> bool:
    """A real number (not a bool, not a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A real number that is neither infinite nor NaN."""
    return is_number(value) and math.isfinite(value)


def is_seed(value: Any) -> bool:
    """An integer Gymnasium and NumPy accept as a seed: 0 <= seed < 2**32."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def is_count(value: Any) -> bool:
    """An integer >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def require_sequence(value: Any, field_name: str, allowed: str) -> tuple:
    """``value`` as a tuple, or a ValueError naming the field when it is not a list or tuple."""
    require(isinstance(value, (list, tuple)), field_name, allowed, value)
    return tuple(value)


def require_device(device: Any) -> None:
    """A ValueError naming ``device`` unless it is "cpu", or a CUDA or MPS device this machine has."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    require(available.get(kind, False), "device", f"'cpu' or an available device (CUDA: {available['cuda']}, "
            f"MPS: {available['mps']})", device)


def require_discrete_actions_and_flat_obs(env_id: str, action_space, observation_space, algorithm: str) -> None:
    """Raise ``ValueError`` naming ``env_id`` unless the env has Discrete actions and flat Box observations."""
    require(isinstance(action_space, gym.spaces.Discrete), "env_id", f"an environment with Discrete actions ({algorithm})",
            f"{env_id} with {action_space}")
    require(isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1, "env_id",
            "an environment with flat Box observations", f"{env_id} with {observation_space}")


def greedy_returns(env_id: str, act: Callable[[torch.Tensor], torch.Tensor], episodes: int = 100, seed: int = 10_000,
                   num_envs: int = 10, env_kwargs: dict | None = None) -> np.ndarray:
    """Undiscounted returns of ``episodes`` full episodes, acting with ``act(obs_batch) -> actions``.

    Runs ``num_envs`` copies at once and counts only each copy's first ``episodes / num_envs`` episodes,
    so the result does not favour short episodes. Seeds differ from training's by default.
    """
    require(episodes >= 1, "episodes", ">= 1", episodes)
    num_envs = min(num_envs, episodes)
    per_env = -(-episodes // num_envs)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **(env_kwargs or {})) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=seed)
    running, finished = np.zeros(num_envs), [[] for _ in range(num_envs)]
    with torch.inference_mode():
        while any(len(done) < per_env for done in finished):
            actions = act(torch.as_tensor(obs, dtype=torch.float32)).cpu().numpy()
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            running += rewards
            for index in np.flatnonzero(terminated | truncated):
                finished[index].append(running[index])
                running[index] = 0.0
    envs.close()
    return np.concatenate([np.array(done[:per_env]) for done in finished])[:episodes]


SCHEDULES = ("constant", "linear")


def scheduled(initial: float, schedule: str, progress: float) -> float:
    """A hyperparameter's value after ``progress`` (0 to 1) of training: constant, or linear from ``initial`` to 0."""
    require(schedule in SCHEDULES, "schedule", f"one of {SCHEDULES}", schedule)
    return initial if schedule == "constant" else initial * (1.0 - progress)
