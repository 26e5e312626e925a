"""Deep Q-learning (Chapter 4): Q-learning with a neural network, a replay buffer and a target
network.

Mnih et al. (2015), with the double-DQN target of van Hasselt et al. (2016) as an option. The TD
target bootstraps unless the episode *terminated*: a time-limit truncation stores the true final
observation and bootstraps from it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlkit.checkpoint import env_state, load_env_state
from rlkit.nets import QNetwork
from rlkit.presets import AlgorithmConfig
from rlkit.training import (
    StepBudgetTrainer,
    TrainResult,
    fit,
    greedy_mean_return,
    is_count,
    is_finite_number,
    is_number,
    is_seed,
    require,
    require_device,
    require_discrete_actions_and_flat_obs,
    seed_everything,
)


@dataclass
class DQNConfig(AlgorithmConfig):
    """DQN's hyperparameters, each with its default (common DQN settings).

    ``DQNConfig.for_env(env_id, **overrides)`` applies the tested preset of ``env_id``
    (``rlkit/presets.py``): for CartPole-v1, rl-baselines3-zoo's."""

    algorithm: ClassVar[str] = "dqn"

    env_id: str = "CartPole-v1"
    seed: int = 0
    total_steps: int = 100_000  # environment steps
    learning_rate: float = 1e-3
    batch_size: int = 64
    buffer_size: int = 50_000  # replay capacity, in transitions
    learning_starts: int = 1_000  # steps of uniform-random play before the first update
    gamma: float = 0.99
    # steps between copies of the online net into the target net
    target_update_interval: int = 500
    train_frequency: int = 4  # steps between training bursts
    gradient_steps: int = 1  # gradient steps per burst
    # fraction of total_steps over which epsilon decays linearly
    exploration_fraction: float = 0.2
    start_epsilon: float = 1.0
    end_epsilon: float = 0.05
    hidden_sizes: tuple[int, ...] = (64, 64)
    max_grad_norm: float = 10.0
    # choose the next action with the online net, value it with the target net
    double_dqn: bool = False
    device: str = "cpu"
    progress: bool = False

    def _validate(self) -> None:
        require(is_seed(self.seed), "seed", "an integer in [0, 2**32)", self.seed)
        for name in (
            "total_steps",
            "batch_size",
            "buffer_size",
            "target_update_interval",
            "train_frequency",
            "gradient_steps",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            is_count(self.learning_starts, minimum=0),
            "learning_starts",
            "an integer >= 0",
            self.learning_starts,
        )
        for name in (
            "learning_rate",
            "gamma",
            "exploration_fraction",
            "start_epsilon",
            "end_epsilon",
        ):
            require(
                is_finite_number(getattr(self, name)), name, "a finite number", getattr(self, name)
            )
        require(is_number(self.max_grad_norm), "max_grad_norm", "a number", self.max_grad_norm)
        require(isinstance(self.double_dqn, bool), "double_dqn", "True or False", self.double_dqn)
        require_device(self.device)
        require(
            0 < self.learning_rate <= 1,
            "learning_rate",
            "in (0, 1] (Adam moves each weight by about this much)",
            self.learning_rate,
        )
        require(
            self.buffer_size >= self.batch_size,
            "buffer_size",
            f">= batch_size ({self.batch_size})",
            self.buffer_size,
        )
        require(0 <= self.gamma <= 1, "gamma", "in [0, 1]", self.gamma)
        require(
            0 < self.exploration_fraction <= 1,
            "exploration_fraction",
            "in (0, 1]",
            self.exploration_fraction,
        )
        for name in ("start_epsilon", "end_epsilon"):
            require(0 <= getattr(self, name) <= 1, name, "in [0, 1]", getattr(self, name))
        require(
            self.max_grad_norm > 0,
            "max_grad_norm",
            "> 0 (math.inf: never clip)",
            self.max_grad_norm,
        )
        require(
            all(is_count(size) for size in self.hidden_sizes),
            "hidden_sizes",
            "positive layer sizes (integers)",
            self.hidden_sizes,
        )


