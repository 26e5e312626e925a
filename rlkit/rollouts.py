"""Fixed-length rollouts from ``gymnasium.vector`` environments: the data collection of A2C and PPO.

Every update plays ``num_steps`` steps in each of ``num_envs`` copies and stores them batch-first,
``[num_envs, num_steps]``. The copies are *not* reset between updates: the last observation is
carried into the next rollout, so an episode can span several updates (PPO's first implementation
detail).

The envs run in SAME_STEP autoreset mode: a copy whose episode ends is reset inside the same
``step`` call, the observation returned is the new episode's first one, and the true final
observation arrives in ``info["final_obs"]``. Gymnasium 1.x, done right (Chapter 1, "Episodes,
termination and truncation"):

- ``dones[:, t] = 1`` when the episode ended at step t, by termination or truncation, so that GAE
  never bootstraps across it;
- a *truncated* (and not terminated) step gets ``gamma * V(final observation)`` added to its reward:
  the time limit cut an episode that would have gone on (Pardo et al., 2018), the way
  Stable-Baselines3 does it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from rlkit.checkpoint import env_state, load_env_state
from rlkit.envs.cartpole import BatchedCartPole
from rlkit.nets import ActorCritic
from rlkit.training import require


@dataclass
class Rollout:
    """One update's data, ``[num_envs, num_steps]`` (observations and continuous actions add a last
    dim)."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor  # log pi_old(a_t | s_t) at collection time
    values: torch.Tensor  # V_old(s_t) at collection time
    rewards: torch.Tensor  # with gamma * V(final obs) added at truncated steps
    dones: torch.Tensor  # 1 where the episode ended at this step (terminated or truncated)
    last_value: torch.Tensor  # [num_envs]: V(observation after the last step), GAE's bootstrap
    # undiscounted returns of episodes ended here
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def num_transitions(self) -> int:
        return int(self.rewards.numel())


BATCHED_ENVS = {"CartPole-v1": BatchedCartPole}


def require_registered(env_id: str) -> None:
    """A ValueError naming ``env_id`` unless Gymnasium knows it (``module:EnvId`` imports the module
    first)."""
    require(isinstance(env_id, str), "env_id", "a gymnasium environment id (a string)", env_id)
    try:
        # "module:EnvId-v0": Gymnasium imports the module, which registers the env
        if ":" in env_id:
            importlib.import_module(env_id.split(":")[0])
        gym.spec(env_id.split(":")[-1])
    except (gym.error.Error, ImportError, ValueError) as error:
        raise ValueError(
            f"env_id must be a registered gymnasium environment, got {env_id!r} ({error})"
        ) from None


def make_vector_env(
    env_id: str, num_envs: int, batched: bool = False, env_kwargs: dict | None = None
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` with SAME_STEP autoreset: Gymnasium's ``SyncVectorEnv``, or
    with ``batched`` rlkit's implementation that steps all copies in one set of array operations."""
    require(isinstance(num_envs, int) and num_envs >= 1, "num_envs", "an integer >= 1", num_envs)
    if batched:
        require(
            env_id in BATCHED_ENVS,
            "batched_env",
            f"False for {env_id!r} (batched versions exist of {sorted(BATCHED_ENVS)})",
            batched,
        )
        return BATCHED_ENVS[env_id](num_envs, **(env_kwargs or {}))
    require_registered(env_id)
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **(env_kwargs or {})) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


class RolloutCollector:
    """Steps a vector env with an ``ActorCritic`` and returns one ``Rollout`` per call to
    ``collect``.

    It keeps the current observation of every copy, and each copy's running return and length,
    across calls.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        agent: ActorCritic,
        num_steps: int,
        gamma: float,
        seed: int,
    ):
        require(
            envs.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.SAME_STEP,
            "envs",
            "a vector env in SAME_STEP autoreset mode (make_vector_env builds one)",
            envs.metadata.get("autoreset_mode"),
        )
        require(
            isinstance(num_steps, int) and num_steps >= 1, "num_steps", "an integer >= 1", num_steps
        )
        require(0 <= gamma <= 1, "gamma", "in [0, 1]", gamma)
        self.envs, self.agent, self.num_steps, self.gamma = envs, agent, num_steps, gamma
        self.device = next(agent.parameters()).device
        space = envs.single_action_space
        self.action_bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        obs, _ = envs.reset(seed=seed)
        self.obs = self._tensor(obs)
        self.running_return = np.zeros(envs.num_envs)
        self.running_length = np.zeros(envs.num_envs, dtype=np.int64)
        self.env_steps = 0

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, dtype=torch.float32, device=self.device)

    def state_dict(self) -> dict:
        """What the next rollout continues from: the envs' state, the current observations, the
        running episodes."""
        return {
            "envs": env_state(self.envs),
            "obs": self.obs.cpu(),
            "running_return": torch.from_numpy(self.running_return.copy()),
            "running_length": torch.from_numpy(self.running_length.copy()),
            "env_steps": self.env_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        load_env_state(self.envs, state["envs"])
        self.obs = state["obs"].to(self.device)
        self.running_return, self.running_length = (
            state["running_return"].numpy().copy(),
            state["running_length"].numpy().copy(),
        )
        self.env_steps = state["env_steps"]

    def collect(self) -> Rollout:
        """Play ``num_steps`` steps in every copy with the current policy (no gradients)."""
        copies, steps = self.envs.num_envs, self.num_steps
        obs, actions, logprobs, values = [], [], [], []
        rewards, dones = (
            np.zeros((copies, steps), dtype=np.float32),
            np.zeros((copies, steps), dtype=np.float32),
        )
        returns, lengths = [], []
        with torch.inference_mode():
            for t in range(steps):
                action, logprob, value = self.agent.act(self.obs)
                for column, item in (
                    (obs, self.obs),
                    (actions, action),
                    (logprobs, logprob),
                    (values, value),
                ):
                    column.append(item)
                self.obs = self._step(action, rewards[:, t], dones[:, t], returns, lengths)
            last_value = self.agent.value(self.obs)
        self.env_steps += steps * copies
        return Rollout(
            torch.stack(obs, dim=1),
            torch.stack(actions, dim=1),
            torch.stack(logprobs, dim=1),
            torch.stack(values, dim=1),
            self._tensor(rewards),
            self._tensor(dones),
            last_value,
            returns,
            lengths,
        )

    def _step(
        self,
        actions: torch.Tensor,
        rewards: np.ndarray,
        dones: np.ndarray,
        returns: list,
        lengths: list,
    ) -> torch.Tensor:
        """One vector step: fill this step's rewards (with the truncation bootstrap) and done flags;
        the next obs."""
        env_actions = actions.cpu().numpy()
        # the Gaussian sample is stored as drawn; the env gets it clipped
        if self.action_bounds is not None:
            env_actions = np.clip(env_actions, *self.action_bounds)
        next_obs, rewards[:], terminated, truncated, info = self.envs.step(env_actions)
        ended = terminated | truncated
        dones[:] = ended
        self.running_return += rewards
        self.running_length += 1
        if ended.any():
            cut_short = truncated & ~terminated
            if cut_short.any():
                final_values = self.agent.value(
                    self._tensor(np.stack(info["final_obs"][cut_short]))
                )
                rewards[cut_short] += self.gamma * final_values.cpu().numpy()
            returns.extend(self.running_return[ended].tolist())
            lengths.extend(self.running_length[ended].tolist())
            self.running_return[ended], self.running_length[ended] = 0.0, 0
        return self._tensor(next_obs)
