"""REINFORCE (Chapter 5): the Monte Carlo policy gradient, with or without a learned state-value
baseline.

Williams (1992); Sutton & Barto (2018), section 13.4 for the baseline. Each update plays one
complete episode in each of ``episodes_per_update`` copies of the environment (a
``gymnasium.vector`` env in NEXT_STEP autoreset mode) with the current policy and follows the
gradient estimate

    g = 1/E sum_episodes sum_t (G_t - b(s_t)) grad log pi(a_t | s_t)        (eq-reinforce-baseline)

with ``b = 0`` without a baseline (eq-reinforce-gradient). The sum is divided by the number of
episodes ``E``, a constant, and not by the number of steps, which depends on the actions: dividing
by it would bias the estimate and break the baseline's zero mean.

Gymnasium 1.x, done right:
- an episode that *terminated* has no future: its return stops there;
- an episode that was *truncated* (a time limit) would have gone on: with a baseline, its last
  reward gets ``gamma * V(final observation)`` added (Chapter 1's truncation rule). Without a
  value function there is nothing to bootstrap from, and REINFORCE treats the time limit as the
  end, as the textbook algorithm does;
- in NEXT_STEP mode the step after an episode end only resets that copy: the action is ignored, the
  reward is 0. It and everything after the copy's first episode are masked out and never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch

from rlkit.advantages import discounted_returns
from rlkit.checkpoint import env_state, load_env_state
from rlkit.losses import masked_mean, masked_whiten, policy_gradient_loss
from rlkit.nets import CategoricalPolicy, ValueNetwork
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
class ReinforceConfig(AlgorithmConfig):
    """REINFORCE's hyperparameters, each with its default (the first settings tried on
    CartPole-v1: untuned).

    ``ReinforceConfig.for_env(env_id, **overrides)`` applies the tested preset of ``env_id``
    (``rlkit/presets.py``)."""

    algorithm: ClassVar[str] = "reinforce"

    env_id: str = "CartPole-v1"
    seed: int = 0
    total_steps: int = 200_000  # environment steps of the episodes trained on
    # complete episodes per gradient estimate (one per env copy)
    episodes_per_update: int = 8
    learning_rate: float = 1e-3  # policy's Adam step size
    value_learning_rate: float = 1e-3  # baseline's Adam step size
    value_epochs: int = 10  # gradient steps on the baseline per update (full batch)
    gamma: float = 0.99
    # learn V(s) and subtract it from the return (eq-reinforce-baseline)
    baseline: bool = True
    # whiten G_t - b(s_t) over the batch (a common, biased, trick)
    normalize_advantages: bool = False
    hidden_sizes: tuple[int, ...] = (64, 64)
    max_grad_norm: float | None = None  # clip the policy gradient's global norm (None: never)
    device: str = "cpu"
    progress: bool = False

    def _validate(self) -> None:
        require(is_seed(self.seed), "seed", "an integer in [0, 2**32)", self.seed)
        for name in ("total_steps", "episodes_per_update", "value_epochs"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        for name in ("learning_rate", "value_learning_rate", "gamma"):
            require(
                is_finite_number(getattr(self, name)), name, "a finite number", getattr(self, name)
            )
        for name in ("baseline", "normalize_advantages"):
            require(
                isinstance(getattr(self, name), bool), name, "True or False", getattr(self, name)
            )
        require_device(self.device)
        for name in ("learning_rate", "value_learning_rate"):
            require(
                0 < getattr(self, name) <= 1,
                name,
                "in (0, 1] (Adam moves each weight by about this much)",
                getattr(self, name),
            )
        require(0 <= self.gamma <= 1, "gamma", "in [0, 1]", self.gamma)
        require(
            self.max_grad_norm is None
            or (is_number(self.max_grad_norm) and self.max_grad_norm > 0),
            "max_grad_norm",
            "> 0 or None",
            self.max_grad_norm,
        )
        require(
            all(is_count(size) for size in self.hidden_sizes),
            "hidden_sizes",
            "positive layer sizes (integers)",
            self.hidden_sizes,
        )


@dataclass
class EpisodeBatch:
    """One complete episode per env copy, stacked as ``[E, T]`` (``T``: the longest episode),
    right-padded.

    ``mask`` is 1 on the steps of each copy's episode and 0 on the autoreset step and everything
    after. ``final_obs`` is the observation each episode ended in (what a truncation bootstraps
    from).
    """

    obs: torch.Tensor  # [E, T, obs_dim]
    actions: torch.Tensor  # [E, T]
    rewards: torch.Tensor  # [E, T]
    mask: torch.Tensor  # [E, T]
    terminated: torch.Tensor  # [E, T], 1 at a terminal last step
    truncated: torch.Tensor  # [E, T], 1 at a truncated last step
    final_obs: torch.Tensor  # [E, obs_dim], the observation each episode ended in

    @property
    def num_steps(self) -> int:
        return int(self.mask.sum())

    @property
    def episode_returns(self) -> torch.Tensor:
        return (self.rewards * self.mask).sum(dim=1)


def make_envs(env_id: str, copies: int) -> gym.vector.SyncVectorEnv:
    """``copies`` of ``env_id`` in a vector env with NEXT_STEP autoreset (the mode this module masks
    for)."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(copies)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    require_discrete_actions_and_flat_obs(
        env_id,
        envs.single_action_space,
        envs.single_observation_space,
        "REINFORCE here uses a categorical policy",
    )
    return envs