class ReplayBuffer:
    """A ring buffer of transitions in preallocated tensors; uniform sampling."""

    def __init__(self, capacity: int, obs_dim: int, device: str | torch.device = "cpu"):
        self.obs = torch.zeros(capacity, obs_dim, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=device)
        self.actions = torch.zeros(capacity, dtype=torch.long, device=device)
        self.rewards = torch.zeros(capacity, device=device)
        self.terminated = torch.zeros(capacity, device=device)
        self.capacity, self.size, self.position, self.device = capacity, 0, 0, torch.device(device)

    def add(self, obs, action, reward, next_obs, terminated) -> None:
        i = self.position
        self.obs[i], self.next_obs[i] = (
            torch.as_tensor(obs, device=self.device),
            torch.as_tensor(next_obs, device=self.device),
        )
        self.actions[i], self.rewards[i], self.terminated[i] = (
            int(action),
            float(reward),
            float(terminated),
        )
        self.position, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def state_dict(self) -> dict:
        return {
            "obs": self.obs,
            "next_obs": self.next_obs,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminated": self.terminated,
            "size": self.size,
            "position": self.position,
        }

    def load_state_dict(self, state: dict) -> None:
        for name in ("obs", "next_obs", "actions", "rewards", "terminated"):
            getattr(self, name).copy_(state[name])
        self.size, self.position = state["size"], state["position"]

    def sample(self, batch_size: int, generator: torch.Generator):
        # CPU generator: same draws on any device
        index = torch.randint(self.size, (batch_size,), generator=generator).to(self.device)
        return (
            self.obs[index],
            self.actions[index],
            self.rewards[index],
            self.next_obs[index],
            self.terminated[index],
        )


def td_targets(
    q_target: QNetwork,
    q_online: QNetwork,
    rewards,
    next_obs,
    terminated,
    gamma: float,
    double: bool,
):
    """``y = r + gamma (1 - terminated) Q_target(s', a*)`` (eq-dqn-target); ``a* = argmax Q_target``
    or, for double DQN, ``argmax Q_online`` (eq-double-dqn-target)."""
    with torch.no_grad():
        next_q = q_target(next_obs)
        best = (q_online(next_obs) if double else next_q).argmax(dim=1, keepdim=True)
        return rewards + gamma * (1.0 - terminated) * next_q.gather(1, best).squeeze(1)


def epsilon_at(step: int, config: DQNConfig) -> float:
    """Linear decay from start_epsilon to end_epsilon over exploration_fraction * total_steps, then
    constant."""
    progress = min(1.0, step / (config.exploration_fraction * config.total_steps))
    return config.start_epsilon + progress * (config.end_epsilon - config.start_epsilon)


def _make_env(config: DQNConfig) -> gym.Env:
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(config.env_id))
    require_discrete_actions_and_flat_obs(
        config.env_id, env.action_space, env.observation_space, "DQN"
    )
    return env