def collect_episodes(
    envs: gym.vector.VectorEnv, policy: CategoricalPolicy, seed: int | None = None
) -> EpisodeBatch:
    """Play until every copy has finished one episode that started at this call; stack them.

    The copies are reset first (``seed`` seeds that reset). A copy that finishes early keeps being
    stepped (a vector env steps all copies) but those steps, starting with its autoreset step, are
    masked out. The batch lives on the policy's device.
    """
    require(
        envs.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.NEXT_STEP,
        "envs",
        "a vector env in NEXT_STEP autoreset mode (make_envs builds one)",
        envs.metadata.get("autoreset_mode"),
    )
    device = next(policy.parameters()).device
    obs, _ = envs.reset(seed=seed)
    copies = envs.num_envs
    running = np.ones(copies, dtype=bool)
    steps: list[tuple] = []
    final_obs = np.zeros_like(obs)
    with torch.inference_mode():
        while running.any():
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device)
            actions = policy.distribution(obs_tensor).sample()
            next_obs, rewards, terminated, truncated, _ = envs.step(actions.cpu().numpy())
            steps.append(
                (
                    obs_tensor,
                    actions,
                    rewards,
                    running.copy(),
                    terminated & running,
                    truncated & running,
                )
            )
            ended = running & (terminated | truncated)
            # NEXT_STEP mode: the step's observation is the final one
            final_obs[ended] = next_obs[ended]
            running &= ~ended
            obs = next_obs
    stacked = [
        torch.stack([torch.as_tensor(step[i], device=device) for step in steps], dim=1)
        for i in range(6)
    ]
    obs_batch, actions, rewards, mask, terminated, truncated = stacked
    return EpisodeBatch(
        obs_batch,
        actions,
        rewards.float(),
        mask.float(),
        terminated.float(),
        truncated.float(),
        torch.as_tensor(final_obs, dtype=torch.float32, device=device),
    )


def returns_to_go(
    batch: EpisodeBatch, gamma: float, value: ValueNetwork | None = None
) -> torch.Tensor:
    """``G_t = r_t + gamma G_{t+1}`` within each episode (eq-return-recursive), 0 on masked steps.

    With ``value``, a truncated episode's last reward gets ``gamma * V(final observation)`` added:
    the return it would have had if the time limit had not cut it. A terminated episode gets nothing
    added, also when the time limit fell on the same step (Gymnasium then sets both flags).
    """
    rewards = batch.rewards * batch.mask
    if value is not None:
        cut_short = batch.truncated * (1.0 - batch.terminated)
        with torch.no_grad():
            rewards = rewards + gamma * cut_short * value(batch.final_obs)[:, None]
    ends = torch.maximum(torch.maximum(batch.terminated, batch.truncated), 1.0 - batch.mask)
    return discounted_returns(rewards, gamma, dones=ends) * batch.mask


def reinforce_loss(
    policy: CategoricalPolicy, batch: EpisodeBatch, advantages: torch.Tensor
) -> torch.Tensor:
    """The surrogate whose gradient is eq-reinforce-baseline: ``policy_gradient_loss`` (a mean over
    valid steps) rescaled to a sum over steps divided by the number of episodes."""
    logprobs = policy.distribution(batch.obs).log_prob(batch.actions)
    steps_per_episode = batch.mask.sum() / batch.mask.shape[0]
    return policy_gradient_loss(logprobs, advantages, batch.mask) * steps_per_episode


def advantages_of(
    batch: EpisodeBatch, returns: torch.Tensor, value: ValueNetwork | None, normalize: bool
) -> torch.Tensor:
    """``G_t - V(s_t)`` with a baseline, ``G_t`` without; whitened over valid steps when
    ``normalize``."""
    advantages = returns
    if value is not None:
        with torch.no_grad():
            advantages = (returns - value(batch.obs)) * batch.mask
    return masked_whiten(advantages, batch.mask) if normalize else advantages


def fit_value(
    value: ValueNetwork,
    optimizer: torch.optim.Optimizer,
    batch: EpisodeBatch,
    returns: torch.Tensor,
    epochs: int,
) -> float:
    """Regress ``V(s_t)`` on the returns ``G_t`` (mean squared error over valid steps); the last
    loss."""
    for _ in range(epochs):
        loss = masked_mean((value(batch.obs) - returns) ** 2, batch.mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


class ReinforceTrainer(StepBudgetTrainer):
    """REINFORCE's training, one batch of complete episodes per update, until ``total_steps`` steps
    are trained on."""

    algorithm = "reinforce"

    def __init__(self, config: ReinforceConfig):
        super().__init__(config)
        seed_everything(config.seed)
        self.envs = make_envs(config.env_id, config.episodes_per_update)
        obs_dim, n_actions = (
            self.envs.single_observation_space.shape[0],
            int(self.envs.single_action_space.n),
        )
        self.policy = CategoricalPolicy(obs_dim, n_actions, config.hidden_sizes).to(config.device)
        self.value = (
            ValueNetwork(obs_dim, config.hidden_sizes).to(config.device)
            if config.baseline
            else None
        )
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.learning_rate)
        self.value_optimizer = (
            torch.optim.Adam(self.value.parameters(), lr=config.value_learning_rate)
            if self.value is not None
            else None
        )
        self.env_steps = 0

    def _update(self) -> dict[str, float]:
        config, value = self.config, self.value
        batch = collect_episodes(
            self.envs, self.policy, seed=config.seed if self.updates_done == 0 else None
        )
        returns = returns_to_go(batch, config.gamma, value)
        advantages = advantages_of(batch, returns, value, config.normalize_advantages)
        loss = reinforce_loss(self.policy, batch, advantages)
        self.policy_optimizer.zero_grad()
        loss.backward()
        grad_norm = _clip(self.policy, config.max_grad_norm)
        self.policy_optimizer.step()
        self.env_steps += batch.num_steps
        row = {
            "step": self.env_steps,
            "episode_return": float(batch.episode_returns.mean()),
            "policy_loss": loss.item(),
            "grad_norm": grad_norm,
        }
        if value is not None:
            row["value_loss"] = fit_value(
                value, self.value_optimizer, batch, returns, config.value_epochs
            )
        return row

    def _state(self) -> dict:
        state = {
            "policy": self.policy.state_dict(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "steps": self.env_steps,
            "envs": env_state(self.envs),
        }
        if self.value is not None:
            state.update(
                value=self.value.state_dict(), value_optimizer=self.value_optimizer.state_dict()
            )
        return state

    def _load_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        if self.value is not None:
            self.value.load_state_dict(state["value"])
            self.value_optimizer.load_state_dict(state["value_optimizer"])
        self.env_steps = state["steps"]
        load_env_state(self.envs, state["envs"])

    def result(self) -> TrainResult:
        return TrainResult(self.config, self.policy, self.history, critic=self.value)

    def close(self) -> None:
        self.envs.close()


def train(config: ReinforceConfig) -> TrainResult:
    """Train REINFORCE on ``config.env_id``; one history row per update. ``result.agent`` is the
    policy, ``result.critic`` the baseline (None without one)."""
    return fit(ReinforceTrainer(config), config.progress)


def gradient_estimates(
    policy: CategoricalPolicy,
    baseline: ValueNetwork,
    env_id: str,
    batches: int,
    episodes_per_batch: int,
    gamma: float = 0.99,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batches`` independent batches with the fixed ``policy``; return the policy-gradient
    estimates of eq-reinforce-gradient (no baseline) and eq-reinforce-baseline (``baseline``),
    ``[batches, n_params]`` each.

    Both come from the same episodes, so their difference is exactly the baseline's term,
    ``1/E sum b(s_t) grad log pi(a_t|s_t)``, whose expectation is 0 (eq-baseline-zero-mean). For
    that reason both use the same returns, never bootstrapped: measure at a policy whose episodes
    terminate. ``seed`` seeds the environments and the action sampling (torch's global generator is
    left as it was).
    """
    require(batches >= 2, "batches", ">= 2", batches)
    envs = make_envs(env_id, episodes_per_batch)
    without, with_baseline = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for index in range(batches):
            _append_gradients(
                policy, baseline, envs, gamma, seed if index == 0 else None, without, with_baseline
            )
    envs.close()
    return torch.stack(without), torch.stack(with_baseline)


def _append_gradients(policy, baseline, envs, gamma, seed, without, with_baseline) -> None:
    """One batch: append its gradient estimate without and with the baseline."""
    batch = collect_episodes(envs, policy, seed=seed)
    returns = returns_to_go(batch, gamma)
    for advantages, out in (
        (returns, without),
        (advantages_of(batch, returns, baseline, False), with_baseline),
    ):
        policy.zero_grad()
        reinforce_loss(policy, batch, advantages).backward()
        out.append(torch.cat([-p.grad.flatten() for p in policy.parameters()]))  # ascent direction


def _clip(module: torch.nn.Module, max_norm: float | None) -> float:
    norm = torch.nn.utils.clip_grad_norm_(
        module.parameters(), float("inf") if max_norm is None else max_norm
    )
    return float(norm)


def evaluate(result: TrainResult, episodes: int = 100, seed: int = 10_000) -> float:
    """Mean undiscounted return of the greedy policy ``argmax_a pi(a|s)`` over ``episodes``
    episodes."""
    policy, device = result.agent, result.config.device
    return greedy_mean_return(result, lambda obs: policy.greedy(obs.to(device)), episodes, seed)