class DQNTrainer(StepBudgetTrainer):
    """DQN's training: environment steps up to the next training burst form one update (one history
    row)."""

    algorithm = "dqn"

    def __init__(self, config: DQNConfig):
        super().__init__(config)
        seed_everything(config.seed)
        self.env = _make_env(config)
        obs_dim, n_actions = self.env.observation_space.shape[0], int(self.env.action_space.n)
        self.q_online = QNetwork(obs_dim, n_actions, config.hidden_sizes).to(config.device)
        self.q_target = copy.deepcopy(self.q_online)
        self.optimizer = torch.optim.Adam(self.q_online.parameters(), lr=config.learning_rate)
        self.buffer = ReplayBuffer(config.buffer_size, obs_dim, config.device)
        self.rng = np.random.default_rng(config.seed)
        self.sampler = torch.Generator().manual_seed(config.seed)
        self.env.action_space.seed(config.seed)
        self.obs, _ = self.env.reset(seed=config.seed)
        self.env_steps, self.recent_returns = 0, []

    def _update(self) -> dict[str, float] | None:
        """Play until the next training burst and do it; its row (None when training ends first)."""
        config = self.config
        while self.env_steps < config.total_steps:
            step = self.env_steps
            self._act_and_store(step)
            self.env_steps += 1
            row = None
            if step >= config.learning_starts and (step + 1) % config.train_frequency == 0:
                steps = [
                    _gradient_step(
                        self.q_online,
                        self.q_target,
                        self.optimizer,
                        self.buffer,
                        self.sampler,
                        config,
                    )
                    for _ in range(config.gradient_steps)
                ]
                row = {
                    "step": step + 1,
                    "loss": float(np.mean([loss for loss, _ in steps])),
                    "grad_norm": float(np.mean([norm for _, norm in steps])),
                    "epsilon": epsilon_at(step, config),
                }
                if self.recent_returns:
                    row["episode_return"] = float(np.mean(self.recent_returns[-10:]))
            if (step + 1) % config.target_update_interval == 0:
                self.q_target.load_state_dict(self.q_online.state_dict())
            if row is not None:
                return row
        return None

    def _act_and_store(self, step: int) -> None:
        """One epsilon-greedy environment step, stored in the replay buffer."""
        config, env = self.config, self.env
        if step < config.learning_starts or self.rng.random() < epsilon_at(step, config):
            action = int(env.action_space.sample())
        else:
            with torch.inference_mode():
                action = int(
                    self.q_online(
                        torch.as_tensor(self.obs, dtype=torch.float32, device=config.device)
                    ).argmax()
                )
        next_obs, reward, terminated, truncated, info = env.step(action)
        # next_obs is the true final one, also when truncated
        self.buffer.add(self.obs, action, reward, next_obs, terminated)
        self.obs = next_obs
        if terminated or truncated:
            self.recent_returns = (self.recent_returns + [float(info["episode"]["r"])])[-10:]
            self.obs, _ = env.reset()

    def _state(self) -> dict:
        return {
            "q_online": self.q_online.state_dict(),
            "q_target": self.q_target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "epsilon_rng": self.rng.bit_generator.state,
            "sampler": self.sampler.get_state(),
            "env": env_state(self.env),
            "obs": torch.from_numpy(np.array(self.obs)),
            "step": self.env_steps,
            "recent_returns": list(self.recent_returns),
        }

    def _load_state(self, state: dict) -> None:
        self.q_online.load_state_dict(state["q_online"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.rng.bit_generator.state = state["epsilon_rng"]
        self.sampler.set_state(state["sampler"])
        load_env_state(self.env, state["env"])
        self.obs, self.env_steps = state["obs"].numpy().copy(), state["step"]
        self.recent_returns = list(state["recent_returns"])

    def result(self) -> TrainResult:
        return TrainResult(self.config, self.q_online, self.history)

    def close(self) -> None:
        self.env.close()


def train(config: DQNConfig) -> TrainResult:
    """Train DQN on ``config.env_id``; one history row per training burst."""
    return fit(DQNTrainer(config), config.progress)


def _gradient_step(q_online, q_target, optimizer, buffer, sampler, config) -> float:
    obs, actions, rewards, next_obs, terminated = buffer.sample(config.batch_size, sampler)
    targets = td_targets(
        q_target, q_online, rewards, next_obs, terminated, config.gamma, config.double_dqn
    )
    q_taken = q_online(obs).gather(1, actions[:, None]).squeeze(1)
    loss = F.smooth_l1_loss(q_taken, targets)  # Huber: quadratic near 0, linear beyond |error| = 1
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(q_online.parameters(), config.max_grad_norm)
    optimizer.step()
    return loss.item(), float(grad_norm)


def evaluate(result: TrainResult, episodes: int = 100, seed: int = 10_000) -> float:
    """Mean undiscounted return of the greedy policy ``argmax_a Q(s, a)`` over ``episodes``
    episodes."""
    q, device = result.agent, result.config.device
    return greedy_mean_return(result, lambda obs: q(obs.to(device)).argmax(dim=1), episodes, seed)
